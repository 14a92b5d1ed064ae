"""The RocksDB consume queue (5.3 ``storeType=defaultRocksDB``), read side.

Mirrors the broker's ``RocksDBConsumeQueueStore`` (the database, its queues and the dispatch
checkpoint), ``RocksDBConsumeQueueTable`` (the ``default`` column family: one entry per unit) and
``RocksDBConsumeQueueOffsetTable`` (the ``offset`` column family: per-queue max/min and the checkpoint),
with ``RocksDBConsumeQueue`` for one queue. Layouts: :mod:`formats.rocksdbcq`.

The store is never changed: RocksDB bindings write into the folder they open (rocksdict leaves a
``rocksdict-config.json``; a read-write open would replay the WAL and compact), so the database's
own files are copied into a private temporary folder (a reflink clone where the file system has them,
else a plain copy; never a hard link, which would share the bytes with the store) and that copy is
opened read-only, then removed on close. Queues are read one key range at a time, in blocks: nothing
holds the whole database.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass

import numpy as np

from rmqstore_cli.formats import rocksdbcq as fmt

from ..errors import StoreCorruptError, UsageError

BLOCK_UNITS = 65536  # units decoded per block (28 B + key each): a block's columns are a few MB

_FICLONE = 0x40049409  # ioctl(dst, FICLONE, src): copy-on-write clone (btrfs, xfs, ...)
_COPY_ATTEMPTS = 3


def _needed(name: str) -> bool:
    """The files a read-only open reads: CURRENT, the manifests, options, tables, WALs, blob files."""
    return (name in ("CURRENT", "IDENTITY") or name.startswith("MANIFEST-") or name.startswith("OPTIONS-")
            or name.endswith((".sst", ".log", ".blob")))


def _clone_or_copy(src: str, dst: str) -> None:
    with open(src, "rb") as fsrc, open(dst, "wb") as fdst:
        try:
            fcntl.ioctl(fdst.fileno(), _FICLONE, fsrc.fileno())
            return
        except OSError:
            pass
        shutil.copyfileobj(fsrc, fdst, 1 << 20)


def copy_database(src: str, dst: str) -> list[str]:
    """Copy the database files RocksDB needs from ``src`` into the empty folder ``dst``; the names copied.

    A live broker may finish a compaction between the listing and the copy (a table file vanishes):
    the copy is then taken again, a few times."""
    last = None
    for _ in range(_COPY_ATTEMPTS):
        for n in os.listdir(dst):
            os.unlink(os.path.join(dst, n))
        try:
            names = sorted(n for n in os.listdir(src) if _needed(n))
            # CURRENT first: it names the manifest, which names the tables copied after it
            for n in sorted(names, key=lambda n: n != "CURRENT"):
                _clone_or_copy(os.path.join(src, n), os.path.join(dst, n))
            return names
        except FileNotFoundError as e:
            last = e
        except OSError as e:
            raise UsageError(f"cannot copy the RocksDB consume queue {src} to {dst}: {e.strerror}") from None
    raise StoreCorruptError(f"the RocksDB consume queue {src} changed while it was copied ({last.filename} vanished): "
                            "is a broker running on it?")


def _rocksdict():
    try:
        import rocksdict
    except ImportError:
        raise UsageError("reading a RocksDB consume queue needs the rocksdict package: "
                         "pip install 'rmqstore[rocksdb]' (or pip install rocksdict)") from None
    return rocksdict


@dataclass(frozen=True)
class OffsetEntry:
    """A ``max`` or ``min`` entry of the offset table: the unit's commitlog offset and queue offset."""

    phy_offset: int
    cq_offset: int


@dataclass
class RocksQueueUnits:
    """A queue's units in [min offset, max offset) as columns (the file queue's QueueUnits, plus store times)."""

    queue_offsets: np.ndarray
    phy: np.ndarray
    size: np.ndarray
    tags: np.ndarray
    store_time: np.ndarray
    end_offset: int
    min_offset: int
    stop_file: str | None = None
    stop_position: int = 0


