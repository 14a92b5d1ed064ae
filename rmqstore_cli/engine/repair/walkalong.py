"""The broker's recovery walk read off verify's walk of the log (``recover`` in one process).

``recover`` verifies the store as it is (the plan's assessment), walks the log as the broker's recovery does
(§13.4: its stop, the records it re-dispatches) and checks the consume queues against the recovered log
(derived_windows.WindowedCheck). The three read every record. When the log is what a crash usually leaves —
every segment the broker walks ends with a BLANK up to one whose data ends (zeros, the end of the file), and
no record fails verify's checks — verify's window reports hold exactly the records the broker's walk accepts:
the walk's tally and its dispatch prediction are taken from them, and the derived-file check runs on the same
reports, assuming the recovered end is where the data ends. The broker's own step then reads only the stop
(:func:`..log.walk.broker_walk` from the position verify's records end at).

Whenever the reports do not prove the broker's walk gives the same answer (a record verify rejects, a magic v2
record under 4.9 rules, records after the stop, a queue changed or a unit past the end by a later step), nothing
of the fused answer is used: the planner walks as before (``recovery.Planner``), with the same plan.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.records import MAGIC_V1

from ..arrays import queue_key, queue_of_key
from ..derived.dispatchcolumns import VerifyTopicIds
from ..derived.dispatchpredict import DispatchPrediction
from ..derived.lmq import MultiDispatchRule, RowTopics, chunk_targets
from ..log.walk import LogTally, WalkStop, broker_walk, cq_dispatched, lenient_records


def walk_sinks(planner, start: int, lenient: bool = True):
    """(tally, prediction or None, sink) of the recovery walk from segment ``start``: the tally already holds the
    records before it (``lenient``: ``lenient_records``, ours, unless ``broker_only``); the prediction is made on an
    abnormal start (every walked record is re-dispatched) and kept as ``planner.early_prediction``."""
    tally = LogTally()
    if lenient and not planner.broker_only:  # ours: the records before the walk, for the derived files' checks and times
        lenient_records(planner.cl_segments, start, tally)
    planner.early_prediction = None
    if planner.plan.last_exit_ok or planner.broker_only:
        return tally, None, tally
    # The consume-queue puts are predicted in this walk, from the queues as they are now; Planner._dispatch uses it
    # when its range and the queues turn out the same (else it walks the log again for them).
    from .batchrecovery import batch_queue_state

    qstate = planner._queue_state()
    pred = DispatchPrediction(qstate, MultiDispatchRule(planner.cfg), batch_queue_state(planner),
                              planner.store.batch_topics())
    planner.early_prediction = (pred, {k: list(v) for k, v in qstate.items()},
                                {k: list(v) for k, v in pred.batch_state.items()})

    def sink(seg_start, buf, h, tally=tally, pred=pred):
        tally(seg_start, buf, h)
        pred(seg_start, buf, h)
    return tally, pred, sink


class _LiveRecords:
    """DispatchPrediction's walk sink, handed only the records the put rules can act on: a record whose own unit is
    already there (it ends at or before its queue's maxPhysicOffset as the prediction holds it now; that value only
    grows) is skipped by the rules (DispatchPrediction._queue) and changes nothing but the count, unless it has
    multi-dispatch units: a chunk with any goes to the prediction whole. A crash copy's queues usually hold every
    record already: the prediction then sorts nothing."""

    def __init__(self, pred: DispatchPrediction):
        self.pred = pred
        # queues seen (topic id << 32 | queueId, sorted) and their maxPhysicOffset when first seen: lower than or
        # equal to the prediction's (it only grows), so a record found dead by it is dead there; a queue without
        # state then gets -2^62 (every record kept)
        self.keys = np.zeros(0, np.int64)
        self.maxp = np.zeros(0, np.int64)
        self._verify_ids = VerifyTopicIds()

    def __call__(self, seg_start: int, buf, h, topics=None) -> None:
        """``topics``: what verify's walk found for the chunk (verify.commitlog.ChunkTopics), or None."""
        pred = self.pred
        tid = self._topic_ids(buf, h, topics)
        key = queue_key(tid, h.queueId.astype(np.int64))
        at = np.searchsorted(self.keys, key)
        if not (at < len(self.keys)).all() or not (self.keys[np.minimum(at, len(self.keys) - 1)] == key).all():
            self._learn(np.setdiff1d(key, self.keys))
            at = np.searchsorted(self.keys, key)
        keep = cq_dispatched(h.sysFlag)
        live = keep & (h.offsets + seg_start + h.totalSize > self.maxp[at])
        if live.all() or self._multi_dispatched(buf, h, keep, tid, topics):
            pred(seg_start, buf, h, topics)
            return
        sub = h.select(live)
        pred.count += len(h) - len(sub)
        if len(sub):
            pred(seg_start, buf, sub)

    def _learn(self, new: np.ndarray) -> None:
        names = {v: n for n, v in self.pred.topics.items()}
        maxp = []
        for k in new.tolist():
            number, q = queue_of_key(k)
            st = self.pred.state.get((names[number], q))
            maxp.append(st[1] if st is not None else -(1 << 62))
        keys = np.concatenate([self.keys, new])
        order = np.argsort(keys, kind="stable")
        self.keys, self.maxp = keys[order], np.concatenate([self.maxp, np.asarray(maxp, np.int64)])[order]

    def _topic_ids(self, buf, h, topics) -> np.ndarray:
        """The records' topics as ids in the prediction's registry (dispatchcolumns.VerifyTopicIds)."""
        return self._verify_ids(buf, h, self.pred.topics, topics)

    def _multi_dispatched(self, buf, h, keep, tid, topics=None) -> bool:
        rule = self.pred.multi_dispatch
        if rule is None or not rule.enabled:
            return False
        if topics is not None and not topics.multi[keep].any():
            return False  # no record carries both multi-dispatch properties: no LMQ unit (lmq.chunk_targets)
        if not keep.all():
            h, tid = h.select(keep), tid[keep]
        names = {v: n for n, v in self.pred.topics.items()}
        return len(chunk_targets(rule, fast.kernel_view(buf), h, RowTopics(tid, names))) > 0


