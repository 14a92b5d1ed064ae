"""A store root opened offline (the broker's DefaultMessageStore, read side).

``Store.open`` never creates, locks or changes anything: every file is opened read-only.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .log.checkpoint import Checkpoint, read_checkpoint, read_checkpoint_head
from .log.commitlog import CommitLog
from .config.files import parse_fastjson, read_store_config_json  # noqa: F401  (parse_fastjson: callers import it here)
from .config.storeconfig import StoreConfig, apply_settings, infer_geometry, read_broker_conf
from .derived.consumequeue import ConsumeQueue, ConsumeQueueExt, list_queues
from .errors import NotAStoreError, UsageError
from .findings import Finding
from .layout import READ, WRITE, Layout, detect_layout, is_rocksdb_dir, require_understood
from .derived.index import IndexService

if TYPE_CHECKING:
    from .derived.rocksdbqueue import RocksDBConsumeQueue, RocksDBConsumeQueueStore

KNOWN_ENTRIES = {
    "commitlog", "consumequeue", "consumequeue_ext", "batchconsumequeue", "index", "checkpoint", "abort",
    "lock", "config", "timerwheel", "timerlog", "compaction", "epochFileCheckpoint", "brokerIdentity",
    "transaction", "abort.bak", "timercheck", "timermetrics", "rocksdbstore", "dledger",
}


@dataclass
class LockState:
    """Whether the store's ``lock`` file exists and a broker holds it."""

    exists: bool
    held: bool | None  # None: could not probe (no permission)
    detail: str = ""


def probe_lock(root: str) -> LockState:
    """Is the broker's ``lock`` file locked (fcntl record lock on byte 0, §12.2)?

    Probed with F_GETLK so nothing is acquired and the file is never created or changed.
    """
    path = os.path.join(root, "lock")
    if not os.path.isfile(path):
        return LockState(False, False)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return LockState(True, None, e.strerror or "")
    try:
        import struct

        # struct flock { short l_type; short l_whence; off_t l_start; off_t l_len; pid_t l_pid; }
        req = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
        try:
            res = fcntl.fcntl(fd, fcntl.F_GETLK, req)
        except OSError as e:
            return LockState(True, None, e.strerror or "")
        l_type, _, _, _, pid = struct.unpack("hhqqi4x", res)
        if l_type == fcntl.F_UNLCK:
            return LockState(True, False)
        return LockState(True, True, f"held by pid {pid}")
    finally:
        os.close(fd)


