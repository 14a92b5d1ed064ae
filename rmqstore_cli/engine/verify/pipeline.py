"""Offline verification of a whole store: every check the broker makes, and the ones it skips.

Two phases:

1. :func:`verify_segments` walks a range of commitlog segments independently (records never
   cross a segment, §2.6) and returns a :class:`SegmentReport` per segment: findings plus
   the header columns of every record it read (:func:`iter_windows`: the same walk, a report per
   sub-segment window, what the in-process verify consumes).
2. :func:`verify_store` merges the reports in segment order and cross-checks the log with the
   consume queues, ext files, index files and checkpoint (Appendix B).

With ``-j`` (:func:`verify_store_jobs`) worker processes take whole segments and run both phases'
window checks on them (:mod:`.windowchecks`); this process merges their small per-segment results.

The engine never prints: it returns :class:`~rmqstore_cli.engine.findings.Finding` objects
and a summary dict. Finding codes are stable (docs/findings.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from ..errors import UsageError
from ..findings import Finding
from .commitlog import (REASON_CODES, SegmentReport, _resync, iter_segments_parallel,  # noqa: F401 (public API)
                        as_windows, first_windows, iter_windows, verify_segments, verify_segments_parallel,
                        whole_segments, window_report)
from .batchqueues import BatchQueueCheck
from .indexcoverage import IndexCoverage
from .index import _check_checkpoint, _check_index, _check_root
from .lmq import check_lmq_dispatch
from .queues import _check_consume_queues, _check_dispatch
from .records import (ERROR, INFO, SEVERITY_ORDER, WARNING, _Agg, _Records, _RefClassifier,  # noqa: F401
                      keep_freed_heap, map_large_allocations)
from .rocksdbqueues import check_database
from ..timer.presence import may_be_present as timer_may_be_present
from .dispatch import NotMergeable
from .windowchecks import WindowChecks, add_store_time_finding, check_delay_properties as _check_delay_properties  # noqa: F401
from .windows import segments_overlap


@dataclass
class VerifyResult:
    """verify's findings and its summary of the store."""

    findings: list
    summary: dict

    @property
    def exit_code(self) -> int:
        """0 when nothing worse than info was found, 1 otherwise."""
        return 1 if any(f.severity in (ERROR, WARNING) for f in self.findings) else 0


class InProcessCrossChecks:
    """Runs the consume-queue/ext and index cross-checks here, queue after queue and file after file;
    a distributed verify passes its own object with the same two methods to :func:`verify_store`."""

    @staticmethod
    def consume_queues(store, recs, refs, findings: list, summary: dict):
        return _check_consume_queues(store, recs, refs, findings, summary)

    @staticmethod
    def index(store, recs, refs, findings: list, summary: dict) -> None:
        _check_index(store, recs, refs, findings, summary)


def verify_store(store, *, check_crc: bool = True, reports: Iterable[SegmentReport] | None = None,
                 progress: Callable[[int], None] | None = None, cross_checks=InProcessCrossChecks,
                 columns=None) -> VerifyResult:
    """Verify everything in ``store``; ``reports`` (in segment order) may come from parallel
    :func:`verify_segments` calls, e.g. the stream of :func:`iter_segments_parallel` (they are consumed:
    their record columns are released once used).

    In process, the log is verified in windows (:mod:`.windows`): one window's records at a
    time (whole-segment reports are cut into windows). A distributed ``cross_checks``, or segments that overlap, take the whole-log formulation.
    ``columns``: dispatch columns an earlier one-process walk of the same log kept, for the windowed walk
    (:func:`.commitlog.iter_segment_windows`)."""
    if store.rocksdb is not None:
        if cross_checks is not InProcessCrossChecks or segments_overlap(store.commitlog):
            raise UsageError("a RocksDB consume queue is verified in process, on commitlog files that do not overlap")
        return _verify_in_windows(store, check_crc=check_crc, reports=reports, progress=progress)
    if cross_checks is InProcessCrossChecks and not segments_overlap(store.commitlog):
        return _verify_in_windows(store, check_crc=check_crc, reports=reports, progress=progress, columns=columns)
    return _verify_whole_log(store, check_crc=check_crc, reports=None if reports is None else list(whole_segments(reports)),
                             progress=progress,
                             cross_checks=cross_checks)


