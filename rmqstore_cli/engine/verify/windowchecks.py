"""Verify's cross-checks window by window, in this process or spread over ``-j`` worker processes.

:class:`WindowChecks` holds every check that takes the log's records one window at a time (consume
queues, batch queues, index files, LMQ and dispatch completeness, store-time order, DELAY properties).
In process, the windows come in log order and everything accumulates here. With ``-j``, forked workers
each take whole commitlog segments (records never cross one, §2.6): a worker walks its segment, runs
every window check on it and sends back only what the checks added — findings (aggregated as they are
here), the references no window resolved, furthest finds, a :class:`~.dispatch.WindowMissing` per window,
the segment's first and last store times — a few rows per queue and file, never a record. This process
merges those results in segment order, which gives the same findings, order and counts as the walk in
one process.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..derived.lmq import is_lmq
from ..findings import Finding
from .batchqueues import BatchQueueCheck
from .commitlog import first_windows, iter_segment_windows, window_report
from .dispatch import DispatchWindows, WindowMissing
from .filechecks import FileChecksPlan
from .indexcoverage import IndexCoverage
from .lmq import LmqDispatchCheck, after_furthest_unit
from .records import ERROR, WARNING, _Agg, _Records
from .rocksdbqueues import CheckpointDispatch, RocksQueueWindows
from .queueruns import QueueRuns
from .windows import IndexWindows, QueueWindows, Windows


@dataclass
class SegmentChecks:
    """What the window checks of one commitlog segment added, as a ``-j`` worker sends it back."""

    segment: int
    findings: list  # the walk's and the DELAY check's findings, in the order they were made
    kept: list  # the segment's last window report (segment-level fields), without its columns
    times: _Agg  # CL_STORE_TIME inside the segment
    first: tuple | None  # (store time, path, position, offset) of the segment's first record
    last_ts: int | None
    newest: int | None
    records: int
    dispatch: list  # (WindowMissing, window number) of the windows that matter to the dispatch check
    partials: dict = field(default_factory=dict)  # ("q"|"b"|"x", number) or "lmq" -> the checker's partial
    extra: object = None  # what the caller's extra per-window work made of the segment (``WindowChecks.extra``)


class _DispatchSummaries:
    """Stands in for :class:`~.dispatch.DispatchWindows` in a worker: keeps each window's summary to send back."""

    def __init__(self):
        self.items: list = []

    def window(self, recs: _Records, marks: np.ndarray, found_end: int | None, w: int) -> None:
        s = WindowMissing(recs, marks, found_end, keep_cols=False)
        if s.found_end is not None or s.n:
            self.items.append((s, w))