class Store:
    """The parts of a store root: commitlog, consume queues, ext, index, checkpoint, flags."""

    def __init__(self, root: str, config: StoreConfig):
        self.root = root
        self.config = config
        cl_dir = config.storePathCommitLog or os.path.join(root, "commitlog")
        self._index: IndexService | None = None
        self._queues: dict[tuple[str, int], ConsumeQueue | RocksDBConsumeQueue] = {}
        self._exts: dict[tuple[str, int], ConsumeQueueExt] = {}
        self._bcqs: dict = {}
        self._batch_topics: set | None = None
        self._layout: Layout | None = None
        self._rocksdb: RocksDBConsumeQueueStore | None = None
        if self.layout.has("dledger") and self.layout.dledger_dirs:
            from .log.dledger import DLedgerCommitLog, choose_dir

            self.commitlog = DLedgerCommitLog(choose_dir(root, config.dLegerSelfId), config)
        else:
            self.commitlog = CommitLog(cl_dir, config)

    @property
    def is_dledger(self) -> bool:
        return getattr(self.commitlog, "is_dledger", False)

    # --- opening -------------------------------------------------------------------

    @classmethod
    def open(cls, root: str, *, config_file: str | None = None, overrides: dict | None = None) -> "Store":
        root = os.path.abspath(os.path.expanduser(root))
        if not os.path.exists(root):
            raise UsageError(f"store directory {root} does not exist")
        if not os.path.isdir(root):
            raise UsageError(f"{root} is a file, not a store directory")
        if not os.access(root, os.R_OK | os.X_OK):
            raise UsageError(f"store directory {root} is not readable")
        cfg = StoreConfig()
        if config_file:
            cfg = apply_settings(cfg, read_broker_conf(config_file))
        if overrides:
            cfg = apply_settings(cfg, {k: v for k, v in overrides.items() if v is not None})
        try:
            cfg = infer_geometry(cfg, root)
        except OSError as e:
            raise UsageError(f"cannot read {root}: {e.strerror}") from None
        store = cls(root, cfg)
        store._check_is_store()
        return store

    def _check_is_store(self) -> None:
        entries = set(os.listdir(self.root))
        markers = {"commitlog", "consumequeue", "index", "checkpoint"}
        if not (entries & markers) and not os.path.isdir(self.commitlog.directory):
            if not entries:
                raise NotAStoreError(f"{self.root} is empty: not a RocketMQ store (no commitlog/, consumequeue/, index/ or checkpoint)")
            raise NotAStoreError(f"{self.root} is not a RocketMQ store (no commitlog/, consumequeue/, index/ or checkpoint)")

    # --- layout --------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        if self._layout is None:
            self._layout = detect_layout(self.root, self.config)
        return self._layout

    def require(self, command: str, *, writes: bool = False) -> None:
        """Refuse (exit 3) a command on a layout the engine does not understand for it."""
        require_understood(self.layout, command, WRITE if writes else READ)

    # --- parts ---------------------------------------------------------------------

    @property
    def index(self) -> IndexService:
        if self._index is None:
            self._index = IndexService(self.root, self.config)
        return self._index

    @property
    def rocksdb(self) -> RocksDBConsumeQueueStore | None:
        """The RocksDB consume queue (5.3 storeType=defaultRocksDB), None for file consume queues."""
        if self._rocksdb is None and self.layout.has("rocksdb-cq"):
            cq_dir = os.path.join(self.root, "consumequeue")
            if not is_rocksdb_dir(cq_dir) and list_queues(self.root, "consumequeue"):
                raise UsageError(f"the broker's settings say storeType=defaultRocksDB but {cq_dir} holds file consume "
                                 "queues: check --config")
            from .derived.rocksdbqueue import RocksDBConsumeQueueStore  # only a RocksDB store needs it (and tempfile)

            self._rocksdb = RocksDBConsumeQueueStore(cq_dir, lambda: self.commitlog.min_offset)
        return self._rocksdb

    def queues(self) -> list[tuple[str, int]]:
        if self.rocksdb is not None:
            return self.rocksdb.queues()
        return list_queues(self.root, "consumequeue")

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | RocksDBConsumeQueue:
        """One consume queue: a file queue, or a RocksDBConsumeQueue of the database (same read methods)."""
        key = (topic, queue_id)
        if key not in self._queues:
            if self.rocksdb is not None:
                self._queues[key] = self.rocksdb.queue(topic, queue_id)
            else:
                self._queues[key] = ConsumeQueue(self.root, topic, queue_id, self.config)
        return self._queues[key]

    def ext(self, topic: str, queue_id: int) -> ConsumeQueueExt:
        key = (topic, queue_id)
        if key not in self._exts:
            self._exts[key] = ConsumeQueueExt(self.root, topic, queue_id, self.config)
        return self._exts[key]

    def batch_queues(self) -> list[tuple[str, int]]:
        """(topic, queueId) of every ``batchconsumequeue/`` queue (§9)."""
        from .derived.batchcq import list_batch_queues

        return list_batch_queues(self.root)

    def batch_queue(self, topic: str, queue_id: int):
        from .derived.batchcq import BatchConsumeQueue

        key = (topic, queue_id)
        got = self._bcqs.get(key)
        if got is None:
            got = self._bcqs[key] = BatchConsumeQueue(self.root, topic, queue_id, self.config)
        return got

    def batch_topics(self) -> set[str]:
        """Topics dispatched into batch consume queues (folders under batchconsumequeue/, topics.json)."""
        if self._batch_topics is None:
            from .derived.batchcq import batch_topics

            self._batch_topics = batch_topics(self)
        return self._batch_topics

    def ext_queues(self) -> list[tuple[str, int]]:
        return list_queues(self.root, "consumequeue_ext")

    def checkpoint(self) -> Checkpoint:
        return read_checkpoint(os.path.join(self.root, "checkpoint"))

    def checkpoint_head(self, n: int = 24) -> bytes:
        return read_checkpoint_head(os.path.join(self.root, "checkpoint"), n)

    @property
    def abort_exists(self) -> bool:
        return os.path.exists(os.path.join(self.root, "abort"))

    def lock_state(self) -> LockState:
        return probe_lock(self.root)

    def stray_entries(self) -> list[Finding]:
        out = []
        for name in sorted(os.listdir(self.root)):
            if name not in KNOWN_ENTRIES and not name.startswith("dledger-"):
                out.append(Finding("STORE_STRAY", "info", os.path.join(self.root, name), None,
                                   f"unexpected entry {name!r} in the store root"))
        return out

    def read_config_json(self, name: str) -> dict | None:
        """A ``config/*.json`` file written by fastjson (bare integer keys), falling back to ``.bak``."""
        return read_store_config_json(self.root, name)

    def close(self) -> None:
        self.commitlog.close()
        if self._index:
            self._index.close()
        for q in self._queues.values():
            if hasattr(q, "segments"):
                q.segments.close()
        if self._rocksdb is not None:
            self._rocksdb.close()
        for e in self._exts.values():
            e.segments.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