def _verify_in_windows(store, *, check_crc: bool = True, reports: Iterable[SegmentReport] | None = None,
                       progress: Callable[[int], None] | None = None, jobs: int = 1, extra=None,
                       columns=None) -> VerifyResult:
    keep_freed_heap()  # the walk's chunk columns reuse freed heap memory (in -j's forked workers too)
    cl = store.commitlog
    findings: list[Finding] = []
    findings += cl.segments.problems
    parallel = reports is None and parallel_checks(store, jobs)
    checks = WindowChecks(store, findings, check_crc=check_crc, jobs=jobs if parallel else 1,
                          extra=extra if parallel else None, columns=columns if parallel else None)
    tail = None
    if parallel:
        if _has_log_independent_checks(store, with_dledger=False):  # -j splits the DLedger walk itself
            from ..parallel import Background

            tail = Background(_log_independent_checks, store, False)  # beside the workers: no core idles while it runs
        checks.run_parallel(jobs, progress)
    else:
        if reports is None and _entries_along_walk(store):
            tail = _EntriesAlongWalk(store)
        if reports is None:
            source = iter_windows(cl, check_crc=check_crc, progress=progress, columns=columns)
        else:
            firsts = first_windows(cl)
            source = (w for rep in reports for w in as_windows(rep, cl, firsts))
        for rep in source:
            checks.window(rep)
    checks.settle()
    queues, batch, index_files, dispatch, lmq, kept = (checks.queues, checks.batch, checks.index_files, checks.dispatch,
                                                       checks.lmq, checks.kept)
    n_records = checks.n_records
    findings += checks.times.findings()
    summary: dict = {"root": store.root, "version": store.config.version,
                     "commitlog": {"files": len(kept), "records": n_records, "bytes": int(sum(r.bytes for r in kept)),
                                   "blanks": int(sum(r.blanks for r in kept)), "minOffset": cl.min_offset}}
    data_end, recovery_end = _log_end(store, kept, findings)
    summary["commitlog"].update(maxOffset=data_end, recoveryEnd=recovery_end)
    no_records = _Records(store, [])
    no_records.invalid = np.asarray(sorted(o for r in kept for o in r.invalid), dtype=np.int64)
    refs = _RefClassifier(no_records, kept, cl, data_end)  # for the references no window found a record for
    for q in queues + batch:
        q.finish(refs, findings)
    dispatch.finish(cl, findings)
    lmq.finish(findings)
    summary["consumeQueues"] = {"queues": len(queues), "units": sum(q.units for q in queues)}
    if store.rocksdb is not None:
        summary["consumeQueues"].update(check_database(store, queues, data_end, findings))
    if batch:
        summary["batchConsumeQueues"] = {"queues": len(batch), "units": sum(b.units for b in batch)}
    for ix in index_files:
        ix.finish(refs, findings)
    checks.index_coverage.finish(findings)
    summary["index"] = {"files": len(store.index.files), "entries": sum(ix.entries for ix in index_files)}
    if refs.lost_refs:
        findings.append(lost_tail_finding(cl, data_end, refs.lost_refs))
    _check_checkpoint(store, _Newest(n_records, checks.newest), findings)
    _check_root(store, findings)
    if tail is None:
        _check_timer(store, findings, summary)
    else:
        found, timer, dledger = tail.result()
        findings += found
        if timer:
            summary["timer"] = timer
        if dledger is not None:
            summary["commitlog"]["recoveryEnd"] = dledger["recoveryEnd"]
            summary["dledger"] = dledger["dledger"]
    if getattr(cl, "is_dledger", False) and (tail is None or parallel):
        # with -j the entry walk is split by data file, after the window workers
        from .dledger import check_dledger  # DLedger's modules load only for a DLedger log

        check_dledger(store, findings, summary, jobs=jobs if parallel else 1)
    sort_findings(findings, summary)
    return VerifyResult(findings, summary)


def _entries_along_walk(store) -> bool:
    """Whether a one-process verify takes the DLedger entry checks' per-file parts from the window walk: on a DLedger
    log the window walk's scans walk every data file whole, its entries and the messages inside them in one compiled
    pass, so the entry checks need no walk of their own (nor a second process to hide one in)."""
    return getattr(store.commitlog, "is_dledger", False)


class _EntriesAlongWalk:
    """:func:`_log_independent_checks` with the DLedger entry walk made along the window walk
    (:func:`.dledger.capture_entries`); :meth:`result`, once the walk is done, runs them."""

    def __init__(self, store):
        from .dledger import capture_entries

        self.store = store
        self.captured = capture_entries(store)

    def result(self) -> tuple[list, dict, dict | None]:
        return _log_independent_checks(self.store, captured=self.captured)


def _has_log_independent_checks(store, with_dledger: bool = True) -> bool:
    """Whether :func:`_log_independent_checks` has anything to read (else no process is forked for it)."""
    if with_dledger and getattr(store.commitlog, "is_dledger", False):
        return True
    if not timer_may_be_present(store):
        return False
    from ..timer.store import TimerStore

    ts = TimerStore(store)
    try:
        return bool(ts.present)
    finally:
        ts.close()


def _log_independent_checks(store, with_dledger: bool = True, captured=None) -> tuple[list, dict, dict | None]:
    """The timer store's and the DLedger entries' checks (they read no window result): (findings in the order
    :func:`_verify_in_windows` adds them, the ``timer`` summary, the DLedger summary parts). ``captured``: see
    :func:`.dledger.check_dledger`."""
    findings: list = []
    timer = _timer_checks(store, findings)
    dledger = None
    if with_dledger and getattr(store.commitlog, "is_dledger", False):
        part: dict = {"commitlog": {}}
        from .dledger import check_dledger

        check_dledger(store, findings, part, captured=captured)
        dledger = {"recoveryEnd": part["commitlog"]["recoveryEnd"], "dledger": part["dledger"]}
    return findings, timer, dledger