class WindowChecks:
    """The commitlog side of the broker's consistency: what ``ReputMessageService`` would have dispatched
    (consume queues, batch queues, LMQ, index entries) checked against the records, one window at a time."""

    def __init__(self, store, findings: list, *, check_crc: bool = True, jobs: int = 1, extra=None, columns=None):
        """The record-independent checks of every queue and index file are made here, or with ``jobs`` > 1 by the
        workers of :meth:`run_parallel` (this process then has them once that call has started the workers).

        ``extra`` (with ``jobs`` > 1): more work for the workers in the same walk, so the log is not walked again
        for it: in a worker ``extra.window(rep)`` gets each window report before the checks consume its columns
        (it must not consume them), ``extra.chunk`` (if it has one) each chunk of valid records as the walk decodes
        them (iter_segment_windows' ``chunk_sink``), and ``extra.segment_result(i)`` (picklable) ends segment ``i``;
        this process gets those in log order as ``extra.merge(i, result)``. ``columns``: kept dispatch columns for
        the workers' walks (iter_segment_windows)."""
        self.extra = extra
        self.columns = columns
        cl = self.cl = store.commitlog
        self.store, self.check_crc, self.findings = store, check_crc, findings
        # in one process, runs of small segments share a window; a -j worker takes whole segments, so each keeps its own
        self.windows = windows = Windows(cl, grouped=jobs <= 1)
        self._pending: list = []  # the reports of the window being gathered (a window of several segments)
        rocksdb = store.rocksdb
        keys = store.queues()
        self.plan = None
        self._receive = None
        if jobs > 1 and rocksdb is None:
            from rmqstore_cli.formats.warmup import warm_up

            warm_up()  # numba imported and every kernel loaded once, before the forks, not in each worker
            self.plan = FileChecksPlan.make(store, keys, self._index_files(), windows)
        if self.plan is None:
            self._setup(self._queues_here(findings), None, [])

    def _index_files(self) -> list:
        return [f for f in self.store.index.files if f.complete]

    def _queues_here(self, findings: list) -> list:
        queue_windows = QueueWindows if self.store.rocksdb is None else RocksQueueWindows
        return [queue_windows(self.store, topic, qid, self.windows, findings) for topic, qid in self.store.queues()]

    def _setup(self, queues: list, index_files: list | None, found: list) -> None:
        """Everything else, once the queues' checks are built (``index_files`` None: built here; ``found``: what
        building the queues' checks elsewhere found), adding findings in the one-process order."""
        store, findings, windows, cl, check_crc = self.store, self.findings, self.windows, self.cl, self.check_crc
        self.queues = queues
        findings += found
        self.queue_runs = QueueRuns(queues, [is_lmq(q.scan.topic) for q in queues], windows)
        self.batch = [BatchQueueCheck(store, topic, qid, findings) for topic, qid in store.batch_queues()]
        findings += store.index.problems
        self.index_files = index_files if index_files is not None else [IndexWindows(f, windows) for f in self._index_files()]
        self.index_coverage = IndexCoverage(store, self.index_files)
        phy_maxes = [q.phy_max for q in self.queues + self.batch if q.phy_max is not None]
        if store.rocksdb is None:
            self.dispatch = DispatchWindows(max(phy_maxes) if phy_maxes else None)
        else:  # the database's checkpoint is where the broker's next start dispatches from
            self.dispatch = CheckpointDispatch(store.rocksdb.checkpoint)
        self.lmq = LmqDispatchCheck(store, after_furthest_unit(max(phy_maxes) if phy_maxes else None))
        self.dispatch.reread_with(lambda w: _Records(store, [window_report(cl, k, check_crc=check_crc)
                                                             for k in windows.members(w)]))
        self._fresh()

    # -- the file checks shared out among the workers (parallel.stream_segments' exchange) ---------------------

    def part(self, k: int, workers: int):
        """In worker ``k``: its share of the per-file checks, built."""
        return self.plan.part(k, workers)

    def combine(self, parts: list):
        """Here: every worker's share; returns what each worker gets (None: each builds them all itself)."""
        loaded = self.plan.load(parts)
        if loaded is None:
            self._setup(self._queues_here(self.findings), None, [])
            return None
        self._setup(*loaded)
        return parts

    def accept_later(self, receive: Callable) -> None:
        """In a worker: ``receive(block)`` returns :meth:`combine`'s result (raises queue.Empty if it has not come
        and ``block`` is false), read when the first window is checked."""
        self._receive = receive

    def _fresh(self) -> None:
        self.times = _Agg()
        self.first_record: tuple | None = None
        self.prev_ts: int | None = None
        self.newest: int | None = None
        self.n_records = 0
        self.kept: list = []  # the segments' last window reports: the segment-level fields

    def window(self, rep) -> None:
        """One window's report (in log order here; in segment order within a worker), checked once the window that
        holds it is whole (a window of several small segments: its last segment's report)."""
        w, complete = self.windows.of_report(rep.index)
        if self._pending and self._pending_window != w:
            self._check_window()  # a report of the window was missing (the walk yields each one: not expected)
        self._pending.append(rep)
        self._pending_window = w
        if complete:
            self._check_window()

    def _check_window(self) -> None:
        reports, w = self._pending, self._pending_window
        self._pending = []
        for rep in reports:
            self.findings += rep.findings
        recs = _Records(self.store, reports)  # consumes the reports' columns
        self.kept += [rep for rep in reports if rep.last]
        self.n_records += len(recs)
        if len(recs):
            ts = recs.c["storeTimestamp"]
            if self.first_record is None:
                self.first_record = (int(ts[0]), *recs.location(0), int(recs.phy[0]))
            self.prev_ts = store_times_window(recs, self.prev_ts, self.times)
            top = int(ts.max())
            self.newest = top if self.newest is None else max(self.newest, top)
            check_delay_properties(recs, self.findings)
        marks = np.zeros(len(recs), dtype=bool)
        others = np.zeros(len(recs), dtype=bool)  # found by LMQ units: the records' own units are checked apart
        found_end = self.queue_runs.window(w, recs, marks, others)
        for b in self.batch:
            end = b.window(*self.windows.bounds(w), recs, marks)
            if end is not None:
                found_end = end if found_end is None else max(found_end, end)
        self.dispatch.window(recs, marks, found_end, w)
        self.lmq.window(recs)
        # the index entries each record holds, counted by the entry pass (what the coverage check compares)
        held = np.zeros(len(recs), np.int32) if self.index_coverage.files else None
        for ix in self.index_files:
            ix.window(w, self.windows, recs, held)
        self.index_coverage.window(recs, *self.windows.bounds(w), held)

    def settle(self) -> None:
        """The queues' checks brought up to date with what the windows found (before their results are read)."""
        if self._pending:
            self._check_window()
        self.queue_runs.settle()

    def _checkers(self):
        self.settle()
        yield from ((("q", k), q) for k, q in enumerate(self.queues))
        yield from ((("b", k), b) for k, b in enumerate(self.batch))
        yield from ((("x", k), ix) for k, ix in enumerate(self.index_files))
        yield "lmq", self.lmq
        yield "ixc", self.index_coverage

    # -- in a worker ---------------------------------------------------------------------------------------

    def enter_worker(self, wait: bool = True) -> bool:
        """In a freshly forked worker: the shared file checks received (when :meth:`run_parallel` shared them
        out), and what this process gathered before the fork forgotten (the main process has it). Without
        ``wait``, False when the shared checks have not arrived yet (nothing done)."""
        if getattr(self, "_in_worker", False):
            return True
        if self._receive is not None:
            try:
                shared = self._receive(wait)
            except queue.Empty:
                return False
            self._receive = None
            loaded = self.plan.load(shared) if shared is not None else None
            if loaded is None:  # a share could not travel: every process builds them all
                loaded = (self._queues_here([]), None, [])
            self._setup(*loaded)
        self._in_worker = True
        for _, c in self._checkers():
            c.take_partial()
        self.findings = []
        self.dispatch = _DispatchSummaries()
        self._fresh()
        return True

    def segment_result(self, i: int) -> SegmentChecks:
        """What the windows of segment ``i`` added (then starts afresh for the next segment)."""
        self.enter_worker()
        for rep in self.kept:
            rep.findings = []  # already in self.findings
        out = SegmentChecks(i, self.findings, self.kept, self.times, self.first_record, self.prev_ts, self.newest,
                            self.n_records, self.dispatch.items)
        if self.extra is not None:
            out.extra = self.extra.segment_result(i)
        for key, c in self._checkers():
            got = c.take_partial()
            if got is not None:
                out.partials[key] = got
        self.findings = []
        self.dispatch.items = []
        self._fresh()
        return out

    # -- here, merging ---------------------------------------------------------------------------------------

    def merge(self, res: SegmentChecks) -> None:
        """Fold in a worker's segment result; segments must come in log order."""
        self.findings += res.findings
        self.kept += res.kept
        if res.first is not None:
            ts, path, pos, phy = res.first
            if self.prev_ts is not None and ts < self.prev_ts:
                add_store_time_finding(self.times, path, pos, ts, self.prev_ts, phy)
            self.prev_ts = res.last_ts
        self.times.merge(res.times)
        if res.newest is not None:
            self.newest = res.newest if self.newest is None else max(self.newest, res.newest)
        self.n_records += res.records
        for s, w in res.dispatch:
            self.dispatch.add(s, w)
        for key, c in self._checkers():
            got = res.partials.get(key)
            if got is not None:
                c.merge_partial(got)
        if self.extra is not None:
            self.extra.merge(res.segment, res.extra)

    def run_parallel(self, jobs: int, progress: Callable[[int], None] | None = None) -> None:
        """Every segment's windows checked by ``jobs`` forked workers, merged here in log order."""
        from rmqstore_cli.formats.warmup import warm_up

        from ..parallel import stream_segments

        segs = self.cl.segments.segments
        warm_up()  # before the fork, not in each worker (a second call, after the file checks, costs microseconds)
        # with a plan, the workers first build the per-file checks, a share each, and all get all of them
        results = stream_segments(_segment_checks, len(segs), jobs, self, first_windows(self.cl),
                                  done=(lambda i: progress(segs[i].size)) if progress else None,
                                  exchange=self if self.plan is not None else None, balance=True)
        for res in results:
            self.merge(res)


