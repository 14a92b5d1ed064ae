"""Verify phase 1: each commitlog segment read on its own (records never cross a segment, §2.6).

One walk per segment (:func:`iter_segment_windows`) yields the segment's records in *windows*: fixed
offset ranges ``[seg.start + k*WINDOW_BYTES, seg.start + (k+1)*WINDOW_BYTES)`` inside the segment, a
record belonging to the window its first byte lies in. A production segment is 1 GiB (millions of
small records), so a windowed verify holds one window's columns at a time, not a segment's. The checks may take
the windows of several small segments as one (:func:`grouped_windows`).
:func:`verify_segments` gives one :class:`SegmentReport` per whole segment from the same walk (the
Spark job and the whole-log formulation); ``-j`` streams window reports from worker processes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from rmqstore_cli.formats import fast

from ..log.commitlog import CommitLog, ScanResult
from ..findings import Finding
from ..log.walk import next_by_size
from ..derived.dispatchcolumns import TopicInterner, dispatch_chunk
from .records import ERROR, WARNING
from .segmentreport import SegmentReport, WindowCut, _Columns, replayed_windows

REASON_CODES = {
    fast.R_BODY_CRC: "CL_BODY_CRC",
    fast.R_TOPIC_LENGTH: "CL_TOPIC_LENGTH",
    fast.R_LENGTHS: "CL_LENGTHS",
    fast.R_TOTALSIZE: "CL_TOTALSIZE",
    fast.R_PROP_CRC: "CL_PROP_CRC",
    fast.R_MAGIC_VERSION: "CL_MAGIC_VERSION",
}
_SYSFLAG_KNOWN = {4: 0x3F, 5: 0x7FF}
WINDOW_BYTES = 64 << 20  # a window's offset range: 64 MiB of 100 B records are ~40 MB of columns
# a window of several small segments holds at most this much log (or WINDOW_BYTES, if less): the checks' fixed work
# per window spread over thousands of records, their columns a few MB
GROUP_BYTES = 4 << 20


def window_starts(seg, file_size: int, window_bytes: int | None = None) -> np.ndarray:
    """Absolute start offsets of the windows of one segment (at least one; ``0``: the whole segment).
    Only the readable part (``file_size``) is cut, so windows never reach into the next segment."""
    wb = WINDOW_BYTES if window_bytes is None else window_bytes
    extent = min(seg.size, file_size)
    n = max(1, -(-extent // wb)) if wb > 0 else 1
    return seg.start + np.arange(n, dtype=np.int64) * wb


def grouped_windows(segments: list, file_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of ``segments`` (the log's, or the first of them) that may span several small segments: (start of
    each, and which of them holds each window of the log's numbering, :func:`first_windows`). A run of segments that
    are one window each joins one window while their readable parts add up to at most ``GROUP_BYTES``
    (``WINDOW_BYTES`` if less); a segment of several windows keeps them. Each small segment would otherwise cost the
    checks' fixed work per window (~1 ms) for a few records."""
    limit = min(GROUP_BYTES, WINDOW_BYTES)
    starts: list[int] = []
    group: list[int] = []
    filled = None  # bytes in the window being filled; None: the next segment starts a new one
    for seg in segments:
        ws = window_starts(seg, file_size)
        extent = min(seg.size, file_size)
        if len(ws) == 1 and filled is not None and filled + extent <= limit:
            filled += extent
            group.append(len(starts) - 1)
            continue
        for s in ws.tolist():
            group.append(len(starts))
            starts.append(s)
        filled = extent if len(ws) == 1 else None
    return np.asarray(starts, dtype=np.int64), np.asarray(group, dtype=np.int64)


def holding_window(group: np.ndarray | None, index: int) -> tuple[int, bool]:
    """(the window holding the log's window ``index`` under ``group``, :func:`grouped_windows`' second answer, and
    whether ``index`` is the last one it holds); ``group`` None: windows are not grouped."""
    if group is None:
        return index, True
    g = int(group[index])
    return g, index + 1 >= len(group) or int(group[index + 1]) != g


def first_windows(commitlog: CommitLog) -> list[int]:
    """Number of each segment's first window in the log's window numbering (plus the total, last)."""
    fs = commitlog.segments.file_size
    out = [0]
    for seg in commitlog.segments.segments:
        out.append(out[-1] + len(window_starts(seg, fs)))
    return out


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
    """Verify the given commitlog segments, each independently of the others: one report per segment."""
    return [rep for i in indexes for rep in iter_segment_windows(commitlog, i, check_crc=check_crc, progress=progress,
                                                                window_bytes=0)]


