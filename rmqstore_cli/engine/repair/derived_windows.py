"""The derived-file check of recovery (derived.py) one commitlog window at a time.

``derived.record_table`` holds every record of the recovered log as columns. When every consume-queue
unit agrees with its record (the usual case: a crash leaves queues short, not lying), the verdicts
need much less: per window (verify's sub-segment windows, :mod:`..verify.commitlog`, CRC not checked,
as record_table reads them), the units pointing into it are checked against its records, and of each queue only
the records past its last unit (what a re-dispatch writes) are kept. A lying unit, ext queues,
overlapping segment files or a later step that needs the whole table (the index check, the broker's
outcome for a repaired queue) fall back to ``record_table``, built lazily: the answers are the same.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats.records import CQ_FILLER, CQ_UNIT_SIZE, TRANSACTION_COMMIT, TRANSACTION_NOT

from ..arrays import queue_key
from ..derived.lmq import MultiDispatchRule, record_targets
from .derived import QueueVerdict, RecordTable, in_file_order, record_table, table_of_reports, tail_redispatch
from ..verify.commitlog import first_windows, grouped_windows, holding_window, iter_segment_windows, window_starts
from .lmqtails import NamedUnits, collect_lmq_tails
from .windowunits import WindowUnits


class LazyRecordTable:
    """``derived.RecordTable`` built on first use; the checkpoint's times come from the windowed pass."""

    def __init__(self, store, end: int, count: int, newest: int | None, newest_cq: int):
        self.store, self.end = store, end
        self._times = (count, newest, newest_cq)
        self._full = None

    def times(self) -> tuple:
        return self._times

    @property
    def per_index_file(self) -> bool:
        """The index check may run per index file in verify's windows (no whole table built yet)."""
        return self._full is None

    def __getattr__(self, name):  # recs, reports, queue_records: the whole table
        if name.startswith("_"):
            raise AttributeError(name)
        if self._full is None:
            self._full = record_table(self.store, self.end)
        return getattr(self._full, name)


class _Lie(Exception):
    """A unit disagrees with its record: the whole table decides (derived.check_queue)."""


