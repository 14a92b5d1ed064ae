"""Dispatch of commitlog records to consume queues, ext files and the index (FORMAT.md §14).

Mirrors the broker's dispatcher chain run by the reput service: for each record, in
commitlog order,

1. CommitLogDispatcherBuildConsumeQueue: transaction types NOT and COMMIT only; with
   ``enableConsumeQueueExt`` the ext unit is written first and its address replaces tagsCode;
   units already present are skipped (§7.5); the checkpoint's logicsMsgTimestamp follows;
2. CommitLogDispatcherBuildIndex: types NOT, PREPARED, COMMIT when ``messageIndexEnable``;
   UNIQ_KEY then each KEYS token; already-indexed offsets skipped (§10.6); a full index file
   is left behind, flushed, and its end time becomes the checkpoint's indexMsgTimestamp.

Used by ``append`` (requests built from what it just wrote) and by rebuild/recovery
(``dispatch_chunk`` on chunks from ``CommitLog.scan``).  Writers resume from what is on
disk, so dispatching into an existing store continues its files.

After a record's own unit, multi-dispatch writes its LMQ units (§14.3, :mod:`.lmq`).

Not covered: BatchConsumeQueue topics and filter bitmaps (``enableCalcFilterBitMap``): ext units
are written without a bitmap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from formats import fast
from formats.extaddr import is_ext_addr
from formats.message import decode_utf8
from formats.records import TRANSACTION_COMMIT, TRANSACTION_NOT
from formats.tags import TagsCodeError, tags_code

from ..log.checkpointwriter import CheckpointWriter
from ..config.storeconfig import StoreConfig
from .cqwriter import ConsumeQueueExtWriter, ConsumeQueueWriter
from ..findings import Finding
from .indexwriter import IndexWriter
from .dispatchcolumns import TopicInterner, dispatch_columns
from .lmq import LmqTargets, MultiDispatchRule, chunk_targets


@dataclass(slots=True)
class DispatchRequest:
    """What the broker's DispatchRequest carries for the CQ and index dispatchers."""

    phy: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sysflag: int
    store_timestamp: int
    tags_code: int
    uniq_key: str | None = None
    keys: str | None = None
    bitmap: bytes = b""
    lmq: tuple = ()  # (queue name, queue id, queue offset) of each multi-dispatch unit (.lmq)


_NUMBERS = ("phy", "size", "queue_id", "queue_offset", "sysflag", "store_timestamp", "tags_code")


class _ChunkStrings:
    """Topic, UNIQ_KEY and KEYS strings of a scanned chunk's records, decoded only when a caller reads
    the batch as requests (the bulk dispatch works on topic ids and key hashes and never asks)."""

    def __init__(self, u8, topic_names: list[str], tids, pv, slow: dict):
        self.u8, self.topic_names, self.tids, self.pv, self.slow = u8, topic_names, tids, pv, slow

    def _span(self, name: str, i: int) -> str | None:
        s = int(self.pv.start[name][i])
        return None if s < 0 else decode_utf8(bytes(self.u8[s:int(self.pv.end[name][i])]))

    def rows(self, rows: list[int]) -> tuple[list, list, list]:
        topics = [self.topic_names[t] for t in self.tids[rows].tolist()] if rows else []
        uniqs, keyss = [], []
        for i in rows:
            props = self.slow.get(i)
            if props is None:
                uniqs.append(self._span("UNIQ_KEY", i))
                keyss.append(self._span("KEYS", i))
            else:
                uniqs.append(props.get("UNIQ_KEY") or None)
                keyss.append(props.get("KEYS") or None)
        return topics, uniqs, keyss


