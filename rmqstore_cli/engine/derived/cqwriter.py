"""Consume queue and ConsumeQueueExt writers (the broker's ConsumeQueue.putMessagePositionInfo
and ConsumeQueueExt.put, FORMAT.md §7.5, §8.3), with the state recovery rebuilds on open.

A writer opened on an existing queue resumes where the broker's recovery would (§13.2: valid
units up to the first invalid one; ext: §8.5), so the next unit lands exactly where the broker
would put it and ``next_offset`` is the broker's topicQueueTable value (§13.8).
"""

from __future__ import annotations

import os
import struct

import numpy as np

from rmqstore_cli.formats.extaddr import MAX_REAL_OFFSET, decorate
from rmqstore_cli.formats.records import CQ_FILLER, CQ_UNIT_SIZE, CQEXT_END_BLANK, CQEXT_MAX_UNIT_SIZE, CQEXT_MIN_UNIT_SIZE

from ..config.storeconfig import StoreConfig
from .consumequeue import CQ_DTYPE
from ..log.mappedfile import OPEN_WRITERS, SegmentQueueWriter

_UNIT = struct.Struct(">qiq")
_EXT_HEAD = struct.Struct(">hqqh")
_I16 = struct.Struct(">h")
assert _UNIT.size == CQ_UNIT_SIZE and _EXT_HEAD.size == CQEXT_MIN_UNIT_SIZE
FILLER_UNIT = _UNIT.pack(*CQ_FILLER)