def iter_windows(commitlog: CommitLog, *, check_crc: bool = True,
                 progress: Callable[[int], None] | None = None, chunk_sink=None, columns=None) -> Iterator[SegmentReport]:
    """Every window report of the log, in log order (numbered as :func:`first_windows`); ``chunk_sink``, ``columns``:
    see :func:`iter_segment_windows`."""
    firsts = first_windows(commitlog)
    interner = TopicInterner()  # one for the walk: a segment's topics are mostly the ones before it
    for i in range(len(commitlog.segments.segments)):
        yield from iter_segment_windows(commitlog, i, check_crc=check_crc, progress=progress, first_window=firsts[i],
                                        chunk_sink=chunk_sink, interner=interner, columns=columns)


def window_report(commitlog: CommitLog, w: int, *, check_crc: bool = True) -> SegmentReport:
    """The report of window ``w`` alone (its segment walked again up to it; the others dropped as made)."""
    firsts = first_windows(commitlog)
    i = int(np.searchsorted(firsts, w, side="right")) - 1
    for rep in iter_segment_windows(commitlog, i, check_crc=check_crc, first_window=firsts[i]):
        if rep.index == w:
            return rep
    raise IndexError(w)


def verify_segments_parallel(commitlog: CommitLog, jobs: int, *, check_crc: bool = True,
                             progress: Callable[[int], None] | None = None) -> list[SegmentReport]:
    """:func:`verify_segments` over every segment, one segment per task on ``jobs`` forked processes (``-j``)."""
    from ..parallel import map_ranges, split

    segs = commitlog.segments.segments

    def done(r: range, _reports) -> None:
        if progress:
            progress(sum(segs[i].size for i in r))

    parts = map_ranges(_verify_range, split(len(segs), len(segs)), jobs, commitlog, check_crc, on_result=done)
    return [rep for part in parts for rep in part]


def iter_segments_parallel(commitlog: CommitLog, jobs: int, *, check_crc: bool = True,
                           progress: Callable[[int], None] | None = None) -> Iterator[SegmentReport]:
    """:func:`iter_windows` computed by ``jobs`` forked processes, streamed in log order
    (:func:`.parallel.stream_segments`: a 1 GiB segment never sits in memory whole, here or in a worker).
    The workers start walking now, not when the first report is asked for."""
    from ..parallel import stream_segments

    segs = commitlog.segments.segments
    if jobs <= 1 or len(segs) <= 1:
        return iter_windows(commitlog, check_crc=check_crc, progress=progress)
    firsts = first_windows(commitlog)
    from rmqstore_cli.formats.warmup import warm_up

    warm_up()  # numba imported and every kernel loaded once, before the fork, not in each worker
    return stream_segments(_segment_windows, len(segs), jobs, commitlog, firsts, check_crc,
                           done=(lambda i: progress(segs[i].size)) if progress else None)


def _segment_windows(i: int, commitlog: CommitLog, firsts: list, check_crc: bool) -> Iterator[SegmentReport]:
    return iter_segment_windows(commitlog, i, check_crc=check_crc, first_window=firsts[i])


def _verify_range(r: range, commitlog: CommitLog, check_crc: bool) -> list[SegmentReport]:
    return verify_segments(commitlog, r, check_crc=check_crc)


@dataclass
class ChunkTopics:
    """What verify's property pass found for a chunk, handed to a chunk sink: each record's topic id in ``interner``
    (the walk's :class:`~..derived.dispatchcolumns.TopicInterner`: its ``ids``, topic bytes -> id, grow as the walk
    goes on) and whether it carries both multi-dispatch properties (``multi``); and the rest of the record's dispatch
    columns: tagsCode (``codes``), whether Java cannot compute it (``tags_bad``), index keys per record (``counts``)
    and their hashes (``hashes``, in record order)."""

    tids: np.ndarray
    interner: object
    multi: np.ndarray
    codes: np.ndarray | None = None
    tags_bad: np.ndarray | None = None
    counts: np.ndarray | None = None
    hashes: np.ndarray | None = None


