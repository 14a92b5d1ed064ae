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
segment only after a BLANK, as one scan of the whole log does. With ``-j`` the columns are used only when they
stand for every segment (else the workers parse the log as before: a parent scanning segments one by one would
be the slowest part). Either way the same files.
"""

from __future__ import annotations

import os

from .dispatchspill import DispatchSpill, walk_rules


class WalkedLog:
    """What verify's walk kept (``spill``) and how each segment ended: ``ends[i]`` = (valid records, an invalid
    record was found, it ended with a BLANK)."""

    def __init__(self, spill: DispatchSpill, ends: dict):
        self.spill, self.ends = spill, ends

    def stands_for(self, i: int, seg_start: int) -> bool:
        """Whether segment ``i``'s columns are rebuild's scan of it."""
        return not self.ends[i][1] and self.spill.covers([seg_start])

    def ended_with_blank(self, i: int) -> bool:
        return self.ends[i][2]


def walk_once(store, jobs: int) -> WalkedLog | None:
    """verify's walk of the whole log keeping each segment's dispatch columns and verify's outcome (the spill's
    ``keep`` set: the caller removes it after verify after); None when nothing was kept or, with ``jobs`` > 1, the
    columns do not stand for every segment."""
    from .plan import store_fingerprint

    cl = store.commitlog
    segs = cl.segments.segments
    if not segs or getattr(cl, "is_dledger", False):
        return None
    spill = DispatchSpill.create(store.root, sum(s.size for s in segs))
    if spill is None:
        return None
    spill.delay_table = cl.config.delay_table  # what verify's tagsCode of delay records used
    spill.root, spill.fingerprint = os.path.abspath(store.root), store_fingerprint(store.root)
    spill.rules = walk_rules(cl)
    spill.keep = True
    try:
        ends = _walk_jobs(cl, spill, jobs) if jobs > 1 and len(segs) > 1 else _walk_here(cl, spill)
        spill.finish()
        spill.usable = set(ends) == set(range(len(segs)))  # every segment walked to its end
        for i, (_, invalid, _) in ends.items():
            if invalid:  # verify's records there are not the scan's: read again by both
                spill.drop_segment(segs[i].start)
        walked = WalkedLog(spill, ends)
        if spill.usable and (jobs <= 1 or all(walked.stands_for(i, s.start) for i, s in enumerate(segs))):
            return walked
    except BaseException:
        spill.remove()
        raise
    spill.remove()
    return None


def _segment_end(rep) -> tuple:
    """(records, invalid records, ended with a BLANK) of a segment, from its last window report."""
    return rep.records, bool(rep.invalid), bool(rep.ended_with_blank)


def _walk_here(cl, spill: DispatchSpill) -> dict:
    from ..verify.commitlog import iter_windows

    def sink(i, seg, buf, h, topics=None):
        spill.add(seg, h, topics)

    ends = {}
    for rep in iter_windows(cl, chunk_sink=sink):
        if rep.last:
            spill.keep_outcome(rep)
            ends[rep.segment] = _segment_end(rep)
    return ends


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


def _walk_jobs(cl, spill: DispatchSpill, jobs: int) -> dict:
    from rmqstore_cli.formats.warmup import warm_up

    from ..parallel import stream_segments
    from ..verify.commitlog import first_windows

    segs = cl.segments.segments
    warm_up()  # every kernel loaded once, before the fork
    ends = {}
    for i, kept, end in stream_segments(_walk_segment, len(segs), jobs, cl, first_windows(cl), spill, balance=True):
        spill.merge_segment(segs[i].start, kept)
        if end is not None:
            ends[i] = end
    spill.segment_ids = True  # a worker's walk numbers each segment's topics on its own
    return ends


def dispatch_walked(store, d, walked: WalkedLog, jobs: int, writeback) -> None:
    """The records of the log dispatched by ``d`` (closed after) in log order: each segment from the columns verify's
    walk kept where they stand for the scan, else scanned here; on into the next segment only after a BLANK, as one
    scan of the whole log goes (rebuild._dispatch_all). ``writeback``: rebuild.DispatchWriteback of ``d``."""
    from ..log.commitlog import ScanResult

    def put(batch) -> None:
        d.dispatch_many(batch)
        writeback.after(batch)

    try:
        if jobs > 1 and d.index is not None:
            d.index.use_idle_core()  # no worker runs now: a thread faults the index pages in ahead of the writes
        for i, seg in enumerate(store.commitlog.segments.segments):
            if walked.stands_for(i, seg.start):
                for batch in walked.spill.batches(seg.start):
                    put(batch)
                blank = walked.ended_with_blank(i)
            else:
                res = ScanResult()
                for chunk in store.commitlog.scan(start_index=i, end_index=i + 1, check_crc=False, result=res):
                    put(d.requests_from_chunk(chunk))
                blank = res.stop is not None and res.stop.kind == "blank" and res.stop.segment is seg
            if not blank:
                break
        d.flush(checkpoint=False)
    finally:
        d.close(flush=False)
