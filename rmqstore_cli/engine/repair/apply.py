"""Carrying out a recovery plan safely: backup first, journal, fsync, resumable.

Order of the steps (so a kill at any point leaves a store the next ``recover`` finishes):
files moved aside and tails zeroed first; then the re-dispatch, which is made atomic by
saving every file it may change and the list of existing files before it starts (an
interrupted dispatch is rolled back from the journal on the next run); then the checkpoint;
``abort`` is removed last. ``truncate`` plans are built by the same Planner.
"""

from __future__ import annotations

from contextlib import contextmanager

import os
from dataclasses import dataclass, field

import numpy as np

from .fileops import last_nonzero, zero_range
from .backup import Backup, find_unfinished, fsync_path, read_manifest, undo_entries
from ..errors import StoreInUseError, UsageError
from ..log.lockfile import LOCK_CONTENT, StoreLock
from .plan import RecoveryPlan

DLEDGER_KINDS = ("copy_range", "rewrite_units", "write_text", "rebuild_derived")  # repair/dledgerapply.py


@dataclass
class ApplyResult:
    backup_dir: str
    steps: list = field(default_factory=list)
    dispatch: dict = field(default_factory=dict)
    resumed: bool = False


def roll_back_interrupted_dispatch(backup: Backup) -> bool:
    """A dispatch that began but did not end is undone from its saved files (journal order)."""
    entries = backup.entries
    begins = [i for i, e in enumerate(entries) if e["op"] == "dispatch-prepare"]
    if not begins:
        return False
    i = begins[-1]
    if any(e["op"] == "dispatch-end" for e in entries[i:]):
        return False
    undo_entries(backup.root, backup.dir, [e for e in entries[i:] if e["op"] in ("file", "tree", "range")])
    backup.mark("dispatch-rolled-back")
    return True


def open_backup(root: str, backup_dir: str | None, command: str, info: dict) -> tuple[Backup, bool]:
    """A new backup folder, or the unfinished one of an interrupted run (resumed)."""
    unfinished = find_unfinished(root) if backup_dir is None else (
        backup_dir if os.path.exists(os.path.join(backup_dir, "manifest.jsonl")) and
        not any(e["op"] in ("complete", "restored") for e in read_manifest(backup_dir)) else None)
    if unfinished:
        b = Backup(unfinished, root)
        b.mark("resume", **info)
        roll_back_interrupted_dispatch(b)
        return b, True
    return Backup.create(root, backup_dir, command, info), False


def take_lock(root: str, force: bool) -> StoreLock | None:
    """The broker's lock (§12.2), held for the whole apply; with ``force`` a held lock is ignored."""
    lock = StoreLock(root)
    try:
        return lock.acquire()
    except StoreInUseError:
        if force:
            return None
        raise


def apply_plan(plan: RecoveryPlan, store_root: str, config, backup: Backup, *, index_namer=None,
               zero_tails: bool = True, jobs: int = 1) -> ApplyResult:
    """Carry out ``plan`` on the store (the caller holds the lock). An I/O error (a full disk: ENOSPC
    from the space reservation before any mapped write) undoes every step done so far from the
    backup journal, so the store is left as it was, then is raised again."""
    try:
        return _apply_plan(plan, store_root, config, backup, index_namer=index_namer, zero_tails=zero_tails, jobs=jobs)
    except OSError as e:
        from .backup import restore

        try:
            restore(backup.dir, os.path.abspath(store_root))
        except (OSError, UsageError) as e2:
            raise OSError(e.errno, f"{e.strerror or e}; undoing the steps done so far failed too "
                                   f"({e2}): finish with `rmqstore restore {backup.dir}`", e.filename) from None
        raise OSError(e.errno, f"{e.strerror or e}; every step done so far was undone from {backup.dir}: the "
                               "store is as it was", e.filename) from None


