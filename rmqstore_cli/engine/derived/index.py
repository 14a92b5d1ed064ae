"""Index files, read side and query (the broker's IndexFile / IndexService, §10)."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from rmqstore_cli.formats.hashing import index_key, index_key_hash
from rmqstore_cli.formats.records import (INDEX_ENTRY_FIELDS, INDEX_ENTRY_SIZE, INDEX_HEADER_FIELDS, INDEX_HEADER_SIZE,
                                          INDEX_SLOT_SIZE, fields_dtype, struct_format)

from ..config.storeconfig import StoreConfig
from ..findings import Finding
from ..log.mappedfile import drop_pages
from ..log.segments import data_extents
from ..log.segments import MapBudget, Segment

HEADER_STRUCT = struct.Struct(struct_format(INDEX_HEADER_FIELDS))
ENTRY_STRUCT = struct.Struct(struct_format(INDEX_ENTRY_FIELDS))
ENTRY_DTYPE = fields_dtype(INDEX_ENTRY_FIELDS)
assert HEADER_STRUCT.size == INDEX_HEADER_SIZE and ENTRY_STRUCT.size == INDEX_ENTRY_SIZE
MAX_MSGS_NUM_BATCH = 64


@dataclass
class IndexHeader:
    """An index file's 40-byte header (the broker's IndexHeader)."""

    beginTimestamp: int
    endTimestamp: int
    beginPhyOffset: int
    endPhyOffset: int
    hashSlotCount: int
    indexCount: int

    def as_json(self) -> dict:
        return dict(self.__dict__)


class IndexFile:
    """One ``index/<yyyyMMddHHmmssSSS>`` file."""

    def __init__(self, path: str, slots: int, entries: int, budget: MapBudget | None = None):
        self.path = path
        self.name = os.path.basename(path)
        self.slots = slots
        self.entries = entries
        self.size = os.path.getsize(path)
        self.segment = Segment(path, self.name, 0, self.size, budget=budget)
        self.expected_size = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE + entries * INDEX_ENTRY_SIZE

    @property
    def complete(self) -> bool:
        return self.size == self.expected_size

    def header(self) -> IndexHeader:
        buf = self.segment.buffer()
        if self.size < INDEX_HEADER_SIZE:
            return IndexHeader(0, 0, 0, 0, 0, 0)
        return IndexHeader(*HEADER_STRUCT.unpack_from(buf, 0))

    def slot_table(self) -> np.ndarray:
        n = max(0, min(self.slots, (self.size - INDEX_HEADER_SIZE) // INDEX_SLOT_SIZE))
        return np.frombuffer(self.segment.buffer(), dtype=">i4", count=n, offset=INDEX_HEADER_SIZE) if n else np.zeros(0, ">i4")

    def entry_table(self, count: int | None = None) -> np.ndarray:
        """Entries 0 .. count-1 (entry 0 is never used)."""
        base = INDEX_HEADER_SIZE + self.slots * INDEX_SLOT_SIZE
        avail = max(0, (self.size - base) // INDEX_ENTRY_SIZE)
        n = avail if count is None else max(0, min(count, avail))
        if n == 0:
            return np.zeros(0, dtype=ENTRY_DTYPE)
        return np.frombuffer(self.segment.buffer(), dtype=ENTRY_DTYPE, count=n, offset=base)

    def entry(self, n: int) -> tuple[int, int, int, int]:
        pos = INDEX_HEADER_SIZE + self.slots * INDEX_SLOT_SIZE + n * INDEX_ENTRY_SIZE
        if pos + INDEX_ENTRY_SIZE > self.size:
            raise IndexError(n)
        return ENTRY_STRUCT.unpack_from(self.segment.buffer(), pos)

    def select(self, key_hash: int, max_num: int, begin: int, end: int, out: list[int]) -> None:
        """selectPhyOffset (§10.5): walk the slot chain newest first, appending to ``out``."""
        if not self.complete:
            return
        h = self.header()
        index_count = h.indexCount if h.indexCount > 0 else 1
        slot = key_hash % self.slots
        buf = self.segment.buffer()
        (v,) = struct.unpack_from(">i", buf, INDEX_HEADER_SIZE + slot * INDEX_SLOT_SIZE)
        if v <= 0 or v > index_count or index_count <= 1:
            return
        base = INDEX_HEADER_SIZE + self.slots * INDEX_SLOT_SIZE
        n = v
        unpack = ENTRY_STRUCT.unpack_from
        while len(out) < max_num:
            if n >= self.entries:
                return
            hsh, phy, diff, prev = unpack(buf, base + n * INDEX_ENTRY_SIZE)
            if diff < 0:
                return
            t = h.beginTimestamp + diff * 1000
            if hsh == key_hash and begin <= t <= end:
                out.append(phy)
            if prev <= 0 or prev > index_count or prev == n or t < begin:
                return
            n = prev

    def close(self) -> None:
        self.segment.close()


class IndexService:
    """All index files of a store, in name order (= creation order)."""

    def __init__(self, root: str, config: StoreConfig):
        self.directory = os.path.join(root, "index")
        self.config = config
        self.files: list[IndexFile] = []
        self.budget = MapBudget()  # index files mapped at once (a 4 TB store has ~1,400 of 400 MB)
        self.problems: list[Finding] = []
        if not os.path.isdir(self.directory):
            return
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if os.path.islink(path) or not os.path.isfile(path):
                self.problems.append(Finding("IDX_STRAY", "warning", path, None, f"unexpected entry {name} in index/"))
                continue
            if not (name.isdigit() and len(name) == 17):
                self.problems.append(Finding("IDX_BAD_NAME", "warning", path, None,
                                             f"index file name {name!r} is not a 17-digit timestamp"))
                continue
            f = IndexFile(path, config.maxHashSlotNum, config.maxIndexNum, self.budget)
            if not f.complete:
                self.problems.append(Finding("IDX_WRONG_SIZE", "error", path, 0,
                                             f"index file {name} is {f.size} bytes, expected {f.expected_size}"))
            self.files.append(f)

    def query(self, topic: str, key: str, max_num: int, begin: int, end: int, cap: bool = True) -> list[int]:
        """IndexService.queryOffset (§10.6): newest file first, broker's stop rules."""
        if cap:
            max_num = min(max_num, MAX_MSGS_NUM_BATCH)
        key_hash = index_key_hash(index_key(topic, key))
        out: list[int] = []
        for f in reversed(self.files):
            if not f.complete:
                continue
            h = f.header()
            last = f is self.files[-1]
            if _overlaps(begin, end, h.beginTimestamp, h.endTimestamp):
                f.select(key_hash, max_num, begin, end, out)
            if h.beginTimestamp < begin or len(out) >= max_num:
                break
            del last
        return out

    def close(self) -> None:
        for f in self.files:
            f.close()


