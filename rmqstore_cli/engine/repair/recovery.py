"""What the broker's next start would do to a store (DefaultMessageStore.load + recover, §13),
for 4.9.3 and 5.3.3 separately, as a plan of file actions that ``repair`` can apply safely.

Read-only. The plan follows the broker's decisions step by step (§13.1 order): segment
loading (§1.3), consume queue recovery (§13.2, §8.5), the commitlog start segment and walk
(§13.4/13.5), truncation (§13.6/13.7), index deletion after a crash (§10.6), re-dispatch
and the checkpoint/abort changes. Where the broker would lose data that can be kept
(consume-queue units it never rebuilds, stale bytes after a cut) the plan says so and
does better; where it would refuse to start, the plan names the file and the reason.
"""

from __future__ import annotations

import os

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.records import CQ_UNIT_SIZE, MAGIC_V1, MAGIC_V2, SYSFLAG_BORNHOST_V6

from ..log.checkpoint import Checkpoint
from .checkpointfix import plan_checkpoint_and_abort
from ..derived.consumequeue import ConsumeQueue
from ..derived.dispatchpredict import DispatchPrediction
from ..derived.lmq import MultiDispatchRule
from ..log.walk import LogTally, WalkStop, broker_walk, lenient_records, resync, rewalk
from ..store import Store
from .batchrecovery import (batch_dispatch_starts, batch_max_physic, batch_queue_state,
                            check_batch_queues, load_batch_queues, recover_batch_queues, truncate_batch_queues)
from .derived_plan import check_derived, dispatch_starts, queue_repairs
from .walkalong import WalkAlong, walk_sinks, walks_along, walks_along_jobs
from .extplan import cut_exts_to_queues, recover_ext
from .indexplan import index_after_crash, index_past_end, load_index
from .plan import Action, QueueState, RecoveryPlan, cut_files, store_fingerprint
from .plan_summary import summarize
from ..timer.presence import may_be_present as timer_may_be_present
from .probes import file_has_data, first_unit, invalid_unit, nonzero_after, SegmentFrom, queue_file_units

REFUSE = "the broker would refuse to start: "


