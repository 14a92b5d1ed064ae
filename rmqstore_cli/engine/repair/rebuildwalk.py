"""``rebuild`` walking the log once: verify's walk feeds both the rebuild and verify after it.

``rebuild`` reads every record twice: its own scan (without CRC) computes each record's dispatch columns (queue,
offsets, tagsCode, index key hashes), then verify after the apply walks the log again, CRCs every body and
computes the same columns with the same compiled property pass, to check the new files against them. The
commitlog is the one file rebuild never writes. So here verify's walk runs first, as recover's plan walk runs
(:mod:`.walkalong`): each segment's dispatch columns go to a :class:`.dispatchspill.DispatchSpill` (files in a
scratch folder: memory stays flat) together with verify's outcome of the segment; the rebuild dispatches from
those columns (as recover's re-dispatch does, apply.run_dispatch) and verify after takes each segment still as
the walk read it from what was kept (:meth:`.dispatchspill.SpilledColumns.replay`) instead of reading it again.
With ``-j`` the segments are walked in workers (each segment's topic ids its own, as ``verify -j``'s).

A segment's columns stand for rebuild's scan of it when verify found no invalid record in it (the scan reads
without CRC; a record verify rejects is a record the two read differently). Records that need more than the
columns (a tagsCode Java cannot compute, multi-dispatch units) leave their segment's columns unusable too. Such a
segment is scanned by the rebuild itself, and read again by verify after it; the scan goes on into the next
segment only after a BLANK, as one scan of the whole log does. Each segment is dispatched as soon as it is walked
(with ``-j``, while the workers walk the next ones). With ``-j`` the main process scans at most one such segment
itself; at the second, everything is built again the workers' way (rebuild.direct_requests): a main process
scanning segments one by one would be the slowest part. Either way the same files.
"""

from __future__ import annotations

import os

from .dispatchspill import DispatchSpill, walk_rules

MAX_SCANNED_HERE = 1  # with -j: segments the main process scans itself before it gives the workers the rebuild


class ColumnsRefused(Exception):
    """With ``-j``: too many segments' columns do not stand for the scan; the rebuild is made again the workers' way
    (what was dispatched into the scratch folder is thrown away)."""


class WalkedLog:
    """What verify's walk kept (``spill``) and how each segment ended: ``ends[i]`` = (valid records, an invalid
    record was found, it ended with a BLANK)."""

    def __init__(self, spill: DispatchSpill):
        self.spill, self.ends = spill, {}

    def stands_for(self, i: int, seg_start: int) -> bool:
        """Whether segment ``i``'s columns are rebuild's scan of it."""
        return not self.ends[i][1] and self.spill.covers([seg_start])


def walk_and_dispatch(store, d, jobs: int, writeback) -> WalkedLog | None:
    """verify's walk of the whole log (``jobs`` > 1: in workers) keeping each segment's dispatch columns and verify's
    outcome, every record dispatched by ``d`` (closed after) in log order as its segment comes in: from the columns
    where they stand for rebuild's scan, else scanned here; on into the next segment only after a BLANK.
    ``writeback``: rebuild.DispatchWriteback of ``d``. Returns what was kept (the spill's ``keep`` set: the caller
    removes it after verify after), or None when no scratch folder could be made (nothing was dispatched). Raises
    ColumnsRefused with ``jobs`` > 1 (see MAX_SCANNED_HERE)."""
    cl = store.commitlog
    segs = cl.segments.segments
    spill = _new_spill(store) if segs and not getattr(cl, "is_dledger", False) else None
    if spill is None:
        d.close(flush=False)
        return None
    walked = WalkedLog(spill)
    parallel = jobs > 1 and len(segs) > 1
    spill.usable = True  # per segment: WalkedLog.stands_for, DispatchSpill.drop_segment
    spill.segment_ids = parallel  # a worker's walk numbers each segment's topics on its own
    dispatching, scanned = True, 0
    walk = _walked_segments(cl, spill, jobs)
    try:
        for i, end in walk:
            walked.ends[i] = end
            if end[1]:  # an invalid record: verify's records there are not the scan's, read again by both
                spill.drop_segment(segs[i].start)
            if not dispatching:
                continue  # the scan stopped before this segment: walked for verify after only
            if walked.stands_for(i, segs[i].start):
                for batch in spill.batches(segs[i].start):
                    d.dispatch_many(batch)
                    writeback.after(batch)
                dispatching = end[2]
            else:
                scanned += 1
                if parallel and scanned > MAX_SCANNED_HERE:
                    raise ColumnsRefused(f"{scanned} segments need the rebuild's own scan")
                dispatching = _scan_segment(cl, i, d, writeback)
        spill.usable = set(walked.ends) == set(range(len(segs)))
        d.flush(checkpoint=False)
    except BaseException:
        walk.close()  # the workers stopped now, before anyone builds again or removes what they write into
        spill.remove()
        raise
    finally:
        d.close(flush=False)
    return walked