def iter_segment_windows(commitlog: CommitLog, i: int, *, check_crc: bool = True, progress=None,
                         window_bytes: int | None = None, first_window: int | None = None,
                         chunk_sink=None, interner: TopicInterner | None = None, columns=None) -> Iterator[SegmentReport]:
    """Walk segment ``i`` once and yield a report per window (:func:`window_starts`; ``window_bytes=0``: one
    report for the whole segment, numbered ``i``), in order, each as soon as the walk has passed its end.
    Windows are numbered from ``first_window`` (default: the log's numbering, :func:`first_windows`).
    ``chunk_sink(i, seg, buf, headers, topics)`` also gets each chunk of valid records as the walk decodes it (another
    pass reading the same records: recover's recovery walk, repair/walkalong.py), with what the walk's property pass
    found (:class:`ChunkTopics`). ``interner``: the walk's topic ids, shared with the segments before (a new one
    by default). ``columns``: the dispatch columns an earlier walk of the same records with the same ids kept
    (repair/dispatchspill.SpilledColumns: ``start_segment``, ``take``), taken instead of the property pass for the
    chunks whose records are that walk's; where that walk read this very file whole and it has not been written
    since (``replay``), the segment's reports are made from what that walk kept, without reading it again."""
    seg = commitlog.segments.segments[i]
    cfg = commitlog.config
    starts = window_starts(seg, commitlog.segments.file_size, window_bytes)
    nw = len(starts)
    if window_bytes == 0:
        first = i
    else:
        first = first_windows(commitlog)[i] if first_window is None else first_window
    # the segment-level fields are gathered on the last window's report
    rep = SegmentReport(first + nw - 1, seg.path, seg.start, segment=i, window_start=int(starts[-1]),
                        crc_checked=check_crc)
    whole_log_ids = interner is not None  # the walk's topic ids: shared with the segments before, or this one's
    interner = TopicInterner() if interner is None else interner
    cut = WindowCut(rep, seg, i, first, starts, interner, progress)
    if columns is not None and chunk_sink is None and window_bytes is None:
        kept_walk = columns.replay(commitlog, seg, interner.known(), whole_log_ids, check_crc)
        if kept_walk is not None:  # the segment as the plan's walk read it: not read again
            yield from replayed_windows(cut, *kept_walk)
            return
    view = _single_segment_view(commitlog, seg)
    buf = seg.buffer()
    u8 = fast.as_u8(buf) if seg.size else np.zeros(0, np.uint8)
    limit = min(seg.size, commitlog.segments.file_size)
    wrong_size = seg.size != commitlog.segments.file_size
    delay_table = cfg.delay_table
    known = _SYSFLAG_KNOWN.get(cfg.version, 0x7FF)
    max_size = cfg.maxMessageSize + (65536 if cfg.version >= 5 else 0)
    f = rep.findings

    def at(pos: int, code: str, sev: str, msg: str, **extra) -> None:
        f.append(Finding(code, sev, seg.path, pos, msg, {"phyOffset": seg.start + pos, **extra}))

    dledger = getattr(commitlog, "is_dledger", False)
    if columns is not None and not columns.start_segment(seg.start, interner.known(), whole_log_ids):
        columns = None
    pos = 0
    while True:
        res = ScanResult()
        for chunk in view.scan(start_position=pos, check_crc=check_crc, result=res):
            h = chunk.headers
            phy = chunk.phy
            kept = columns.take(phy, h.totalSize) if columns is not None else None
            if kept is None:
                columns = None
                tids, codes, tags_bad, counts, hashes, multi = dispatch_chunk(u8, h, interner, delay_table)
            else:
                tids, codes, counts, hashes, raws = kept
                interner.learn(raws, int(tids.max()) + 1 if len(tids) else 0)
                tags_bad = multi = np.zeros(len(h), bool)  # a segment's columns are kept only without either
            if chunk_sink is not None:
                chunk_sink(i, seg, buf, h, ChunkTopics(tids, interner, multi, codes, tags_bad, counts, hashes))
            cols = {"phy": phy, "size": h.totalSize, "queueId": h.queueId, "queueOffset": h.queueOffset,
                    "sysFlag": h.sysFlag, "storeTimestamp": h.storeTimestamp, "topic": tids, "tagsCode": codes,
                    "tagsBad": tags_bad, "keyCount": counts}
            rep.data_end = int(phy[-1] + h.totalSize[-1])
            # Checks the broker does not make (§13.3 "Not checked by Java"); one pass over the chunk says whether
            # any record breaks one of them, and only then each rule's records are looked for
            bad_flags = (h.sysFlag & ~known) != 0
            if cfg.version >= 5:
                bad_flags |= ((h.sysFlag & 0x700) >> 8) >= 4
            if (bad_flags | (h.physicalOffset != phy) | (h.queueId < 0) | (h.queueOffset < 0) | (h.totalSize > max_size)).any():
                _field_checks(h, phy, bad_flags, max_size, at)
            yield from cut.add(cols, hashes)  # the reports of the windows the walk passed the end of
            del chunk, h, phy, tids, codes, tags_bad, counts, hashes, multi, cols
        stop = res.stop
        rep.blanks += 1 if stop.kind == fast.STOP_BLANK else 0
        p = stop.position
        if dledger and stop.kind == fast.STOP_INVALID and not stop.entry_level:
            # a damaged message inside an entry DLedger keeps: reported, and the walk goes on at the next entry
            rep.invalid.append(seg.start + p)
            from .dledger import message_stop  # DLedger's modules load only for a DLedger log

            nxt = message_stop(commitlog, seg, stop, u8, at)
            if nxt is None:
                rep.data_end = seg.start + p
                rep.unread_from, rep.unread_reported = seg.start + p, True
                break
            rep.data_end = seg.start + nxt
            pos = nxt
            continue
        if dledger and stop.kind not in (fast.STOP_BLANK, fast.STOP_ZERO):
            # the entries end here: the entry checks (verify/dledger.check_dledger) say why; in a file DLedger's
            # recovery never reads, the broker serves the entries after it: the walk goes on at the next one
            from ..log.dledger import recovery_start_file, resume_by_unit

            nxt = resume_by_unit(view, res.entry_walk) if i < recovery_start_file(commitlog) and res.entry_walk else None
            if nxt is not None and nxt[1] > p:
                pos = nxt[1]
                continue
            rep.stop_offset, rep.stop_kind = seg.start + p, stop.kind
            rep.unread_from, rep.unread_reported = seg.start + p, True
            break
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
    rep.all_zero = cut.records == 0 and not rep.invalid and _first_nonzero(u8, 0, seg.size) is None
    yield from cut.finish()  # the window the walk ended in, the empty ones after it, the last