class DispatchBatch(Sequence):
    """Many DispatchRequests as columns (commitlog order): int64 arrays for the numbers, lists
    for topics, keys and bitmaps.  Reads like a list of :class:`DispatchRequest` (index, slice,
    iterate); the Dispatcher works on the columns without making a request object per record.

    A batch scanned from the commitlog (:meth:`Dispatcher.requests_from_chunk`) also carries what
    dispatch computes per record as columns: ``topic_ids`` into ``topic_names``, and each record's
    index key hashes (``key_count`` per record, ``key_hashes`` in record order); its topic and key
    strings are decoded only if someone reads them."""

    __slots__ = _NUMBERS + ("_topic", "_uniq", "_keys", "bitmap", "topic_ids", "topic_names", "key_count", "key_hashes",
                            "_strings", "_rows", "lmq")

    def __init__(self, phy, size, topic, queue_id, queue_offset, sysflag, store_timestamp, tags_code,
                 uniq_key, keys, bitmap=None, *, topic_ids=None, topic_names=None, key_count=None, key_hashes=None,
                 strings: _ChunkStrings | None = None, rows=None, lmq: LmqTargets | None = None):
        i64 = np.int64
        self.lmq = lmq  # the records' multi-dispatch units (None: none)
        self.phy = np.asarray(phy, dtype=i64)
        self.size = np.asarray(size, dtype=i64)
        self.queue_id = np.asarray(queue_id, dtype=i64)
        self.queue_offset = np.asarray(queue_offset, dtype=i64)
        self.sysflag = np.asarray(sysflag, dtype=i64)
        self.store_timestamp = np.asarray(store_timestamp, dtype=i64)
        self.tags_code = np.asarray(tags_code, dtype=i64)
        self._topic, self._uniq, self._keys = topic, uniq_key, keys
        self.bitmap = bitmap  # None: no record has a bitmap
        self.topic_ids, self.topic_names = topic_ids, topic_names
        self.key_count, self.key_hashes = key_count, key_hashes
        self._strings, self._rows = strings, rows

    def __getstate__(self):
        # A batch sent between processes (rebuild -j) must not carry its chunk's buffer: its strings are
        # decoded here, once, and the reference to the mapped segment is dropped.
        if self._strings is not None:
            if self._uniq is None or self._keys is None or self._topic is None:
                self._decode_strings()
        return {k: (None if k in ("_strings", "_rows") else getattr(self, k)) for k in self.__slots__}

    def __setstate__(self, state) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def _decode_strings(self) -> None:
        self._topic, self._uniq, self._keys = self._strings.rows(self._rows.tolist())

    @property
    def topic(self) -> list:
        if self._topic is None:
            if self._strings is None:
                self._topic = [self.topic_names[t] for t in self.topic_ids.tolist()]
            else:
                self._decode_strings()
        return self._topic

    @property
    def uniq_key(self) -> list:
        if self._uniq is None:
            self._decode_strings()
        return self._uniq

    @property
    def keys(self) -> list:
        if self._keys is None:
            self._decode_strings()
        return self._keys

    @classmethod
    def from_requests(cls, reqs: Sequence[DispatchRequest]) -> "DispatchBatch":
        if isinstance(reqs, DispatchBatch):
            return reqs
        bitmaps = [r.bitmap for r in reqs]
        lmq = [(i, r.lmq) for i, r in enumerate(reqs) if r.lmq]
        return cls([r.phy for r in reqs], [r.size for r in reqs], [r.topic for r in reqs],
                   [r.queue_id for r in reqs], [r.queue_offset for r in reqs], [r.sysflag for r in reqs],
                   [r.store_timestamp for r in reqs], [r.tags_code for r in reqs], [r.uniq_key for r in reqs],
                   [r.keys for r in reqs], bitmaps if any(bitmaps) else None,
                   lmq=LmqTargets.from_lists(lmq) if lmq else None)

    def __len__(self) -> int:
        return len(self.phy)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self.phy))[i])
        n = len(self.phy)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("DispatchBatch index out of range")
        return DispatchRequest(int(self.phy[i]), int(self.size[i]), self.topic[i], int(self.queue_id[i]),
                               int(self.queue_offset[i]), int(self.sysflag[i]), int(self.store_timestamp[i]),
                               int(self.tags_code[i]), self.uniq_key[i], self.keys[i],
                               b"" if self.bitmap is None else self.bitmap[i])

    def __iter__(self):
        cols = (self.phy.tolist(), self.size.tolist(), self.topic, self.queue_id.tolist(),
                self.queue_offset.tolist(), self.sysflag.tolist(), self.store_timestamp.tolist(),
                self.tags_code.tolist(), self.uniq_key, self.keys)
        if self.bitmap is None:
            for row in zip(*cols):
                yield DispatchRequest(*row)
        else:
            for row, bm in zip(zip(*cols), self.bitmap):
                yield DispatchRequest(*row, bm)

    def take(self, idx: np.ndarray) -> "DispatchBatch":
        """The records at the (sorted) positions ``idx``."""
        idx = np.asarray(idx, dtype=np.int64)
        il = idx.tolist()
        pick = lambda col: None if col is None else [col[i] for i in il]  # noqa: E731
        columns = dict(topic_names=self.topic_names, strings=self._strings,
                       lmq=None if self.lmq is None else self.lmq.take_rows(idx),
                       topic_ids=None if self.topic_ids is None else self.topic_ids[idx],
                       rows=None if self._rows is None else self._rows[idx])
        if self.key_hashes is not None:
            counts = self.key_count.astype(np.int64)
            keep = np.zeros(len(self.phy), dtype=bool)
            keep[idx] = True
            columns.update(key_count=self.key_count[idx], key_hashes=self.key_hashes[np.repeat(keep, counts)])
        return DispatchBatch(self.phy[idx], self.size[idx], pick(self._topic), self.queue_id[idx], self.queue_offset[idx],
                             self.sysflag[idx], self.store_timestamp[idx], self.tags_code[idx], pick(self._uniq),
                             pick(self._keys), pick(self.bitmap), **columns)