_WALK_AHEAD = 3  # windows a worker walks before it waits for the shared file checks (memory: a window's columns each)


def _segment_checks(i: int, checks: WindowChecks, firsts: list):
    pending: list = []  # windows walked while the shared file checks were on their way
    for rep in iter_segment_windows(checks.cl, i, check_crc=checks.check_crc, first_window=firsts[i],
                                    chunk_sink=getattr(checks.extra, "chunk", None), columns=checks.columns):
        if checks.extra is not None:
            checks.extra.window(rep)
        if not checks.enter_worker(wait=len(pending) >= _WALK_AHEAD):
            pending.append(rep)
            continue
        for r in pending + [rep]:
            checks.window(r)
        pending = []
    checks.enter_worker()
    for r in pending:
        checks.window(r)
    yield checks.segment_result(i)


def store_times_window(recs: _Records, prev_ts: int | None, agg: _Agg) -> int:
    """CL_STORE_TIME within one window and across its boundary with the previous one; returns its last store time."""
    ts = recs.c["storeTimestamp"]
    if prev_ts is not None and int(ts[0]) < prev_ts:
        path, pos = recs.location(0)
        add_store_time_finding(agg, path, pos, int(ts[0]), prev_ts, int(recs.phy[0]))
    for i in (np.flatnonzero(ts[1:] < ts[:-1]) + 1).tolist():
        path, pos = recs.location(i)
        add_store_time_finding(agg, path, pos, int(ts[i]), int(ts[i - 1]), int(recs.phy[i]))
    return int(ts[-1])