class RocksDBConsumeQueueStore:
    """The ``consumequeue/`` RocksDB database of a store (RocksDBConsumeQueueStore + its offset table),
    opened on a private copy when first used."""

    def __init__(self, directory: str, min_phy_offset=lambda: 0):
        self.directory = directory
        self._min_phy_offset = min_phy_offset
        self._db = None
        self._offset_cf = None
        self._tmp: str | None = None
        self._cleanup = None
        self._offsets: dict[tuple[str, int], dict[str, OffsetEntry]] | None = None
        self._checkpoint: int | None = None
        self.problems: list[tuple[str, str, dict]] = []  # (code, message, details): entries that decode to nothing
        self._queue_list: list[tuple[str, int]] | None = None
        self.files: list[str] = []

    # --- the private copy ------------------------------------------------------------------

    @property
    def present(self) -> bool:
        """Whether the folder holds a database (a store configured for RocksDB may not have written one yet)."""
        try:
            return any(_needed(n) for n in os.listdir(self.directory))
        except OSError:
            return False

    def _open(self):
        if self._db is not None:
            return self._db
        if not self.present:
            return None
        rd = _rocksdict()
        if not os.path.isfile(os.path.join(self.directory, "CURRENT")):
            raise StoreCorruptError(f"{self.directory} holds RocksDB tables but no CURRENT file: the database cannot be opened")
        self._tmp = tempfile.mkdtemp(prefix="rmqstore-rocksdb-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._tmp, True)
        copy = os.path.join(self._tmp, "db")
        os.mkdir(copy)
        try:
            self.files = copy_database(self.directory, copy)
        except BaseException:
            self.close()  # no partial copy left behind (a full disk, an interrupt)
            raise
        opts = rd.Options(raw_mode=True)
        try:
            cfs = rd.Rdict.list_cf(copy, opts)
            self._db = rd.Rdict(copy, options=opts, access_type=rd.AccessType.read_only(),
                                column_families={n: rd.Options(raw_mode=True) for n in cfs if n != fmt.DEFAULT_CF})
        except Exception as e:  # rocksdict raises plain Exception with RocksDB's status text
            self.close()
            raise StoreCorruptError(f"cannot open the RocksDB consume queue {self.directory}: {e}") from None
        self.column_families = cfs
        if fmt.OFFSET_CF in cfs:
            self._offset_cf = self._db.get_column_family(fmt.OFFSET_CF)
        return self._db

    def close(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            finally:
                self._db = None
                self._offset_cf = None
        if self._cleanup is not None:
            self._cleanup()
            self._cleanup = None

    def _unreadable(self, e: Exception) -> StoreCorruptError:
        text = str(e).replace(os.path.join(self._tmp or "", "db"), self.directory)  # name the store's files
        return StoreCorruptError(f"the RocksDB consume queue {self.directory} cannot be read: {text}")

    def _check_status(self, it) -> None:
        """An iterator that meets a damaged table stops as if the data ended: ask it why it stopped."""
        try:
            it.status()
        except Exception as e:  # rocksdict raises plain Exception with RocksDB's status text
            raise self._unreadable(e) from None

    # --- RocksDBConsumeQueueOffsetTable ---------------------------------------------------------

    def _load_offsets(self) -> None:
        """The offset column family (two entries per queue and the checkpoint: small) into a dict."""
        if self._offsets is not None:
            return
        offsets: dict = {}
        if self._open() is not None and self._offset_cf is not None:
            entries = []  # two per queue and the checkpoint: small
            it = self._offset_cf.iter()
            it.seek_to_first()
            while it.valid():
                entries.append((it.key(), it.value()))
                it.next()
            self._check_status(it)
            for key, value in entries:
                k = fmt.parse_offset_key(key)
                if k is not None and k[0] == fmt.CHECKPOINT_TOPIC and k[1] == "max" and k[2] == 0:
                    cp = fmt.parse_checkpoint_value(value)
                    if cp is None:
                        self.problems.append(("RDB_OFFSET_ENTRY", f"the dispatch checkpoint's value is {len(value)} bytes, "
                                              f"not {fmt.CHECKPOINT_VALUE_SIZE}", {"keyHex": key.hex()}))
                    else:
                        self._checkpoint = cp
                    continue
                v = fmt.parse_offset_value(value)
                if k is None or k[1] not in ("max", "min") or v is None:
                    self.problems.append(("RDB_OFFSET_ENTRY", "offset-table entry that is not a queue's max/min "
                                          f"(key {key.hex()}, {len(value)}-byte value): the broker ignores it",
                                          {"keyHex": key.hex()}))
                    continue
                offsets.setdefault((k[0], k[2]), {})[k[1]] = OffsetEntry(*v)
        self._offsets = offsets

    def offset_entries(self, topic: str, queue_id: int) -> dict[str, OffsetEntry]:
        self._load_offsets()
        return self._offsets.get((topic, queue_id), {})

    @property
    def checkpoint(self) -> int | None:
        """The highest commitlog offset dispatched (``getMaxPhyOffsetInConsumeQueue``); None when absent."""
        self._load_offsets()
        return self._checkpoint

    @property
    def has_offset_family(self) -> bool:
        return self._open() is not None and self._offset_cf is not None

    # --- the queues ---------------------------------------------------------------------------

    def _unit_queues(self) -> list[tuple[str, int]]:
        """Queues that hold units, one seek per queue (past each queue's key range), not one step per unit."""
        db = self._open()
        out = []
        if db is None:
            return out
        it = db.iter()
        it.seek_to_first()
        bad_first, bad_count = None, 0
        while it.valid():
            key = it.key()
            k = fmt.parse_unit_key(key)
            if k is None:  # stepped over one by one (they have no queue to skip), reported once
                bad_first = bad_first or key
                bad_count += 1
                it.next()
                continue
            out.append((k[0], k[1]))
            it.seek(fmt.queue_range(k[0], k[1])[1])
        self._check_status(it)
        if bad_count:
            self.problems.append(("RDB_UNIT_KEY", f"{bad_count} keys of the default column family are not unit keys "
                                  "(topic length | 0x01 | topic | 0x01 | queue id | 0x01 | queue offset), the first "
                                  f"{bad_first.hex()}", {"keyHex": bad_first.hex(), "count": bad_count}))
        return out

    def queues(self) -> list[tuple[str, int]]:
        """(topic, queueId) of every queue with units or offset-table entries, sorted like file queues."""
        if self._queue_list is None:  # the copy never changes: list it once
            self._load_offsets()
            self._queue_list = sorted(set(self._unit_queues()) | set(self._offsets))
        return list(self._queue_list)

    def queue(self, topic: str, queue_id: int) -> "RocksDBConsumeQueue":
        return RocksDBConsumeQueue(self, topic, queue_id)

    def iter_range(self, start: bytes, end: bytes):
        """(key, value) of the default column family in [start, end), in key order."""
        db = self._open()
        if db is None:
            return
        it = db.iter()
        it.seek(start)
        while it.valid():
            key = it.key()
            if key >= end:
                break
            yield key, it.value()
            it.next()

    def iterator_at(self, start: bytes):
        """A default-column-family iterator at the first key >= ``start``; None without a database."""
        db = self._open()
        if db is None:
            return None
        it = db.iter()
        it.seek(start)
        return it

    def get(self, key: bytes) -> bytes | None:
        db = self._open()
        if db is None:
            return None
        try:
            return db.get(key)
        except Exception as e:
            raise self._unreadable(e) from None


class RocksDBConsumeQueue:
    """One queue of the database (RocksDBConsumeQueue over RocksDBConsumeQueueTable)."""

    def __init__(self, db: RocksDBConsumeQueueStore, topic: str, queue_id: int):
        self.db = db
        self.topic = topic
        self.queue_id = queue_id
        self.directory = db.directory
        self._prefix = fmt.queue_prefix(topic, queue_id)
        self._start, self._end = fmt.queue_range(topic, queue_id)

    # --- the offset table -----------------------------------------------------------------------

    @property
    def max_entry(self) -> OffsetEntry | None:
        return self.db.offset_entries(self.topic, self.queue_id).get("max")

    @property
    def min_entry(self) -> OffsetEntry | None:
        return self.db.offset_entries(self.topic, self.queue_id).get("min")

    @property
    def max_offset(self) -> int:
        """``getMaxOffsetInQueue``: the max entry's queue offset + 1 (the next offset to assign), 0 without one."""
        m = self.max_entry
        return m.cq_offset + 1 if m is not None else 0

    def min_offset(self) -> int:
        """``getMinOffsetInQueue`` (RocksDBConsumeQueueOffsetTable#getMinCqOffset): the min entry while its unit
        is still in the commitlog, else the first unit from the commitlog's min offset on (``correctMinCqOffset``:
        a binary search between the entries), the max + 1 when every unit is before it, 0 without a max entry."""
        cl_min = self.db._min_phy_offset()
        mn, mx = self.min_entry, self.max_entry
        if mn is not None and mn.phy_offset >= cl_min:
            return mn.cq_offset
        if mx is None:
            return 0
        if mx.phy_offset < cl_min:
            return mx.cq_offset + 1
        low, high = (mn.cq_offset if mn is not None else 0), mx.cq_offset
        found = -1
        while high >= low:  # binarySearchInCQ(min=true): the lowest offset whose unit is at or past cl_min
            mid = low + ((high - low) >> 1)
            u = self.unit_at(mid)
            if u is None:
                low = mid + 1
                continue
            if u[0] == cl_min:
                found = mid
                break
            if u[0] > cl_min:
                found, high = mid, mid - 1
            else:
                low = mid + 1
        # no unit found (the range's units are missing): the broker answers the offset it searched from
        return found if found != -1 else (mn.cq_offset if mn is not None else 0)

    # --- units --------------------------------------------------------------------------------

    def location(self, queue_offset: int) -> tuple[str, None]:
        """Where a unit is, for findings: the database folder (its key names topic, queue and offset)."""
        return self.directory, None

    def unit_value(self, queue_offset: int) -> tuple[int, int, int, int] | None:
        """(phyOffset, size, tagsCode, storeTime) of the unit at ``queue_offset``, None when there is none."""
        v = self.db.get(fmt.unit_key(self.topic, self.queue_id, queue_offset))
        if v is None:
            return None
        if len(v) != fmt.CQ_VALUE_SIZE:
            raise StoreCorruptError(f"unit {queue_offset} of {self.topic}/{self.queue_id} in {self.directory} has a "
                                    f"{len(v)}-byte value, not {fmt.CQ_VALUE_SIZE}")
        u = fmt.CQ_VALUE.parse(v)
        return u.phyOffset, u.size, u.tagsCode, u.storeTime

    def unit_at(self, queue_offset: int) -> tuple[int, int, int] | None:
        u = self.unit_value(queue_offset)
        return None if u is None else u[:3]

    def blocks(self, start: int = 0, stop: int | None = None, block: int = BLOCK_UNITS, bad: list | None = None):
        """(queue offsets int64, values CQ_VALUE_DTYPE) of the units in [start, stop), ``block`` at a time, in
        queue-offset order. Entries whose key or value does not decode are skipped (and listed in ``bad`` as
        (queue offset or key, reason) when it is given)."""
        bad = [] if bad is None else bad
        lo = fmt.unit_key(self.topic, self.queue_id, max(start, 0)) if start > 0 else self._start
        hi = fmt.unit_key(self.topic, self.queue_id, stop) if stop is not None else self._end
        it = self.db.iterator_at(lo)
        if it is None:
            return
        prefix, klen, vsize = self._prefix, len(self._prefix) + fmt.QUEUE_OFFSET_SIZE, fmt.CQ_VALUE_SIZE
        key_of, value_of, step, valid = it.key, it.value, it.next, it.valid  # the per-unit loop: bound methods
        keys, values = [], []
        while valid():
            key = key_of()
            if key >= hi:
                break
            value = value_of()
            step()
            if len(key) != klen or len(value) != vsize or not key.startswith(prefix):
                bad.append(_bad_entry(key, value, prefix, klen))
                continue
            keys.append(key)
            values.append(value)
            if len(keys) == block:
                yield self._columns(keys, values, klen, bad)
                keys, values = [], []
        self.db._check_status(it)
        if keys:
            yield self._columns(keys, values, klen, bad)

    @staticmethod
    def _columns(keys: list, values: list, klen: int, bad: list):
        n = len(keys)
        raw = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(n, klen)[:, klen - fmt.QUEUE_OFFSET_SIZE:]
        qofs = np.ascontiguousarray(raw).view(">i8").reshape(n).astype(np.int64)
        vals = fmt.decode_values(b"".join(values), n)
        negative = qofs < 0  # they sort after every other unit of the queue (big-endian sign bit)
        if negative.any():
            bad.extend((keys[i].hex(), "negative queue offset") for i in np.flatnonzero(negative).tolist())
            qofs, vals = qofs[~negative], vals[~negative]
        return qofs, vals

    def units(self, *, all_files: bool = True) -> RocksQueueUnits:
        """The units the broker serves: [min offset, max offset) (units past the max entry are dirty: the
        broker writes over them). One queue's columns; the database is never read whole."""
        lo, hi = self.min_offset(), self.max_offset
        parts = list(self.blocks(lo, hi))
        cat = lambda i, f: (np.concatenate([p[i][f] if f else p[i] for p in parts]).astype(np.int64)  # noqa: E731
                            if parts else np.zeros(0, np.int64))
        return RocksQueueUnits(cat(0, None), cat(1, "phyOffset"), cat(1, "size"), cat(1, "tagsCode"), cat(1, "storeTime"),
                               hi, lo)

    def bounds(self) -> tuple[int, int, int | None]:
        """(min offset, max offset, end of the max entry's record: phy + size, or None) as the broker reads them."""
        mx = self.max_entry
        last_end = None
        if mx is not None:
            u = self.unit_at(mx.cq_offset)
            last_end = mx.phy_offset + u[1] if u is not None else None
        return self.min_offset(), self.max_offset, last_end

    def key_range_units(self) -> int:
        """How many entries the queue's key range holds (the units, dirty ones included)."""
        return sum(len(q) for q, _ in self.blocks())


def _bad_entry(key: bytes, value: bytes, prefix: bytes, klen: int) -> tuple:
    if len(key) != klen or not key.startswith(prefix):
        return key.hex(), "key is not a unit key of this queue"
    return fmt.queue_offset_of(key), f"{len(value)}-byte value, not {fmt.CQ_VALUE_SIZE}"