@dataclass
class DispatchStats:
    records: int = 0
    cq_units: int = 0
    cq_skipped: int = 0  # already present (idempotent re-dispatch) or out of order
    ext_units: int = 0
    index_entries: int = 0
    unsafe_topics: int = 0
    lmq_units: int = 0  # multi-dispatch units (also counted in cq_units)


def unsafe_topic_dir(topic: str) -> bool:
    """A topic that cannot be used as a directory name inside ``consumequeue/``."""
    return (not topic) or "/" in topic or "\x00" in topic or topic in (".", "..")


class Dispatcher:
    """Builds consume queues, ext units and index entries from records, like the broker's reput.

    ``index_namer(store_timestamp) -> 'yyyyMMddHHmmssSSS'`` names new index files (default:
    the wall clock, as the broker does).  ``checkpoint``: a shared :class:`CheckpointWriter`
    (one is created if omitted).  Nothing reaches the disk durably before :meth:`flush`.
    """

    def __init__(self, store_root: str, config: StoreConfig, *, index_namer: Callable[[int], str] | None = None,
                 checkpoint: CheckpointWriter | None = None, journal=None, repair: bool = False):
        self.root = store_root
        # repair (recover/truncate re-dispatch): units only at their record's QUEUEOFFSET, and the
        # record the last index file ends with is not indexed a second time (the broker's '<' test does)
        self.repair = repair
        self.config = config
        self.journal = journal  # an UndoJournal: every writer records what it changes
        self.checkpoint = checkpoint if checkpoint is not None else CheckpointWriter(store_root, journal)
        self._queues: dict[tuple[str, int], ConsumeQueueWriter] = {}
        self._exts: dict[tuple[str, int], ConsumeQueueExtWriter] = {}
        self.index = (IndexWriter(store_root, config, namer=index_namer, on_file_full=self._index_file_full,
                                  journal=journal)
                      if config.messageIndexEnable else None)
        cur = self.index.cur if self.index is not None else None
        # Only a file with room: when the last file is full, the record it ends with may have keys
        # in the next (lost) file, and indexing it again, as the broker does, is what keeps them.
        self._indexed_through = (cur.end_phy if (repair and cur is not None and 1 < cur.index_count < cur.entries)
                                 else -1)
        self.stats = DispatchStats()
        self.problems: list[Finding] = []
        self.delay_table = config.delay_table
        self.last_dispatched_end = -1  # phy + size of the last record dispatched
        self._interner = TopicInterner()
        self.multi_dispatch = MultiDispatchRule(config)

    def index_continues_after(self, phy: int, keys_held: int | None = None) -> None:
        """The index holds every key of the records before ``phy`` and the first ``keys_held`` keys of the
        record at ``phy`` (all of them when None): a rebuild of the files after a full one. Those keys are
        not indexed again, as the broker's '<' test would."""
        if keys_held is None:
            self._indexed_through = phy
        else:
            self._indexed_through = phy - 1
            if self.index is not None:
                self.index.skip_keys = (phy, keys_held)

    # --- per-queue writers (opened lazily, state recovered from disk) --------------------------

    def queue(self, topic: str, queue_id: int) -> ConsumeQueueWriter:
        key = (topic, queue_id)
        w = self._queues.get(key)
        if w is None:
            w = self._queues[key] = ConsumeQueueWriter(self.root, topic, queue_id, self.config,
                                                       journal=self.journal, strict_offsets=self.repair)
        return w

    def ext(self, topic: str, queue_id: int) -> ConsumeQueueExtWriter:
        key = (topic, queue_id)
        w = self._exts.get(key)
        if w is None:
            w = self._exts[key] = ConsumeQueueExtWriter(self.root, topic, queue_id, self.config,
                                                         journal=self.journal)
        return w

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The broker's topicQueueTable entry for this queue (§13.8): its consume queue's max offset."""
        return self.queue(topic, queue_id).next_offset

    # --- dispatch ------------------------------------------------------------------------------

    def dispatch(self, req: DispatchRequest) -> None:
        self.dispatch_many((req,))

    def dispatch_many(self, reqs: Sequence[DispatchRequest]) -> None:
        """Dispatch records in commitlog order (same result as one ``dispatch`` per record).

        ``reqs`` may be a :class:`DispatchBatch` (no per-record objects) or any sequence of
        requests.  Consume queues are independent files, so each queue's units are written
        as one group; index entries go in commitlog order."""
        if not len(reqs):
            return
        b = DispatchBatch.from_requests(reqs)
        logics_ts = self._dispatch_cq(b)
        self._dispatch_lmq(b)
        stats = self.stats
        if self.index is not None:
            before = self.index.entries_written
            ib = b
            if self._indexed_through >= 0:
                if int(b.phy[0]) <= self._indexed_through:
                    ib = b.take(np.flatnonzero(b.phy > self._indexed_through))
                else:
                    self._indexed_through = -1
            if len(ib):
                self.index.build(ib)
            stats.index_entries += self.index.entries_written - before
        n = len(b)
        stats.records += n
        self.last_dispatched_end = int(b.phy[n - 1]) + int(b.size[n - 1])
        if logics_ts is not None:
            self.checkpoint.set(logicsMsgTimestamp=logics_ts)

    def _dispatch_cq(self, b: DispatchBatch) -> int | None:
        """CommitLogDispatcherBuildConsumeQueue over a batch, grouped per queue; returns the
        store time of the last record it took (the checkpoint's logicsMsgTimestamp)."""
        stats = self.stats
        t = b.sysflag & 0xC
        sel = np.flatnonzero((t == TRANSACTION_NOT) | (t == TRANSACTION_COMMIT))
        if not len(sel):
            return None
        if b.topic_ids is not None:
            names = b.topic_names
            tid = b.topic_ids[sel].astype(np.int64)
        else:
            names = list(dict.fromkeys(b.topic))
            ids = {t: k for k, t in enumerate(names)}
            tid = np.fromiter(map(ids.__getitem__, b.topic), dtype=np.int64, count=len(b))[sel]
        bad_ids = [k for k, name in enumerate(names) if unsafe_topic_dir(name)]
        if bad_ids:
            bad = np.isin(tid, bad_ids)
            for i, t in zip(sel[bad].tolist(), tid[bad].tolist()):
                stats.unsafe_topics += 1
                self.problems.append(Finding("DISPATCH_UNSAFE_TOPIC", "error", None, int(b.phy[i]),
                                             f"topic {names[t]!r} cannot be a consume queue directory; not dispatched"))
            sel, tid = sel[~bad], tid[~bad]
            if not len(sel):
                return None
        qid = b.queue_id[sel]
        key = (tid << 32) | (qid & 0xFFFFFFFF)
        if len(names) == 1 and (qid == qid[0]).all():
            groups = [(sel, int(tid[0]))]
        else:
            order = np.argsort(key, kind="stable")
            ks = key[order]
            cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
            groups = zip(np.split(sel[order], cuts), tid[order][np.r_[0, cuts]].tolist())
        ext_on = self.config.enableConsumeQueueExt
        for g, t in groups:
            topic, q = names[t], int(b.queue_id[g[0]])
            cq = self._queues.get((topic, q)) or self.queue(topic, q)
            phy, size, tags, qo = b.phy[g], b.size[g], b.tags_code[g], b.queue_offset[g]
            if not ext_on:
                done = cq.put_many(phy, size, tags, qo)
                stats.cq_units += done
                stats.cq_skipped += len(g) - done
                continue
            # Writing the ext unit only for units the queue accepts keeps a re-dispatch
            # from leaving orphan ext units (Java writes it before the duplicate check).
            ext = self.ext(topic, q)
            ts = b.store_timestamp[g].tolist()
            bms = [b.bitmap[i] for i in g.tolist()] if b.bitmap is not None else [b""] * len(g)
            for p, s, tg, o, st, bm in zip(phy.tolist(), size.tolist(), tags.tolist(), qo.tolist(), ts, bms):
                if not cq.accepts(p, s, o):
                    stats.cq_skipped += 1
                    continue
                addr = ext.put(tg, st, bm)
                if is_ext_addr(addr):
                    tg = addr
                    stats.ext_units += 1
                if cq.put(p, s, tg, o):
                    stats.cq_units += 1
                else:
                    stats.cq_skipped += 1
        return int(b.store_timestamp[sel[-1]])

    def _dispatch_lmq(self, b: DispatchBatch) -> None:
        """multiDispatchLmqQueue: after the records' own units, each record's multi-dispatch units, with its
        plain tagsCode (no ext), by the same put rules; per queue in log order. The broker writes them
        whatever its own put did (a unit skipped as already present still returns true)."""
        lt = b.lmq
        if lt is None or not len(lt):
            return
        t = b.sysflag[lt.row] & 0xC
        ok = (t == TRANSACTION_NOT) | (t == TRANSACTION_COMMIT)
        if not ok.all():
            lt = LmqTargets(lt.row[ok], lt.name[ok], lt.queue_id[ok], lt.queue_offset[ok], lt.names)
        key = (lt.name << 32) | (lt.queue_id & 0xFFFFFFFF)
        order = np.argsort(key, kind="stable")
        ks = key[order]
        cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        stats = self.stats
        for g in np.split(order, cuts):
            if not len(g):
                continue
            name, q = lt.names[int(lt.name[g[0]])], int(lt.queue_id[g[0]])
            if unsafe_topic_dir(name):
                continue
            rows = lt.row[g]
            cq = self._queues.get((name, q)) or self.queue(name, q)
            done = cq.put_many(b.phy[rows], b.size[rows], b.tags_code[rows], lt.queue_offset[g])
            stats.cq_units += done
            stats.lmq_units += done
            stats.cq_skipped += len(g) - done

    def requests_from_chunk(self, chunk) -> DispatchBatch:
        """DispatchRequests for the records of a :class:`commitlog.Chunk` (reput's parse, §13.3),
        as a :class:`DispatchBatch` of columns: topic ids, tagsCode and index key hashes come from
        the compiled property scan verify uses (:func:`derived.dispatchcolumns.dispatch_columns`), so a
        record is parsed by one implementation whichever command reads it."""
        h = chunk.headers
        u8 = fast.kernel_view(chunk.buf)
        n = len(h)
        interner = self._interner
        tids = interner.intern_chunk(u8, chunk.buf, h)
        codes, tags_bad, counts, kh, pv, slow = dispatch_columns(u8, h, tids, interner, self.delay_table, details=True)
        names = interner.topics()
        lmq = chunk_targets(self.multi_dispatch, u8, h, lambda i: names[int(tids[i])])
        batch = DispatchBatch(h.offsets + chunk.segment.start, h.totalSize, None, h.queueId, h.queueOffset, h.sysFlag,
                              h.storeTimestamp, codes, None, None, topic_ids=tids, topic_names=names, key_count=counts,
                              key_hashes=kh, strings=_ChunkStrings(u8, names, tids, pv, slow),
                              rows=np.arange(n, dtype=np.int64), lmq=lmq if len(lmq) else None)
        if tags_bad.any():
            # checkMessageAndReturnSize fails on such a record; reput skips it by its size
            for i in np.flatnonzero(tags_bad).tolist():
                try:
                    tags_code(names[int(tids[i])], slow[i], int(h.storeTimestamp[i]), self.delay_table)
                except TagsCodeError as e:
                    self.problems.append(Finding("DISPATCH_BAD_DELAY", "error", None, int(batch.phy[i]), str(e)))
            batch = batch.take(np.flatnonzero(~tags_bad))
        return batch

    def dispatch_chunk(self, chunk) -> int:
        """Dispatch every record of a commitlog scan chunk; returns how many were dispatched."""
        reqs = self.requests_from_chunk(chunk)
        self.dispatch_many(reqs)
        return len(reqs)

    def dispatch_chunks(self, chunks: Iterable) -> int:
        return sum(self.dispatch_chunk(c) for c in chunks)

    def _index_file_full(self, end_timestamp: int) -> None:
        self.checkpoint.set(indexMsgTimestamp=end_timestamp)
        self.checkpoint.flush()

    # --- durability ----------------------------------------------------------------------------

    def flush(self, checkpoint: bool = True) -> None:
        """Make every unit and entry written so far durable (then the checkpoint)."""
        for w in self._queues.values():
            w.flush()
        for w in self._exts.values():
            w.flush()
        if self.index is not None:
            self.index.flush()
        if checkpoint:
            self.checkpoint.flush()

    def close(self, flush: bool = True) -> None:
        if flush:
            self.flush()
        for w in self._queues.values():
            w.close(flush=False)
        for w in self._exts.values():
            w.close(flush=False)
        if self.index is not None:
            self.index.close(flush=False)
        self._queues.clear()
        self._exts.clear()