def add_store_time_finding(agg: _Agg, path: str, pos: int, ts: int, prev_ts: int, phy: int, count: int = 1) -> None:
    """CL_STORE_TIME for a record stored before its predecessor (``count`` such records when merging partial results)."""
    agg.add("", "CL_STORE_TIME", WARNING, path, pos, f"STORETIMESTAMP {ts} is earlier than the previous record's "
            f"{prev_ts}: a broker whose clock went back writes exactly this, and so does `append --from --keep-store-times` "
            "replaying older records; the broker reads such a log, but lookups by time (`--since`, `get --time`, the "
            "broker's offset-by-time) assume store times do not go down and may land early or late", phyOffset=phy)
    agg.count[("", "CL_STORE_TIME")] += count - 1


def check_delay_properties(recs: _Records, findings: list) -> None:
    tid = recs.topic_ids.get("SCHEDULE_TOPIC_XXXX")
    if tid is None:
        return
    for i in np.flatnonzero(recs.c["topic"] == tid).tolist():
        if recs.tags_code(i) is None:
            path, pos = recs.location(i)
            findings.append(Finding("CL_DELAY_PROPERTY", ERROR, path, pos, "DELAY property is not a number: the broker rejects "
                                    "this record and recovery truncates the log here", {"phyOffset": int(recs.phy[i])}))