def _apply_plan(plan: RecoveryPlan, store_root: str, config, backup: Backup, *, index_namer=None,
                zero_tails: bool = True, jobs: int = 1) -> ApplyResult:
    res = ApplyResult(backup.dir)
    root = os.path.abspath(store_root)
    for a in plan.actions:
        if a.kind == "move_aside":
            if os.path.lexists(a.path):
                backup.move(a.path, a.why)
                res.steps.append(f"moved {os.path.relpath(a.path, root)} into the backup")
        elif a.kind == "extend":
            if os.path.exists(a.path) and os.path.getsize(a.path) < a.extra["size"]:
                backup.save_file(a.path)  # restore truncates it back to this length
                os.truncate(a.path, a.extra["size"])
                fsync_path(a.path)
                res.steps.append(f"padded {os.path.relpath(a.path, root)} with zeros to {a.extra['size']} bytes")
        elif a.kind == "zero_tail":
            if not os.path.exists(a.path):
                continue
            end = last_nonzero(a.path, a.offset)
            if end > a.offset:
                backup.save_range(a.path, a.offset, end - a.offset)
                if zero_tails:
                    zero_range(a.path, a.offset, end)
                res.steps.append(f"zeroed {end - a.offset} bytes of {os.path.relpath(a.path, root)} from {a.offset}")
        elif a.kind in DLEDGER_KINDS:
            from .dledgerapply import apply_dledger_action

            res.steps.append(apply_dledger_action(a, root, config, backup))
    dispatch = next((a for a in plan.actions if a.kind == "dispatch"), None)
    index_ts_before = _index_msg_timestamp(root)
    if dispatch is not None:
        res.dispatch = run_dispatch(root, config, backup, dispatch.extra["from"], dispatch.extra["to"],
                                    plan.dispatch.get("queuesGaining", {}),
                                    index_namer or reused_names(dispatch.extra.get("indexNames") or []),
                                    index_after=dispatch.extra.get("indexAfter"), jobs=jobs,
                                    queues_complete=plan.dispatch.get("newConsumeQueueUnits") == 0,
                                    spill=getattr(plan, "dispatch_spill", None))
        res.steps.append(f"dispatched {res.dispatch['records']} records: {res.dispatch['cqUnits']} consume-queue units, "
                         f"{res.dispatch['indexEntries']} index entries")
    if any(a.kind == "timer" for a in plan.actions):
        from .timerfix import apply_timer_repair

        res.steps += apply_timer_repair(plan.timer_repair, root, backup)
    cp = next((a for a in plan.actions if a.kind == "checkpoint"), None)
    if cp is not None:
        from ..log.checkpointwriter import CheckpointWriter

        path = os.path.join(root, "checkpoint")
        if os.path.exists(path):
            backup.save_file(path)
        else:
            backup.mark("created", path="checkpoint")
        w = CheckpointWriter(root)
        fields = dict(cp.extra["fields"])
        if cp.extra.get("indexFromFiles"):
            # the index was rebuilt: the end of the file the re-dispatch left behind full, if any
            from .checkpointfix import index_timestamp_on_disk

            fields["indexMsgTimestamp"] = index_timestamp_on_disk(root, config)
        elif dispatch is not None and not (cp.extra.get("indexCorrected") and _index_msg_timestamp(root) == index_ts_before):
            fields.pop("indexMsgTimestamp", None)  # the dispatcher's value when it filled an index file
        w.set(**fields)
        w.dirty = True
        w.flush()
        res.steps.append("checkpoint updated")
    ab = next((a for a in plan.actions if a.kind == "remove_abort"), None)
    if ab is not None and os.path.exists(ab.path):
        backup.move(ab.path, ab.why)
        res.steps.append("abort removed (clean shutdown)")
    fsync_path(root, True)
    return res


def reused_names(names: list[str]):
    """An index namer giving the files a re-dispatch creates the names of the files it rebuilds, in order (then the
    broker's clock rule): a file rebuilt with the same records keeps its name, whose time is when the broker made it."""
    from ..derived.indexwriter import wall_clock_namer

    left = iter(sorted(names))

    def namer(store_timestamp: int) -> str:
        return next(left, None) or wall_clock_namer(store_timestamp)

    return namer