class ConsumeQueueWriter:
    """Appends 20-byte units to ``consumequeue/<topic>/<queueId>``.

    State mirrors the broker's ConsumeQueue after recovery: ``write_offset`` (logical byte
    offset of the next unit = last file start + write position), ``max_physic_offset``
    (end of the last unit's message, -1 for a new queue) and the ``first_create`` flag of the
    file created when the queue had no file (which enables pre-blank filling, §7.3).
    """

    def __init__(self, root: str, topic: str, queue_id: int, config: StoreConfig, dirname: str = "consumequeue",
                 journal=None, strict_offsets: bool = False, recover: bool = True):
        self.topic = topic
        # strict_offsets (repairs): a unit is written only at its record's QUEUEOFFSET; the broker
        # appends at the current position whatever the offset says (§7.5) and so shifts a queue
        self.strict_offsets = strict_offsets
        self.refused = 0  # units not written because their offset is not the next position (strict)
        self.queue_id = queue_id
        self.file_size = config.mappedFileSizeConsumeQueue
        self.files = SegmentQueueWriter(os.path.join(root, dirname, topic, str(queue_id)), self.file_size, journal,
                                        OPEN_WRITERS)
        self.max_physic_offset = -1
        self.write_offset = 0
        self.has_files = False
        self.first_create_start: int | None = None  # start of the file created in an empty queue
        self.min_logic_offset = 0
        self.out_of_order = 0  # units appended at a position that differs from cqOffset*20 (logged by Java)
        if recover:  # not for a queue of a folder that was empty when the writing began (rebuild -j: see .cqdirect)
            self._recover()

    def _recover(self) -> None:
        starts = self.files.existing_starts()
        if not starts:
            return
        self.has_files = True
        fs = self.file_size
        self.min_logic_offset = starts[0]
        # Recovery scans from the third-last file; a full valid file hands over to the next.
        k = max(0, len(starts) - 3)
        write = starts[k]
        for start in starts[k:]:
            if start != write:
                break
            path = self.files.path_of(start)
            with open(path, "rb") as f:
                data = f.read(fs)
            n = len(data) // CQ_UNIT_SIZE
            arr = np.frombuffer(data, dtype=CQ_DTYPE, count=n)
            valid = (arr["phyOffset"] >= 0) & (arr["size"] > 0)
            bad = np.flatnonzero(~valid)
            m = int(bad[0]) if len(bad) else n
            if m:
                self.max_physic_offset = int(arr["phyOffset"][m - 1]) + int(arr["size"][m - 1])
            write = start + m * CQ_UNIT_SIZE
            if m < n or m * CQ_UNIT_SIZE < fs:
                break
        self.write_offset = write

    @property
    def next_offset(self) -> int:
        """The next queue offset to assign (topicQueueTable, §13.8)."""
        return self.write_offset // CQ_UNIT_SIZE

    def accepts(self, phy: int, size: int, cq_offset: int) -> bool:
        """Would ``put`` write a unit (i.e. not skip it as already present, §7.5)?"""
        if phy + size <= self.max_physic_offset:
            return False
        if cq_offset != 0 and self.has_files and cq_offset * CQ_UNIT_SIZE < self.write_offset:
            return False
        if self.strict_offsets and self.has_files and cq_offset * CQ_UNIT_SIZE != self.write_offset:
            return False
        return True

    def put(self, phy: int, size: int, tags_code: int, cq_offset: int) -> bool:
        """putMessagePositionInfo: returns False when the unit is skipped as already present."""
        if phy + size <= self.max_physic_offset:
            return False
        fs = self.file_size
        expected = cq_offset * CQ_UNIT_SIZE
        if not self.has_files:
            start = expected - expected % fs
            seg = self.files.open(start)
            self.has_files = True
            self.first_create_start = start
            self.write_offset = start
            self.min_logic_offset = start
        else:
            # A full last file leaves write_offset on the next boundary: the next consecutive
            # file is opened (created), even if ``expected`` lies further on.
            pos = self.write_offset
            seg = self.files.open(pos - pos % fs)
        in_file = self.write_offset - seg.start
        if seg.start == self.first_create_start and cq_offset != 0 and in_file == 0:
            until = expected % fs
            if until:
                seg.write(0, FILLER_UNIT * (until // CQ_UNIT_SIZE))
            self.write_offset = seg.start + until
            self.min_logic_offset = expected
            in_file = until
        if cq_offset != 0:
            if expected < self.write_offset:
                return False
            if expected != self.write_offset:
                if self.strict_offsets:
                    self.refused += 1
                    return False
                self.out_of_order += 1  # Java only logs this and appends at the current position
        elif self.strict_offsets and expected != self.write_offset:
            self.refused += 1
            return False
        seg.touch(in_file, CQ_UNIT_SIZE)
        _UNIT.pack_into(seg.mm, in_file, phy, size, tags_code)
        seg.dirty = True
        self.write_offset += CQ_UNIT_SIZE
        self.max_physic_offset = phy + size
        return True

    def put_many(self, phy: np.ndarray, size: np.ndarray, tags: np.ndarray, cq_offset: np.ndarray) -> int:
        """``put`` for each unit in order (int64 arrays); returns how many were written.

        Runs of units that ``put`` would all append consecutively (ends increasing past
        ``max_physic_offset``, no queue offset behind the write position, inside one file)
        are packed and written with one slice assignment; the first unit of an empty queue
        (pre-blank fill) and any unit breaking a run go through ``put`` itself."""
        n = len(phy)
        fs = self.file_size
        per_file = fs // CQ_UNIT_SIZE
        if fs % CQ_UNIT_SIZE:
            per_file = 0  # odd geometry: one unit at a time
        end = phy + size
        expected = cq_offset * CQ_UNIT_SIZE
        done = 0
        i = 0
        while i < n:
            # units whose record ends at or before max_physic_offset are already present: ``put`` skips
            # them without changing anything (a re-dispatch over an intact queue is all of these)
            if end[i] <= self.max_physic_offset:
                more = np.flatnonzero(end[i:] > self.max_physic_offset)
                i = n if not len(more) else i + int(more[0])
                continue
            w = self.write_offset
            if per_file == 0 or not self.has_files or w == self.first_create_start:
                done += self.put(int(phy[i]), int(size[i]), int(tags[i]), int(cq_offset[i]))
                i += 1
                continue
            in_file = w % fs
            k = min(n - i, per_file - in_file // CQ_UNIT_SIZE)
            e = end[i : i + k]
            prev = np.empty(k, dtype=np.int64)
            prev[0] = self.max_physic_offset
            prev[1:] = e[:-1]
            pos = w + CQ_UNIT_SIZE * np.arange(k, dtype=np.int64)
            exp = expected[i : i + k]
            nonzero = cq_offset[i : i + k] != 0
            ok = (e > prev) & ~(nonzero & (exp < pos))
            if self.strict_offsets:
                ok &= exp == pos
            run = k if ok.all() else int(np.argmin(ok))
            if run == 0:
                done += self.put(int(phy[i]), int(size[i]), int(tags[i]), int(cq_offset[i]))
                i += 1
                continue
            units = np.empty(run, dtype=CQ_DTYPE)
            units["phyOffset"] = phy[i : i + run]
            units["size"] = size[i : i + run]
            units["tagsCode"] = tags[i : i + run]
            seg = self.files.open(w - in_file)
            seg.write(in_file, units.tobytes())
            seg.dirty = True
            self.out_of_order += int(np.count_nonzero(nonzero[:run] & (exp[:run] != pos[:run])))
            self.write_offset = w + run * CQ_UNIT_SIZE
            self.max_physic_offset = int(e[run - 1])
            done += run
            i += run
        return done

    def append_straight(self, units: np.ndarray, first_offset: int, first_end: int, last_end: int) -> bool:
        """Copy packed ``units`` (CQ_DTYPE, records in log order, ends strictly increasing, queue offsets
        consecutive from ``first_offset`` / 20) when ``put`` would append every one of them at the write
        position of the current file; False (nothing written) when it would not, or they do not fit in it."""
        w = self.write_offset
        fs = self.file_size
        if (not self.has_files or first_offset != w or first_end <= self.max_physic_offset or fs % CQ_UNIT_SIZE
                or w == self.first_create_start):
            return False
        in_file = w % fs
        n = len(units) * CQ_UNIT_SIZE
        if in_file + n > fs:
            return False
        seg = self.files.open(w - in_file)
        seg.write(in_file, units.view(np.uint8))
        self.write_offset = w + n
        self.max_physic_offset = last_end
        return True

    def accept_written(self, first_offset: int, first_end: int, last_end: int, count: int, first_unit: tuple) -> bool:
        """``count`` units (a straight group: record ends strictly increasing, queue offsets consecutive from
        ``first_offset`` / 20) are already in the files at ``first_offset`` (rebuild -j, :mod:`.cqdirect`): True when
        ``put`` would have put every one of them exactly there, and the queue's state then moves past them as it
        would; False when it would not. ``first_unit`` (phy, size, tagsCode) goes through ``put`` itself when it is
        the first of a new queue (the file's creation and pre-blank fill)."""
        if self.file_size % CQ_UNIT_SIZE or first_offset < 0:
            return False
        if not self.has_files or self.write_offset == self.first_create_start:
            phy, size, tags = first_unit
            if not self.put(phy, size, tags, first_offset // CQ_UNIT_SIZE) or self.write_offset != first_offset + CQ_UNIT_SIZE:
                return False
            if count == 1:
                return True
            # the second unit: its end is past the first's (straight), the first's is now max_physic_offset
            first_offset, first_end, count = first_offset + CQ_UNIT_SIZE, self.max_physic_offset + 1, count - 1
        w = self.write_offset
        if first_offset != w or first_end <= self.max_physic_offset:
            return False
        self.write_offset = w + count * CQ_UNIT_SIZE
        self.max_physic_offset = last_end
        return True

    def flush(self) -> None:
        self.files.flush()

    def close(self, flush: bool = True) -> None:
        self.files.close(flush)


class ConsumeQueueExtWriter:
    """Appends CqExtUnits to ``consumequeue_ext/<topic>/<queueId>`` (§8.3); resumes like §8.5."""

    def __init__(self, root: str, topic: str, queue_id: int, config: StoreConfig, journal=None):
        self.file_size = config.mappedFileSizeConsumeQueueExt
        self.files = SegmentQueueWriter(os.path.join(root, "consumequeue_ext", topic, str(queue_id)), self.file_size,
                                        journal, OPEN_WRITERS)
        self.last_start: int | None = None
        self.position = 0  # write position inside the last file
        self._recover()

    def _recover(self) -> None:
        starts = self.files.existing_starts()
        if not starts:
            return
        fs = self.file_size
        cursor = 0
        for start in starts:
            with open(self.files.path_of(start), "rb") as f:
                data = f.read(fs)
            cursor = 0
            while cursor + 2 <= len(data):
                (size,) = _I16.unpack_from(data, cursor)
                if size <= 0:
                    break
                cursor += size
        self.last_start = starts[-1]
        self.position = min(cursor, fs)

    def put(self, tags_code: int, store_time: int, bitmap: bytes = b"") -> int:
        """Write one unit; returns its decorated address, or 1 (a positive number) on failure."""
        size = CQEXT_MIN_UNIT_SIZE + len(bitmap)
        if size > CQEXT_MAX_UNIT_SIZE:
            return 1
        fs = self.file_size
        for _ in range(3):
            if self.last_start is None:
                self.last_start, self.position = 0, 0
            elif self.position >= fs:
                self.last_start, self.position = self.last_start + fs, 0
            if self.last_start + self.position + size > MAX_REAL_OFFSET:
                return 1
            seg = self.files.open(self.last_start)
            free = fs - self.position - CQEXT_END_BLANK
            if size > free:
                seg.touch(self.position, 2)
                _I16.pack_into(seg.mm, self.position, -1)  # end marker; the file is full
                seg.dirty = True
                self.position = fs
                continue
            seg.touch(self.position, size)
            _EXT_HEAD.pack_into(seg.mm, self.position, size, tags_code, store_time, len(bitmap))
            if bitmap:
                seg.write(self.position + CQEXT_MIN_UNIT_SIZE, bitmap)
            seg.dirty = True
            addr = decorate(self.last_start + self.position)
            self.position += size
            return addr
        return 1

    def flush(self) -> None:
        self.files.flush()

    def close(self, flush: bool = True) -> None:
        self.files.close(flush)