def _field_checks(h, phy: np.ndarray, bad_flags: np.ndarray, max_size: int, at) -> None:
    """The fields of a chunk's records the broker does not check (§13.3 "Not checked by Java"), reported by ``at``."""
    for j in np.flatnonzero(h.physicalOffset != phy).tolist():
        at(int(h.offsets[j]), "CL_PHYOFFSET", ERROR,
           f"PHYSICALOFFSET field says {int(h.physicalOffset[j])}, the record is at {int(phy[j])}")
    for j in np.flatnonzero(bad_flags).tolist():
        at(int(h.offsets[j]), "CL_SYSFLAG", WARNING, f"SYSFLAG 0x{int(h.sysFlag[j]) & 0xFFFFFFFF:X} has bits this broker version never sets")
    for j in np.flatnonzero((h.queueId < 0) | (h.queueOffset < 0)).tolist():
        at(int(h.offsets[j]), "CL_FIELD_RANGE", WARNING,
           f"negative QUEUEID {int(h.queueId[j])} or QUEUEOFFSET {int(h.queueOffset[j])}")
    for j in np.flatnonzero(h.totalSize > max_size).tolist():
        at(int(h.offsets[j]), "CL_TOO_LARGE", WARNING, f"TOTALSIZE {int(h.totalSize[j])} exceeds what the broker accepts ({max_size})")


def _resync(buf, u8, p: int, stop, limit: int, commitlog: CommitLog) -> int | None:
    """Where the next record starts after an invalid one (:func:`..log.walk.next_by_size`)."""
    return next_by_size(buf, u8, p, stop.reason, stop.size, limit, commitlog.magics(False))


def as_windows(rep: SegmentReport, commitlog: CommitLog, firsts: list) -> Iterator[SegmentReport]:
    """``rep`` in the log's window numbering: a whole-segment report (:func:`verify_segments`, e.g. from a
    caller's own parallel run) cut into its windows' reports; a window report as it is."""
    if not (rep.last and rep.window_start == rep.start):
        yield rep
        return
    seg = commitlog.segments.segments[rep.segment]
    starts = window_starts(seg, commitlog.segments.file_size)
    first = firsts[rep.segment]
    rep.index, rep.window_start = first + len(starts) - 1, int(starts[-1])
    if len(starts) > 1:
        acc = _Columns()
        acc.add(rep.cols, rep.key_hashes)
        for k, (cols, keys) in enumerate(acc.cut(starts[1:])):
            yield SegmentReport(first + k, seg.path, seg.start, cols=cols, topics=rep.topics, key_hashes=keys,
                                segment=rep.segment, window_start=int(starts[k]), last=False)
        rep.cols, rep.key_hashes = acc.take_all()
    yield rep


def whole_segments(reports: Iterable[SegmentReport]) -> Iterator[SegmentReport]:
    """Window reports (in log order) joined back into one report per segment, as :func:`verify_segments`
    makes them; whole-segment reports pass as they are (the whole-log formulation needs segment reports)."""
    pending: list[SegmentReport] = []
    for rep in reports:
        pending.append(rep)
        if not rep.last:
            continue
        if len(pending) > 1:
            acc = _Columns()
            for r in pending:
                acc.add(r.cols, r.key_hashes)
                r.cols, r.key_hashes = {}, None
            rep.cols, rep.key_hashes = acc.take_all()
        rep.index, rep.window_start = rep.segment if rep.segment >= 0 else rep.index, rep.start
        pending = []
        yield rep