def walks_along(planner) -> bool:
    """Whether the plan's walks can be one in this process (see the module doc); else the planner walks as before."""
    return planner.jobs <= 1 and _can_walk_along(planner)


def walks_along_jobs(planner) -> bool:
    """Whether the plan's walks can be one ``-j`` walk (walkalongjobs.py: verify's workers run the window checks)."""
    from ..verify.pipeline import parallel_checks

    return (planner.jobs > 1 and len(planner.cl_segments) > 1 and parallel_checks(planner.store, planner.jobs)
            and _can_walk_along(planner))


def _can_walk_along(planner) -> bool:
    st, cfg = planner.store, planner.cfg
    if not planner.walk_along_allowed:
        return False
    segs = planner.cl_segments
    cl = st.commitlog.segments
    return (getattr(planner, "verify_along", False) and not planner.broker_only
            and planner.cut_at is None and bool(segs) and not getattr(st, "is_dledger", False)
            and st.rocksdb is None and not cl.problems
            and len(segs) == len(cl.segments) and all(a is b for a, b in zip(segs, cl.segments))
            and all(s.size == cl.file_size for s in segs)
            and all(a.start + a.size <= b.start for a, b in zip(segs, segs[1:]))
            and not (cfg.checkCRCOnRecover and planner.version >= 5 and cfg.forceVerifyPropCRC)
            and not st.batch_topics())


def queue_snapshot(planner) -> tuple:
    """What the derived check read of the queues: compared again before its answer is used."""
    return tuple((k, qs.end, qs.max_physic, tuple(s.path for s in qs.segments))
                 for k, qs in sorted(planner.queues.items()))


