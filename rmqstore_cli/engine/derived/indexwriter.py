"""Index file writer (the broker's IndexService.buildIndex / IndexFile.putKey, FORMAT.md §10.4, §10.6).

Entries are written through an ``mmap`` of the current index file.  Keys are hashed and
chained in bulk (numpy) when a run of keys goes into one file; the result is the same as the
broker's one-key-at-a-time insertion, including its quirks:

* a file created after a full one starts with ``begin = end =`` the previous file's end
  (timestamp and physical offset); the first entry's timeDiff is computed against that
  inherited begin, only then is begin set to the entry's own values;
* a new file is created as soon as a message is dispatched while the last file is full, even
  if that message has no key (it then stays empty, with the inherited header);
* a message whose offset is below the current file's endPhyOffset is not indexed again.

File names come from ``namer(store_timestamp)`` of the message that made the file necessary:
the broker (and ``append``) use the wall clock, a rebuild may use the message's store time.
Names are kept unique and increasing.
"""

from __future__ import annotations

import datetime as _dt
import os
import struct
import time
from typing import Callable, Sequence

import numpy as np

from rmqstore_cli.formats.indexbuild import put_entries
from rmqstore_cli.formats.hashing import INT_MIN, index_key_hash, index_key_hash_many, java_hash
from rmqstore_cli.formats.records import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE, TRANSACTION_ROLLBACK

from ..config.storeconfig import StoreConfig
from .index import HEADER_STRUCT
from ..log.mappedfile import WritableSegment, fsync_dir, makedirs
from ..log.writeback import PopulateAhead, populate_write

INT_MAX = (1 << 31) - 1
_I32 = struct.Struct(">i")
_ENTRY = struct.Struct(">iqii")
VECTOR_MIN = 24  # below this many keys the scalar path is faster than numpy


