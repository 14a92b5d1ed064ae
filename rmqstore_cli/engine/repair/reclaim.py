"""Freeing disk space offline: which oldest commitlog files go under a chosen policy, the derived files the
broker's cleaner removes behind them, the new min offsets, and what each consumer group loses.

Policies: ``as-broker`` (what ``DefaultMessageStore.CleanCommitLogService`` + ``CleanConsumeQueueService``
would delete on the next start, see :mod:`.cleanup`), ``consumed`` (only files every reader of every queue
has consumed, against ``config/consumerOffset.json`` and ``config/delayOffset.json``), ``before`` (files
whose every record was stored before a time), ``keep-files`` and ``free`` (the oldest files up to a count or
a size). Whatever the policy: oldest first, never the newest file, never a hole; then (on a DLedger store, whose
data files stand for the commitlog files: :mod:`.dledgercleanup`) DLedger's index files behind the ledger's new
begin index, and the consume-queue, ext and index files exactly as ``MappedFileQueue.deleteExpiredFileByOffset`` / ``ConsumeQueueExt.truncateByMinAddress``
/ ``IndexService.deleteExpiredFile`` remove them for the new min offset, so the broker loads the kept files
with min offset = the first kept file's start.

Applying deletes the files (nothing can be backed up in place) or moves them into a backup folder whose
journal ``restore`` plays back (engine/repair/backup.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from .cleanup import CleanupPrediction, CleanupSettings, DiskUsage, LogFile, predict_cleanup
from .derivedcleanup import derived_behind
from .dledgercleanup import dledger_behind, predict_dledger_cleanup
from ..errors import StoreCorruptError, UsageError

POLICIES = ("as-broker", "consumed", "before", "keep-files", "free")
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


@dataclass
class ReclaimPlan:
    policy: str
    version: int
    root: str
    commitlog: list  # [(LogFile, reason)], oldest first
    derived: list  # [DerivedFile], in the broker's order
    min_before: int
    min_after: int
    queues: list = field(default_factory=list)  # queues whose min offset moves
    loss: list = field(default_factory=list)  # per reader and queue: unconsumed messages lost
    prediction: CleanupPrediction | None = None
    notes: list = field(default_factory=list)
    files_total: int = 0
    dledger: bool = False  # the log is a DLedger store's data files

    @property
    def freed(self) -> int:
        return sum(f.allocated for f, _ in self.commitlog) + sum(d.allocated for d in self.derived)

    @property
    def paths(self) -> list[str]:
        return [f.path for f, _ in self.commitlog] + [d.path for d in self.derived]

    @property
    def empty(self) -> bool:
        return not self.commitlog and not self.derived

    @property
    def exit_code(self) -> int:
        """--dry-run: 0 nothing to delete, 1 files would be deleted."""
        return 0 if self.empty else 1

    @property
    def unconsumed_lost(self) -> int:
        return sum(r["unconsumedLost"] for r in self.loss)

    def summary(self) -> dict:
        return {"type": "reclaim-plan", "policy": self.policy, "version": self.version, "store": self.root,
                "dledger": self.dledger,
                "commitlogFiles": [{"name": f.name, "path": f.path, "start": f.start, "size": f.size,
                                    "mtime": f.mtime_ms, "reason": r} for f, r in self.commitlog],
                "derivedFiles": [d.as_json() for d in self.derived],
                "commitlogFilesKept": self.files_total - len(self.commitlog),
                "minPhyOffsetBefore": self.min_before, "minPhyOffsetAfter": self.min_after,
                "freedBytes": self.freed, "queues": self.queues, "consumerLoss": self.loss,
                "unconsumedLost": self.unconsumed_lost, "notes": self.notes,
                "prediction": self.prediction.as_json() if self.prediction else None}


# --- readers of the queues ---------------------------------------------------------------------------------


def readers(store) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """(topic, queueId) -> [(reader, committed offset)]: every group of consumerOffset.json (a group that has
    offsets on some queues of a topic and none on another counts as having consumed nothing there), and the
    schedule service on SCHEDULE_TOPIC_XXXX (delayOffset.json; a level without an offset delivers from 0)."""
    from ..config.files import CONSUMER_OFFSETS, DELAY_OFFSETS, consumer_offsets, delay_offsets, read_config

    files = read_config(store.root)
    on_disk = store.queues()
    out: dict[tuple[str, int], list] = {}
    topic_groups: dict[str, set] = {}
    for e in consumer_offsets(files[CONSUMER_OFFSETS]):
        name = e.group + (f"@{e.suffix}" if e.suffix else "")
        out.setdefault((e.topic, e.queue_id), []).append((name, e.offset))
        topic_groups.setdefault(e.topic, set()).add(name)
    for t, q in on_disk:
        have = {g for g, _ in out.get((t, q), [])}
        for g in sorted(topic_groups.get(t, set()) - have):
            out.setdefault((t, q), []).append((g, 0))
    delays = delay_offsets(files[DELAY_OFFSETS])
    for t, q in on_disk:
        if t == SCHEDULE_TOPIC:
            out.setdefault((t, q), []).append((f"delay level {q + 1} (delayOffset.json)", delays.get(q + 1, 0)))
    return out


def _valid_units(cq, seg) -> int:
    arr = cq.file_units(seg)
    bad = np.flatnonzero((arr["phyOffset"] < 0) | (arr["size"] <= 0))
    return int(bad[0]) if len(bad) else len(arr)


def queue_mins(cq, min_phys: tuple[int, ...]) -> tuple[list[int], int]:
    """correctMinOffset for each commitlog min in ``min_phys`` (the queue offset of the first valid unit at or
    past it, else the queue's end), and the queue's end as a pull sees it (getMaxOffsetInQueue: the last file's
    start plus its valid units). Files are read oldest first only until every min is found."""
    segs = cq.segments.segments
    if not segs:
        return [0] * len(min_phys), 0
    last = segs[-1]
    end = last.start // CQ_UNIT_SIZE + _valid_units(cq, last)
    found: list[int | None] = [None] * len(min_phys)
    for seg in segs:
        if all(f is not None for f in found):
            break
        arr = cq.file_units(seg)
        phy = arr["phyOffset"]
        n = _valid_units(cq, seg)
        for j, m in enumerate(min_phys):
            if found[j] is None and n:
                hit = np.flatnonzero(phy[:n] >= m)
                if len(hit):
                    found[j] = seg.start // CQ_UNIT_SIZE + int(hit[0])
        del arr, phy
    return [end if f is None else min(f, end) for f in found], end


def queue_effects(store, min_before: int, min_after: int, who: dict) -> tuple[list, list]:
    """Queues whose min offset moves, and per reader the messages it had not consumed that the move removes."""
    queues, loss = [], []
    if min_after <= min_before:
        return queues, loss
    for t, q in store.queues():
        (lo_b, lo_a), hi = queue_mins(store.queue(t, q), (min_before, min_after))
        if lo_a == lo_b:
            continue
        queues.append({"topic": t, "queueId": q, "minOffsetBefore": lo_b, "minOffsetAfter": lo_a, "maxOffset": hi,
                       "messagesRemoved": lo_a - lo_b})
        for g, committed in who.get((t, q), []):
            lost = max(0, min(lo_a, hi) - max(committed, lo_b))
            loss.append({"group": g, "topic": t, "queueId": q, "committed": committed, "minOffsetBefore": lo_b,
                         "minOffsetAfter": lo_a, "nextOffset": max(committed, lo_a) if committed < hi else committed,
                         "unconsumedLost": lost})
    return queues, loss


def first_unconsumed_phy(store, who: dict, ignore_unread: bool, min_phy: int) -> tuple[int | None, str]:
    """The lowest commitlog offset of a message some reader has not consumed (None: every message is consumed),
    and which queue holds it. A queue's units follow the commitlog, so it is the unit at the lowest committed
    offset (or at the queue's min)."""
    best, where = None, ""
    for t, q in store.queues():
        cq = store.queue(t, q)
        rs = who.get((t, q))
        if not rs and ignore_unread:
            continue
        (lo,), hi = queue_mins(cq, (min_phy,))
        if not rs:
            start, label = lo, f"{t}/{q} (no group reads it)"
        else:
            g, committed = min(rs, key=lambda r: r[1])
            start = max(committed, lo)
            label = f"{t}/{q} ({g} at {committed})"
        if start >= hi:
            continue
        unit = cq.unit_at(start)
        if unit is None:
            continue
        if best is None or unit[0] < best:
            best, where = unit[0], label
    return best, where


# --- the plan ------------------------------------------------------------------------------------------------


def _prefix(files: list[LogFile], ok) -> list[LogFile]:
    out = []
    for f in files[:-1]:
        if not ok(f):
            break
        out.append(f)
    return out


def plan_reclaim(store, policy: str, *, settings: CleanupSettings | None = None, now_ms: int | None = None,
                 disk: DiskUsage | None = None, tz: str | None = None, before_ms: int | None = None,
                 keep_files: int | None = None, free_bytes: int | None = None,
                 ignore_unread: bool = False) -> ReclaimPlan:
    """Plan a reclaim under ``policy`` (one of POLICIES). Reads file names, sizes, modification times, queue
    units and the config files; changes nothing."""
    if policy not in POLICIES:
        raise UsageError(f"unknown reclaim policy {policy!r}")
    if store.abort_exists:
        raise StoreCorruptError(f"store {store.root} was not shut down cleanly (abort file present); "
                                "run `rmqstore recover` first")
    version = store.config.version
    files = [LogFile.of(s) for s in store.commitlog.segments.segments]
    min_before = files[0].start if files else 0
    notes: list[str] = []
    who = readers(store)
    prediction = None
    is_dledger = getattr(store.commitlog, "is_dledger", False)
    if policy == "as-broker":
        if now_ms is None or disk is None:
            raise UsageError("the broker's cleanup needs a time and a disk usage")
        predict = predict_dledger_cleanup if is_dledger else predict_cleanup
        prediction = predict(store, settings or CleanupSettings(), now_ms, disk, tz=tz)
        chosen = prediction.commitlog
        derived = prediction.derived
        min_after = prediction.min_after
    else:
        if policy == "consumed":
            limit, where = first_unconsumed_phy(store, who, ignore_unread, min_before)
            if limit is not None:
                notes.append(f"the oldest message a reader has not consumed is at {limit}, in {where}")
            sel = _prefix(files, lambda f: limit is None or f.start + f.size <= limit)
            reason = "every message consumed by every reader"
        elif policy == "before":
            from ..log.storetime import commitlog_offset_at

            off = store.commitlog.offset_at(before_ms) if is_dledger else commitlog_offset_at(store.commitlog, before_ms)
            sel = _prefix(files, lambda f: off is None or f.start + f.size <= off)
            reason = "every record stored before the time"
        elif policy == "keep-files":
            if keep_files is None or keep_files < 1:
                raise UsageError("--keep-files must be at least 1 (the newest file is never deleted)")
            sel = files[:max(len(files) - keep_files, 0)]
            reason = f"older than the newest {keep_files} files"
        else:
            if free_bytes is None or free_bytes <= 0:
                raise UsageError("--free needs a positive size")
            sel, got = [], 0
            for f in files[:-1]:
                if got >= free_bytes:
                    break
                sel.append(f)
                got += f.allocated
            if got < free_bytes:
                notes.append(f"only {got} bytes of commitlog files can go without deleting the newest file")
            reason = "oldest files up to the size to free"
        chosen = [(f, reason) for f in sel]
        min_after = files[len(sel)].start if len(sel) < len(files) else min_before
        if is_dledger:  # DLedger's index files behind the new begin index, then the broker's derived files
            derived = dledger_behind(store, len(sel))
        else:
            derived = derived_behind(store, min_after) if min_after > 0 else []
    queues, loss = queue_effects(store, min_before, min_after, who)
    if not files:
        notes.append("the store has no commitlog files")
    return ReclaimPlan(policy, version, store.root, chosen, derived, min_before, min_after, queues, loss,
                       prediction, notes, len(files), is_dledger)


# --- applying -------------------------------------------------------------------------------------------------


def same_filesystem(store_root: str, folder: str) -> bool:
    """Is ``folder`` (or its nearest existing parent) on the store's filesystem? Moving there frees nothing."""
    probe = os.path.abspath(folder)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        return os.stat(probe).st_dev == os.stat(store_root).st_dev
    except OSError:
        return False


@dataclass
class ReclaimResult:
    steps: list
    moved_to: str | None = None


def _check_unchanged(plan: ReclaimPlan) -> None:
    for f, _ in plan.commitlog:
        try:
            st = os.stat(f.path)
        except OSError:
            raise UsageError(f"{f.path} is gone since the plan was made; run reclaim again") from None
        if st.st_size != f.size:
            raise UsageError(f"{f.path} changed since the plan was made; run reclaim again")
    for d in plan.derived:
        if not os.path.exists(d.path):
            raise UsageError(f"{d.path} is gone since the plan was made; run reclaim again")


def apply_reclaim(plan: ReclaimPlan, *, move_to: str | None = None, delete: bool = False) -> ReclaimResult:
    """Delete (``delete``) or move into the backup folder ``move_to`` every file of the plan: the commitlog
    files oldest first, then the derived files, as the broker's cleaner does (a stop in between leaves a
    contiguous log whose stale derived files the broker's cleaner removes). Holds the store's lock throughout
    (exit 4 if a broker holds it)."""
    from .apply import save_lock_file, take_lock
    from .backup import Backup
    from ..log.mappedfile import fsync_path

    if not (move_to or delete):
        raise UsageError("choose --yes (delete) or --move-to DIR")
    root = plan.root
    backup = None
    if move_to:
        backup = Backup.create(root, move_to, "reclaim", {"policy": plan.policy, "version": plan.version,
                                                        "minPhyOffsetBefore": plan.min_before,
                                                        "minPhyOffsetAfter": plan.min_after})
        save_lock_file(root, backup)
    try:
        lock = take_lock(root, False)
    except BaseException:
        if backup is not None:  # nothing moved: no journal to leave behind
            import shutil

            shutil.rmtree(backup.dir, ignore_errors=True)
        raise
    steps = []
    try:
        _check_unchanged(plan)
        dirs = set()
        for path, why in [(f.path, r) for f, r in plan.commitlog] + [(d.path, d.why) for d in plan.derived]:
            rel = os.path.relpath(path, root)
            if backup is not None:
                backup.move(path, why)
                steps.append(f"moved {rel} to {backup.dir}")
            else:
                os.unlink(path)
                dirs.add(os.path.dirname(path))
                steps.append(f"deleted {rel}")
        for d in sorted(dirs):
            fsync_path(d, True)
        if backup is not None:
            backup.mark("complete")
    finally:
        if lock is not None:
            lock.release()
    return ReclaimResult(steps, backup.dir if backup else None)
