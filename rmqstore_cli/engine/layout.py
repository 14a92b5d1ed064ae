"""Which store layout a root holds, and whether the engine understands it well enough to act.

The broker writes more than the classic layout (FORMAT.md): a DLedger commitlog (appendix D), a
RocksDB consume queue (5.3 ``storeType=defaultRocksDB``), batch consume queues (section 9), LMQ
queues fed by multi-dispatch (14.3) and the timer store (appendix C). A tool that misreads one of
them reports false findings, and a repair planned on a misread store destroys what the broker
keeps. So every command asks here first: a part the engine does not understand for what the
command does is refused with one line (exit 3) before anything is planned or written.

Support is declared per feature in ``SUPPORT``; a feature becomes readable or writable there when
the engine handles it, and nowhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import UsageError

# Feature -> (what it is, for the refusal line).
FEATURES = {
    "dledger": "a DLedger commitlog",
    "rocksdb-cq": "a RocksDB consume queue",
    "batch-cq": "batch consume queues",
    "lmq": "LMQ queues (multi-dispatch)",
    "timer": "a timer store",
}

READ, WRITE = "read", "write"

# Feature -> why writing commands are refused on it (one clause of the refusal line).
WRITE_REASONS = {
    "dledger": "on a DLedger store rmqstore writes only with recover, truncate, rebuild consumequeue|index|all, reclaim, "
               "offsets set and repair config, which keep the entries, their index units and the DLedger checkpoint consistent",
    "rocksdb-cq": "rmqstore reads that database (on a copy) but does not write it the way the broker does: its "
                  "units, queue offsets and dispatch checkpoint would no longer match the commitlog",
}

# Feature -> the set of command names the engine handles it for, per kind of access. "*" is every
# command of that kind. A command missing here is refused on a store with that feature.
SUPPORT: dict[str, dict[str, set[str]]] = {
    # Reads see the messages inside the entries at the broker's offsets (log/dledger.py).
    "dledger": {READ: {"dump commitlog", "dump consumequeue", "dump cqext", "dump index", "dump store", "dump checkpoint",
                       "dump config", "dump offsets", "dump dledger", "get", "index query", "stats", "verify", "diff",
                       "salvage", "spark export", "spark stats", "spark verify", "reclaim"},
                # reclaim: the data files as DLedger's own cleaner deletes them (repair/dledgercleanup.py)
                WRITE: {"rebuild consumequeue", "rebuild index", "rebuild all", "recover", "truncate", "reclaim",
                        # config/ only; they read the consume queues and messages at their offsets
                        "offsets set", "repair config"}},
    "rocksdb-cq": {
        # The database is read on a private copy (engine/derived/rocksdbqueue.py). Writes stay refused:
        # rmqstore cannot yet write the database the way the broker does (WRITE_REASONS above).
        READ: {"dump commitlog", "dump index", "dump checkpoint", "index query", "dump config", "diff",
               "dump consumequeue", "get", "dump offsets", "stats", "verify", "dump store", "salvage --jsonl"},
        WRITE: set(),
    },
    # Batch consume queues (§9) are read, checked, rebuilt, recovered and truncated; appends are refused (inner
    # batches and their INNER_BASE assignment are not written).
    "batch-cq": {READ: {"dump commitlog", "dump index", "dump checkpoint", "index query", "dump consumequeue", "get",
                        "verify", "stats", "dump config", "diff", "dump offsets", "dump store"},
                 WRITE: {"rebuild", "recover", "truncate"}},
    # LMQ queues (§14.3): units checked against the records naming them, written by dispatch, kept by
    # recovery and truncation. The Spark jobs join units to records without the multi-dispatch rules.
    "lmq": {READ: {"dump commitlog", "dump consumequeue", "dump cqext", "dump index", "dump checkpoint", "dump store",
                   "dump offsets", "dump config", "index query", "get", "verify", "stats", "diff"},
            WRITE: {"append", "offsets set", "repair config", "rebuild", "recover", "truncate"}},
    # Reads understand the timer store (dump timer, stats, verify's TM_* checks); recover and truncate
    # keep it consistent with the commitlog they leave (repair/timerfix.py), rebuild timer rewrites its
    # wheel. A consume-queue rebuild puts the timer queue's units at their records' own queue offsets (the
    # ones timercheck counts in), byte for byte the broker's on the samples; cqext is not rebuilt yet.
    "timer": {READ: {"*"}, WRITE: {"append", "rebuild index", "rebuild timer", "rebuild consumequeue", "rebuild all",
                                   "offsets set", "repair config", "recover", "truncate"}},
}


# (feature, command) -> why a command that reads the rest of such a store is still refused on it.
COMMAND_REASONS = {
    **{("dledger", f"spark rebuild {what}"): "the Spark rebuild cuts classic commitlog segments into tasks and has not been "
                                             f"made to read the messages inside DLedger entries; `rmqstore rebuild {what}` "
                                             "rebuilds them from the entries (in place, with a backup)"
       for what in ("consumequeue", "index", "all")},
    ("dledger", "dump timer"): "no broker-written DLedger sample holds a timer store, so its offsets into the entries "
                               "were never checked against the broker",
    ("rocksdb-cq", "salvage --to"): "the new store would get file consume queues while the broker's settings keep "
                                    "a RocksDB one; `salvage --jsonl` rescues the records",
}


class UnsupportedLayoutError(UsageError):
    """The store holds a layout the engine does not understand for this command (exit 3)."""


@dataclass(frozen=True)
class Layout:
    """What a store root holds beyond the classic commitlog + file consume queues."""

    features: frozenset[str] = frozenset()
    dledger_dirs: tuple[str, ...] = ()  # the dledger-<selfId> folders found
    details: dict = field(default_factory=dict, compare=False)  # feature -> what was seen

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def is_classic(self) -> bool:
        return not self.features


def _nonempty_dir(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return any(True for _ in it)
    except OSError:
        return False


def is_rocksdb_dir(path: str) -> str | None:
    """The database's own files, if ``path`` is a RocksDB folder."""
    try:
        names = os.listdir(path)
    except OSError:
        return None
    seen = [n for n in names if n == "CURRENT" or n.startswith("MANIFEST-") or n.endswith(".sst")
            or n.startswith("OPTIONS-")]
    # topics may be named CURRENT or MANIFEST-x (not *.sst: no dots): a database's CURRENT is a file
    if os.path.isfile(os.path.join(path, "CURRENT")) and any(n.startswith("MANIFEST-") for n in names):
        return ", ".join(sorted(seen)[:4])
    if any(n.endswith(".sst") for n in names):
        return ", ".join(sorted(seen)[:4])
    return None