def millis_name(ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` of an epoch-millisecond time in local time (UtilAll.timeMillisToHumanString)."""
    t = _dt.datetime.fromtimestamp(ms / 1000.0)
    return t.strftime("%Y%m%d%H%M%S") + "%03d" % (ms % 1000)


def wall_clock_namer(_store_timestamp: int) -> str:
    """The broker's rule: the creation time of the file."""
    return millis_name(int(time.time() * 1000))


def store_time_namer(store_timestamp: int) -> str:
    """Name a file after the store time of the message that created it (for rebuilds)."""
    return millis_name(store_timestamp)


def _java_div1000(d: int) -> int:
    q = abs(d) // 1000
    return q if d >= 0 else -q


_INV31 = pow(31, -1, 1 << 32)  # 31 is odd, so it is invertible modulo 2**32
_POW = np.ones(1, dtype=np.uint32)  # 31**e mod 2**32
_IPOW = np.ones(1, dtype=np.uint32)  # 31**-e mod 2**32


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(31**e, 31**-e) mod 2**32 for e in [0, n] (uint32 arithmetic wraps like Java int)."""
    global _POW, _IPOW
    if len(_POW) <= n:
        m = max(n + 1, 2 * len(_POW))
        p = np.full(m, 31, dtype=np.uint32)
        p[0] = 1
        q = np.full(m, _INV31, dtype=np.uint32)
        q[0] = 1
        _POW, _IPOW = np.cumprod(p, dtype=np.uint32), np.cumprod(q, dtype=np.uint32)
    return _POW, _IPOW


def _index_hashes(keys: list[str], prefix: np.ndarray, topics: list[str], rec: np.ndarray) -> np.ndarray:
    """keyHash of ``topic#key`` for many keys (int64).  String.hashCode of a concatenation is
    hash(a) * 31**len(b) + hash(b) (mod 2**32), so each key is hashed alone and combined with
    the cached hash of its ``topic#`` (``prefix``; ``topics[rec[j]]`` is key j's topic).  The
    keys' hashes come from one prefix sum over all their characters: hash of chars [s, e) =
    31**(e-1) * sum(c[p] * 31**-p).  Non-ASCII keys take the general path."""
    joined = "".join(keys)
    if not joined.isascii():
        return index_key_hash_many([f"{topics[i]}#{k}" for i, k in zip(rec.tolist(), keys)])
    m = len(keys)
    lens = np.fromiter(map(len, keys), dtype=np.int64, count=m)
    ends = np.cumsum(lens)
    c = len(joined)
    pw, ipw = _powers(max(c, int(lens.max()) if m else 0))
    acc = np.zeros(c + 1, dtype=np.uint32)
    if c:
        chars = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
        np.cumsum(chars * ipw[:c], dtype=np.uint32, out=acc[1:])
    h = pw[np.maximum(ends - 1, 0)] * (acc[ends] - acc[ends - lens])
    full = (prefix * pw[lens] + h).view(np.int32).astype(np.int64)
    out = np.abs(full)
    out[full == INT_MIN] = 0
    return out


def _hashed_keys(b, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(record of each key, its keyHash) for the records with ``ok``, from a batch that carries its
    records' key hashes (``key_count`` per record, ``key_hashes`` in record order: UNIQ_KEY, then KEYS)."""
    counts = b.key_count.astype(np.int64)
    recs = np.repeat(np.arange(len(counts), dtype=np.int64), np.where(ok, counts, 0))
    return recs, b.key_hashes[np.repeat(ok, counts)].astype(np.int64)


class _OpenIndex:
    """An index file mapped read-write, with its header held in memory."""

    def __init__(self, path: str, slots: int, entries: int, *, create: bool, journal=None):
        self.path = path
        self.name = os.path.basename(path)
        self.slots = slots
        self.entries = entries
        size = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE + entries * INDEX_ENTRY_SIZE
        self.seg = WritableSegment(path, 0, size, create=create, journal=journal)
        self.entry_base = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE
        if journal is not None and not create:
            journal.save(self.seg, 0, self.entry_base)  # header and slots change in place
        (self.begin_ts, self.end_ts, self.begin_phy, self.end_phy, self.slot_count,
         disk_count) = HEADER_STRUCT.unpack_from(self.seg.mm, 0)
        self.disk_count_raw = disk_count  # 0 on a fresh file until the first put
        self.index_count = disk_count if disk_count > 0 else 1
        self.slot_table = np.frombuffer(self.seg.mm, dtype=">i4", count=slots, offset=INDEX_HEADER_SIZE)
        self.u8 = np.frombuffer(self.seg.mm, dtype=np.uint8)  # what the compiled put_many writes through
        self.ahead: PopulateAhead | None = None

    @property
    def full(self) -> bool:
        return self.index_count >= self.entries

    def write_header(self) -> None:
        count = self.index_count if self.index_count > 1 else self.disk_count_raw
        header = HEADER_STRUCT.pack(self.begin_ts, self.end_ts, self.begin_phy, self.end_phy, self.slot_count, count)
        if self.seg.mm[:HEADER_STRUCT.size] == header:
            return  # unchanged: a file only resumed (or left behind full) is not written, its mtime stays
        self.seg.mm[:HEADER_STRUCT.size] = header
        self.seg.dirty = True

    # --- one key (IndexFile.putKey) -------------------------------------------------------

    def put(self, key_hash: int, phy: int, ts: int) -> bool:
        if self.index_count >= self.entries:
            return False
        mm = self.seg.mm
        slot_pos = INDEX_HEADER_SIZE + (key_hash % self.slots) * INDEX_SLOT_SIZE
        (prev,) = _I32.unpack_from(mm, slot_pos)
        if prev <= 0 or prev > self.index_count:
            prev = 0
        diff = self._diff(ts)
        pos = self.entry_base + self.index_count * INDEX_ENTRY_SIZE
        self.seg.touch(pos, INDEX_ENTRY_SIZE)
        _ENTRY.pack_into(mm, pos, key_hash, phy, diff, prev)
        _I32.pack_into(mm, slot_pos, self.index_count)
        self.seg.dirty = True
        if self.index_count <= 1:
            self.begin_phy, self.begin_ts = phy, ts
        if prev == 0:
            self.slot_count += 1
        self.index_count += 1
        self.end_phy, self.end_ts = phy, ts
        return True

    def _diff(self, ts: int) -> int:
        if self.begin_ts <= 0:
            return 0
        d = _java_div1000(ts - self.begin_ts)
        return INT_MAX if d > INT_MAX else (0 if d < 0 else d)

    # --- many keys at once, same result as repeated put() ----------------------------------

    def put_many(self, hashes: np.ndarray, phys: np.ndarray, tss: np.ndarray) -> None:
        """``put`` for each key in order (keyHash >= 0), in one compiled pass over the mapped file."""
        k = len(hashes)
        assert k <= self.entries - self.index_count
        if k == 0:
            return
        c = self.index_count
        first_diff = -1
        if c <= 1:  # first entry: diff against the inherited begin, then begin := its own values
            first_diff = self._diff(int(tss[0]))
            self.begin_phy, self.begin_ts = int(phys[0]), int(tss[0])
        self.seg.touch(self.entry_base + c * INDEX_ENTRY_SIZE, k * INDEX_ENTRY_SIZE)
        if self.ahead is not None:
            self.ahead.before_write(self.entry_base + c * INDEX_ENTRY_SIZE, k * INDEX_ENTRY_SIZE)
        else:
            populate_write(self.seg.mm, self.entry_base + c * INDEX_ENTRY_SIZE, k * INDEX_ENTRY_SIZE)
        self.slot_count += put_entries(self.u8, self.slots, c, hashes, phys, tss, self.begin_ts, first_diff)
        self.seg.dirty = True
        self.index_count = c + k
        self.end_phy, self.end_ts = int(phys[-1]), int(tss[-1])

    def populate_ahead(self) -> None:
        """Fault in the entries' pages by a thread ahead of the writes (writeback.PopulateAhead)."""
        if self.ahead is None and self.seg.mm is not None:
            try:
                self.ahead = PopulateAhead(self.u8.ctypes.data, len(self.seg.mm))
            except (OSError, AttributeError):  # no libc madvise here: the writes fault their pages in themselves
                self.ahead = None

    def close(self, flush: bool) -> None:
        if self.seg.mm is None:
            return  # closed already (a failed switch to a new file leaves the old one as current)
        self.write_header()
        if self.ahead is not None:
            self.ahead.stop()
            self.ahead = None
        self.slot_table = self.u8 = None
        self.seg.close(flush=flush)


class IndexWriter:
    """Appends index entries to ``<root>/index``, resuming in the last existing file."""

    def __init__(self, root: str, config: StoreConfig, *, namer: Callable[[int], str] | None = None,
                 on_file_full: Callable[[int], None] | None = None, journal=None):
        self.directory = os.path.join(root, "index")
        self.slots = config.maxHashSlotNum
        self.entries = config.maxIndexNum
        self.namer = namer or wall_clock_namer
        self.on_file_full = on_file_full
        self.journal = journal
        self.cur: _OpenIndex | None = None
        self.created: list[str] = []
        self.entries_written = 0
        # (phy, n): the first n keys of the record at phy are already in the last file (a record whose keys
        # straddle a full file and the next one, when that next one is rebuilt)
        self.skip_keys: tuple[int, int] | None = None
        self._last_name = ""
        self._left_behind: list[str] = []
        self._prefix_hash: dict[str, int] = {}
        self.populate_ahead = False  # a core is free while this process writes: use_idle_core()
        names = self._names()
        if names:
            self._last_name = names[-1]
            self.cur = _OpenIndex(os.path.join(self.directory, names[-1]), self.slots, self.entries, create=False,
                                  journal=journal)

    def use_idle_core(self) -> None:
        """Another core is idle while this process writes the index (``recover -j``'s re-dispatch from the plan's
        columns): a thread faults the entries' pages in ahead of the compiled pass. The same bytes."""
        self.populate_ahead = True
        if self.cur is not None:
            self.cur.populate_ahead()

    def _names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.directory) if n.isdigit() and len(n) == 17)
        except FileNotFoundError:
            return []

    def _unique_name(self, store_ts: int) -> str:
        name = self.namer(store_ts)
        if name <= self._last_name or os.path.exists(os.path.join(self.directory, name)):
            n = int(self._last_name or name) + 1
            while os.path.exists(os.path.join(self.directory, "%017d" % n)):
                n += 1
            name = "%017d" % n
        return name

    def _new_file(self, store_ts: int) -> _OpenIndex:
        """getAndCreateLastIndexFile: a new file seeded with the previous file's end values."""
        prev = self.cur
        end_phy = prev.end_phy if prev else 0
        end_ts = prev.end_ts if prev else 0
        if prev is not None:
            prev.close(flush=True)  # the broker flushes a left-behind file, then records its end time
            self._left_behind.append(prev.path)
            if self.on_file_full is not None:
                self.on_file_full(end_ts)
        makedirs(self.directory, self.journal)
        name = self._unique_name(store_ts)
        f = _OpenIndex(os.path.join(self.directory, name), self.slots, self.entries, create=True, journal=self.journal)
        if end_phy > 0:
            f.begin_phy = f.end_phy = end_phy
        if end_ts > 0:
            f.begin_ts = f.end_ts = end_ts
        f.write_header()
        if self.populate_ahead:
            f.populate_ahead()
        self._last_name = name
        self.created.append(f.path)
        self.cur = f
        return f

    def build(self, batch: Sequence) -> None:
        """buildIndex for each request in commitlog order (``phy, store_timestamp, sysflag, topic,
        uniq_key, keys`` attributes, or a dispatch.DispatchBatch of such columns)."""
        phy = getattr(batch, "phy", None)
        if isinstance(phy, np.ndarray) and self.entries >= 2 and not (np.diff(phy) < 0).any():
            self._build_columns(batch)
        else:
            self._build_scalar(batch)

    def _build_columns(self, b) -> None:
        """``build`` for a batch in commitlog order: keys collected and hashed in bulk, then
        placed file by file (a new file when the next request arrives at a full one)."""
        n = len(b)
        if n == 0:
            return
        phy = b.phy
        tss = b.store_timestamp
        cur = self.cur
        if cur is None or cur.index_count >= self.entries:
            cur = self._new_file(int(tss[0]))
        # Requests come in commitlog order, so only those below the file's end at the start
        # are "already indexed" (every indexed key moves endPhyOffset up to its own offset).
        ok = (phy >= cur.end_phy) & ((b.sysflag & 0xC) != TRANSACTION_ROLLBACK)
        if getattr(b, "key_hashes", None) is not None:
            recs, hashes = _hashed_keys(b, ok)
        else:
            recs, hashes = self._hash_keys(b, ok)
        m = len(recs)
        kphy = phy[recs]
        kts = tss[recs]
        if self.skip_keys is not None and m:
            skip_phy, skip_n = self.skip_keys
            first = np.flatnonzero(kphy == skip_phy)[:skip_n]
            if len(first):
                keep = np.ones(m, dtype=bool)
                keep[first] = False
                recs, kphy, kts = recs[keep], kphy[keep], kts[keep]
                hashes = hashes[keep] if hashes is not None else None
                m = len(recs)
            if int(phy[-1]) >= skip_phy:
                self.skip_keys = None
        j = 0
        while True:
            take = min(self.entries - cur.index_count, m - j)
            if take > 0:
                self.entries_written += take
                if take < VECTOR_MIN:
                    for h, p, t in zip(hashes[j : j + take].tolist(), kphy[j : j + take].tolist(),
                                       kts[j : j + take].tolist()):
                        ok = cur.put(h, p, t)
                        assert ok
                else:
                    cur.put_many(hashes[j : j + take], kphy[j : j + take], kts[j : j + take])
                j += take
            if cur.index_count < self.entries or j == 0:
                break
            r = int(recs[j - 1])
            if j < m and int(recs[j]) == r:
                cur = self._new_file(int(kts[j]))  # full in the middle of one message's keys
            elif r + 1 < n:
                cur = self._new_file(int(tss[r + 1]))  # the next request finds the file full
            else:
                break

    def _hash_keys(self, b, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(record of each key, its keyHash) for the records with ``ok``, from the batch's key strings."""
        n = len(b)
        topics, uniqs, keyss = b.topic, b.uniq_key, b.keys
        if ok.all():
            il = range(n)
        else:
            il = np.flatnonzero(ok).tolist()
            uniqs = [uniqs[i] for i in il]
            keyss = [keyss[i] for i in il]
        # UNIQ_KEY first, then each KEYS token, record by record: collected per kind, hashed,
        # then put in that order with a stable sort on (record, kind).
        if uniqs.count(None):
            u_rec = [i for i, u in zip(il, uniqs) if u is not None]
            u_val = [u for u in uniqs if u is not None]
        else:
            u_rec, u_val = list(il), uniqs
        if keyss.count(None) or keyss.count(""):
            k_val = [k for k in keyss if k]
        else:
            k_val = keyss
        if " " in "".join(k_val):
            k_rec, k_val = [], []
            for i, k in zip(il, keyss):
                if k:
                    for tok in k.split(" "):
                        if tok:
                            k_rec.append(i)
                            k_val.append(tok)
        elif k_val is keyss:
            k_rec = list(il)
        else:
            k_rec = [i for i, k in zip(il, keyss) if k]
        m = len(u_rec) + len(k_rec)
        rec = np.array(u_rec + k_rec, dtype=np.int64)
        if m:
            order = np.argsort(rec * 2 + (np.arange(m) >= len(u_rec)), kind="stable")
            ids = {t: k for k, t in enumerate(dict.fromkeys(topics))}
            tid = np.fromiter(map(ids.__getitem__, topics), dtype=np.int64, count=n)
            pre = np.array([self._prefix(t) for t in ids], dtype=np.uint32)[tid[rec]]
            hashes = _index_hashes(u_val + k_val, pre, topics, rec)[order]
            recs = rec[order]
        else:
            hashes = None
            recs = rec
        return recs, hashes

    def _prefix(self, topic: str) -> int:
        """String.hashCode of ``topic#`` as uint32 (cached)."""
        h = self._prefix_hash.get(topic)
        if h is None:
            h = self._prefix_hash[topic] = java_hash(topic + "#") & 0xFFFFFFFF
        return h

    def _build_scalar(self, batch: Sequence) -> None:
        cur = self.cur
        pend_keys: list[str] = []
        pend_phy: list[int] = []
        pend_ts: list[int] = []
        room = (self.entries - cur.index_count) if cur is not None else 0
        end_phy = cur.end_phy if cur is not None else 0
        for req in batch:
            if cur is None or room <= 0:
                self._commit(cur, pend_keys, pend_phy, pend_ts)
                cur = self._new_file(req.store_timestamp)
                room = self.entries - cur.index_count
                end_phy = cur.end_phy
            phy = req.phy
            if phy < end_phy:
                continue
            if (req.sysflag & 0xC) == TRANSACTION_ROLLBACK:
                continue
            topic = req.topic
            keys = req.keys
            uniq = req.uniq_key
            if uniq is None and not keys:
                continue
            ks = [uniq] if uniq is not None else []
            if keys:
                ks += [k for k in keys.split(" ") if k]
            if self.skip_keys is not None and phy >= self.skip_keys[0]:
                if phy == self.skip_keys[0]:
                    ks = ks[self.skip_keys[1]:]
                self.skip_keys = None
            ts = req.store_timestamp
            for k in ks:
                if room <= 0:
                    self._commit(cur, pend_keys, pend_phy, pend_ts)
                    cur = self._new_file(ts)
                    room = self.entries - cur.index_count
                pend_keys.append(f"{topic}#{k}")
                pend_phy.append(phy)
                pend_ts.append(ts)
                room -= 1
                end_phy = phy
        self._commit(cur, pend_keys, pend_phy, pend_ts)

    def _commit(self, cur: _OpenIndex | None, keys: list[str], phys: list[int], tss: list[int]) -> None:
        if not keys:
            return
        self.entries_written += len(keys)
        if len(keys) < VECTOR_MIN:
            for k, p, t in zip(keys, phys, tss):
                ok = cur.put(index_key_hash(k), p, t)
                assert ok
        else:
            cur.put_many(index_key_hash_many(keys), np.asarray(phys, dtype=np.int64), np.asarray(tss, dtype=np.int64))
        keys.clear()
        phys.clear()
        tss.clear()

    @property
    def end_timestamp(self) -> int:
        return self.cur.end_ts if self.cur else 0

    def flush(self) -> None:
        if self.cur is not None:
            self.cur.write_header()
            self.cur.seg.flush()
        for path in self._left_behind:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._left_behind.clear()
        if self.created:
            fsync_dir(self.directory)

    def close(self, flush: bool = True) -> None:
        if flush:
            self.flush()
        if self.cur is not None:
            self.cur.close(flush=flush)
            self.cur = None
