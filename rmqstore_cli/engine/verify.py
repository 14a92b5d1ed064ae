"""Offline verification of a whole store: every check the broker makes, and the ones it skips.

Two phases, so the first can later run per segment in parallel (``-j``):

1. :func:`verify_segments` walks a range of commitlog segments independently (records never
   cross a segment, §2.6) and returns a :class:`SegmentReport` per segment: findings plus
   the header columns of every record it read.
2. :func:`verify_store` merges the reports in segment order and cross-checks the log with the
   consume queues, ext files, index files and checkpoint (Appendix B).

The engine never prints: it returns :class:`~rmqstore_cli.engine.findings.Finding` objects
and a summary dict. Finding codes are stable (README "Finding codes").
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from formats import fast
from formats.extaddr import is_ext_addr, undecorate
from formats.hashing import index_key, index_key_hash
from formats.message import decode_utf8
from formats.properties import parse_properties
from formats.records import (CQ_FILLER, CQ_UNIT_SIZE, INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE,
                             TRANSACTION_COMMIT, TRANSACTION_NOT, TRANSACTION_ROLLBACK)
from formats.tags import TagsCodeError, tags_code

from .commitlog import CommitLog, ScanResult
from .findings import Finding

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITY_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}

REASON_CODES = {
    fast.R_BODY_CRC: "CL_BODY_CRC",
    fast.R_TOPIC_LENGTH: "CL_TOPIC_LENGTH",
    fast.R_LENGTHS: "CL_LENGTHS",
    fast.R_TOTALSIZE: "CL_TOTALSIZE",
    fast.R_PROP_CRC: "CL_PROP_CRC",
    fast.R_MAGIC_VERSION: "CL_MAGIC_VERSION",
}
# Reasons after which TOTALSIZE can still be trusted to find the next record.
_CHAIN_INTACT = {fast.R_BODY_CRC, fast.R_PROP_CRC, fast.R_MAGIC_VERSION}
_SYSFLAG_KNOWN = {4: 0x3F, 5: 0x7FF}

_COLS = ("phy", "size", "queueId", "queueOffset", "sysFlag", "storeTimestamp", "topic", "propsPos", "propsLen")


@dataclass
class SegmentReport:
    """What one commitlog segment holds, read on its own."""

    index: int
    path: str
    start: int
    findings: list = field(default_factory=list)
    cols: dict = field(default_factory=dict)  # name -> numpy column over the segment's valid records
    topics: list = field(default_factory=list)  # topic strings; cols["topic"] holds indexes into it
    invalid: list = field(default_factory=list)  # absolute offsets of records that failed validation
    ended_with_blank: bool = False
    stop_offset: int = 0  # absolute offset where the walk stopped
    stop_kind: str = ""
    data_end: int = 0  # absolute end of the last byte that belongs to a record (valid or not)
    unread_from: int | None = None  # absolute offset from which the rest of the file was not read as records
    unread_reported: bool = False  # a finding already explains the unread rest
    all_zero: bool = False
    records: int = 0
    bytes: int = 0
    blanks: int = 0


def _single_segment_view(commitlog: CommitLog, seg) -> CommitLog:
    """The same CommitLog rules over one segment only, so scans stop at its end."""
    view = copy.copy(commitlog)
    view.segments = copy.copy(commitlog.segments)
    view.segments.segments = [seg]
    return view


def _first_nonzero(u8: np.ndarray, start: int, end: int) -> int | None:
    if start >= end:
        return None
    nz = np.flatnonzero(u8[start:end])
    return start + int(nz[0]) if len(nz) else None


def verify_segments(commitlog: CommitLog, indexes: Iterable[int], *, check_crc: bool = True,
                    progress: Callable[[int], None] | None = None) -> list[SegmentReport]:
    """Verify the given commitlog segments, each independently of the others."""
    return [_verify_segment(commitlog, i, check_crc, progress) for i in indexes]


def verify_segments_parallel(commitlog: CommitLog, jobs: int, *, check_crc: bool = True,
                             progress: Callable[[int], None] | None = None) -> list[SegmentReport]:
    """:func:`verify_segments` over every segment, one segment per task on ``jobs`` forked processes (``-j``)."""
    from .parallel import map_ranges, split

    segs = commitlog.segments.segments

    def done(r: range, _reports) -> None:
        if progress:
            progress(sum(segs[i].size for i in r))

    parts = map_ranges(_verify_range, split(len(segs), len(segs)), jobs, commitlog, check_crc, on_result=done)
    return [rep for part in parts for rep in part]


def _verify_range(r: range, commitlog: CommitLog, check_crc: bool) -> list[SegmentReport]:
    return verify_segments(commitlog, r, check_crc=check_crc)


def _verify_segment(commitlog: CommitLog, i: int, check_crc: bool, progress) -> SegmentReport:
    seg = commitlog.segments.segments[i]
    cfg = commitlog.config
    rep = SegmentReport(i, seg.path, seg.start)
    view = _single_segment_view(commitlog, seg)
    buf = seg.buffer()
    u8 = fast.as_u8(buf) if seg.size else np.zeros(0, np.uint8)
    limit = min(seg.size, commitlog.segments.file_size)
    wrong_size = seg.size != commitlog.segments.file_size
    parts = {c: [] for c in _COLS}
    interned: dict[bytes, int] = {}
    mv = memoryview(buf) if seg.size else memoryview(b"")
    known = _SYSFLAG_KNOWN.get(cfg.version, 0x7FF)
    max_size = cfg.maxMessageSize + (65536 if cfg.version >= 5 else 0)
    f = rep.findings

    def at(pos: int, code: str, sev: str, msg: str, **extra) -> None:
        f.append(Finding(code, sev, seg.path, pos, msg, {"phyOffset": seg.start + pos, **extra}))

    pos = 0
    while True:
        res = ScanResult()
        for chunk in view.scan(start_position=pos, check_crc=check_crc, result=res):
            h = chunk.headers
            phy = chunk.phy
            parts["phy"].append(phy)
            parts["size"].append(h.totalSize.astype(np.int64))
            parts["queueId"].append(h.queueId)
            parts["queueOffset"].append(h.queueOffset)
            parts["sysFlag"].append(h.sysFlag)
            parts["storeTimestamp"].append(h.storeTimestamp)
            parts["propsPos"].append(h.propsStart)
            parts["propsLen"].append(h.propsLength)
            tids = [interned.setdefault(bytes(mv[s:s + n]), len(interned))
                    for s, n in zip(h.topicStart.tolist(), h.topicLength.tolist())]
            parts["topic"].append(np.asarray(tids, dtype=np.int32))
            rep.data_end = int(phy[-1] + h.totalSize[-1])
            # Checks the broker does not make (§13.3 "Not checked by Java").
            for k in np.flatnonzero(h.physicalOffset != phy).tolist():
                at(int(h.offsets[k]), "CL_PHYOFFSET", ERROR,
                   f"PHYSICALOFFSET field says {int(h.physicalOffset[k])}, the record is at {int(phy[k])}")
            bad_flags = (h.sysFlag & ~known) != 0
            if cfg.version >= 5:
                bad_flags |= ((h.sysFlag & 0x700) >> 8) >= 4
            for k in np.flatnonzero(bad_flags).tolist():
                at(int(h.offsets[k]), "CL_SYSFLAG", WARNING, f"SYSFLAG 0x{int(h.sysFlag[k]) & 0xFFFFFFFF:X} has bits this broker version never sets")
            for k in np.flatnonzero((h.queueId < 0) | (h.queueOffset < 0)).tolist():
                at(int(h.offsets[k]), "CL_FIELD_RANGE", WARNING,
                   f"negative QUEUEID {int(h.queueId[k])} or QUEUEOFFSET {int(h.queueOffset[k])}")
            for k in np.flatnonzero(h.totalSize > max_size).tolist():
                at(int(h.offsets[k]), "CL_TOO_LARGE", WARNING, f"TOTALSIZE {int(h.totalSize[k])} exceeds what the broker accepts ({max_size})")
        stop = res.stop
        rep.blanks += 1 if stop.kind == fast.STOP_BLANK else 0
        p = stop.position
        if stop.kind == fast.STOP_BLANK:
            rep.ended_with_blank = True
            rep.data_end = seg.start + p + 8
            if stop.size != seg.size - p:
                at(p, "CL_BLANK_SIZE", ERROR, f"BLANK marker says {stop.size} bytes remain, the file has {seg.size - p}")
            break
        if stop.kind == fast.STOP_INVALID:
            code = REASON_CODES.get(stop.reason, "CL_INVALID")
            rep.invalid.append(seg.start + p)
            rec_end = p + max(stop.size, 8)
            tail_zero = rec_end <= limit and _first_nonzero(u8, min(rec_end, limit), limit) is None
            last_zero = 0 < stop.size and p + stop.size <= limit and not u8[p + stop.size - 8:p + stop.size].any()
            if tail_zero and last_zero:
                at(p, "CL_TORN_TAIL", ERROR, f"partially written record ({fast.REASON_TEXT[stop.reason]}) followed only by zeros: "
                   "a write torn by a crash; broker recovery truncates the log here", reason=fast.REASON_TEXT[stop.reason])
                rep.data_end = seg.start + p
                rep.unread_from, rep.unread_reported = seg.start + p, True
                break
            at(p, code, ERROR, f"{fast.REASON_TEXT[stop.reason]}; broker recovery would truncate the log here "
               "and delete every later file", reason=fast.REASON_TEXT[stop.reason])
            nxt = _resync(buf, u8, p, stop, limit, commitlog)
            if nxt is None:
                at(p, "CL_GARBAGE", ERROR, "cannot find the next record after this invalid one; the rest of the file is not readable as records")
                rep.data_end = seg.start + limit
                rep.unread_from, rep.unread_reported = seg.start + p, True
                break
            rep.data_end = seg.start + nxt
            pos = nxt
            continue
        # The walk ended without a BLANK: classify what follows (tail classification).
        rep.stop_offset, rep.stop_kind = seg.start + p, stop.kind
        rep.unread_from = seg.start + p
        if wrong_size and stop.kind in (fast.STOP_TORN, fast.STOP_EOF):
            rep.unread_reported = True  # SEG_WRONG_SIZE explains the cut
        elif stop.kind == fast.STOP_ZERO or (stop.kind == fast.STOP_EOF and p >= limit):
            nz = _first_nonzero(u8, p, limit)
            if nz is not None:
                at(nz, "CL_STALE_AFTER_END", WARNING, f"non-zero bytes after the end of data at {seg.start + p}: stale data a later "
                   "recovery could misread")
        elif stop.kind == fast.STOP_TORN:
            at(p, "CL_TORN_TAIL", ERROR,
               f"record header claims {stop.size} bytes, past the end of the file: a torn write; broker recovery truncates here")
            rep.unread_reported = True
        elif stop.kind == fast.STOP_EOF:
            at(p, "CL_NO_BLANK", WARNING, "the file ends without a BLANK marker")
        else:
            what = "bytes that are not a record" if stop.kind == fast.STOP_BAD_MAGIC else f"a record with TOTALSIZE {stop.size}"
            at(p, "CL_GARBAGE", ERROR, f"{what} (magic 0x{stop.magic & 0xFFFFFFFF:08X}); the broker's recovery ends the log here")
            rep.unread_reported = True
        break
    for c in _COLS:
        rep.cols[c] = np.concatenate(parts[c]) if parts[c] else np.zeros(0, np.int64)
    rep.topics = [decode_utf8(t) for t in interned]
    rep.records = len(rep.cols["phy"])
    rep.bytes = int(rep.cols["size"].sum()) if rep.records else 0
    rep.all_zero = rep.records == 0 and not rep.invalid and _first_nonzero(u8, 0, seg.size) is None
    if progress:
        progress(seg.size)
    return rep


def _resync(buf, u8, p: int, stop, limit: int, commitlog: CommitLog) -> int | None:
    """Where the next record starts after an invalid one, or None if no candidate is a record."""
    cands = []
    if stop.reason in _CHAIN_INTACT:
        cands.append(p + stop.size)
    else:
        h = fast.decode_headers(buf, np.asarray([p], np.int64), u8)
        cands += [p + int(h.computedSize[0]), p + stop.size]
    for c in cands:
        if p < c <= limit - 8:
            w = fast.walk(buf, c, limit, commitlog.magics(False), max_records=1)
            if len(w.offsets) or w.kind in (fast.STOP_BLANK, fast.STOP_ZERO):
                return c
        elif c == limit:
            return c
    return None


# --- phase 2: merge and cross-check ------------------------------------------------------


@dataclass
class VerifyResult:
    findings: list
    summary: dict

    @property
    def exit_code(self) -> int:
        """0 when nothing worse than info was found, 1 otherwise."""
        return 1 if any(f.severity in (ERROR, WARNING) for f in self.findings) else 0


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


def verify_store(store, *, check_crc: bool = True, reports: list[SegmentReport] | None = None,
                 progress: Callable[[int], None] | None = None) -> VerifyResult:
    """Verify everything in ``store``; ``reports`` may come from parallel :func:`verify_segments` calls."""
    cl = store.commitlog
    findings: list[Finding] = []
    findings += cl.segments.problems
    if reports is None:
        reports = verify_segments(cl, range(len(cl.segments.segments)), check_crc=check_crc, progress=progress)
    for r in reports:
        findings += r.findings
    recs = _Records(store, reports)
    summary: dict = {"root": store.root, "version": store.config.version,
                     "commitlog": {"files": len(reports), "records": len(recs), "bytes": int(sum(r.bytes for r in reports)),
                                   "blanks": int(sum(r.blanks for r in reports)), "minOffset": cl.min_offset}}
    data_end, recovery_end = _log_end(store, reports, findings)
    summary["commitlog"].update(maxOffset=data_end, recoveryEnd=recovery_end)
    _check_store_times(recs, findings)
    _check_delay_properties(recs, findings)
    refs = _RefClassifier(recs, reports, cl, data_end)
    cq_phys = _check_consume_queues(store, recs, refs, findings, summary)
    _check_dispatch(store, recs, cq_phys, findings)
    _check_index(store, recs, refs, findings, summary)
    if refs.lost_refs:
        seg = cl.segments.find(data_end) or (cl.segments.segments[-1] if cl.segments.segments else None)
        path = seg.path if seg else cl.directory
        findings.append(Finding("CL_LOST_TAIL", ERROR, path, data_end - seg.start if seg else None,
                                f"the commitlog ends at {data_end} but {refs.lost_refs} consume-queue units / index entries point "
                                "past it: the tail of the log is missing (zero-filled or cut)", {"phyOffset": data_end, "references": refs.lost_refs}))
    _check_checkpoint(store, recs, findings)
    _check_root(store, findings)
    findings.sort(key=lambda f: (SEVERITY_ORDER.get(f.severity, 3), f.path or "", f.offset if f.offset is not None else -1, f.code))
    counts = {s: sum(1 for f in findings if f.severity == s) for s in (ERROR, WARNING, INFO)}
    summary["findings"] = counts
    return VerifyResult(findings, summary)


def _log_end(store, reports: list[SegmentReport], findings: list) -> tuple[int, int]:
    """(end of data, where the broker's recovery walk would stop); reports pre-allocated / unreachable files."""
    data_end = store.commitlog.min_offset
    for r in reports:
        if r.records or r.invalid or r.blanks:
            data_end = max(data_end, r.data_end)
    recovery_end = None
    end_rep = None
    for r in reports:
        if r.invalid:
            recovery_end = r.invalid[0]
            break
        if not r.ended_with_blank:
            recovery_end, end_rep = r.stop_offset, r
            break
    if recovery_end is None and reports:
        last = reports[-1]
        recovery_end = last.data_end - 8 if last.ended_with_blank else last.stop_offset
    if end_rep is not None:
        later = [r for r in reports if r.index > end_rep.index]
        with_data = [r for r in later if not r.all_zero]
        if with_data and not end_rep.unread_reported:
            findings.append(Finding("CL_NO_BLANK", ERROR, end_rep.path, end_rep.stop_offset - end_rep.start,
                                    f"the file ends its data without a BLANK marker but {len(with_data)} later file(s) hold data: "
                                    "the broker stops reading here and recovery would delete them",
                                    {"phyOffset": end_rep.stop_offset}))
        for r in later:
            if r.all_zero:
                findings.append(Finding("CL_PREALLOCATED", INFO, r.path, 0,
                                        "all-zero file after the end of the log (pre-allocated); recovery deletes it"))
    return data_end, recovery_end if recovery_end is not None else 0


def _check_store_times(recs: _Records, findings: list) -> None:
    ts = recs.c["storeTimestamp"]
    if len(ts) < 2:
        return
    back = np.flatnonzero(ts[1:] < ts[:-1]) + 1
    agg = _Agg()
    for i in back.tolist():
        path, pos = recs.location(i)
        agg.add("", "CL_STORE_TIME", WARNING, path, pos, f"STORETIMESTAMP {int(ts[i])} is earlier than the previous record's "
                f"{int(ts[i - 1])} (clock moved back, or records were copied in)", phyOffset=int(recs.phy[i]))
    findings += agg.findings()


def _check_delay_properties(recs: _Records, findings: list) -> None:
    tid = recs.topic_ids.get("SCHEDULE_TOPIC_XXXX")
    if tid is None:
        return
    for i in np.flatnonzero(recs.c["topic"] == tid).tolist():
        if recs.tags_code(i) is None:
            path, pos = recs.location(i)
            findings.append(Finding("CL_DELAY_PROPERTY", ERROR, path, pos, "DELAY property is not a number: the broker rejects "
                                    "this record and recovery truncates the log here", {"phyOffset": int(recs.phy[i])}))


def _check_consume_queues(store, recs: _Records, refs: _RefClassifier, findings: list, summary: dict) -> list:
    """Consume queue ↔ commitlog and ext ↔ consume queue (Appendix B); returns the phys of every unit."""
    all_phys = []
    queues = store.queues()
    n_units = 0
    ext_on = store.config.enableConsumeQueueExt
    for topic, qid in queues:
        cq = store.queue(topic, qid)
        findings += cq.segments.problems
        u = cq.units()
        n_units += len(u.phy)
        agg = _Agg()
        group = (topic, qid)
        _check_cq_holes(cq, u, agg, group)
        filler = (u.phy == CQ_FILLER[0]) & (u.size == CQ_FILLER[1]) & (u.tags == CQ_FILLER[2])
        real = np.flatnonzero(~filler)
        if filler.any():
            first = int(u.queue_offsets[np.flatnonzero(filler)[0]])
            path, pos = _cq_loc(cq, first)
            # Recognised padding (§7.3): not a problem, but worth knowing when reading offsets.
            findings.append(Finding("CQ_FILLER", INFO, path, pos, f"{int(filler.sum())} pre-blank filler units (queue starts at a non-zero offset)",
                                    {"count": int(filler.sum())}))
        phys = u.phy[real]
        all_phys.append(phys)
        idx, status = refs.classify(phys)
        want_tid = recs.topic_ids.get(topic, -1)
        ext = store.ext(topic, qid) if ext_on else None
        ext_refs = []
        for j in np.flatnonzero(status == refs.MISSING).tolist():
            qo = int(u.queue_offsets[real[j]])
            path, pos = _cq_loc(cq, qo)
            agg.add(group, "CQ_NO_RECORD", ERROR, path, pos, f"unit {qo} points at {int(phys[j])}, where no commitlog record starts",
                    topic=topic, queueId=qid, queueOffset=qo)
        ok = np.flatnonzero(status == refs.FOUND)
        ri = idx[ok]
        uu = real[ok]
        c = recs.c
        tran = c["sysFlag"][ri] & 0xC
        checks = [
            ("CQ_SIZE", c["size"][ri] != u.size[uu], lambda j, r: f"size {int(u.size[j])}, the record's TOTALSIZE is {int(c['size'][r])}"),
            ("CQ_TOPIC", c["topic"][ri] != want_tid, lambda j, r: f"points at a record of topic {recs.topic(r)!r}"),
            ("CQ_QUEUE_ID", c["queueId"][ri] != qid, lambda j, r: f"points at a record of queue {int(c['queueId'][r])}"),
            ("CQ_QUEUE_OFFSET", c["queueOffset"][ri] != u.queue_offsets[uu],
             lambda j, r: f"points at a record whose QUEUEOFFSET is {int(c['queueOffset'][r])} (queue offsets not contiguous)"),
            ("CQ_TRAN_TYPE", (tran != TRANSACTION_NOT) & (tran != TRANSACTION_COMMIT),
             lambda j, r: "points at a prepared/rollback transaction record, which the broker never dispatches"),
        ]
        bad = np.zeros(len(ok), dtype=bool)
        for code, mask, text in checks:
            mask = mask & ~bad
            if code in ("CQ_TOPIC", "CQ_QUEUE_ID", "CQ_QUEUE_OFFSET") and mask.any():
                mask = mask & ~_lmq_match(recs, ri, u.queue_offsets[uu], topic, mask)
            for k in np.flatnonzero(mask).tolist():
                j, r = int(uu[k]), int(ri[k])
                qo = int(u.queue_offsets[j])
                path, pos = _cq_loc(cq, qo)
                agg.add(group, code, ERROR, path, pos, f"unit {qo}: {text(j, r)}", topic=topic, queueId=qid, queueOffset=qo,
                        phyOffset=int(u.phy[j]))
            bad |= mask
        # tagsCode (after ext indirection) needs the properties: only for units that passed the rest.
        for k in np.flatnonzero(~bad).tolist():
            j, r = int(uu[k]), int(ri[k])
            qo = int(u.queue_offsets[j])
            stored = int(u.tags[j])
            expected = recs.tags_code(r)
            if expected is None:
                continue  # CL_DELAY_PROPERTY already says why
            if ext is not None and is_ext_addr(stored):
                ext_refs.append((qo, stored, r, expected))
                continue
            if stored != expected:
                path, pos = _cq_loc(cq, qo)
                agg.add(group, "CQ_TAGS", ERROR, path, pos, f"unit {qo}: tagsCode {stored}, the record's TAGS give {expected}",
                        topic=topic, queueId=qid, queueOffset=qo, phyOffset=int(u.phy[j]))
        if ext is not None:
            _check_ext(ext, cq, ext_refs, recs, agg, group, findings)
        findings += agg.findings()
    summary["consumeQueues"] = {"queues": len(queues), "units": n_units}
    return all_phys


def _lmq_match(recs: _Records, ri, queue_offsets, topic: str, mask) -> np.ndarray:
    """Units of a multi-dispatch (LMQ) queue point at other topics' records (§14.3)."""
    out = np.zeros(len(ri), dtype=bool)
    for k in np.flatnonzero(mask).tolist():
        p = recs.props(int(ri[k]))
        names = p.get("INNER_MULTI_DISPATCH", "").split(",")
        offs = p.get("INNER_MULTI_QUEUE_OFFSET", "").split(",")
        if topic in names and len(names) == len(offs):
            out[k] = offs[names.index(topic)] == str(int(queue_offsets[k]))
    return out


def _check_cq_holes(cq, u, agg: _Agg, group) -> None:
    """Non-zero units after the end of a queue: data the broker can no longer reach."""
    segs = cq.segments.segments
    if not segs:
        return
    end_pos = u.end_offset * CQ_UNIT_SIZE
    for seg in segs:
        if seg.start + seg.size <= end_pos:
            continue
        arr = cq.file_units(seg)
        first = max(0, (end_pos - seg.start) // CQ_UNIT_SIZE)
        rest = arr[first:]
        nz = np.flatnonzero((rest["phyOffset"] != 0) | (rest["size"] != 0) | (rest["tagsCode"] != 0))
        if len(nz):
            pos = (first + int(nz[0])) * CQ_UNIT_SIZE
            # located at the break (the first invalid unit), where the damage is, not at the stranded units
            end_seg = cq.segments.find(end_pos) or seg
            agg.add(group, "CQ_HOLE", ERROR, end_seg.path, end_pos - end_seg.start, f"units after the end of the queue at offset "
                    f"{u.end_offset} (next non-zero unit at {seg.name}+{pos}): the broker "
                    "treats the queue as ending at the first invalid unit and cannot reach them", topic=group[0], queueId=group[1])
            return


def _check_ext(ext, cq, ext_refs, recs: _Records, agg: _Agg, group, findings: list) -> None:
    findings += ext.segments.problems
    for qo, addr, r, expected in ext_refs:
        unit = ext.get(addr)
        path, pos = _cq_loc(cq, qo)
        if unit is None:
            agg.add(group, "EXT_UNREADABLE", ERROR, path, pos, f"unit {qo}: ext address {addr} cannot be read", queueOffset=qo,
                    extOffset=undecorate(addr))
            continue
        if unit["tagsCode"] != expected:
            agg.add(group, "EXT_TAGS", ERROR, path, pos, f"unit {qo}: ext tagsCode {unit['tagsCode']}, the record's TAGS give {expected}",
                    queueOffset=qo, extOffset=unit["offset"])
        elif unit["msgStoreTime"] != int(recs.c["storeTimestamp"][r]):
            agg.add(group, "EXT_STORE_TIME", ERROR, path, pos, f"unit {qo}: ext msgStoreTime {unit['msgStoreTime']} differs from the "
                    f"record's STORETIMESTAMP {int(recs.c['storeTimestamp'][r])}", queueOffset=qo, extOffset=unit["offset"])
    for unit in ext.units():
        if unit["size"] != 20 + unit["bitMapSize"] or unit["bitMapSize"] < 0:
            seg = ext.segments.find(unit["offset"])
            agg.add(group, "EXT_SIZE", ERROR, seg.path if seg else ext.directory, unit["offset"] - (seg.start if seg else 0),
                    f"ext unit size {unit['size']} does not equal 20 + bitMapSize {unit['bitMapSize']}")


def _check_dispatch(store, recs: _Records, cq_phys: list, findings: list) -> None:
    """Records the broker should have put into a consume queue but did not."""
    if not len(recs):
        return
    tran = recs.c["sysFlag"] & 0xC
    dispatchable = (tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)
    phys = np.concatenate(cq_phys) if cq_phys else np.zeros(0, np.int64)
    missing = np.flatnonzero(dispatchable & ~np.isin(recs.phy, phys))
    if not len(missing):
        return
    # maxPhysicOffset of the queues: the broker re-dispatches everything from there at start (§13.1).
    if len(phys):
        _, found = recs.lookup(phys)
        ends = phys[found] + recs.c["size"][recs.lookup(phys[found])[0]] if found.any() else phys
        high = int(ends.max()) if len(ends) else 0
    else:
        high = 0
    lag = missing[recs.phy[missing] >= high]
    old = missing[recs.phy[missing] < high]
    if len(lag):
        path, pos = recs.location(int(lag[0]))
        findings.append(Finding("CQ_DISPATCH_LAG", INFO, path, pos, f"{len(lag)} records after the consume queues' high-water mark "
                                "are not dispatched yet; the broker dispatches them when it starts", {"count": int(len(lag)),
                                                                                                       "phyOffset": int(recs.phy[lag[0]])}))
    agg = _Agg()
    for i in old.tolist():
        path, pos = recs.location(i)
        t, q = recs.topic(i), int(recs.c["queueId"][i])
        agg.add((t, q), "CQ_NOT_DISPATCHED", ERROR, path, pos, f"record of {t}/{q} (queue offset {int(recs.c['queueOffset'][i])}) is "
                "missing from its consume queue; the broker will not dispatch it again", topic=t, queueId=q, phyOffset=int(recs.phy[i]),
                queueOffset=int(recs.c["queueOffset"][i]))
    findings += agg.findings()


def _check_index(store, recs: _Records, refs: _RefClassifier, findings: list, summary: dict) -> None:
    svc = store.index
    findings += svc.problems
    n_entries = 0
    for f in svc.files:
        if not f.complete:
            continue
        agg = _Agg()
        h = f.header()
        count = h.indexCount if h.indexCount > 0 else 1
        base = INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE
        if count > f.entries:
            agg.add(f.path, "IDX_HEADER", ERROR, f.path, 36, f"indexCount {h.indexCount} exceeds maxIndexNum {f.entries}")
            count = f.entries
        ent = f.entry_table(count)[1:]
        n = np.arange(1, count, dtype=np.int64)
        n_entries += len(n)
        if not len(n):
            continue
        kh = ent["keyHash"].astype(np.int64)
        phy = ent["phyOffset"].astype(np.int64)
        diff = ent["timeDiff"].astype(np.int64)
        prev = ent["prevIndex"].astype(np.int64)
        epos = lambda e: base + int(e) * INDEX_ENTRY_SIZE  # noqa: E731
        # Slot chains (§10.4): each entry links to the previous entry of its slot; the slot holds the newest.
        slot = np.where(kh >= 0, kh % f.slots, -1)
        order = np.lexsort((n, slot))
        s_sorted, n_sorted = slot[order], n[order]
        exp_prev_sorted = np.where(np.r_[False, s_sorted[1:] == s_sorted[:-1]], np.r_[0, n_sorted[:-1]], 0)
        exp_prev = np.empty_like(prev)
        exp_prev[order] = exp_prev_sorted
        for k in np.flatnonzero((prev != exp_prev) & (slot >= 0)).tolist():
            agg.add(f.path, "IDX_CHAIN", ERROR, f.path, epos(n[k]), f"entry {int(n[k])} links to {int(prev[k])}, expected "
                    f"{int(exp_prev[k])} (the previous entry with the same hash slot)", entry=int(n[k]))
        table = f.slot_table().astype(np.int64)
        exp_table = np.zeros(f.slots, dtype=np.int64)
        last = np.r_[s_sorted[1:] != s_sorted[:-1], True]
        ok_slots = s_sorted[last] >= 0
        exp_table[s_sorted[last][ok_slots]] = n_sorted[last][ok_slots]
        for s in np.flatnonzero(table != exp_table).tolist()[:1]:
            cnt = int((table != exp_table).sum())
            agg.add(f.path, "IDX_SLOT", ERROR, f.path, INDEX_HEADER_SIZE + s * INDEX_SLOT_SIZE, f"hash slot {s} holds entry "
                    f"{int(table[s])}, expected {int(exp_table[s])}" + (f" ({cnt} slots differ)" if cnt > 1 else ""), slot=s)
        used = int(len(np.unique(slot[slot >= 0])))
        if h.hashSlotCount != used:
            agg.add(f.path, "IDX_HEADER", ERROR, f.path, 32, f"hashSlotCount {h.hashSlotCount}, the entries use {used} slots")
        if h.beginPhyOffset != int(phy[0]) or h.endPhyOffset != int(phy[-1]):
            agg.add(f.path, "IDX_HEADER", ERROR, f.path, 16, f"header offsets {h.beginPhyOffset}..{h.endPhyOffset} differ from the "
                    f"entries' {int(phy[0])}..{int(phy[-1])}")
        for k in np.flatnonzero(kh < 0).tolist():
            agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(n[k]), f"entry {int(n[k])} has a negative key hash {int(kh[k])}", entry=int(n[k]))
        idx, status = refs.classify(phy)
        for k in np.flatnonzero(status == refs.MISSING).tolist():
            agg.add(f.path, "IDX_NO_RECORD", ERROR, f.path, epos(n[k]), f"entry {int(n[k])} points at {int(phy[k])}, where no commitlog "
                    "record starts", entry=int(n[k]), phyOffset=int(phy[k]))
        ts = recs.c["storeTimestamp"]
        for k in np.flatnonzero((status == refs.FOUND) & (kh >= 0)).tolist():
            r = int(idx[k])
            e = int(n[k])
            if int(recs.c["sysFlag"][r]) & 0xC == TRANSACTION_ROLLBACK:
                agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(e), f"entry {e} points at a rollback record, which is never indexed",
                        entry=e, phyOffset=int(phy[k]))
            elif int(kh[k]) not in recs.key_hashes(r):
                agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(e), f"entry {e} points at {int(phy[k])}, a record with no key of "
                        f"hash {int(kh[k])}", entry=e, phyOffset=int(phy[k]))
            elif e >= 2 and h.beginTimestamp > 0:
                d = int(ts[r]) - h.beginTimestamp
                want = min(max(int(d / 1000) if d >= 0 else -((-d) // 1000), 0), 2**31 - 1)
                if int(diff[k]) != want:
                    agg.add(f.path, "IDX_TIME_DIFF", WARNING, f.path, epos(e), f"entry {e} timeDiff {int(diff[k])} s, the record's store "
                            f"time gives {want} s", entry=e)
        first_found = status[0] == refs.FOUND
        last_found = status[-1] == refs.FOUND
        if first_found and h.beginTimestamp != int(ts[idx[0]]):
            agg.add(f.path, "IDX_HEADER", WARNING, f.path, 0, f"beginTimestamp {h.beginTimestamp} differs from the first entry's record "
                    f"({int(ts[idx[0]])})")
        if last_found and h.endTimestamp != int(ts[idx[-1]]):
            agg.add(f.path, "IDX_HEADER", WARNING, f.path, 8, f"endTimestamp {h.endTimestamp} differs from the last entry's record "
                    f"({int(ts[idx[-1]])})")
        findings += agg.findings()
    summary["index"] = {"files": len(svc.files), "entries": n_entries}


def _check_checkpoint(store, recs: _Records, findings: list) -> None:
    path = os.path.join(store.root, "checkpoint")
    cp = store.checkpoint()
    if not cp.exists:
        if len(recs):
            findings.append(Finding("CP_MISSING", WARNING, path, None, "no checkpoint file; the broker creates an empty one and "
                                    "treats every record as unflushed"))
        return
    if cp.fileSize != 4096:
        findings.append(Finding("CP_SIZE", WARNING, path, 0, f"checkpoint is {cp.fileSize} bytes, the broker maps 4096"))
    if not len(recs):
        return
    newest = int(recs.c["storeTimestamp"].max())
    if cp.physicMsgTimestamp > newest:
        findings.append(Finding("CP_PHYSIC_AHEAD", WARNING, path, 0, f"physicMsgTimestamp {cp.physicMsgTimestamp} is after the newest "
                                f"record ({newest}): records the broker had flushed are missing"))
    if cp.logicsMsgTimestamp > newest:
        findings.append(Finding("CP_LOGICS_AHEAD", WARNING, path, 8, f"logicsMsgTimestamp {cp.logicsMsgTimestamp} is after the newest "
                                f"record ({newest}): dispatched records are missing from the commitlog"))
    ends = [f.header().endTimestamp for f in store.index.files if f.complete]
    if cp.indexMsgTimestamp > max(ends, default=0):
        findings.append(Finding("CP_INDEX_AHEAD", WARNING, path, 16, f"indexMsgTimestamp {cp.indexMsgTimestamp} is after every index "
                                "file's endTimestamp: index files are missing"))


def _check_root(store, findings: list) -> None:
    findings += store.stray_entries()
    if store.abort_exists:
        cp = store.checkpoint()
        doomed = [f.name for f in store.index.files if f.complete and f.header().endTimestamp > cp.indexMsgTimestamp]
        findings.append(Finding("STORE_ABORT", INFO, os.path.join(store.root, "abort"), None,
                                "the last broker run did not shut down cleanly: its next start runs abnormal recovery (re-checks "
                                f"the log from the checkpoint, re-dispatches, and deletes {len(doomed)} index file(s) newer than "
                                "indexMsgTimestamp)", {"indexFilesDeletedOnRecovery": doomed}))
    lock = store.lock_state()
    if lock.held:
        findings.append(Finding("STORE_LOCKED", WARNING, os.path.join(store.root, "lock"), None,
                                f"a broker holds the store lock ({lock.detail}): files may change while they are verified"))