def _has_lmq_queue(cq_dir: str) -> bool:
    try:
        return any(n.startswith("%LMQ%") for n in os.listdir(cq_dir))
    except OSError:
        return False


def _timer_has_data(root: str) -> bool:
    tl = os.path.join(root, "timerlog")
    try:
        for n in os.listdir(tl):
            p = os.path.join(tl, n)
            if os.path.isfile(p) and os.path.getsize(p) > 0:
                return True
    except OSError:
        pass
    return False


def detect_layout(root: str, config=None) -> Layout:
    """Look at a store root's folders (and the broker's settings when given); reads no file data."""
    features: set[str] = set()
    details: dict[str, str] = {}
    try:
        names = set(os.listdir(root))
    except OSError:
        names = set()
    dledger = tuple(sorted(n for n in names if n.startswith("dledger-") and os.path.isdir(os.path.join(root, n))))
    cl_dir = (getattr(config, "storePathCommitLog", None) or os.path.join(root, "commitlog"))
    if getattr(config, "enableDLegerCommitLog", False):
        features.add("dledger")
        details["dledger"] = "enableDLegerCommitLog=true in the broker's settings"
    elif dledger and not _nonempty_dir(cl_dir):
        features.add("dledger")
        details["dledger"] = f"{'/, '.join(dledger)}/ beside an empty or missing commitlog/"
    cq_dir = os.path.join(root, "consumequeue")
    rocks = is_rocksdb_dir(cq_dir)
    if rocks or getattr(config, "storeType", "default") == "defaultRocksDB":
        features.add("rocksdb-cq")
        details["rocksdb-cq"] = f"consumequeue/ is a RocksDB database ({rocks})" if rocks \
            else "storeType=defaultRocksDB in the broker's settings"
    if _nonempty_dir(os.path.join(root, "batchconsumequeue")):
        features.add("batch-cq")
        details["batch-cq"] = "batchconsumequeue/ holds queues"
    if not rocks and _has_lmq_queue(cq_dir):
        features.add("lmq")
        details["lmq"] = "consumequeue/ holds %LMQ% queues"
    if _timer_has_data(root):
        features.add("timer")
        details["timer"] = "timerlog/ holds units"
    return Layout(frozenset(features), dledger, details)


def supported(feature: str, command: str, access: str) -> bool:
    allowed = SUPPORT.get(feature, {}).get(access, set())
    return "*" in allowed or command in allowed or command.split(" ")[0] in allowed


def require_understood(layout: Layout, command: str, access: str) -> None:
    """Refuse ``command`` (exit 3, nothing planned or written) on a layout the engine does not
    understand for that kind of access."""
    missing = [f for f in sorted(layout.features) if not supported(f, command, access)]
    if not missing:
        return
    what = "; ".join(f"{FEATURES[f]} ({layout.details.get(f, f)})" for f in missing)
    reasons = [COMMAND_REASONS[(f, command)] for f in missing if (f, command) in COMMAND_REASONS]
    if access == READ and len(reasons) == len(missing):
        raise UnsupportedLayoutError(f"cannot `{command}` this store: it holds {what}: {'; '.join(reasons)}; "
                                     "nothing was changed")
    command = command.split(" --")[0]
    if "dledger" in missing and command == "append":
        raise UnsupportedLayoutError(
            "refusing `append`: the store keeps its messages in a DLedger (Raft) log, and a replicated log must not be "
            "written behind its group's back (the other replicas would never hold the entries); send the messages "
            "through the group's leader. Nothing was changed")
    what = "; ".join(f"{FEATURES[f]} ({layout.details.get(f, f)})" for f in missing)
    if access == WRITE:
        why = "; ".join(WRITE_REASONS[f] for f in missing if f in WRITE_REASONS)
        raise UnsupportedLayoutError(
            f"refusing `{command}`: the store holds {what}, which rmqstore cannot yet write safely"
            + (f" ({why})" if why else "")
            + " (supported for writing: a classic commitlog with file consume queues); nothing was changed")
    raise UnsupportedLayoutError(
        f"cannot `{command}` this store: it holds {what}, which rmqstore cannot read yet "
        f"(its findings would be false); supported: a classic commitlog with file consume queues")