class WalkAlong:
    """verify's walk of the whole log, its window reports also read as the broker's recovery walk from segment
    ``start`` (records before it as ``lenient_records`` reads them) and fed to the derived check."""

    def __init__(self, planner, start: int):
        self.planner, self.start = planner, start
        self.segs = planner.cl_segments
        self.tally, self.pred, _ = walk_sinks(planner, start, lenient=False)
        self.live = _LiveRecords(self.pred) if self.pred is not None else None
        self.v1_only = planner.version < 5
        self.ok = True  # every report so far agrees with the broker's walk
        self.stop_seg: int | None = None  # segment the broker's walk ends in
        self.stop_pos = 0
        self.last_end: dict = {}  # segment -> position after its last record
        self.before = LogTally()  # the records of the segments before ``start`` (lenient_records)
        self.lenient_ok = True  # verify's records there are the ones lenient_records reads
        self.walk_first = 0  # how many of the tally's records come before the walk
        self.check = None
        self.snapshot = None
        self.stop: WalkStop | None = None
        self.after_stop = False  # verify's walk found records after the broker's stop
        self.spill = getattr(planner, "dispatch_spill", None)  # the records' dispatch columns kept for the apply

    def run(self) -> WalkStop | None:
        """Walk (verify's findings go to ``planner.verify_findings``); the broker's stop, or None when the reports do
        not prove it (the caller walks as the broker does)."""
        from ..verify.pipeline import verify_store
        from .derived_windows import WindowedCheck

        planner = self.planner
        last = self.segs[-1]
        planner.end = last.start + last.size  # the derived check's assumption: the log is recovered to its data end
        self.check = WindowedCheck.start(planner, grouped=True)  # fed by verify's walk in this process
        self.snapshot = queue_snapshot(planner)
        planner.verify_findings = verify_store(planner.store, reports=self._reports()).findings
        planner.walk_along = self
        return self._finish(True)

    def _finish(self, whole: bool) -> WalkStop | None:
        """After verify's walk: the broker's stop confirmed by its own walk, the kept columns judged (``whole``: every
        segment was read along), the tally joined to the records before the walk."""
        if self.ok and self.stop_seg is not None:
            self.stop = self._broker_stop()
        self._spill_done(whole)
        if self.stop is not None:
            if not self.lenient_ok:  # the records before the walk read again as lenient_records reads them
                self.before = LogTally()
                lenient_records(self.segs, self.start, self.before)
            self.walk_first = len(self.before)
            self.before.merge(self.tally)
            self.tally = self.before
        return self.stop

    def _spill_done(self, whole: bool) -> None:
        """The dispatch columns kept stand for the re-dispatch's scan when the broker's walk was read off verify's
        (its records are verify's up to the stop) and verify rejected no record before the walk's start file (the
        re-dispatch's scan reads without CRC; dispatchspill.py)."""
        if self.spill is not None:
            self.spill.finish()
            self.spill.usable = whole and self.stop is not None and self.lenient_ok

    def _reports(self):
        from ..verify.commitlog import iter_windows

        check = self.check
        for rep in iter_windows(self.planner.store.commitlog, chunk_sink=self._chunk):
            if rep.last and self.spill is not None:
                self.spill.keep_outcome(rep)  # before the checks read it
            if self.ok and rep.last:
                self._segment_end(rep)
            if check is not None:
                check.report(rep)
            yield rep

    def _chunk(self, i: int, seg, buf, h, topics=None) -> None:
        """A chunk of valid records of segment ``i``, as verify's walk decodes it (before the segment's reports), with
        what its property pass found (``topics``: verify.commitlog.ChunkTopics)."""
        if self.spill is not None:
            self.spill.add(seg, h, topics)
        if not self.ok:
            return
        if seg is not self.segs[i]:
            self.ok = False
            return
        if self.stop_seg is not None:
            self.after_stop = True  # verify reads on past the broker's stop; the derived check's reports hold these
            return
        if i < self.start and not self.lenient_ok:
            return
        if int(h.offsets[0]) != self.last_end.get(i, 0):  # verify skipped an invalid record: the broker stops there
            if i < self.start:
                self.lenient_ok = False  # lenient_records reads without CRC: its records are not verify's
                return
            self._stop_at(i)
            self.after_stop = True
            return
        if i < self.start:
            self.before(seg.start, buf, h)
        elif self.v1_only and (h.magicCode != MAGIC_V1).any():
            self.ok = False  # 4.9's walk stops at a magic v2 record, verify reads on
            return
        else:
            self.tally(seg.start, buf, h)
            if self.live is not None:
                self.live(seg.start, buf, h, topics)
        self.last_end[i] = int(h.offsets[-1]) + int(h.totalSize[-1])

    def _segment_end(self, rep) -> None:
        """Segment ``rep.segment`` walked (its last report): where the broker's walk goes on or ends."""
        i = rep.segment
        if self.stop_seg is not None:
            return
        if rep.invalid and i < self.start:
            self.lenient_ok = False
        elif rep.invalid and rep.invalid[0] != rep.start + self.last_end.get(i, 0):
            self.ok = False
        elif i >= self.start and (rep.invalid or not (rep.ended_with_blank and i + 1 < len(self.segs))):
            self._stop_at(i)

    def _stop_at(self, i: int) -> None:
        """The broker's walk ends in segment ``i`` after the records read so far: the derived check's reports from
        now on are cut there (they hold no record after it unless ``after_stop``)."""
        self.stop_seg, self.stop_pos = i, self.last_end.get(i, 0)
        self.planner.end = self.segs[i].start + self.stop_pos

    def _broker_stop(self) -> WalkStop | None:
        """The broker's walk resumed where verify's records of the stop segment end: it must find no record there."""
        p = self.planner
        found = [0]

        def count(seg_start, buf, h):
            found[0] += len(h)

        stop = broker_walk(self.segs, p.cfg, p.version, self.stop_seg, p.cfg.checkCRCOnRecover, count,
                           start_position=self.stop_pos)
        if found[0] or stop.segment_index != self.stop_seg or stop.position != self.stop_pos:
            return None
        return stop

    def check_holds(self) -> bool:
        """Whether the derived check fed by this walk answers for the recovered log (``derived_plan._verify_along``):
        the broker's walk ended where the check assumed (the data's end), the queues are as it read them and no
        unit points past the end; else the check walks on its own."""
        planner, check = self.planner, self.check
        return (check is not None and self.stop is not None and not self.after_stop and not check.invalid_seen
                and not check.lied and self.stop.offset == planner.end and queue_snapshot(planner) == self.snapshot
                and _units_before(check, planner.end))


def _units_before(check, end: int) -> bool:
    """Every real unit the check read points before ``end`` (units behind the log's first file do: it starts at or
    before ``end``): then ``WindowedCheck.start`` with the recovered end takes the same units and windows."""
    return all(top is None or top < end for _qs, _last, _first, top in check.queues.values())