def _index_msg_timestamp(root: str) -> int | None:
    from ..log.checkpoint import read_checkpoint

    try:
        return read_checkpoint(os.path.join(root, "checkpoint")).indexMsgTimestamp
    except Exception:  # noqa: BLE001 - a missing/short checkpoint: nothing to compare
        return None


def run_dispatch(root: str, config, backup: Backup, start: int, end: int, gaining: dict, index_namer,
                 index_after: tuple | None = None, jobs: int = 1, queues_complete: bool = False, spill=None) -> dict:
    """Re-dispatch [start, end) with the Dispatcher; every file it may change is saved first.

    ``jobs`` > 1 and [start, end) beginning in the first segment (a crash's whole-log re-dispatch): forked
    workers parse whole segments into dispatch columns (rebuild -j's path, repair/rebuild.py), the writes stay
    here, in log order. Both read from the first segment on, going into the next one past a BLANK.

    ``queues_complete``: the plan predicted no new consume-queue unit (a crash copy whose queues hold every
    record), so the serial dispatch writes only index entries and the checkpoint and does not read every queue to
    skip the units it holds (Dispatcher.queues_complete; not with ext units or batch queues, whose writers it
    would still open). With ``jobs`` > 1 the workers then make no queue plan (no grouping, pruning or sending of
    units that are all skipped).

    ``spill``: the records' dispatch columns the plan's walk kept (dispatchspill.DispatchSpill); when they cover
    the dispatched segments the re-dispatch reads them instead of walking the log again (same batches, same files)."""
    from ..derived.dispatch import Dispatcher
    from ..store import Store

    backup.mark("dispatch-prepare", start=start, end=end)
    # Files the dispatcher appends to in place: the last file of each queue gaining units,
    # its ext, the last index file and the checkpoint. New files are undone by the tree list.
    targets = set()
    for key in gaining:
        topic, _, qid = key.rpartition("-")
        for sub in ("consumequeue", "consumequeue_ext"):
            d = os.path.join(root, sub, topic, qid)
            if os.path.isdir(d):
                names = sorted(n for n in os.listdir(d) if n.isdigit())
                if names:
                    targets.add(os.path.join(d, names[-1]))
    idx = os.path.join(root, "index")
    if os.path.isdir(idx):
        names = sorted(n for n in os.listdir(idx) if n.isdigit())
        if names:
            targets.add(os.path.join(idx, names[-1]))
    cpp = os.path.join(root, "checkpoint")
    if os.path.exists(cpp):
        targets.add(cpp)
    for t in sorted(targets):
        backup.save_file(t)
    backup.snapshot_tree(["consumequeue", "consumequeue_ext", "index"])
    if not os.path.exists(cpp):
        backup.mark("created", path="checkpoint")
    backup.mark("dispatch-begin")
    st = Store.open(root, overrides={k: getattr(config, k) for k in (
        "mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue", "mappedFileSizeConsumeQueueExt",
        "enableConsumeQueueExt", "maxHashSlotNum", "maxIndexNum", "messageIndexEnable", "version")})
    segs = st.commitlog.segments.segments
    start_index = 0
    for k, s in enumerate(segs):
        if s.start <= start:
            start_index = k
    spilled = (spill is not None and not st.batch_topics() and not st.config.enableConsumeQueueExt
               and st.config.maxIndexNum >= 2 and spill.same_delays(st.config.delay_table)
               and spill.covers([s.start for s in segs[start_index:] if s.start < end]))
    parallel = not spilled and jobs > 1 and start_index == 0 and len(segs) > 1
    if parallel:
        from .dispatchjobs import PruningDispatcher

        d = PruningDispatcher(root, st.config, index_namer=index_namer, repair=True)
    else:
        d = Dispatcher(root, st.config, index_namer=index_namer, repair=True)
    # set before any worker is forked: they then make no queue plan at all (nothing to group, prune or send)
    d.queues_complete = queues_complete and not st.config.enableConsumeQueueExt and not d.batch_topics
    if index_after is not None:
        d.index_continues_after(*index_after)
    from .rebuild import DispatchWriteback

    # the index entries and units written are handed to the kernel's write-back as the dispatch goes on (as rebuild
    # does), so the final flush does not wait for all of a large store's dirty pages at once
    writeback = DispatchWriteback(d)
    try:
        if parallel:
            from .dispatchjobs import skipped_units
            from .rebuild import parallel_requests

            if not d.queues_complete:
                d.prepare_pruning(start, end)  # the workers leave out the units the queues hold (dispatchjobs.py)

            def handle(batch):
                d.queues_known()
                batch = _inside(batch, start, end)
                d.dispatch_many(batch)
                d.stats.cq_skipped += skipped_units(batch)
                writeback.after(batch)

            # the records' strings travel only for the one-key-at-a-time index writer (as rebuild -j sends them):
            # the bulk dispatch reads the workers' topic ids and index key hashes
            parallel_requests(st, d, jobs, handle, strings=d.config.maxIndexNum < 2)
        elif spilled:
            if jobs > 1 and d.index is not None:
                d.index.use_idle_core()  # no worker runs now: a thread faults the index pages in ahead of the writes
            for seg in segs[start_index:]:
                if seg.start >= end:
                    break
                for batch in spill.batches(seg.start):
                    batch = _inside(batch, start, end)
                    d.dispatch_many(batch)
                    writeback.after(batch)
        else:
            for chunk in st.commitlog.scan(start_index=start_index, check_crc=False):
                batch = _inside(d.requests_from_chunk(chunk), start, end)
                d.dispatch_many(batch)
                writeback.after(batch)
                if chunk.segment.start + int(chunk.headers.offsets[-1]) >= end:
                    break
        d.flush()
    finally:
        d.close(flush=False)
        st.close()
        if spill is not None and not spill.keep:
            spill.remove()
    s = d.stats
    backup.mark("dispatch-end", records=s.records, cqUnits=s.cq_units, indexEntries=s.index_entries)
    return {"records": s.records, "cqUnits": s.cq_units, "cqSkipped": s.cq_skipped, "extUnits": s.ext_units,
            "indexEntries": s.index_entries, "problems": [p.as_json() for p in d.problems]}


