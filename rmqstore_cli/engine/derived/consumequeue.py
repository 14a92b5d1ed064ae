"""Consume queues and their ext files, read side (the broker's ConsumeQueue / ConsumeQueueExt)."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from rmqstore_cli.formats.extaddr import is_ext_addr, undecorate
from rmqstore_cli.formats.records import (CQ_FILLER, CQ_UNIT_FIELDS, CQ_UNIT_SIZE, CQEXT_HEADER_FIELDS, fields_dtype,
                                          struct_format)

from ..config.storeconfig import StoreConfig
from ..log.segments import SegmentQueue

CQ_DTYPE = fields_dtype(CQ_UNIT_FIELDS)
assert CQ_DTYPE.itemsize == CQ_UNIT_SIZE
_EXT_HEAD = struct.Struct(struct_format(CQEXT_HEADER_FIELDS))


def is_filler(phy: int, size: int, tags: int) -> bool:
    return (phy, size, tags) == CQ_FILLER


@dataclass
class QueueUnits:
    """The valid units of a queue (the broker's view: up to the first invalid unit)."""

    queue_offsets: np.ndarray  # int64
    phy: np.ndarray
    size: np.ndarray
    tags: np.ndarray
    end_offset: int  # next queue offset to assign (max offset)
    min_offset: int  # first queue offset present on disk (file start)
    stop_file: str | None  # file where the valid units ended (None: ended at a file boundary)
    stop_position: int


class ConsumeQueue:
    """One ``consumequeue/<topic>/<queueId>`` directory."""

    def __init__(self, root: str, topic: str, queue_id: int, config: StoreConfig, dirname: str = "consumequeue"):
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(root, dirname, topic, str(queue_id))
        self.file_size = config.mappedFileSizeConsumeQueue
        self.segments = SegmentQueue(self.directory, self.file_size, "consume queue")

    def file_units(self, seg) -> np.ndarray:
        n = min(seg.size, self.file_size) // CQ_UNIT_SIZE
        if n <= 0:
            return np.zeros(0, dtype=CQ_DTYPE)
        return np.frombuffer(seg.buffer(), dtype=CQ_DTYPE, count=n)

    def units(self, *, all_files: bool = True) -> QueueUnits:
        """Valid units from the first file (or, like recovery, the third-last) on.

        A unit is valid iff phy >= 0 and size > 0 (§7.4); the first invalid unit ends the queue,
        and a file that is not full ends it too.
        """
        segs = self.segments.segments
        parts_q, parts_p, parts_s, parts_t = [], [], [], []
        start_i = 0 if all_files else max(0, len(segs) - 3)
        stop_file, stop_pos = None, 0
        end = segs[start_i].start // CQ_UNIT_SIZE if segs else 0
        for seg in segs[start_i:]:
            arr = self.file_units(seg)
            n = _valid_prefix(arr)
            base = seg.start // CQ_UNIT_SIZE
            if seg.start // CQ_UNIT_SIZE != end and parts_q:
                break  # gap between files: the queue's continuity is broken here
            parts_q.append(np.arange(base, base + n, dtype=np.int64))
            parts_p.append(arr["phyOffset"][:n].astype(np.int64))
            parts_s.append(arr["size"][:n].astype(np.int64))
            parts_t.append(arr["tagsCode"][:n].astype(np.int64))
            end = base + n
            if n * CQ_UNIT_SIZE < self.file_size:
                stop_file, stop_pos = seg.path, n * CQ_UNIT_SIZE
                break
        cat = lambda p: np.concatenate(p) if p else np.zeros(0, np.int64)  # noqa: E731
        min_off = segs[0].start // CQ_UNIT_SIZE if segs else 0
        return QueueUnits(cat(parts_q), cat(parts_p), cat(parts_s), cat(parts_t), end, min_off, stop_file, stop_pos)

    def bounds(self) -> tuple[int, int, int | None]:
        """(min offset, end offset, end of the last valid unit's record: phy + size, or None) by the
        same rules as :meth:`units`, one file at a time: nothing per unit is kept."""
        segs = self.segments.segments
        min_off = segs[0].start // CQ_UNIT_SIZE if segs else 0
        end = min_off
        last_end = None
        for k, seg in enumerate(segs):
            base = seg.start // CQ_UNIT_SIZE
            if k and base != end:
                break  # gap between files: the queue's continuity is broken here
            arr = self.file_units(seg)
            n = _valid_prefix(arr)
            if n:
                last_end = int(arr["phyOffset"][n - 1]) + int(arr["size"][n - 1])
            end = base + n
            if n * CQ_UNIT_SIZE < self.file_size:
                break
        return min_off, end, last_end

    def unit_at(self, queue_offset: int) -> tuple[int, int, int] | None:
        pos = queue_offset * CQ_UNIT_SIZE
        seg = self.segments.find(pos - pos % self.file_size)
        if seg is None or (pos % self.file_size) + CQ_UNIT_SIZE > seg.size:
            return None
        u = self.file_units(seg)[(pos % self.file_size) // CQ_UNIT_SIZE]
        return int(u["phyOffset"]), int(u["size"]), int(u["tagsCode"])


def _valid_prefix(arr: np.ndarray) -> int:
    """Units before the first invalid one (phyOffset < 0 or size <= 0), looked for in blocks that grow 8x: a queue
    file is pre-allocated for 300,000 units and often holds a few hundred, and the whole file's comparisons cost
    ~2 ms (an LMQ broker has thousands of such queues)."""
    at, step = 0, 4096
    while at < len(arr):
        part = arr[at:at + step]
        bad = np.flatnonzero((part["phyOffset"] < 0) | (part["size"] <= 0))
        if len(bad):
            return at + int(bad[0])
        at += len(part)
        step *= 8
    return len(arr)


class ConsumeQueueExt:
    """One ``consumequeue_ext/<topic>/<queueId>`` directory of CqExtUnits (§8)."""

    def __init__(self, root: str, topic: str, queue_id: int, config: StoreConfig):
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(root, "consumequeue_ext", topic, str(queue_id))
        self.file_size = config.mappedFileSizeConsumeQueueExt
        self.segments = SegmentQueue(self.directory, self.file_size, "consume queue ext")

    def get(self, address: int) -> dict | None:
        """The unit at an ext address (decorated), or None if it cannot be read (§8.4)."""
        if not is_ext_addr(address):
            return None
        off = undecorate(address)
        seg = self.segments.find(off - off % self.file_size)
        if seg is None:
            return None
        pos = off % self.file_size
        buf = seg.buffer()
        if pos + _EXT_HEAD.size > seg.size:
            return None
        size, tags, store_time, bm = _EXT_HEAD.unpack_from(buf, pos)
        if size < 1:
            return None
        bitmap = bytes(buf[pos + 20 : pos + 20 + bm]) if bm >= 1 else b""
        return {"address": address, "offset": off, "size": size, "tagsCode": tags, "msgStoreTime": store_time,
                "bitMapSize": bm, "filterBitMapHex": bitmap.hex()}

    def units(self):
        """Every unit in file order, the way ext recovery walks them (§8.5)."""
        for seg in self.segments.segments:
            buf = seg.buffer()
            pos = 0
            while pos + 2 <= seg.size:
                (size,) = struct.unpack_from(">h", buf, pos)
                if size <= 0 or pos + 20 > seg.size:
                    break
                _, tags, store_time, bm = _EXT_HEAD.unpack_from(buf, pos)
                yield {"offset": seg.start + pos, "size": size, "tagsCode": tags, "msgStoreTime": store_time,
                       "bitMapSize": bm, "filterBitMapHex": bytes(buf[pos + 20 : pos + 20 + max(bm, 0)]).hex()}
                pos += size


def list_queues(root: str, dirname: str = "consumequeue") -> list[tuple[str, int]]:
    """(topic, queueId) pairs on disk; non-integer queue directories are skipped like the broker. Read with
    ``scandir``: an entry's type comes with the directory read, not a stat per queue folder."""
    base = os.path.join(root, dirname)
    out = []
    try:
        with os.scandir(base) as it:
            topics = [e for e in it if _is_dir(e) and not e.is_symlink()]
    except OSError:
        return out
    for topic in topics:
        with os.scandir(topic.path) as it:
            queues = [e for e in it if _is_dir(e)]
        for q in queues:
            try:
                qid = int(q.name)
            except ValueError:
                continue
            out.append((topic.name, qid))
    out.sort(key=lambda tq: (tq[0], tq[1]))
    return out


def _is_dir(entry) -> bool:
    """``os.path.isdir`` of a directory entry (a link to a folder counts; an entry that cannot be read does not)."""
    try:
        return entry.is_dir()
    except OSError:
        return False
