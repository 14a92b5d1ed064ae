"""A recovery plan: the file actions of the broker's next start as ``recover`` / ``truncate`` plan them
(:mod:`.recovery` makes it, :mod:`.apply` carries it out), its queue states and its exit-code contract."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from ..errors import EXIT_CLEAN, EXIT_CORRUPT, EXIT_FINDINGS


@dataclass
class Action:
    """One change to one file; ``repair`` backs the bytes up before doing it."""

    kind: str  # move_aside | extend | zero_tail | dispatch | checkpoint | remove_abort
    path: str | None
    why: str
    offset: int | None = None  # zero_tail: first byte to zero
    housekeeping: bool = False  # the broker does this at every start; loses nothing
    extra: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        d = {"action": self.kind, "path": self.path, "why": self.why}
        if self.offset is not None:
            d["offset"] = self.offset
        if self.housekeeping:
            d["housekeeping"] = True
        d.update(self.extra)
        return d


@dataclass
class QueueState:
    topic: str
    queue_id: int
    directory: str
    segments: list  # effective segments (after moving bad files aside)
    file_size: int
    end: int = 0  # logical byte end (next unit position)
    max_physic: int = -1
    max_ext: int = 1
    first_units: np.ndarray | None = None
    truncated_units: int = 0
    new_units: int = 0
    exists: bool = True

    @property
    def max_offset(self) -> int:
        return self.end // CQ_UNIT_SIZE


@dataclass
class RecoveryPlan:
    root: str
    version: int
    last_exit_ok: bool
    refusals: list = field(default_factory=list)
    data_loss: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    commitlog: dict = field(default_factory=dict)
    dispatch: dict = field(default_factory=dict)
    checkpoint_before: dict = field(default_factory=dict)
    checkpoint_after: dict = field(default_factory=dict)
    index_deleted: list = field(default_factory=list)
    salvage: dict | None = None
    summary: dict = field(default_factory=dict)
    queues: dict = field(default_factory=dict)
    startup_cost: dict | None = None  # engine.startup: what the next start reads (recover plans only)
    queue_repairs: list = field(default_factory=list)  # per queue: the broker's outcome and ours (derived_plan)
    refused_queues: list = field(default_factory=list)  # queues the log cannot fill contiguously
    # The exit-code contract (engine/repair/outcome.py fills these from a verify run before anything is
    # applied): every error/warning finding is fixed by an action, kept on purpose (with why), or
    # left (the plan does not repair it: the applied repair will exit 1).
    fixed_findings: list = field(default_factory=list)
    kept_findings: list = field(default_factory=list)
    left_findings: list = field(default_factory=list)
    assessed: bool = False
    keep_valid_after: bool = False  # the explicit choice that lets a plan with data loss be applied
    # (size, mtime, inode) of every file under the store root when planning began (store_fingerprint):
    # the apply reuses this plan only if the store is still so once the lock is held.
    fingerprint: dict | None = field(default=None, repr=False, compare=False)
    # verify's findings on the store as planned, when the planning walk made them (plan_recovery(with_verify))
    verify_findings: list | None = field(default=None, repr=False, compare=False)
    queue_ends: dict = field(default_factory=dict)  # (topic, queueId) -> next queue offset before the re-dispatch
    timer_repair: object = None  # repair.timerfix.TimerRepair: the timer store's changes (the "timer" action)

    @property
    def repairs(self) -> list:
        return [a for a in self.actions if not a.housekeeping]

    @property
    def empty(self) -> bool:
        """Nothing to repair and nothing damaged: the broker's next start changes nothing but what it does at
        every start anyway (housekeeping: 5.x's confirmPhyOffset, a zero-length or pre-allocated last file),
        and, once assessed, verify found nothing (housekeeping that fixes something verify reports is work)."""
        fixes = any(f.get("severity") in ("error", "warning") for f in self.fixed_findings)
        return not (self.repairs or fixes or self.refusals or self.data_loss or self.kept_findings
                    or self.left_findings)

    @property
    def exit_code(self) -> int:
        """``--dry-run``: 0 empty plan, 1 actions or damage, 2 data would be lost without a choice."""
        if self.data_loss and not self.keep_valid_after:
            return EXIT_CORRUPT
        return EXIT_CLEAN if self.empty else EXIT_FINDINGS

    @property
    def expected_exit(self) -> int:
        """What applying this plan will exit with: 2 refused (data loss), 1 when findings the plan
        does not repair will remain, else 0 (verify clean, or only the kept findings left)."""
        if self.data_loss and not self.keep_valid_after:
            return EXIT_CORRUPT
        return EXIT_FINDINGS if self.left_findings else EXIT_CLEAN

    def as_json(self) -> dict:
        return {
            "type": "recover-plan", "version": self.version, "mode": "normal" if self.last_exit_ok else "abnormal",
            "refusals": self.refusals, "dataLoss": self.data_loss, "notes": self.notes,
            "commitlog": self.commitlog, "dispatch": self.dispatch, "indexDeleted": self.index_deleted,
            "checkpointBefore": self.checkpoint_before, "checkpointAfter": self.checkpoint_after,
            "salvage": self.salvage, "actions": [a.as_json() for a in self.actions],
            "queueRepairs": self.queue_repairs, "refusedQueues": self.refused_queues,
            "summary": self.summary, "exitCode": self.exit_code,
            "empty": self.empty, "assessed": self.assessed, "expectedApplyExitCode": self.expected_exit,
            "fixedFindings": self.fixed_findings, "keptFindings": self.kept_findings, "leftFindings": self.left_findings,
        } | ({"startupCost": self.startup_cost} if self.startup_cost is not None else {})


def store_fingerprint(root: str) -> dict:
    """{relative path: (size, mtime_ns, inode)} of every file and folder under ``root`` but ``lock`` (which
    taking the lock writes). Taken before a plan reads the store and again under the lock: equal means no
    file the plan read was written, replaced, added or removed in between."""
    out: dict = {}
    _fingerprint_dir(os.path.abspath(root), "", out)
    return out


def _fingerprint_dir(path: str, rel: str, out: dict) -> None:
    """One folder of :func:`store_fingerprint`: ``scandir`` gives each entry's type, so only the lstat itself is
    a system call per file (a broker with thousands of queues has as many folders and files)."""
    try:
        it = os.scandir(path)
    except OSError:
        return  # as os.walk: a folder that cannot be listed (or vanished) adds nothing
    with it:
        entries = list(it)
    for e in entries:
        r = rel + e.name
        try:
            st = e.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if r != "lock":
            out[r] = (st.st_size, st.st_mtime_ns, st.st_ino)
        if e.is_dir(follow_symlinks=False):
            _fingerprint_dir(e.path, r + os.sep, out)


def cut_files(planner, segments: list, file_size: int, end: int, after: str, tail: str) -> list:
    """MappedFileQueue.truncateDirtyFiles(end) as planned actions: a file starting after ``end`` is moved aside
    (``after`` says why), the file holding ``end`` has its bytes after it zeroed when any is set (``tail``; ours,
    so they cannot reappear); returns the files kept."""
    from .probes import nonzero_after

    keep = []
    for seg in segments:
        if seg.start > end:
            planner.move_aside(seg.path, after)
            continue
        keep.append(seg)
        if seg.start <= end < seg.start + file_size and nonzero_after(seg.path, end - seg.start):
            planner.act("zero_tail", seg.path, tail, offset=end - seg.start)
    return keep
