"""Verify phase 2 building blocks: the merged record columns, reference classification and
finding aggregation shared by the consume-queue and index cross-checks."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from formats.hashing import index_key, index_key_hash
from formats.message import decode_utf8
from formats.properties import parse_properties
from formats.records import CQ_UNIT_SIZE
from formats.tags import TagsCodeError, tags_code

from .findings import Finding

if TYPE_CHECKING:
    from .commitlog import CommitLog
    from .verify_commitlog import SegmentReport

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITY_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}

_COLS = ("phy", "size", "queueId", "queueOffset", "sysFlag", "storeTimestamp", "topic", "propsPos", "propsLen")


class _Agg:
    """Group repeated findings of one code in one file set: the first location plus a count."""

    def __init__(self):
        self.first: dict[tuple, Finding] = {}
        self.count: dict[tuple, int] = {}

    def add(self, group, code, sev, path, offset, msg, **extra) -> None:
        key = (group, code)
        if key not in self.first:
            self.first[key] = Finding(code, sev, path, offset, msg, extra)
            self.count[key] = 0
        self.count[key] += 1

    def findings(self) -> list[Finding]:
        out = []
        for key, f in self.first.items():
            n = self.count[key]
            if n > 1:
                f.message += f" (and {n - 1} more like it)"
            f.extra["count"] = n
            out.append(f)
        return out


class _Records:
    """All valid commitlog records as columns, with lazy per-record dispatch info."""

    def __init__(self, store, reports: list[SegmentReport]):
        self.store = store
        topics: dict[str, int] = {}
        cols = {c: [] for c in _COLS}
        seg_idx = []
        for r in reports:
            remap = np.asarray([topics.setdefault(t, len(topics)) for t in r.topics] or [0], dtype=np.int32)
            for c in _COLS:
                col = r.cols[c]
                cols[c].append(remap[col] if c == "topic" and len(col) else col)
            seg_idx.append(np.full(r.records, r.index, dtype=np.int32))
        self.topic_ids = topics
        self.topics = list(topics)
        cat = lambda p: np.concatenate(p).astype(np.int64) if p else np.zeros(0, np.int64)  # noqa: E731
        self.c = {c: cat(cols[c]) for c in _COLS}
        self.seg = cat(seg_idx)
        self.phy = self.c["phy"]
        if len(self.phy) > 1 and not np.all(np.diff(self.phy) > 0):
            order = np.argsort(self.phy, kind="stable")
            self.c = {k: v[order] for k, v in self.c.items()}
            self.seg = self.seg[order]
            self.phy = self.c["phy"]
        self.invalid = np.asarray(sorted(o for r in reports for o in r.invalid), dtype=np.int64)
        self._props: dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self.phy)

    def lookup(self, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.searchsorted(self.phy, phys)
        clipped = np.minimum(idx, max(len(self.phy) - 1, 0))
        found = (idx < len(self.phy)) & (self.phy[clipped] == phys) if len(self.phy) else np.zeros(len(phys), bool)
        return clipped, found

    def props(self, i: int) -> dict:
        p = self._props.get(i)
        if p is None:
            n = int(self.c["propsLen"][i])
            if n > 0:
                buf = self.store.commitlog.segments.segments[int(self.seg[i])].buffer()
                s = int(self.c["propsPos"][i])
                p = parse_properties(decode_utf8(bytes(buf[s:s + n])))
            else:
                p = {}
            self._props[i] = p
        return p

    def topic(self, i: int) -> str:
        return self.topics[int(self.c["topic"][i])]

    def tags_code(self, i: int) -> int | None:
        try:
            return tags_code(self.topic(i), self.props(i), int(self.c["storeTimestamp"][i]), self.store.config.delay_table)
        except TagsCodeError:
            return None

    def key_hashes(self, i: int) -> set[int]:
        p = self.props(i)
        topic = self.topic(i)
        keys = ([p["UNIQ_KEY"]] if p.get("UNIQ_KEY") else []) + [k for k in p.get("KEYS", "").split(" ") if k]
        return {index_key_hash(index_key(topic, k)) for k in keys}

    def location(self, i: int) -> tuple[str, int]:
        seg = self.store.commitlog.segments.segments[int(self.seg[i])]
        return seg.path, int(self.phy[i]) - seg.start


class _RefClassifier:
    """Sort offsets that consume queues / index entries point at into found / explained / lost / missing."""

    FOUND, SKIP, LOST, MISSING = 0, 1, 2, 3

    def __init__(self, recs: _Records, reports: list[SegmentReport], commitlog: CommitLog, data_end: int):
        self.recs = recs
        self.data_end = data_end
        segs = commitlog.segments.segments
        self.starts = np.asarray([s.start for s in segs], dtype=np.int64)
        self.ends = np.asarray([s.start + min(s.size, commitlog.segments.file_size) for s in segs], dtype=np.int64)
        self.explained = [(r.unread_from, r.start + commitlog.segments.file_size) for r in reports
                          if r.unread_from is not None and r.unread_reported]
        self.lost_refs = 0

    def classify(self, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
        # References are in offset order: a reference past the end followed by one that is found is a corrupt
        # reference, not a lost tail (only the trailing run can be the tail).
        found_at = np.flatnonzero(status == self.FOUND)
        if len(found_at):
            status[np.flatnonzero(status[: found_at[-1]] == self.LOST)] = self.MISSING
        self.lost_refs += int((status == self.LOST).sum())
        return idx, status


def _cq_loc(cq, queue_offset: int) -> tuple[str, int]:
    pos = queue_offset * CQ_UNIT_SIZE
    start = pos - pos % cq.file_size
    return os.path.join(cq.directory, "%020d" % start), pos % cq.file_size
