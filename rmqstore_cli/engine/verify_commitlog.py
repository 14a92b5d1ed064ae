"""Verify phase 1: each commitlog segment read on its own (records never cross a segment, §2.6).

:func:`verify_segments` returns a :class:`SegmentReport` per segment: findings plus the columns
of every valid record (``-j`` and the Spark job run it per segment in other processes).
"""

from __future__ import annotations

import copy
from collections import deque
from itertools import islice
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import numpy as np

from formats import fast

from .commitlog import CommitLog, ScanResult
from .findings import Finding
from .logwalk import next_by_size
from .verify_dispatch import TopicInterner, dispatch_columns
from .verify_records import _COL_TYPES, _COLS, ERROR, WARNING

REASON_CODES = {
    fast.R_BODY_CRC: "CL_BODY_CRC",
    fast.R_TOPIC_LENGTH: "CL_TOPIC_LENGTH",
    fast.R_LENGTHS: "CL_LENGTHS",
    fast.R_TOTALSIZE: "CL_TOTALSIZE",
    fast.R_PROP_CRC: "CL_PROP_CRC",
    fast.R_MAGIC_VERSION: "CL_MAGIC_VERSION",
}
_SYSFLAG_KNOWN = {4: 0x3F, 5: 0x7FF}


@dataclass
class SegmentReport:
    """What one commitlog segment holds, read on its own."""

    index: int
    path: str
    start: int
    findings: list = field(default_factory=list)
    cols: dict = field(default_factory=dict)  # name -> numpy column over the segment's valid records
    topics: list = field(default_factory=list)  # topic strings; cols["topic"] holds indexes into it
    key_hashes: object = None  # index key hashes of the records, cols["keyCount"] per record, in order
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


def iter_segments_parallel(commitlog: CommitLog, jobs: int, *, check_crc: bool = True,
                           progress: Callable[[int], None] | None = None) -> Iterator[SegmentReport]:
    """:func:`verify_segments_parallel` as a stream, in segment order: a windowed verify consumes each report
    while the workers read the next segments, so the reports are never all held at once."""
    import multiprocessing

    from . import parallel

    segs = commitlog.segments.segments
    ranges = parallel.split(len(segs), len(segs))
    if jobs <= 1 or len(ranges) <= 1:
        for r in ranges:
            yield from verify_segments(commitlog, r, check_crc=check_crc, progress=progress)
        return
    parallel._TASK = (_verify_range, (commitlog, check_crc))
    workers = min(jobs, len(ranges))
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            # at most one task ahead of each worker: reports the consumer has not taken yet stay few
            todo = iter(ranges)
            pending = deque((r, pool.apply_async(parallel._call, (r,))) for r in islice(todo, workers + 1))
            while pending:
                r, result = pending.popleft()
                reports = result.get()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append((nxt, pool.apply_async(parallel._call, (nxt,))))
                if progress:
                    progress(sum(segs[i].size for i in r))
                yield from reports
                del reports
    finally:
        parallel._TASK = None


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
    interner = TopicInterner()
    key_parts = []
    delay_table = cfg.delay_table
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
            parts["size"].append(h.totalSize.astype(np.int32))
            parts["queueId"].append(h.queueId)
            parts["queueOffset"].append(h.queueOffset)
            parts["sysFlag"].append(h.sysFlag)
            parts["storeTimestamp"].append(h.storeTimestamp)
            tids = interner.intern_chunk(u8, buf, h)
            parts["topic"].append(tids)
            codes, tags_bad, counts, hashes = dispatch_columns(u8, h, tids, interner, delay_table)
            parts["tagsCode"].append(codes)
            parts["tagsBad"].append(tags_bad)
            parts["keyCount"].append(counts)
            key_parts.append(hashes)
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
        rep.cols[c] = (np.concatenate(parts[c]) if parts[c] else np.zeros(0)).astype(_COL_TYPES[c], copy=False)
    rep.key_hashes = np.concatenate(key_parts) if key_parts else np.zeros(0, np.int32)
    rep.topics = interner.topics()
    rep.records = len(rep.cols["phy"])
    rep.bytes = int(rep.cols["size"].sum()) if rep.records else 0
    rep.all_zero = rep.records == 0 and not rep.invalid and _first_nonzero(u8, 0, seg.size) is None
    if progress:
        progress(seg.size)
    return rep


def _resync(buf, u8, p: int, stop, limit: int, commitlog: CommitLog) -> int | None:
    """Where the next record starts after an invalid one (:func:`.logwalk.next_by_size`)."""
    return next_by_size(buf, u8, p, stop.reason, stop.size, limit, commitlog.magics(False))
