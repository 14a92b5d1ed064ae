"""A checkpoint consistent with the log a repair leaves (StoreCheckpoint, FORMAT.md §11).

The broker's checkpoint describes what was flushed: physicMsgTimestamp the store time of the last
flushed commitlog record, logicsMsgTimestamp that of the last record written to a consume queue,
indexMsgTimestamp the endTimestamp of the last index file left behind full (the one before the
newest file). A cut (recover's truncation, ``truncate --offset``) or a rebuild can leave a field
naming a record or an index file that no longer exists; the next abnormal start would then pick
its start file from a time the log does not reach, and ``verify`` reports ``CP_*_AHEAD``.
These helpers bring such fields back to the log's real end, and leave every other value as the
broker wrote it.
"""

from __future__ import annotations

import os

from ..log.checkpoint import Checkpoint


def log_end_times(tally) -> tuple[int | None, int | None, int | None]:
    """(store time of the last record of the log the plan leaves, the newest store time in it, store
    time of the last record a consume queue takes), from the planner's running tally of the records
    before its end (log.walk.LogTally; None when none)."""
    return tally.last_ts, tally.newest_ts, tally.last_cq_ts


def index_timestamp(files) -> int:
    """indexMsgTimestamp as the broker keeps it: the endTimestamp of the file left behind when the
    newest one was created (the second newest), 0 while there is at most one file (§10.6)."""
    files = [f for f in files if f.complete]
    return files[-2].header().endTimestamp if len(files) >= 2 else 0


def correct_times(planner, after: Checkpoint) -> tuple[bool, bool]:
    """Every checkpoint-time correction of a recovery plan, in order: (times after the records they describe
    were set back (derived-file damage), the index timestamp must be taken from the index files after the
    re-dispatch (index rebuilt))."""
    corrected = _times_after_records(planner, after)
    return corrected, consistent_checkpoint(planner, after)


def consistent_checkpoint(planner, after: Checkpoint) -> bool:
    """Lower the fields of ``after`` that point past the log the plan leaves; returns True when the
    index timestamp must be taken from the index files after the re-dispatch (index rebuilt)."""
    last, newest, last_cq = log_end_times(planner.tally)
    if newest is not None:
        if after.physicMsgTimestamp > newest:
            after.physicMsgTimestamp = last
        if after.logicsMsgTimestamp > newest:
            after.logicsMsgTimestamp = last_cq if last_cq is not None else 0
    if planner.plan.index_deleted:
        return True
    kept = [f for f in planner.index_files if f.complete]
    if kept and after.indexMsgTimestamp > max(f.header().endTimestamp for f in kept):
        after.indexMsgTimestamp = index_timestamp(kept)
    return False


def _times_after_records(planner, after: Checkpoint) -> bool:
    """Checkpoint times after the records they describe (a future time makes the broker believe data
    was flushed or dispatched that the log does not hold): set to what the recovered store holds."""
    table = getattr(planner, "record_table", None)
    if table is None:
        return False
    count, newest, newest_cq = table.times()
    if not count:
        return False
    changed = False
    if after.physicMsgTimestamp > newest:
        after.physicMsgTimestamp, changed = newest, True
    if after.logicsMsgTimestamp > newest_cq:
        after.logicsMsgTimestamp, changed = newest_cq, True
    ends = [f.header().endTimestamp for f in planner.store.index.files if f.complete]  # as on disk, before any rebuild
    if after.indexMsgTimestamp > max(ends, default=0):
        full = [f.header().endTimestamp for f in planner.index_files
                if f.complete and f.header().indexCount >= planner.cfg.maxIndexNum]
        after.indexMsgTimestamp, changed = (full[-1] if full else 0), True
        planner.index_ts_corrected = True
    if changed:
        planner.plan.notes.append("checkpoint times after the newest record they describe are set back to the "
                                  "recovered store's (the broker would trust them)")
    return changed


def index_timestamp_on_disk(root: str, config) -> int:
    """``index_timestamp`` of the index files now in ``root/index``."""
    from ..derived.index import IndexService

    svc = IndexService(root, config)
    try:
        return index_timestamp(svc.files)
    finally:
        svc.close()


def write_fields(root: str, fields: dict, backup) -> bool:
    """Set checkpoint ``fields`` (fsynced), the old file saved in ``backup`` first; False if unchanged."""
    from ..log.checkpointwriter import CheckpointWriter

    path = os.path.join(root, "checkpoint")
    w = CheckpointWriter(root)
    w.set(**fields)
    if not w.dirty and os.path.exists(path):
        return False
    if os.path.exists(path):
        backup.save_file(path)
    else:
        backup.mark("created", path="checkpoint")
    w.flush()
    return True


def plan_checkpoint_and_abort(planner, cp: Checkpoint) -> None:
    """The checkpoint fields and the abort file as the broker's start leaves them (Planner's last steps)."""
    after = Checkpoint(cp.physicMsgTimestamp, cp.logicsMsgTimestamp, cp.indexMsgTimestamp,
                       cp.masterFlushedOffset, cp.confirmPhyOffset, cp.exists, cp.fileSize)
    dispatching = any(a.kind == "dispatch" for a in planner.plan.actions)
    if planner.last_cq_ts is not None and (dispatching or not planner.plan.last_exit_ok):
        after.logicsMsgTimestamp = planner.last_cq_ts
    if planner.version >= 5 and planner.last_record_start is not None:
        after.confirmPhyOffset = planner.last_record_start
    corrected, index_from_files = correct_times(planner, after)
    planner.plan.checkpoint_after = after.as_json(planner.version)
    planner.plan.checkpoint_after["indexMsgTimestampNote"] = "advances if re-dispatch fills an index file"
    if after.to_bytes() != cp.to_bytes() or not cp.exists or index_from_files:
        fields = {k: getattr(after, k) for k in ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp",
                                                 "masterFlushedOffset", "confirmPhyOffset")}
        only_confirm = (after.logicsMsgTimestamp == cp.logicsMsgTimestamp)
        changed = [k for k in fields if getattr(cp, k) != fields[k]]
        why = ("5.3.3 sets confirmPhyOffset to the start of the last record at every start (4.9.3 has no such "
               "field): the broker's next start writes it" if changed == ["confirmPhyOffset"] and cp.exists
               and not index_from_files else "checkpoint fields the broker sets during recovery")
        planner.act("checkpoint", os.path.join(planner.store.root, "checkpoint"),
                    why + (" (times after the log corrected)" if corrected else ""),
                    housekeeping=only_confirm and planner.plan.last_exit_ok and not corrected,
                    extra={"fields": fields, "indexCorrected": getattr(planner, "index_ts_corrected", False),
                           **({"indexFromFiles": True} if index_from_files else {})})
    if not planner.plan.last_exit_ok:
        planner.act("remove_abort", os.path.join(planner.store.root, "abort"),
                    "a clean shutdown removes abort; done last, after everything else is on disk")
