"""``recover -j``: the broker's recovery walk read off ``verify -j``'s walk of the log, as :mod:`.walkalong` reads it
off verify's walk in one process.

verify's ``-j`` workers walk whole segments (records never cross one) and already feed the derived-file check
(derived_windows.FedByVerify). Here they also gather, per segment, what walkalong.WalkAlong gathers from the
same records: the walk's tally, the inputs of the consume-queue put prediction (recoveryjobs._PredictionInputs:
only the records a queue does not hold yet), where the segment's valid records end and whether verify skipped an
invalid record. This process folds the segments in in log order with WalkAlong's rules and finds the broker's stop
(confirmed by the broker's own walk from there, as WalkAlong does). Whenever they cannot prove the broker's walk
gives the same answer, nothing of it is used: the planner walks as before (recoveryjobs.broker_walk_jobs), with
the same plan. So ``recover -j`` walks the log once for verify, the broker's walk and the derived check, as
``recover`` in one process does.
"""

from __future__ import annotations

from rmqstore_cli.formats.records import MAGIC_V1

from ..log.walk import LogTally
from .recoveryjobs import _PredictionInputs, _feed
from .walkalong import WalkAlong, _units_before, queue_snapshot

# Prediction inputs a worker may hold for one segment before the walk along gives up (the planner then walks as
# before): a crash copy's queues usually hold nearly every record, so few are held; 5 int64 columns a record.
MAX_HELD = 1 << 21


class _SegmentPart:
    """What a worker's walk along found in one segment."""

    __slots__ = ("tally", "inputs", "last_end", "records", "gap", "bad", "invalid", "blank", "start")

    def __init__(self):
        self.tally = LogTally()
        self.inputs = None
        self.last_end = 0  # position after the segment's last valid record before any gap
        self.records = 0  # valid records verify read in the segment (after a gap too)
        self.gap = False  # verify skipped an invalid record (the broker's walk stops there)
        self.bad = False  # the reports cannot stand for the broker's walk (a magic v2 record under 4.9 rules, ...)
        self.invalid = None  # the segment report's first invalid record (absolute offset), if any
        self.blank = False  # the segment ended with a BLANK
        self.start = 0


class _Along:
    """verify's ``-j`` extra (WindowChecks): the derived check's feed (FedByVerify, if any) plus the walk along."""

    def __init__(self, walk: "WalkAlongJobs", fed):
        self.walk, self.fed = walk, fed
        self.chunk = self._chunk  # iter_segment_windows' chunk_sink in the workers
        self._parts: dict = {}
        self._coll = None

    # -- in a worker --

    def _part(self, i: int) -> _SegmentPart:
        p = self._parts.get(i)
        if p is None:
            p = self._parts[i] = _SegmentPart()
            w = self.walk
            self._coll = _PredictionInputs(w.pred) if w.pred is not None and i >= w.start else None
        return p

    def _chunk(self, i: int, seg, buf, h, topics=None) -> None:
        w, p = self.walk, self._part(i)
        if w.spill is not None:
            w.spill.add(seg, h, topics)
        p.records += len(h)
        if p.gap or p.bad:
            return
        if seg is not w.segs[i]:
            p.bad = True
            return
        if int(h.offsets[0]) != p.last_end:  # verify skipped an invalid record: the broker's walk stops there
            p.gap = True
            return
        if i >= w.start and w.v1_only and (h.magicCode != MAGIC_V1).any():
            p.bad = True  # 4.9's walk stops at a magic v2 record, verify reads on
            return
        p.tally(seg.start, buf, h)
        if self._coll is not None:
            self._coll(seg.start, buf, h, topics)
            if self._coll.held > MAX_HELD:
                p.bad = True
                return
        p.last_end = int(h.offsets[-1]) + int(h.totalSize[-1])

    def window(self, rep) -> None:
        if self.fed is not None:
            self.fed.window(rep)
        if rep.last:
            if self.walk.spill is not None:
                self.walk.spill.keep_outcome(rep)  # before the checks read it
            p = self._part(rep.segment)
            p.invalid = rep.invalid[0] if rep.invalid else None
            p.blank, p.start = bool(rep.ended_with_blank), rep.start

    def segment_result(self, i: int):
        p = self._part(i)
        if self._coll is not None:
            p.inputs = self._coll.take()
        self._parts.pop(i, None)
        self._coll = None
        w = self.walk
        spilled = w.spill.finish_segment(w.segs[i].start) if w.spill is not None else None
        return (self.fed.segment_result(i) if self.fed is not None else None, p, spilled)

    # -- here --

    def merge(self, i: int, part) -> None:
        fed_part, p, spilled = part
        if self.fed is not None:
            self.fed.merge(i, fed_part)
        w = self.walk
        if spilled is not None and w.spill is not None:
            w.spill.merge_segment(w.segs[i].start, spilled)
            w.spill.segment_ids = True  # a worker's walk numbers each segment's topics on its own
        w.merge(i, p)


class WalkAlongJobs(WalkAlong):
    """verify's ``-j`` walk of the whole log, its workers' segment results also read as the broker's recovery walk
    from segment ``start`` and fed to the derived check (the same decisions as :class:`WalkAlong`)."""

    def __init__(self, planner, start: int):
        super().__init__(planner, start)
        self.live = None  # the prediction's put rules run here, on the records the workers send (_PredictionInputs)
        self.fed = None
        self.merged = 0  # segments folded in, in order

    def run(self):
        from ..verify.pipeline import verify_store_jobs
        from .derived_windows import FedByVerify, WindowedCheck

        planner = self.planner
        last = self.segs[-1]
        planner.end = last.start + last.size  # the derived check's assumption, as WalkAlong makes it
        self.check = WindowedCheck.start(planner)
        self.snapshot = queue_snapshot(planner)
        self.fed = FedByVerify(self.check) if self.check is not None and len(self.check.segs) > 1 else None
        planner.verify_findings = verify_store_jobs(planner.store, planner.jobs, extra=_Along(self, self.fed)).findings
        planner.walk_along = self
        if self.merged != len(self.segs):  # verify's workers did not run the window checks (or not on every segment)
            self.ok = False
        return self._finish(self.merged == len(self.segs))

    def merge(self, i: int, p: _SegmentPart) -> None:
        """Segment ``i``'s part, in log order: WalkAlong's per-chunk and segment-end rules at segment grain."""
        if i != self.merged:
            self.ok = False
        self.merged += 1
        if not self.ok:
            return
        if p.bad:
            self.ok = False
            return
        if self.stop_seg is not None:
            if p.records:
                self.after_stop = True  # records after the broker's stop
            return
        if i < self.start:
            if p.gap or p.invalid is not None:
                self.lenient_ok = False  # lenient_records reads without CRC: its records are not verify's
            elif self.lenient_ok:
                self.before.merge(p.tally)
            return
        self.tally.merge(p.tally)
        if p.inputs is not None:
            _feed(self.pred, p.inputs)
        self.last_end[i] = p.last_end
        if p.gap:
            self._stop_at(i)
            self.after_stop = True
        elif p.invalid is not None and p.invalid != p.start + p.last_end:
            self.ok = False
        elif p.invalid is not None or not (p.blank and i + 1 < len(self.segs)):
            self._stop_at(i)

    def check_holds(self) -> bool:
        planner, check, fed = self.planner, self.check, self.fed
        return (fed is not None and not fed.bad and fed.merged.issuperset(range(len(check.segs)))
                and self.stop is not None and not self.after_stop and self.stop.offset == planner.end
                and queue_snapshot(planner) == self.snapshot and _units_before(check, planner.end))
