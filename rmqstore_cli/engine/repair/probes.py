"""Reads of store files that recovery planning makes besides the record walk: bytes after a position,
consume-queue units of a file, an index put torn before its header update, a segment seen from inside."""

from __future__ import annotations

import os

import numpy as np

from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from ..derived.index import last_live_entry
from ..log.segments import data_extents


def index_torn(f) -> bool:
    """Entries or slots written past the header's indexCount: an index put killed before its header update."""
    count = max(f.header().indexCount, 1)
    if count >= f.entries:
        return False
    return last_live_entry(f, count) is not None or bool((f.slot_table() >= count).any())  # compared as read: no 8-byte copy of the table


def nonzero_after(path: str, pos: int) -> bool:
    """Any non-zero byte from ``pos`` to the end of the file. Holes and reserved blocks never written are skipped
    without reading them (:func:`..log.segments.data_extents`: a queue or commitlog file the broker pre-allocates
    is sparse past its data, and so is a copy made with ``cp --sparse``; one this tool wrote is reserved with
    ``posix_fallocate``, which SEEK_DATA reports as data: 6 MB read per queue file); the data parts are read in
    blocks compared with zeros."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        for lo, hi in data_extents(path, pos, os.fstat(fd).st_size):
            p = lo
            while p < hi:
                b = os.pread(fd, min(len(_ZEROS), hi - p), p)
                if not b:
                    return False
                if b != (_ZEROS if len(b) == len(_ZEROS) else bytes(len(b))):
                    return True
                p += len(b)
        return False
    except OSError:
        return False
    finally:
        os.close(fd)


_ZEROS = bytes(1 << 20)


def file_has_data(path: str) -> bool:
    return nonzero_after(path, 0)


class SegmentFrom:
    """A segment seen from a position inside it (for walking after a resync point)."""

    def __init__(self, seg, pos: int):
        self._seg, self.pos = seg, pos
        self.start = seg.start + pos
        self.size = seg.size - pos
        self.name = seg.name
        self.path = seg.path

    def buffer(self):
        return memoryview(self._seg.buffer())[self.pos:]


def queue_file_units(seg, file_size: int) -> np.ndarray:
    from ..derived.consumequeue import CQ_DTYPE

    n = min(seg.size, file_size) // CQ_UNIT_SIZE
    if n <= 0:
        return np.zeros(0, dtype=CQ_DTYPE)
    return np.frombuffer(seg.buffer(), dtype=CQ_DTYPE, count=n)


UNIT_BLOCK = 1 << 16  # consume-queue units tested at a time by first_unit at most (1.3 MB of a file)
FIRST_BLOCK = 256  # ... and in its first block, doubled from block to block


def first_unit(units: np.ndarray, test) -> int:
    """Index of the first unit for which ``test(block)`` (a boolean array per block of units) holds, or
    ``len(units)``: block by block, so a file whose answer comes early is not read to its end (past the data
    the broker wrote, a queue file is a hole every page of which a whole-file test would map). The blocks grow
    from FIRST_BLOCK units: a broker with thousands of queues has as many queue files whose answer (where the
    units end) comes in their first few KB."""
    a, block = 0, FIRST_BLOCK
    while a < len(units):
        hit = np.flatnonzero(test(units[a:a + block]))
        if len(hit):
            return a + int(hit[0])
        a += block
        block = min(block * 2, UNIT_BLOCK)
    return len(units)


def invalid_unit(units: np.ndarray) -> np.ndarray:
    """The broker's consume-queue validity test failed (§13.2: phyOffset >= 0 and size > 0)."""
    return (units["phyOffset"] < 0) | (units["size"] <= 0)