class Planner:
    """Builds a RecoveryPlan; one method per broker step."""

    def __init__(self, store: Store, version: int, *, keep_valid_after: bool = False, cut_at: int | None = None,
                 broker_only: bool = False, jobs: int = 1, walk_along: bool = True):
        self.cut_at = cut_at
        self.walk_along_allowed = walk_along  # the broker's walk read off verify's walk when it can (walkalong.py)
        self.jobs = jobs  # processes for the walks of the log (recoveryjobs.py, derived_windows.py)
        self.broker_only = broker_only
        self.store = store
        self.cfg = store.config
        self.version = version
        self.keep_valid_after = keep_valid_after
        self.plan = RecoveryPlan(store.root, version, not store.abort_exists, keep_valid_after=keep_valid_after)
        self.moved: set[str] = set()

    # --- helpers --------------------------------------------------------------------

    def act(self, kind, path, why, **kw) -> Action:
        a = Action(kind, path, why, **kw)
        self.plan.actions.append(a)
        return a

    def move_aside(self, path: str, why: str, housekeeping: bool = False) -> None:
        if path not in self.moved:
            self.moved.add(path)
            self.act("move_aside", path, why, housekeeping=housekeeping)

    def _load_segments(self, sq, kind: str) -> list:
        """MappedFileQueue.load (§1.3): which files stop the broker; returns the files kept."""
        v5 = self.version >= 5
        for f in sq.problems:
            if f.code == "SEG_BAD_NAME":
                self.plan.refusals.append(f"{REFUSE}{kind} file {os.path.basename(f.path)!r} is not a number "
                                          f"(NumberFormatException in MappedFileQueue.load)")
                self.move_aside(f.path, "file name is not a number; moved so the broker can start")
            elif f.code == "SEG_STRAY_DIR":
                if not v5:
                    self.plan.refusals.append(f"{REFUSE}directory {os.path.basename(f.path)!r} inside {kind}/ "
                                              f"(4.9 checks its length against the file size)")
                self.move_aside(f.path, "stray directory among segment files", housekeeping=v5)
        kept = []
        segs = sq.segments
        for k, seg in enumerate(segs):
            if seg.size == sq.file_size:
                kept.append(seg)
                continue
            last = k == len(segs) - 1
            if seg.size == 0 and last and v5:
                self.move_aside(seg.path, "zero-length last file: 5.x deletes it at load", housekeeping=True)
                continue
            what = "zero-length" if seg.size == 0 else f"{seg.size} bytes instead of {sq.file_size}"
            self.plan.refusals.append(f"{REFUSE}{kind} file {seg.name} is {what} (MappedFileQueue.load checks every size)")
            if kind == "commitlog" and 0 < seg.size < sq.file_size:
                # A short file keeps every record it holds: padded with zeros to the broker's size (the
                # original is saved whole first); the walk below decides where the log ends.
                self.act("extend", seg.path, f"{what}; padded with zeros to {sq.file_size} bytes so the broker can "
                         "start (its records are kept)", extra={"size": sq.file_size})
                kept.append(seg)
                continue
            self.move_aside(seg.path, f"{what}; moved into the backup so the broker can start")
            if seg.size and file_has_data(seg.path):
                self.plan.data_loss.append(f"{kind} file {seg.name} ({seg.size} bytes) holds data but has the wrong size; "
                                           f"it is moved out whole (its records are not in the recovered log; salvage reads it)")
        return kept

    # --- steps ----------------------------------------------------------------------

    def run(self) -> RecoveryPlan:
        st, plan = self.store, self.plan
        cp = st.checkpoint()
        plan.checkpoint_before = cp.as_json(self.version)
        self.cl_segments = self._load_segments(st.commitlog.segments, "commitlog")
        self._load_queues()
        load_batch_queues(self)
        load_index(self)
        self._recover_queues()
        recover_batch_queues(self)
        if self.cut_at is not None:
            return self._run_truncate(cp)
        self._recover_commitlog(cp)
        self._truncate_queues()
        if not self.broker_only:
            cut_exts_to_queues(self, "are referenced by no consume-queue unit (the broker's next start cuts them)")
        index_after_crash(self, cp)
        index_past_end(self)
        if self.broker_only:
            self.verdicts = {}
        else:
            check_derived(self)
            if self.cl_kept:
                check_batch_queues(self)
        self._dispatch(cp)
        _plan_timer(self)
        plan_checkpoint_and_abort(self, cp)
        summarize(self)
        if not self.broker_only:
            plan.queue_repairs = queue_repairs(self, self.broker_from)
        return plan

    def _load_queues(self) -> None:
        self.queues: dict[tuple[str, int], QueueState] = {}
        files = self.store.rocksdb is None  # file queues: the store's own objects, which verify's walk reuses mapped
        for t, q in self.store.queues():
            cq = self.store.queue(t, q) if files else ConsumeQueue(self.store.root, t, q, self.cfg)
            kept = self._load_segments(cq.segments, f"consumequeue/{t}/{q}")
            self.queues[(t, q)] = QueueState(t, q, cq.directory, kept, cq.file_size)
        self.exts: dict[tuple[str, int], list] = {}
        self.ext_walk_ends: dict[tuple[str, int], int] = {}
        if self.cfg.enableConsumeQueueExt:
            for t, q in self.store.ext_queues():
                ext = self.store.ext(t, q)
                self.exts[(t, q)] = (ext, self._load_segments(ext.segments, f"consumequeue_ext/{t}/{q}"))

    def _recover_queues(self) -> None:
        """§13.2: last three files, valid-unit rule; then §13.6 on each queue; ext §8.5."""
        for (t, q), qs in self.queues.items():
            segs = qs.segments
            if not segs:
                continue
            i = max(0, len(segs) - 3)
            while True:
                seg = segs[i]
                arr = queue_file_units(seg, qs.file_size)
                n = first_unit(arr, invalid_unit)
                if n:
                    last = arr[n - 1]
                    qs.max_physic = int(last["phyOffset"]) + int(last["size"])
                    tags = arr["tagsCode"][:n]
                    ext_tags = tags[tags <= -2147483649]
                    if len(ext_tags):
                        qs.max_ext = int(ext_tags[-1])
                pos = n * CQ_UNIT_SIZE
                if pos == qs.file_size and i + 1 < len(segs):
                    i += 1
                    continue
                qs.end = seg.start + pos
                break
            self._cut_queue(qs, qs.end, "consume queue recovery (the broker's valid-unit rule)")
            recover_ext(self, (t, q), qs)

    def _cut_queue(self, qs: QueueState, end: int, why: str) -> None:
        """truncateDirtyFiles(end) on a queue's files, plus our zeroed tail."""
        qs.segments = cut_files(self, qs.segments, qs.file_size, end,
                                f"{why}: file starts after the queue end {end // CQ_UNIT_SIZE}",
                                f"{why}: bytes after the last valid unit (queue offset {end // CQ_UNIT_SIZE}) zeroed so "
                                "they cannot reappear")

    def _start_index(self, cp: Checkpoint, max_cq: int) -> tuple[int, str]:
        segs = self.cl_segments
        n = len(segs)
        if self.plan.last_exit_ok:
            if self.version < 5:
                return max(0, n - 3), "normal recovery (4.9.3): third-last file"
            for k in range(n - 1, -1, -1):
                if segs[k].start <= max_cq:
                    return k, f"normal recovery (5.3.3): newest file starting at or before the consume-queue high-water mark {max_cq}"
            return 0, "normal recovery (5.3.3): no file starts before the consume-queue high-water mark: first file"
        safe = self.cfg.messageIndexEnable and self.cfg.messageIndexSafe
        limit = cp.min_timestamp_index if safe else cp.min_timestamp
        magics = (MAGIC_V1,) if self.version < 5 else (MAGIC_V1, MAGIC_V2)
        import struct

        for k in range(n - 1, -1, -1):
            buf = segs[k].buffer()
            if segs[k].size < 64:
                continue
            magic, = struct.unpack_from(">i", buf, 4)
            if magic not in magics:
                continue
            sysflag, = struct.unpack_from(">i", buf, 36)
            bh = 20 if sysflag & SYSFLAG_BORNHOST_V6 else 8
            ts_pos = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + bh
            if ts_pos + 8 > segs[k].size:
                continue
            ts, = struct.unpack_from(">q", buf, ts_pos)
            if ts != 0 and ts <= limit:
                what = "min(physic, logics) - 3 s" if not safe else "min(that, indexMsgTimestamp)"
                return k, f"abnormal recovery: newest file whose first store time {ts} <= checkpoint {what} = {limit}"
        return 0, "abnormal recovery: no file's first record is old enough: first file"

    def _recover_commitlog(self, cp: Checkpoint) -> None:
        plan = self.plan
        self.max_cq = max([qs.max_physic for qs in self.queues.values()] + batch_max_physic(self) + [-1])
        segs = self.cl_segments
        start, why = self._start_index(cp, self.max_cq) if segs else (0, "no commitlog files")
        stop = None
        along = None
        if walks_along(self):  # the broker's walk read off verify's walk of the log (walkalong.py), when it can say
            along = WalkAlong(self, start)
        elif walks_along_jobs(self):  # the same off verify -j's walk (walkalongjobs.py)
            from .walkalongjobs import WalkAlongJobs

            along = WalkAlongJobs(self, start)
        if along is not None:
            stop = along.run()
            tally, self.walk_first = along.tally, along.walk_first
        if stop is None:
            tally, pred, sink = walk_sinks(self, start)  # (again: nothing of the walk above is kept)
            self.walk_first = len(tally)
            if self.jobs > 1 and len(segs) - start > 1 and not self.store.batch_topics():
                from .recoveryjobs import broker_walk_jobs

                stop = broker_walk_jobs(segs, self.cfg, self.version, start, self.cfg.checkCRCOnRecover, tally, pred,
                                        self.jobs)
            else:
                stop = broker_walk(segs, self.cfg, self.version, start, self.cfg.checkCRCOnRecover, sink)
        # Every record walked lies before the stop: the tally describes the recovered log.
        self.tally, self.stop, self.start_index, self.lenient_upto = tally, stop, start, start
        end = stop.offset if segs else 0
        self.end = end
        plan.commitlog = {
            "startFile": segs[start].name if segs else None, "startOffset": segs[start].start if segs else 0,
            "startReason": why, "checkCRCOnRecover": self.cfg.checkCRCOnRecover,
            "stopOffset": stop.offset, "stopKind": stop.kind, "stopReason": stop.reason,
            "recoveredEnd": end, "walkedRecords": len(tally) - self.walk_first,
            "maxPhyOffsetOfConsumeQueue": self.max_cq,
        }
        if stop.oom:
            plan.refusals.append(f"{REFUSE}the record at {stop.offset} has TOTALSIZE {stop.total_size}; 4.9 allocates "
                                 f"byte[TOTALSIZE] before checking it and dies with OutOfMemoryError")
        if stop.kind == fast.STOP_BAD_MAGIC and "v2" in stop.reason:
            plan.notes.append(f"4.9 reads the magic v2 record at {stop.offset} as garbage and truncates the log there; "
                              f"open this store with --broker-version 5")
        tails = {}  # (file, position) -> any non-zero byte from there on (read once: a 1 GiB tail costs)
        has_data = lambda seg, pos: tails.setdefault((seg.path, pos), nonzero_after(seg.path, pos))  # noqa: E731
        if segs and stop.kind != fast.STOP_BLANK:
            self._look_past(stop, has_data(segs[stop.segment_index], stop.position))
        # §13.6 on the commitlog
        for k, seg in enumerate(segs):
            if seg.start > end:
                has = file_has_data(seg.path)
                self.move_aside(seg.path, f"commitlog truncation at {end}: the file starts after the recovered end"
                                + ("" if has else " (pre-allocated, all zeros)"), housekeeping=not has)
            elif seg.start <= end < seg.start + seg.size and stop.kind != fast.STOP_BLANK:
                if has_data(seg, end - seg.start):
                    self.act("zero_tail", seg.path, f"commitlog cut at {end}: bytes after the recovered end zeroed "
                             f"(Java leaves them; stale records could reappear after a later crash)", offset=end - seg.start)
        self.cl_kept = [s for s in segs if s.start <= end]

    def _run_truncate(self, cp: Checkpoint) -> RecoveryPlan:
        """``truncate --offset``: §13.6 on the commitlog at a record boundary, §13.7 on every
        queue, and index files reaching past the cut rebuilt from the commitlog."""
        plan, cut = self.plan, self.cut_at
        segs = self.cl_segments
        tally = LogTally(limit=cut)
        lenient_records(segs, len(segs), tally)
        self.max_cq = max([qs.max_physic for qs in self.queues.values()] + batch_max_physic(self) + [-1])
        self.tally, self.start_index, self.end, self.lenient_upto = tally, 0, cut, len(segs)
        self.stop = WalkStop(cut, 0, 0, "cut", "truncate --offset")
        plan.commitlog = {"startFile": segs[0].name if segs else None, "startReason": "truncate", "stopOffset": cut,
                          "stopKind": "cut", "stopReason": f"cut requested at {cut}", "recoveredEnd": cut,
                          "checkCRCOnRecover": False, "maxPhyOffsetOfConsumeQueue": self.max_cq}
        for seg in segs:
            if seg.start > cut:
                self.move_aside(seg.path, f"truncate at {cut}: file starts after the cut")
            elif seg.start <= cut < seg.start + seg.size and nonzero_after(seg.path, cut - seg.start):
                self.act("zero_tail", seg.path, f"truncate at {cut}: bytes after the cut zeroed", offset=cut - seg.start)
        self.cl_kept = [s for s in segs if s.start <= cut]
        self.max_cq = max(self.max_cq, cut)  # §13.7 runs on every queue
        self._truncate_queues()
        cut_exts_to_queues(self, f"belonged to consume-queue units cut at {cut}")
        index_past_end(self)
        check_derived(self)
        if self.cl_kept:
            check_batch_queues(self)
        self._dispatch(cp)
        _plan_timer(self)
        self.last_cq_ts = None
        plan_checkpoint_and_abort(self, cp)  # consistent with the cut log (engine/repair/checkpointfix.py)
        summarize(self)
        plan.queue_repairs = queue_repairs(self, self.broker_from)
        return plan

    def _look_past(self, stop: WalkStop, tail_has_data: bool = True) -> None:
        """Valid records after the first bad one: what the broker's cut would throw away. ``tail_has_data``
        False: the stop's file is all zeros from the stop on (no record can start there: not searched)."""
        segs = self.cl_segments
        count = 0
        first = last = None
        skipped = []
        k, seg = stop.segment_index, segs[stop.segment_index]
        p = resync(seg.buffer(), stop.position + 1, seg.size, seg.start, self.version) if tail_has_data else None
        if p is None:
            skipped.append((stop.offset, seg.start + seg.size))
        else:
            skipped.append((stop.offset, seg.start + p))
        positions = [(k, p)] if p is not None else []
        positions += [(j, 0) for j in range(k + 1, len(segs))]
        for j, pos in positions:
            s = segs[j]
            after = LogTally()
            broker_walk([SegmentFrom(s, pos) if pos else s], self.cfg, self.version, 0, True, after)
            if len(after):
                count += len(after)
                first = after.first if first is None else first
                last = after.last_end
        if count:
            self.plan.salvage = {"badOffset": stop.offset, "validRecordsAfter": count, "firstValidAfter": first,
                                 "endOfValidAfter": last, "skippedRanges": skipped}
            if not self.keep_valid_after:
                self.plan.data_loss.append(
                    f"the broker's recovery stops at the bad record at {stop.offset} ({stop.reason}) and drops "
                    f"{count} valid records after it ({first} .. {last}); run `rmqstore salvage` before applying")

    def _truncate_queues(self) -> None:
        """§13.7 when the consume queues reach past the recovered end."""
        end = self.end
        if not self.cl_kept:
            for qs in self.queues.values():
                for seg in qs.segments:
                    self.move_aside(seg.path, "no commitlog files left: the broker destroys every consume queue")
                qs.segments, qs.end, qs.max_physic = [], 0, -1
            return
        truncate_batch_queues(self)
        if self.max_cq < end:
            return
        for qs in self.queues.values():
            old_end = qs.end
            while qs.segments:
                seg = qs.segments[-1]
                arr = queue_file_units(seg, qs.file_size)
                if not len(arr) or int(arr["phyOffset"][0]) >= end:
                    self.move_aside(seg.path, f"consume queue truncation at commitlog offset {end}")
                    qs.segments.pop()
                    qs.end = seg.start
                    continue
                n = 1 + first_unit(arr[1:], lambda u: invalid_unit(u) | (u["phyOffset"] >= end))  # the first unit stays
                n = min(n, max(1, (old_end - seg.start) // CQ_UNIT_SIZE)) if old_end >= seg.start else n
                qs.end = seg.start + n * CQ_UNIT_SIZE
                qs.max_physic = int(arr["phyOffset"][n - 1]) + int(arr["size"][n - 1])
                break
            if not qs.segments:
                qs.max_physic = -1
            if qs.end < old_end:
                qs.truncated_units = (old_end - qs.end) // CQ_UNIT_SIZE
                self._cut_queue(qs, qs.end, f"consume queue truncation at commitlog offset {end}")

    def _dispatch(self, cp: Checkpoint) -> None:
        """Which records get dispatched again (recovery, or 4.9.3's reput at start), and ours."""
        end, plan = self.end, self.plan
        plan.queue_ends = {k: qs.max_offset for k, qs in self.queues.items() if qs.segments}
        walk_start = self.cl_segments[self.start_index].start if self.cl_segments else 0
        if not plan.last_exit_ok:
            broker_from, rule = walk_start, "abnormal recovery dispatches every record it walks"
        elif self.version >= 5:
            broker_from, rule = self.max_cq + 1, "5.3.3 normal recovery dispatches records past the consume-queue high-water mark"
        else:
            reput = max([qs.max_physic for qs in self.queues.values()] + [self.cl_kept[0].start if self.cl_kept else 0])
            broker_from, rule = reput, "4.9.3 reput at start() from the consume-queue high-water mark"
        broker_from = max(broker_from, 0)
        self.broker_from = broker_from
        # Ours: also every record a queue is missing or holds a lying unit for (the broker never
        # rebuilds those: derived_plan) and every record whose index entries were moved out.
        missing = dispatch_starts(self, broker_from)
        ours = min([broker_from] + list(missing.values()) + batch_dispatch_starts(self, broker_from))
        if self.index_rebuild_from is not None:
            ours = min(ours, self.index_rebuild_from)
        if getattr(self, "index_crash_deleted", False):  # indexplan.index_after_crash: from the kept files' end
            ours = min(ours, self.index_files[-1].header().endPhyOffset if self.index_files else 0)
        for (t, q), p in missing.items():
            if not self.verdicts[(t, q)][0].lies:
                plan.notes.append(f"queue {t}/{q} lacks units from commitlog offset {p} on; the broker would never "
                                  f"rebuild them (it dispatches from {broker_from}); we re-dispatch from {p}")
        # Prediction of the consume-queue puts (§7.5) on the records of [ours, end), found again by a
        # second walk (nothing per record is kept from the first); the Dispatcher does them for real.
        # [next offset, maxPhysicOffset, first offset written into an empty queue, queue has no file]
        qstate = self._queue_state()
        early = getattr(self, "early_prediction", None)
        if early is not None and ours == walk_start and early[1] == qstate and early[2] == batch_queue_state(self):
            pred = early[0]  # the records of [walk start, end) are the ones the walk handed it
            qstate = pred.state
            pred.flush()
        else:
            pred = DispatchPrediction(qstate, MultiDispatchRule(self.cfg), batch_queue_state(self), self.store.batch_topics())
            if ours < end:
                rewalk(self.cl_segments, self.lenient_upto, self.version, ours, end, pred)
                pred.flush()
        self.early_prediction = None
        new_units, count = pred.new_units, pred.count
        t = self.tally
        self.qstate = qstate
        self.bstate = pred.batch_state
        self.last_record_start = t.last_start
        # the last record a consume queue takes, if the re-dispatch reaches it
        self.last_cq_ts = t.last_cq_ts if t.last_cq_phy is not None and t.last_cq_phy >= ours else None
        plan.dispatch = {"brokerFrom": broker_from, "brokerRule": rule, "from": ours, "to": end, "records": count,
                         "newConsumeQueueUnits": sum(new_units.values()),
                         "queuesGaining": {f"{t}-{q}": n for (t, q), n in sorted(new_units.items())}}
        if count and (new_units or not plan.last_exit_ok or self.index_rebuild_from is not None or ours < broker_from):
            self.act("dispatch", None, f"dispatch commitlog records [{ours}, {end}) to consume queues and index "
                     f"({rule}; already-present units are skipped by the broker's put rules)",
                     extra={"from": ours, "to": end, "indexAfter": getattr(self, "index_resume_after", None),  # (phy, keys held)
                            "indexNames": sorted(set(plan.index_deleted))})  # the rebuilt files keep these names
        elif count:
            plan.notes.append(f"{count} records in [{ours}, {end}) would be dispatched again; every consume-queue unit and "
                              f"index entry is already present")

    def _queue_state(self) -> dict:
        """The consume-queue put state DispatchPrediction starts from: [next offset, maxPhysicOffset,
        first offset written into an empty queue, queue has no file]."""
        return {k: [qs.max_offset, qs.max_physic, None, not qs.segments] for k, qs in self.queues.items()}


def plan_recovery(store: Store, version: int | None = None, *, keep_valid_after: bool = False,
                  broker_only: bool = False, with_verify: bool = False, jobs: int = 1,
                  walk_along: bool = True, spill_dispatch: bool = False) -> RecoveryPlan:
    """The broker's next start, as a plan (nothing is changed).

    ``broker_only``: the broker's own steps only, without our checks of every consume queue and index
    file against the log (derived_plan) and without reading the records before the broker's walk: enough
    for what the next start reads (engine.startup), not a plan to apply (its checkpoint times may differ).
    ``with_verify``: verify the store too, in the same walk of the log as the derived-file check; its
    findings are ``plan.verify_findings`` (for ``outcome.assess_plan``), else None.
    ``jobs`` > 1: the walks of the log (the broker's, the derived-file check's, verify's) in that many
    processes, whole segments each (recoveryjobs.py); the same plan. ``walk_along=False``: with ``with_verify``,
    the broker's walk walks on its own even where verify's walk could stand for it (walkalong.py; same plan).
    ``spill_dispatch`` (the plan is going to be applied): the walk along also keeps the records' dispatch columns
    on disk for the apply's re-dispatch (dispatchspill.py), as ``plan.dispatch_spill`` when they stand for its
    scan, else None."""
    from .startup import startup_cost

    v = version or store.config.version
    fingerprint = store_fingerprint(store.root)
    planner = Planner(store, v, keep_valid_after=keep_valid_after, broker_only=broker_only, jobs=jobs,
                      walk_along=walk_along)
    planner.verify_along = with_verify and not broker_only
    spill = None
    if spill_dispatch and planner.verify_along and store.abort_exists:  # a crash: the walked records are re-dispatched
        from .dispatchspill import DispatchSpill

        spill = DispatchSpill.create(store.root, sum(s.size for s in store.commitlog.segments.segments))
        if spill is not None:
            from .dispatchspill import walk_rules

            spill.delay_table = store.commitlog.config.delay_table  # what verify's tagsCode of delay records used
            spill.root, spill.fingerprint = os.path.abspath(store.root), fingerprint  # what the walk reads
            spill.rules = walk_rules(store.commitlog)
    planner.dispatch_spill = spill
    try:
        plan = planner.run()
    except BaseException:
        if spill is not None:
            spill.remove()
        raise
    if spill is not None and not spill.usable:
        spill.remove()
        spill = None
    plan.dispatch_spill = spill
    plan.verify_findings = getattr(planner, "verify_findings", None)
    plan.fingerprint = fingerprint
    plan.startup_cost = startup_cost(store, plan)
    return plan


def plan_truncate(store: Store, offset: int, version: int | None = None, jobs: int = 1) -> RecoveryPlan:
    """Cut the commitlog at a record boundary and cascade (refuses a non-boundary offset); ``jobs`` > 1: the
    derived-file check walks whole segments in that many processes (same plan)."""
    from ..errors import UsageError

    end = store.commitlog.find_end(check_crc=False).stop
    data_end = end.offset if end else 0
    if offset < 0 or offset > data_end:
        raise UsageError(f"offset {offset} is outside the commitlog data [0, {data_end}]")
    if offset != data_end:
        before, after = store.commitlog.boundaries_near(offset)
        seg = store.commitlog.segments.find(offset)
        if before != offset and not (seg is not None and seg.start == offset):
            raise UsageError(f"offset {offset} is not a record boundary; nearest boundaries: "
                             f"{before if before is not None else '-'} and {after if after is not None else '-'}")
    v = version or store.config.version
    return Planner(store, v, cut_at=offset, jobs=jobs).run()


def _plan_timer(planner) -> None:
    """:func:`.timerfix.plan_timer_for_recovery`, its modules loaded only when the store may have a timer store
    (without one the plan has nothing to make consistent: no action, no note, ``timer_repair`` stays None)."""
    if not timer_may_be_present(planner.store):
        return
    from .timerfix import plan_timer_for_recovery

    plan_timer_for_recovery(planner)