def parallel_checks(store, jobs: int) -> bool:
    """Whether ``-j`` workers run the window checks too (not only the walk): file-based consume queues, more
    than one segment, segments that do not overlap."""
    return jobs > 1 and store.rocksdb is None and len(store.commitlog.segments.segments) > 1 and not segments_overlap(store.commitlog)


def verify_store_jobs(store, jobs: int, *, check_crc: bool = True, progress: Callable[[int], None] | None = None,
                      extra=None, columns=None) -> VerifyResult:
    """:func:`verify_store` on ``jobs`` processes: the window checks in the workers where the store allows
    (:func:`parallel_checks`), else the walk alone; the same result as one process. ``extra``: the caller's own
    per-window work done by the same workers in the same walk (:class:`.windowchecks.WindowChecks`); it is fed
    only when the workers run the window checks (the caller sees what it was given). ``columns``: see
    :func:`verify_store` (one process, or the workers when they run the window checks)."""
    keep_freed_heap()  # before any worker is forked: they inherit it
    if parallel_checks(store, jobs):
        try:
            return _verify_in_windows(store, check_crc=check_crc, progress=progress, jobs=jobs, extra=extra,
                                      columns=columns)
        except NotMergeable:  # the workers' summaries cannot decide it: the records are read again here
            return verify_store(store, check_crc=check_crc)
    reports = iter_segments_parallel(store.commitlog, jobs, check_crc=check_crc, progress=progress) if jobs > 1 else None
    return verify_store(store, check_crc=check_crc, reports=reports, progress=progress,
                        columns=columns if jobs <= 1 else None)


class _Newest:
    """What the checkpoint check reads of the records: how many, and the newest store time."""

    def __init__(self, n: int, newest: int | None):
        self.n = n
        self.c = {"storeTimestamp": np.asarray([newest if newest is not None else 0], dtype=np.int64)}

    def __len__(self) -> int:
        return self.n


def _verify_whole_log(store, *, check_crc: bool = True, reports: list[SegmentReport] | None = None,
                      progress: Callable[[int], None] | None = None, cross_checks=InProcessCrossChecks) -> VerifyResult:
    """Every record's columns at once, then the cross-checks (the formulation a distributed verify shares)."""
    map_large_allocations()
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
    marks = cross_checks.consume_queues(store, recs, refs, findings, summary)
    for topic, qid in store.batch_queues():
        b = BatchQueueCheck(store, topic, qid, findings)
        b.window(0, (1 << 63) - 1, recs, marks.has_unit)
        b.finish(refs, findings)
        if b.phy_max is not None:
            marks.phy_max = max(marks.phy_max if marks.phy_max is not None else b.phy_max, b.phy_max)
    _check_dispatch(store, recs, marks, findings)
    check_lmq_dispatch(store, recs, marks.phy_max, findings)
    cross_checks.index(store, recs, refs, findings, summary)
    coverage = IndexCoverage(store, None)
    coverage.window(recs, 0, (1 << 63) - 1)
    coverage.finish(findings)
    if refs.lost_refs:
        findings.append(lost_tail_finding(cl, data_end, refs.lost_refs))
    _check_checkpoint(store, recs, findings)
    _check_root(store, findings)
    _check_timer(store, findings, summary)
    if getattr(cl, "is_dledger", False):
        from .dledger import check_dledger

        check_dledger(store, findings, summary)
    sort_findings(findings, summary)
    return VerifyResult(findings, summary)


def _check_timer(store, findings: list, summary: dict) -> None:
    """The 5.x timer store (timerlog, wheel, timercheck, timermetrics), when the store has one."""
    timer = _timer_checks(store, findings)
    if timer:
        summary["timer"] = timer


def _timer_checks(store, findings: list) -> dict:
    """:func:`..timer.check.check_timer_store`, its modules loaded only when the store may have a timer store."""
    if not timer_may_be_present(store):
        return {}
    from ..timer.check import check_timer_store

    return check_timer_store(store, findings)


def lost_tail_finding(cl, data_end: int, lost_refs: int) -> Finding:
    seg = cl.segments.find(data_end) or (cl.segments.segments[-1] if cl.segments.segments else None)
    path = seg.path if seg else cl.directory
    return Finding("CL_LOST_TAIL", ERROR, path, data_end - seg.start if seg else None,
                   f"the commitlog ends at {data_end} but {lost_refs} consume-queue units / index entries point "
                   "past it: the tail of the log is missing (zero-filled or cut)", {"phyOffset": data_end, "references": lost_refs})


def sort_findings(findings: list, summary: dict) -> None:
    """The report's order (severity, file, offset, code) and the per-severity counts."""
    findings.sort(key=lambda f: (SEVERITY_ORDER.get(f.severity, 3), f.path or "", f.offset if f.offset is not None else -1, f.code))
    summary["findings"] = {s: sum(1 for f in findings if f.severity == s) for s in (ERROR, WARNING, INFO)}


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
        add_store_time_finding(agg, path, pos, int(ts[i]), int(ts[i - 1]), int(recs.phy[i]))
    findings += agg.findings()