def _inside(batch, start: int, end: int):
    """The requests of ``batch`` for records in [start, end); the batch itself when all of it lies inside, so the
    usual chunk is not copied column by column."""
    phy = batch.phy
    if not len(phy) or (int(phy.min()) >= start and int(phy.max()) < end):
        return batch
    return batch.take(np.flatnonzero((phy >= start) & (phy < end)))


@contextmanager
def locked_backup(root: str, backup: Backup, force: bool = False):
    """The store's lock held for an apply (its lock file's bytes kept in ``backup`` first); the backup is
    marked complete when the block ends without an error."""
    save_lock_file(root, backup)
    lock = take_lock(root, force)
    try:
        yield
        backup.mark("complete")
    finally:
        if lock is not None:
            lock.release()


def save_lock_file(root: str, backup: Backup) -> None:
    """Taking the lock may write ``lock`` into the lock file; keep its old bytes."""
    path = os.path.join(root, "lock")
    if not os.path.exists(path):
        backup.mark("created", path="lock")
        return
    with open(path, "rb") as f:
        head = f.read(len(LOCK_CONTENT))
    if head != LOCK_CONTENT:
        backup.save_file(path)


def check_backup_location(root: str, backup_dir: str | None) -> None:
    if backup_dir is None:
        return
    from .backup import _inside

    if _inside(backup_dir, root):
        raise UsageError(f"backup folder {backup_dir} is inside the store; choose one outside it")
