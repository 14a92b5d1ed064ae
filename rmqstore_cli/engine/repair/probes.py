"""Reads of store files that recovery planning makes besides the record walk: bytes after a position,
consume-queue units of a file, an index put torn before its header update, a segment seen from inside."""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from ..derived.index import last_live_entry


def index_torn(f) -> bool:
    """Entries or slots written past the header's indexCount: an index put killed before its header update."""
    count = max(f.header().indexCount, 1)
    if count >= f.entries:
        return False
    return last_live_entry(f, count) is not None or bool((f.slot_table().astype("int64") >= count).any())


def nonzero_after(path: str, pos: int) -> bool:
    """Any non-zero byte from ``pos`` to the end of the file (sparse-friendly chunked read)."""
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            while True:
                b = f.read(1 << 20)
                if not b:
                    return False
                if b.count(0) != len(b):
                    return True
    except OSError:
        return False


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