def _overlaps(begin: int, end: int, file_begin: int, file_end: int) -> bool:
    """The broker's isTimeMatched test."""
    return (begin < file_begin and end > file_end) or (file_begin <= begin <= file_end) or (file_begin <= end <= file_end)


_LIVE_BLOCK = 1 << 20  # entries read at a time


def last_live_entry(f, first: int) -> int | None:
    """Number of the last entry at or after ``first`` with a non-zero keyHash, phyOffset or prevIndex (None
    if none): entries the broker wrote past indexCount. Only the parts of the file that hold data are read
    (most of a default 400 MB file is a hole until it fills), in blocks whose pages are dropped after."""
    table = f.entry_table()
    buf = f.segment.buffer()
    base = INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE
    found = None
    for lo, hi in data_extents(f.path, base + first * INDEX_ENTRY_SIZE, base + len(table) * INDEX_ENTRY_SIZE):
        start = max(first, (lo - base) // INDEX_ENTRY_SIZE)
        stop = min(len(table), -(-(hi - base) // INDEX_ENTRY_SIZE))
        for a in range(start, stop, _LIVE_BLOCK):
            blk = table[a:min(a + _LIVE_BLOCK, stop)]
            live = np.flatnonzero((blk["keyHash"] != 0) | (blk["phyOffset"] != 0) | (blk["prevIndex"] != 0))
            if len(live):
                found = a + int(live[-1])
            drop_pages(buf, base + a * INDEX_ENTRY_SIZE, len(blk) * INDEX_ENTRY_SIZE)
    return found