def _new_spill(store) -> DispatchSpill | None:
    from .plan import store_fingerprint

    cl = store.commitlog
    spill = DispatchSpill.create(store.root, sum(s.size for s in cl.segments.segments))
    if spill is not None:
        spill.delay_table = cl.config.delay_table  # what verify's tagsCode of delay records used
        spill.root, spill.fingerprint = os.path.abspath(store.root), store_fingerprint(store.root)
        spill.rules = walk_rules(cl)
        spill.keep = True
    return spill


def _scan_segment(cl, i: int, d, writeback) -> bool:
    """Segment ``i``'s records dispatched as rebuild's scan reads them (rebuild._dispatch_all); whether it ended with
    a BLANK (the scan goes on into the next segment)."""
    from ..log.commitlog import ScanResult

    seg = cl.segments.segments[i]
    res = ScanResult()
    for chunk in cl.scan(start_index=i, end_index=i + 1, check_crc=False, result=res):
        batch = d.requests_from_chunk(chunk)
        d.dispatch_many(batch)
        writeback.after(batch)
    return res.stop is not None and res.stop.kind == "blank" and res.stop.segment is seg


def _segment_end(rep) -> tuple:
    """(records, invalid records, ended with a BLANK) of a segment, from its last window report."""
    return rep.records, bool(rep.invalid), bool(rep.ended_with_blank)


def _walked_segments(cl, spill: DispatchSpill, jobs: int):
    """(segment number, its end) of each segment in log order, once verify's walk of it is done and its columns and
    outcome are in the spill (``jobs`` > 1: walked by workers, a few segments ahead)."""
    segs = cl.segments.segments
    if jobs > 1 and len(segs) > 1:
        from rmqstore_cli.formats.warmup import warm_up

        from ..parallel import stream_segments
        from ..verify.commitlog import first_windows

        warm_up()  # every kernel loaded once, before the fork
        stream = stream_segments(_walk_segment, len(segs), jobs, cl, first_windows(cl), spill, balance=True)
        try:
            for i, kept, end in stream:
                spill.merge_segment(segs[i].start, kept)
                yield i, end
        finally:
            stream.close()  # the workers stopped (an early end: an error, ColumnsRefused)
        return
    from ..verify.commitlog import iter_windows

    def sink(i, seg, buf, h, topics=None):
        spill.add(seg, h, topics)

    for rep in iter_windows(cl, chunk_sink=sink):
        if rep.last:
            spill.keep_outcome(rep)
            spill.finish()  # the segment's file closed: whole
            yield rep.segment, _segment_end(rep)


def _walk_segment(i: int, cl, firsts: list, spill: DispatchSpill):
    """In a worker: segment ``i`` walked as ``verify -j`` walks it, its columns written into the spill's folder;
    yields (its number, what the spill kept of it, its end)."""
    from ..verify.commitlog import iter_segment_windows

    def sink(k, seg, buf, h, topics=None):
        spill.add(seg, h, topics)

    end = None
    for rep in iter_segment_windows(cl, i, first_window=firsts[i], chunk_sink=sink):
        if rep.last:
            spill.keep_outcome(rep)
            end = _segment_end(rep)
    yield i, spill.finish_segment(cl.segments.segments[i].start), end