def _queue_files(qs):
    """(queue offset of the first unit, units, segment) of each file the broker's recovery keeps (as
    derived_plan._queue_units), one file at a time: the caller keeps no view of a file it is done with."""
    from .probes import queue_file_units

    pos = None
    for seg in qs.segments:
        if seg.start >= qs.end or (pos is not None and seg.start != pos):
            break
        arr = queue_file_units(seg, qs.file_size)
        n = min(len(arr), (qs.end - seg.start) // CQ_UNIT_SIZE)
        yield seg.start // CQ_UNIT_SIZE, arr[:n], seg
        pos = seg.start + qs.file_size


def windowed_verdicts(planner) -> dict | None:
    """{(topic, queueId): (QueueVerdict, broker end, broker maxPhysicOffset)} as ``check_derived`` finds
    them, and ``planner.record_table`` set lazily; None when only the whole table can say (then nothing
    is changed). ``planner.jobs`` > 1: whole segments checked by that many forked workers, merged here in log order."""
    jobs = getattr(planner, "jobs", 1)
    check = WindowedCheck.start(planner)
    if check is None:
        return None
    if jobs > 1 and len(check.segs) > 1:
        return check.run_parallel(jobs)
    for k, lo, hi, t in _window_tables(planner.store, check.segs, check.wbounds, check.limits, planner.end):
        if not check.window(k, lo, hi, t):
            return None
    return check.finish()


class WindowedCheck:
    """The windowed derived check fed one window's records at a time, by its own walk
    (:func:`windowed_verdicts`) or by another pass over verify's window reports (:meth:`report`:
    recovery's verify of the store before the apply, so the log is walked once for both)."""

    def __init__(self, planner, segs, limits, wbounds, queues, kept, group=None):
        self.planner, self.segs, self.limits, self.wbounds, self.queues = planner, segs, limits, wbounds, queues
        self.group = group  # grouped windows: the window holding each of verify's (verify.commitlog.grouped_windows)
        self._pending: list = []  # the reports of the window being gathered (a window of several segments)
        self.kept = kept  # the queues' kept units, by window (windowunits.WindowUnits)
        self.topic_index: dict = {}  # topic -> its number, of every queue with files
        for t, _ in queues:
            self.topic_index.setdefault(t, len(self.topic_index))
        self.topic_of_key = np.asarray([self.topic_index[t] for t, _ in kept.keys], np.int64)
        self.qid_of_key = np.asarray([q for _, q in kept.keys], np.int64)
        # each queue with files: (topic number << 32 | queue id), sorted, and the queue offset its units end at
        ends = sorted((queue_key(self.topic_index[t], q), qs.max_offset) for (t, q), (qs, _, _, _) in queues.items())
        self.end_keys = np.asarray([k for k, _ in ends], np.int64)
        self.end_offsets = np.asarray([v for _, v in ends], np.int64)
        self.tails: dict = {}  # key -> list of (phy, size, queueOffset) of records at or past the queue's end
        self.count, self.newest, self.newest_cq = 0, None, 0
        self.lied = False
        self.invalid_seen = False  # a fed report held an invalid record before the recovered end
        self.multi_dispatch = MultiDispatchRule(planner.cfg)
        self.lmq_checked = self.multi_dispatch.enabled and MultiDispatchRule.checked(planner.cfg)

    @classmethod
    def start(cls, planner, grouped: bool = False) -> "WindowedCheck | None":
        """``grouped``: runs of small segments share a window (only when fed by verify's walk in one process,
        :meth:`report`; a ``-j`` worker takes whole segments)."""
        store, end = planner.store, planner.end
        if planner.cfg.enableConsumeQueueExt:
            return None  # ext units: the whole table decides
        cl = store.commitlog
        segs = [s for s in cl.segments.segments if s.start < end]
        if any(a.start + a.size > b.start for a, b in zip(segs, segs[1:])):
            return None
        bounds = np.asarray([s.start for s in segs], np.int64)
        limits = np.asarray([min(s.start + s.size, end) for s in segs], np.int64)
        wbounds, group = grouped_windows(segs, cl.segments.file_size) if grouped else (_window_bounds(cl, segs), None)
        # Per queue with files: its units per file, where the first real unit is (pre-blank fillers before it,
        # §7.3), and which windows each file's units point into.
        queues = {}
        kept = WindowUnits(wbounds)
        for key, qs in planner.queues.items():
            if not qs.segments:
                continue
            first_real, last_unit, max_real = None, None, None
            for first, units, seg in _queue_files(qs):
                phy = units["phyOffset"].astype(np.int64)
                first_real, real = real_units(first, units, phy, first_real)
                if len(bounds):
                    behind = real < bounds[0]
                    if behind.any():
                        if (real < 0).any():
                            return None  # a negative phyOffset is no record the cleaner deleted: CQ_NO_RECORD
                        real = real[~behind]  # behind the commitlog's first file: deleted by the cleaner
                span = window_span(real, bounds, limits, wbounds)
                if span is None:
                    return None  # a unit points where no segment of the recovered log is: CQ_NO_RECORD
                kept.add(key, first, units, phy, first_real, span, source=(seg, qs.file_size))
                if len(units):
                    last_unit = (int(units["phyOffset"][-1]), int(units["size"][-1]))
                if first_real is not None and len(phy) > first_real - first:
                    top = int(phy[max(0, first_real - first):].max())
                    max_real = top if max_real is None else max(max_real, top)
                del units, phy, real
            # (its files' state, the last unit's (phyOffset, size), the first real unit, the highest real phyOffset)
            queues[key] = (qs, last_unit, first_real, max_real)
        kept.done()
        return cls(planner, segs, limits, wbounds, queues, kept, group)

    def report(self, rep) -> None:
        """One of verify's window reports (log order, every window of the log): its records inside the
        recovered log are checked as :func:`_window_tables` would give them. The report is left whole for
        verify (its columns are copied, not consumed). Only a pass without CRC reads the same records as
        the windowed walk: a report with an invalid record before the recovered end sets ``invalid_seen``
        (the caller walks again without CRC)."""
        import copy

        if any(o < self.planner.end for o in rep.invalid):
            self.invalid_seen = True  # past the recovered end both passes' records are cut away
        if self.lied or self.invalid_seen or rep.segment >= len(self.segs):
            return
        mine = copy.copy(rep)
        mine.cols = dict(rep.cols)
        self._pending.append(mine)
        if holding_window(self.group, rep.index)[1]:
            self._check_pending()

    def _check_pending(self) -> None:
        """The window whose reports :meth:`report` gathered, checked."""
        reports, self._pending = self._pending, []
        first, i = reports[0], reports[-1].segment
        k = holding_window(self.group, first.index)[0]
        hi = min(int(self.wbounds[k + 1]) if k + 1 < len(self.wbounds) else self.planner.end, int(self.limits[i]))
        t = table_of_reports(self.planner.store, reports, self.planner.end)
        self.window(k, first.window_start, hi, t.recs)

    def window(self, k: int, lo: int, hi: int, t) -> bool:
        """Window ``k``'s records [lo, hi) (cut at the recovered end); False once a unit lies."""
        if self.lied:
            return False
        c = t.c
        n = len(t)
        self.count += n
        if n:
            ts = c["storeTimestamp"]
            self.newest = int(ts.max()) if self.newest is None else max(self.newest, int(ts.max()))
        tran = c["sysFlag"] & 0xC
        disp = (tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)
        if disp.any():
            self.newest_cq = max(self.newest_cq, int(c["storeTimestamp"][disp].max()))
        _collect_tails(t, disp, self, self.tails)
        named = None  # the window's multi-dispatch units (§14.3)
        if self.lmq_checked and n:
            lt = record_targets(self.planner.store, t, self.multi_dispatch)
            if len(lt):
                named = collect_lmq_tails(t, disp, lt, self.queues, self.tails)
        tid_of = np.full(len(self.topic_index) + 1, -2, np.int64)  # the window's topic ids of the queues' topics
        for name, tid in t.topic_ids.items():
            j = self.topic_index.get(name)
            if j is not None:
                tid_of[j] = tid
        try:
            for units, which, pos in self.kept.runs(k, CHECK_UNITS):
                _check_units(t, self, units, which, pos, tid_of, lo, hi, named)
        except _Lie:
            self.lied = True
            return False
        return True

    def run_parallel(self, jobs: int) -> dict | None:
        """The windows of every segment checked by ``jobs`` forked workers, each segment from a fresh start (the
        checks of a window need nothing of the windows before it); what each adds is folded in here in log order."""
        from rmqstore_cli.formats.warmup import warm_up

        from ..parallel import stream_segments

        warm_up()
        stream = stream_segments(_segment_partial, len(self.segs), jobs, self)
        try:
            for count, newest, newest_cq, tails, lied in stream:
                if lied:
                    self.lied = True
                    return None
                self.add_segment(count, newest, newest_cq, tails)
        finally:
            stream.close()
        return self.finish()

    def add_segment(self, count: int, newest, newest_cq: int, tails: dict) -> None:
        """Folds in what one segment's windows added, checked from a fresh start in a worker (segments in log order)."""
        self.count += count
        if newest is not None:
            self.newest = newest if self.newest is None else max(self.newest, newest)
        self.newest_cq = max(self.newest_cq, newest_cq)
        for key, parts in tails.items():
            self.tails.setdefault(key, []).extend(parts)

    def finish(self) -> dict | None:
        """The verdicts (``windowed_verdicts``'s answer), or None after a lying unit."""
        if self._pending and not (self.lied or self.invalid_seen):
            self._check_pending()  # a window whose last report did not come (the walk yields every one: not expected)
        if self.lied:
            return None
        planner = self.planner
        planner.record_table = LazyRecordTable(planner.store, planner.end, self.count, self.newest, self.newest_cq)
        return _verdicts(planner, self.queues, self.tails)


class FedByVerify:
    """A :class:`WindowedCheck` fed by ``verify -j``'s workers in their walk (``WindowChecks``' ``extra``), as one
    process feeds it verify's window reports (derived_plan._verify_along): each worker checks the windows of its
    segments from a fresh start, as :func:`_segment_partial` does, and sends what they add; this process folds the
    segments in in log order (:meth:`WindowedCheck.run_parallel`'s merge). :meth:`verdicts` is None when the walk
    cannot say (a segment not fed, an invalid record before the recovered end: verify's CRC walk read other records
    than the check's own walk would; a lying unit): the caller then runs the check's own walk."""

    def __init__(self, check: WindowedCheck):
        self.check = check
        self.merged: set = set()
        self.bad = False

    # -- in a worker (a forked copy of this object and its check) --

    def window(self, rep) -> None:
        self.check.report(rep)

    def segment_result(self, i: int):
        c = self.check
        out = (c.count, c.newest, c.newest_cq, c.tails, c.lied or c.invalid_seen)
        c.count, c.newest, c.newest_cq, c.tails, c.lied, c.invalid_seen = 0, None, 0, {}, False, False
        return out

    # -- here --

    def merge(self, i: int, part) -> None:
        if part is None or self.bad:
            self.bad = True
            return
        count, newest, newest_cq, tails, bad = part
        if bad:
            self.bad = True
            return
        self.merged.add(i)
        self.check.add_segment(count, newest, newest_cq, tails)

    def verdicts(self) -> dict | None:
        """The check's answer, when every segment of the recovered log was fed and nothing needs another walk."""
        if self.bad or not self.merged.issuperset(range(len(self.check.segs))):
            return None
        return self.check.finish()


def real_units(first: int, units: np.ndarray, phy: np.ndarray, first_real: int | None) -> tuple:
    """(the queue's first real unit, phyOffsets of this file's real units) of a file whose unit 0 is queue offset
    ``first``, given ``first_real`` of the queue's earlier files (None: only pre-blank fillers so far, §7.3)."""
    if first_real is None:
        if len(units) and tuple(units[0].tolist()) != CQ_FILLER:
            first_real = first  # the usual queue: no filler at its start; no pass over its units
        else:
            filler = (phy == CQ_FILLER[0]) & (units["size"] == CQ_FILLER[1]) & (units["tagsCode"] == CQ_FILLER[2])
            nf = np.flatnonzero(~filler)
            if not len(nf):
                return None, phy[:0]
            first_real = first + int(nf[0])
    return first_real, phy[first_real - first:] if first_real > first else phy


def window_span(real: np.ndarray, bounds: np.ndarray, limits: np.ndarray, wbounds: np.ndarray) -> tuple | None:
    """(first, last) window number the phyOffsets ``real`` point into (window k: [wbounds[k], wbounds[k + 1])), ()
    when ``real`` is empty, or None when one points where no segment is (segment k: [bounds[k], limits[k])).
    ``real`` holds nothing before ``bounds[0]``. Rising offsets (a queue is written in log order) are placed by
    binary searches of the few segment bounds in them, and only their first and last unit in the windows: a 1 TB
    log has ~16,000 windows, and a broker thousands of queue files."""
    n = len(real)
    if not n:
        return ()
    if not len(bounds):
        return None
    if n > 1 and not (real[1:] < real[:-1]).any():
        ends = real[[0, -1]]
        k = np.searchsorted(bounds, ends, side="right") - 1
        if k[0] == k[1]:  # one segment holds the first unit and the last: is the last before its limit
            if ends[1] >= limits[k[1]]:
                return None
        else:
            after = np.append(bounds[1:], np.iinfo(np.int64).max)
            if (np.searchsorted(real, after) > np.searchsorted(real, limits)).any():
                return None  # some unit lies in [limits[k], bounds[k + 1]): past a segment's end
        w = np.searchsorted(wbounds, ends, side="right") - 1
        return int(w[0]), int(w[1])
    w = np.searchsorted(bounds, real, side="right") - 1
    if not ((w >= 0) & (real < limits[np.maximum(w, 0)])).all():
        return None
    w = np.searchsorted(wbounds, real, side="right") - 1
    return int(w.min()), int(w.max())


def _window_bounds(cl, segs: list) -> np.ndarray:
    """Start offsets of the windows of ``segs`` (a prefix of the log's segments: numbered as verify numbers them)."""
    parts = [window_starts(s, cl.segments.file_size) for s in segs]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _window_tables(store, segs: list, wbounds: np.ndarray, limits: np.ndarray, end: int, only: int | None = None):
    """(window number, lo, hi, records) of each window of ``segs`` (or of segment ``only``), one at a time:
    verify's records of the window (no CRC) cut at ``end``; [lo, hi) its offsets inside the recovered log."""
    cl = store.commitlog
    firsts = first_windows(cl)
    for i in range(len(segs)) if only is None else (only,):
        for rep in iter_segment_windows(cl, i, check_crc=False, first_window=firsts[i]):
            k = rep.index
            hi = min(int(wbounds[k + 1]) if k + 1 < len(wbounds) else end, int(limits[i]))
            t = table_of_reports(store, [rep], end)
            yield k, rep.window_start, hi, t.recs
            del t, rep


def _segment_partial(i: int, check: WindowedCheck):
    """In a ``-j`` worker (a forked copy of ``check``): segment ``i``'s windows from a fresh start; one item, what
    they add (records, newest store times, the queues' tails) or that a unit lies."""
    check.count, check.newest, check.newest_cq, check.tails, check.lied = 0, None, 0, {}, False
    p = check.planner
    for k, lo, hi, t in _window_tables(p.store, check.segs, check.wbounds, check.limits, p.end, only=i):
        if not check.window(k, lo, hi, t):
            break
    yield check.count, check.newest, check.newest_cq, check.tails, check.lied


CHECK_UNITS = 1 << 16  # units tested together by _check_units at most (their columns: a few MB), past one file's


def _check_units(t, check, units: np.ndarray, which: np.ndarray, pos: np.ndarray, tid_of: np.ndarray, lo: int, hi: int,
                 named: "NamedUnits | None") -> None:
    """derived.check_queue's unit tests (record at phyOffset; size, topic, queue, QUEUEOFFSET, transaction
    type, tagsCode) on the real units among ``units`` that point into [lo, hi); raises _Lie on the first miss.
    ``which``: each unit's file in ``check.kept``, ``pos`` its queue offset; ``tid_of``: the window's topic id of
    each of the queues' topics. ``named``: the multi-dispatch units the window's records give (:class:`.lmqtails.NamedUnits`),
    or None. A window's units of every queue are tested together: a broker's thousands of queues hold a
    few units each per window."""
    e = check.kept.e
    phy = units["phyOffset"].astype(np.int64)
    sel = np.flatnonzero((pos >= e["first_real"][which]) & (phy >= lo) & (phy < hi))
    if not len(sel):
        return
    which, phy, pos = which[sel], phy[sel], pos[sel]
    size = units["size"][sel].astype(np.int64)
    tags = units["tagsCode"][sel].astype(np.int64)
    idx, found = t.lookup(phy)
    if not found.all():
        raise _Lie
    c = t.c
    tran = c["sysFlag"][idx] & 0xC
    key = e["key"][which]
    own = ((c["topic"][idx] == tid_of[check.topic_of_key[key]]) & (c["queueId"][idx] == check.qid_of_key[key])
           & (c["queueOffset"][idx] == pos))
    if named is not None and len(named):
        j = np.flatnonzero(~own)
        if len(j):
            queues, at = np.unique(key[j], return_inverse=True)
            target = np.asarray([named.key(check.kept.keys[q]) for q in queues.tolist()], np.int64)[at.ravel()]
            own[j] = named.holds(target, idx[j].astype(np.int64), pos[j].astype(np.int64))
    ok = ((c["size"][idx] == size) & own & ((tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT))
          & (c["tagsBad"][idx] | (c["tagsCode"][idx] == tags)))
    if not ok.all():
        raise _Lie


def _collect_tails(t, disp: np.ndarray, check, tails: dict) -> None:
    """Of each queue, the dispatchable records a re-dispatch would write: QUEUEOFFSET at or past the
    queue's end (every record of a queue without files). Each record's queue end is found by one search of
    ``check``'s table of queue ends: Python only for the queues that get records."""
    c = t.c
    rows = np.flatnonzero(disp)
    if not len(rows):
        return
    tid, qid = c["topic"][rows].astype(np.int64), c["queueId"][rows].astype(np.int64)
    qo = c["queueOffset"][rows].astype(np.int64)
    if len(check.end_keys):
        number = np.fromiter((check.topic_index.get(name, -1) for name in t.topics), np.int64, len(t.topics))[tid]
        key = queue_key(number, qid)
        j = np.minimum(np.searchsorted(check.end_keys, key), len(check.end_keys) - 1)
        held = (number >= 0) & (check.end_keys[j] == key) & (qo < check.end_offsets[j])  # its unit exists
        rows, tid, qid, qo = rows[~held], tid[~held], qid[~held], qo[~held]
        if not len(rows):
            return
    pair = queue_key(tid, qid)
    order = np.argsort(pair, kind="stable")  # each queue's records together, in log order
    grouped = pair[order]
    cut = (np.flatnonzero(grouped[1:] != grouped[:-1]) + 1).tolist()
    for a, b in zip([0] + cut, cut + [len(order)]):
        g = order[a:b]
        r = rows[g]
        tails.setdefault((t.topics[int(grouped[a]) >> 32], int(qid[g[0]])), []).append(
            (t.phy[r], c["size"][r].astype(np.int64), qo[g]))


def _verdicts(planner, queues: dict, tails: dict) -> dict:
    out = {}
    cat = lambda parts, j: np.concatenate([p[j] for p in parts]) if parts else np.zeros(0, np.int64)  # noqa: E731
    batch = planner.store.batch_topics()
    for key in sorted(set(planner.queues) | set(tails)):
        t, q = key
        if t in batch and key not in planner.queues:
            continue  # a batch queue's records: batchrecovery.py
        parts = tails.get(key, [])
        phy, size, qo = cat(parts, 0), cat(parts, 1), cat(parts, 2)
        if len(phy) > 1 and (np.diff(phy) < 0).any():  # a queue fed by its own records and by multi-dispatch
            order = np.argsort(phy, kind="stable")
            phy, size, qo = phy[order], size[order], qo[order]
        qs = planner.queues.get(key)
        if key in queues:
            _, last_unit, first_real, _ = queues[key]
            cut, last_end = qs.max_offset, -1
            if first_real is not None and last_unit is not None:  # the last unit is real: its record's end
                last_end = last_unit[0] + last_unit[1]
            broker = (qs.max_offset, qs.max_physic)
        else:
            cut = int(qo.min()) if len(qo) else 0
            if qs is not None:
                cut = max(cut, qs.end // CQ_UNIT_SIZE) if qs.end else cut
            last_end, broker = -1, (cut, -1)
            keep = qo >= cut
            phy, size, qo = phy[keep], size[keep], qo[keep]
        if not len(qo):
            continue
        redispatch, contiguous = tail_redispatch(qo, phy, size, cut, last_end)
        out[key] = (QueueVerdict(t, q, cut, None, "", redispatch, len(qo), contiguous, None, last_end, 0), *broker)
    return out


def index_problems_by_file(store, end: int, files: list) -> list:
    """``index_problems``, each kept index file checked as verify checks it in windows
    (:class:`..verify.windows.IndexWindows`): its entries routed to the commitlog windows they point into, each
    window's records read (no CRC, cut at ``end``) and dropped in turn. No table of the records a file points at
    is built, so memory follows a window, not the log or the file's span (a 400 MB index file over a 1 GiB
    segment of small messages pointed at ~1 GB of record columns)."""
    from ..verify.records import _Records, _RefClassifier
    from ..verify.windows import IndexWindows, Windows

    cl = store.commitlog
    segs = [s for s in cl.segments.segments if s.start < end]
    windows = Windows(cl)
    firsts = first_windows(cl)
    walked = firsts[len(segs)]  # windows of the recovered log's segments; later ones hold no record before end
    found: list = []
    for f in files:
        if not f.complete:
            continue
        ix = IndexWindows(f, windows)
        hit = set()
        for _a, _b, lo, hi in ix.reach:
            hit.update(range(lo, hi + 1))
        tails = []  # each walked segment's last report: its invalid records and unread rest
        hit_segs = set((np.searchsorted(firsts, sorted(hit), side="right") - 1).tolist())
        for i in range(len(segs)):
            if i not in hit_segs:
                continue
            for rep in iter_segment_windows(cl, i, check_crc=False, first_window=firsts[i]):
                if rep.last:
                    tails.append(rep)
                if rep.index in hit:
                    ix.window(rep.index, windows, table_of_reports(store, [rep], end).recs)
                rep.cols = {}
                del rep
        for w in sorted(x for x in hit if x >= walked):
            ix.window(w, windows, _Records(store, []))
        no_records = _Records(store, [])
        no_records.invalid = np.asarray(sorted(o for r in tails for o in r.invalid if o < end), dtype=np.int64)
        ix.finish(_RefClassifier(no_records, tails, cl, end), found)
        del ix, tails
    return in_file_order([x for x in found if x.severity in ("error", "warning")], files)


def index_problems(store, table: RecordTable, files: list) -> list:
    """verify's index checks (§10) on ``files`` against the recovered log: error/warning findings."""
    from ..verify.index import _check_index
    from ..verify.records import _RefClassifier

    if not files:
        return []
    if getattr(table, "per_index_file", False):  # derived_windows: each file in verify's windows
        return index_problems_by_file(store, table.end, files)
    refs = _RefClassifier(table.recs, table.reports, store.commitlog, table.end)
    found: list = []
    _check_index(store, table.recs, refs, found, {}, files=files)
    return in_file_order([f for f in found if f.severity in ("error", "warning")], files)
