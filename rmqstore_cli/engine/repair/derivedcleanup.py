"""The consume-queue, ext and index files the broker's cleaner removes behind a new commitlog min offset
(FORMAT.md 13.10): ``DefaultMessageStore.CleanConsumeQueueService`` with
``MappedFileQueue.deleteExpiredFileByOffset``, ``ConsumeQueue.correctMinOffset`` /
``ConsumeQueueExt.truncateByMinAddress``, and ``IndexService.deleteExpiredFile``. Read-only; used by the
cleanup prediction (cleanup.py) and by reclaim."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from rmqstore_cli.formats.extaddr import is_ext_addr, undecorate
from rmqstore_cli.formats.records import CQ_UNIT_SIZE


@dataclass
class DerivedFile:
    kind: str  # "consumequeue", "consumequeue_ext", "index"
    path: str
    name: str
    size: int
    allocated: int
    why: str
    topic: str | None = None
    queue_id: int | None = None

    def as_json(self) -> dict:
        d = {"kind": self.kind, "path": self.path, "name": self.name, "size": self.size, "why": self.why}
        if self.topic is not None:
            d.update(topic=self.topic, queueId=self.queue_id)
        return d


def _numbered(directory: str, digits: int) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if n.isdigit() and len(n) == digits
                      and os.path.isfile(os.path.join(directory, n)))
    except OSError:
        return []


def _read_long(path: str, pos: int) -> int | None:
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            b = f.read(8)
    except OSError:
        return None
    return struct.unpack(">q", b)[0] if len(b) == 8 else None


def _derived(kind, path, why, topic=None, qid=None) -> DerivedFile:
    st = os.stat(path)
    return DerivedFile(kind, path, os.path.basename(path), st.st_size, st.st_blocks * 512, why, topic, qid)


class _Queue:
    """One queue's files as the cleaner walks them: names oldest first, how many are gone, and the commitlog
    offset of the current first file's last unit (read once per file)."""

    __slots__ = ("topic", "queue_id", "dir", "ext_dir", "names", "first", "last_phy", "ext_names", "ext_first", "ext_hit")

    def __init__(self, root: str, topic: str, qid: int):
        self.topic, self.queue_id = topic, qid
        self.dir = os.path.join(root, "consumequeue", topic, str(qid))
        self.ext_dir = os.path.join(root, "consumequeue_ext", topic, str(qid))
        self.names = _numbered(self.dir, 20)
        self.first = 0
        self.last_phy: int | None = None
        self.ext_names: list[str] | None = None
        self.ext_first = 0
        self.ext_hit: int | None = None


class DerivedCleaner:
    """CleanConsumeQueueService, one call per new commitlog min offset (later calls remove what earlier ones
    left): per queue ``deleteExpiredFileByOffset(min, 20)`` then ``correctMinOffset`` (ext files with
    ``truncateByMinAddress``), then ``IndexService.deleteExpiredFile(min)``. File listings are read once; a
    queue is read again only when the min offset passes its first file's last unit, so a round costs one
    comparison per queue."""

    def __init__(self, store):
        cfg = store.config
        self.root = store.root
        self.cq_size = cfg.mappedFileSizeConsumeQueue
        self.ext_size = cfg.mappedFileSizeConsumeQueueExt
        self.ext = cfg.enableConsumeQueueExt
        self.queues = [_Queue(store.root, t, q) for t, q in store.queues()]
        self.index_dir = os.path.join(store.root, "index")
        self.index_names = _numbered(self.index_dir, 17)
        self.index_first = 0

    def behind(self, min_offset: int) -> list[DerivedFile]:
        out: list[DerivedFile] = []
        if min_offset <= 0:
            return out
        for q in self.queues:
            moved = self._queue(q, min_offset, out)
            if self.ext and (moved or q.ext_hit is None or q.ext_hit < min_offset):
                self._ext(q, min_offset, out)
        while self.index_first < len(self.index_names) - 1:  # never the last index file
            p = os.path.join(self.index_dir, self.index_names[self.index_first])
            end = _read_long(p, 24)  # IndexHeader.endPhyOffset
            if end is None or end >= min_offset:
                break
            out.append(_derived("index", p, f"endPhyOffset < {min_offset}"))
            self.index_first += 1
        return out

    def _queue(self, q: _Queue, min_offset: int, out: list) -> bool:
        """deleteExpiredFileByOffset: oldest first, never the last file, while the long at ``fileSize - 20`` (the
        file's last unit's commitlog offset) is below ``min``."""
        moved = False
        while q.first < len(q.names) - 1:
            if q.last_phy is None:
                p = os.path.join(q.dir, q.names[q.first])
                q.last_phy = _read_long(p, self.cq_size - CQ_UNIT_SIZE) if os.path.getsize(p) >= self.cq_size else None
                if q.last_phy is None:
                    q.last_phy = 1 << 63  # not readable at fileSize - 20: the broker stops there too
            if q.last_phy >= min_offset:
                break
            out.append(_derived("consumequeue", os.path.join(q.dir, q.names[q.first]),
                                f"last unit's commitlog offset < {min_offset}", q.topic, q.queue_id))
            q.first += 1
            q.last_phy = None
            moved = True
        return moved

    def _ext(self, q: _Queue, min_offset: int, out: list) -> None:
        """correctMinOffset then ConsumeQueueExt.truncateByMinAddress: ext files ending before the ext address of
        the first unit at or past ``min`` in the queue's first file."""
        if q.first >= len(q.names):
            return
        hit = _first_unit_at_or_after(os.path.join(q.dir, q.names[q.first]), self.cq_size, min_offset)
        q.ext_hit = hit[1] if hit else 1 << 63  # the same unit is found until the min offset passes it
        if hit is None or not is_ext_addr(hit[2]):
            return
        real = undecorate(hit[2])
        if q.ext_names is None:
            q.ext_names = _numbered(q.ext_dir, 20)
        while q.ext_first < len(q.ext_names) and int(q.ext_names[q.ext_first]) + self.ext_size < real:
            out.append(_derived("consumequeue_ext", os.path.join(q.ext_dir, q.ext_names[q.ext_first]),
                                "ends before the ext unit of the queue's first unit kept", q.topic, q.queue_id))
            q.ext_first += 1


def _first_unit_at_or_after(path: str, file_size: int, min_offset: int) -> tuple[int, int, int] | None:
    """correctMinOffset's search in the first file: (position, phyOffset, tagsCode) of the first unit with
    phy >= min (4.9.3 scans, 5.3.3 searches; the same unit: a queue's units follow the commitlog)."""
    import mmap

    import numpy as np

    from ..derived.consumequeue import CQ_DTYPE

    size = min(os.path.getsize(path), file_size)
    size -= size % CQ_UNIT_SIZE
    if size <= 0:
        return None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
        units = np.frombuffer(m, dtype=CQ_DTYPE)
        hit = np.flatnonzero(units["phyOffset"] >= min_offset)
        result = None
        if len(hit):
            i = int(hit[0])
            result = (i * CQ_UNIT_SIZE, int(units["phyOffset"][i]), int(units["tagsCode"][i]))
        del units, hit
    return result


def derived_behind(store, min_offset: int) -> list[DerivedFile]:
    """The derived files CleanConsumeQueueService removes once the commitlog starts at ``min_offset``."""
    return DerivedCleaner(store).behind(min_offset)
