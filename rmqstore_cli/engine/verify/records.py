"""Verify phase 2 building blocks: the merged record columns, reference classification and
finding aggregation shared by the consume-queue and index cross-checks."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.message import decode_utf8
from rmqstore_cli.formats.properties import parse_properties
from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from ..findings import ERROR, INFO, SEVERITY_ORDER, WARNING, Finding  # noqa: F401 (verify's modules take them from here)

if TYPE_CHECKING:
    from ..log.commitlog import CommitLog

_COL_TYPES = {"phy": np.int64, "size": np.int32, "queueId": np.int32, "queueOffset": np.int64, "sysFlag": np.int32,
              "storeTimestamp": np.int64, "topic": np.int32, "tagsCode": np.int64, "tagsBad": np.bool_, "keyCount": np.int16}
_COLS = tuple(_COL_TYPES)


class _Agg:
    """Group repeated findings of one code in one file set: the first location plus a count."""

    def __init__(self):
        self.first: dict[tuple, Finding] = {}
        self.count: dict[tuple, int] = {}
        self.rank: dict[tuple, object] = {}

    def add(self, group, code, sev, path, offset, msg, *, rank=None, **extra) -> None:
        """Without ``rank`` the first finding added is kept; with one, the lowest ``rank`` is (so a
        check that reads its input in blocks or windows reports the same first location)."""
        key = (group, code)
        if key not in self.first:
            self.first[key] = Finding(code, sev, path, offset, msg, extra)
            self.count[key] = 0
            self.rank[key] = rank
        elif rank is not None and self.rank[key] is not None and rank < self.rank[key]:
            self.first[key] = Finding(code, sev, path, offset, msg, extra)
            self.rank[key] = rank
        self.count[key] += 1

    def __bool__(self) -> bool:
        return bool(self.first)

    def merge(self, later: "_Agg") -> None:
        """Fold in what ``later`` gathered from input that comes after this one's (a ``-j`` worker's
        windows): the same first locations and counts as if every finding had been added here."""
        for key, f in later.first.items():
            if key not in self.first:
                self.first[key], self.count[key], self.rank[key] = f, later.count[key], later.rank[key]
                continue
            rank, mine = later.rank[key], self.rank[key]
            if rank is not None and mine is not None and rank < mine:
                self.first[key], self.rank[key] = f, rank
            self.count[key] += later.count[key]

    def findings(self) -> list[Finding]:
        out = []
        for key, f in self.first.items():
            n = self.count[key]
            if n > 1:
                f.message += f" (and {n - 1} more like it)"
            f.extra["count"] = n
            out.append(f)
        return out


_CONSUMED = np.zeros(0, np.int64)
_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
_mapped_allocations = False


def map_large_allocations() -> None:
    """Make glibc serve every allocation of 256 KiB or more from its own mapping, so freeing a column
    returns its memory to the system at once. By default glibc raises that threshold each time such a
    block is freed (up to 32 MiB); the per-segment report columns (a few MB each) then land on the
    heap, and once merged and freed they stay resident as holes: +45 % anonymous memory on a store of
    100 B messages. Process-wide and idempotent; a no-op where libc has no mallopt. Only the whole-log
    formulation needs it (call it before the reports are made); verify in windows frees and reuses
    same-sized blocks and does not."""
    global _mapped_allocations
    if _mapped_allocations:
        return
    _mapped_allocations = True
    _mallopt((_M_MMAP_THRESHOLD, 256 << 10))


_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters
_M_TOP_PAD = -2
HEAP_KEPT = 64 << 20  # freed heap memory glibc keeps (a bound: RssAnon stays flat whatever the store)
HEAP_PAD = 8 << 20  # extra heap asked for each time it grows
WINDOW_COLUMNS_ON_HEAP = 32 << 20  # blocks below this come from the heap (glibc's largest mmap threshold)
_heap_kept = False


def keep_freed_heap() -> None:
    """Make glibc keep up to :data:`HEAP_KEPT` of freed heap memory instead of handing it back at once. Each walk
    chunk allocates ~24 columns of 64 KiB and frees most of them after the chunk; by default glibc returns the
    top of the heap to the system as soon as 128 KiB are free there, so every chunk faulted its columns in again
    and the kernel zeroed them: ~4.5 ms per 64 MiB of 100 B records, a third of the walk kernel's own time
    (measured 16.8 -> 12.2 ms per segment). The window columns (a few MB each, joined from the chunks once per
    window) come from the heap too (mmap threshold :data:`WINDOW_COLUMNS_ON_HEAP`): mapped on their own, each
    window's columns were faulted in and zeroed afresh, ~0.1 s per GiB of 100 B records, 4x the copy itself;
    on the heap the next window reuses the blocks the last one freed (same sizes). A bounded constant (the
    memory rows stay flat); process-wide and idempotent; a no-op where libc has no mallopt. Not after
    :func:`map_large_allocations` (the whole-log formulation's columns must stay mapped)."""
    global _heap_kept
    if _heap_kept:
        return
    _heap_kept = True
    _mallopt((_M_TRIM_THRESHOLD, HEAP_KEPT), (_M_TOP_PAD, HEAP_PAD))
    if not _mapped_allocations:
        _mallopt((_M_MMAP_THRESHOLD, WINDOW_COLUMNS_ON_HEAP))


def _mallopt(*settings: tuple[int, int]) -> None:
    """glibc's mallopt(param, value) for each setting; nothing where libc has no mallopt."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)  # the process's own symbols, libc's among them (importing ctypes.util took 15-19 ms)
        for param, value in settings:
            libc.mallopt(param, value)
    except (OSError, AttributeError, TypeError):
        pass


class _Records:
    """All valid commitlog records as columns, with each record's dispatch info (tagsCode, key hashes)."""

    def __init__(self, store, reports: list):
        self.store = store
        topics: dict[str, int] = {}
        remaps = [np.asarray([topics.setdefault(t, len(topics)) for t in r.topics] or [0], dtype=np.int32) for r in reports]
        self.topic_ids = topics
        self.topics = list(topics)
        # Each column is allocated once and filled report by report, each report's copy dropped once
        # copied (the reports are consumed): no column exists twice, so merging needs no memory beyond
        # what the reports held.
        lens = [len(r.cols["phy"]) for r in reports]
        n = sum(lens)
        self.c = {}
        # one report (a window, in process) whose topics keep their numbers: its columns are taken as they are
        alone = len(reports) == 1 and np.array_equal(remaps[0][:len(reports[0].topics)], np.arange(len(reports[0].topics)))
        for c in _COLS:
            if alone:
                self.c[c] = np.ascontiguousarray(reports[0].cols[c], dtype=_COL_TYPES[c])
                reports[0].cols[c] = _CONSUMED
                continue
            col = self.c[c] = np.empty(n, dtype=_COL_TYPES[c])
            at = 0
            for r, remap in zip(reports, remaps):
                part = r.cols[c]
                col[at:at + len(part)] = remap[part] if c == "topic" and len(part) else part
                at += len(part)
                r.cols[c] = _CONSUMED
        self.seg = np.empty(n, dtype=np.int32)
        at = 0
        for r, m in zip(reports, lens):
            self.seg[at:at + m] = r.segment if r.segment >= 0 else r.index
            at += m
        n_keys = sum(len(r.key_hashes) for r in reports if r.key_hashes is not None)
        if alone and reports[0].key_hashes is not None:
            self.keys = np.ascontiguousarray(reports[0].key_hashes, dtype=np.int32)
        else:
            self.keys = np.empty(n_keys, dtype=np.int32)
            at = 0
            for r in reports:
                if r.key_hashes is not None:
                    self.keys[at:at + len(r.key_hashes)] = r.key_hashes
                    at += len(r.key_hashes)
        for r in reports:
            r.key_hashes = None
        # where each record's key hashes start in self.keys (int32 while they fit)
        self.key_start = np.zeros(n, dtype=np.int32 if n_keys < 2**31 else np.int64)
        if n > 1:
            np.cumsum(self.c["keyCount"][:-1], dtype=self.key_start.dtype, out=self.key_start[1:])
        self.phy = self.c["phy"]
        if len(self.phy) > 1 and not np.all(self.phy[1:] > self.phy[:-1]):
            order = np.argsort(self.phy, kind="stable")
            self.c = {k: v[order] for k, v in self.c.items()}
            self.seg = self.seg[order]
            self.key_start = self.key_start[order]
            self.phy = self.c["phy"]
        self.invalid = np.asarray(sorted(o for r in reports for o in r.invalid), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.phy)

    def lookup(self, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.searchsorted(self.phy, phys)
        clipped = np.minimum(idx, max(len(self.phy) - 1, 0))
        found = (idx < len(self.phy)) & (self.phy[clipped] == phys) if len(self.phy) else np.zeros(len(phys), bool)
        return clipped, found

    def props(self, i: int) -> dict:
        """The record's properties, decoded again (only for the rare records a check needs them for)."""
        seg = self.store.commitlog.segments.segments[int(self.seg[i])]
        buf = seg.buffer()
        h = fast.decode_headers(buf, np.asarray([int(self.phy[i]) - seg.start], np.int64))
        s, n = int(h.propsStart[0]), int(h.propsLength[0])
        return parse_properties(decode_utf8(bytes(buf[s:s + n]))) if n > 0 else {}

    def topic(self, i: int) -> str:
        return self.topics[int(self.c["topic"][i])]

    def tags_code(self, i: int) -> int | None:
        """tagsCode dispatch would compute; None when the DELAY property is not a number."""
        return None if self.c["tagsBad"][i] else int(self.c["tagsCode"][i])

    def key_hashes(self, i: int) -> set[int]:
        s = int(self.key_start[i])
        return set(self.keys[s:s + int(self.c["keyCount"][i])].tolist())

    def has_key_hash(self, ri: np.ndarray, kh: np.ndarray) -> np.ndarray:
        """For each (record, key hash) pair: does the record have an index key of that hash."""
        out = np.zeros(len(ri), dtype=bool)
        if not len(ri):
            return out
        start, count = self.key_start[ri], self.c["keyCount"][ri].astype(np.int64)
        for j in range(int(count.max()) if len(count) else 0):
            m = count > j
            out[m] |= self.keys[start[m] + j].astype(np.int64) == kh[m]
        return out

    def location(self, i: int) -> tuple[str, int]:
        seg = self.store.commitlog.segments.segments[int(self.seg[i])]
        return seg.path, int(self.phy[i]) - seg.start


class _RefClassifier:
    """Sort offsets that consume queues / index entries point at into found / explained / lost / missing."""

    FOUND, SKIP, LOST, MISSING = 0, 1, 2, 3

    def __init__(self, recs: _Records, reports: list, commitlog: CommitLog, data_end: int):
        self.recs = recs
        self.data_end = data_end
        segs = commitlog.segments.segments
        self.starts = np.asarray([s.start for s in segs], dtype=np.int64)
        self.ends = np.asarray([s.start + min(s.size, commitlog.segments.file_size) for s in segs], dtype=np.int64)
        self.explained = [(r.unread_from, r.start + commitlog.segments.file_size) for r in reports
                          if r.unread_from is not None and r.unread_reported]
        self.lost_refs = 0

    def classify(self, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(record index, status) of each offset, ``phys`` being all references of one queue or file in order."""
        idx, status = self.classify_raw(phys)
        # References are in offset order: a reference past the end followed by one that is found is a corrupt
        # reference, not a lost tail (only the trailing run can be the tail).
        found_at = np.flatnonzero(status == self.FOUND)
        if len(found_at):
            status[np.flatnonzero(status[: found_at[-1]] == self.LOST)] = self.MISSING
        self.lost_refs += int((status == self.LOST).sum())
        return idx, status

    def classify_raw(self, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`classify` of a block of references, before the trailing-run rule and without counting
        lost ones: a caller reading a file in blocks applies those across its blocks."""
        idx, found = self.recs.lookup(phys)
        status = np.full(len(phys), self.MISSING, dtype=np.int8)
        status[found] = self.FOUND
        rest = ~found
        if len(self.recs.invalid):
            status[rest & np.isin(phys, self.recs.invalid)] = self.SKIP
        for a, b in self.explained:
            status[rest & (phys >= a) & (phys < b)] = self.SKIP
        k = np.searchsorted(self.starts, phys, side="right") - 1
        in_seg = (k >= 0) & (phys < self.ends[np.maximum(k, 0)]) if len(self.starts) else np.zeros(len(phys), bool)
        beyond = phys >= self.data_end
        status[rest & (status == self.MISSING) & beyond] = self.LOST
        status[rest & (status == self.MISSING) & ~in_seg] = self.SKIP  # a missing/short file: SEG_* explains it
        status[rest & (phys < 0)] = self.MISSING  # no file or lost tail explains a negative offset
        return idx, status


def _cq_loc(cq, queue_offset: int) -> tuple[str, int | None]:
    if hasattr(cq, "location"):  # a RocksDB consume queue: its units are keys of one database, not file positions
        return cq.location(queue_offset)
    pos = queue_offset * CQ_UNIT_SIZE
    start = pos - pos % cq.file_size
    return os.path.join(cq.directory, "%020d" % start), pos % cq.file_size
