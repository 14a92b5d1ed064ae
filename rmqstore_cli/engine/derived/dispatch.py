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

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.extaddr import is_ext_addr
from rmqstore_cli.formats.records import INDEX_ENTRY_SIZE, TRANSACTION_COMMIT, TRANSACTION_NOT
from rmqstore_cli.formats.tags import TagsCodeError, tags_code

from ..arrays import queue_key
from ..log.checkpointwriter import CheckpointWriter
from ..config.storeconfig import StoreConfig
from .cqwriter import ConsumeQueueExtWriter, ConsumeQueueWriter
from ..findings import Finding
from .indexwriter import IndexWriter
from .dispatchcolumns import TopicInterner, dispatch_columns
from .cqplan import queue_plan, taken_rows, unsafe_topic_dir
from .lmq import LMQ_PROPS, LmqTargets, MultiDispatchRule, RowTopics, chunk_targets
from .batchcq import batch_topics_at, chunk_batch_fields
from .bcqwriter import BatchConsumeQueueWriter
from .dispatchbatch import DispatchBatch, DispatchRequest, _ChunkStrings  # noqa: F401 (public API: append, rebuild)


@dataclass
class DispatchStats:
    records: int = 0
    cq_units: int = 0
    cq_skipped: int = 0  # already present (idempotent re-dispatch) or out of order
    ext_units: int = 0
    index_entries: int = 0
    unsafe_topics: int = 0
    lmq_units: int = 0  # multi-dispatch units (also counted in cq_units)
    bcq_units: int = 0  # batch consume queue units (also counted in cq_units)


class Dispatcher:
    """Builds consume queues, ext units and index entries from records, like the broker's reput.

    ``index_namer(store_timestamp) -> 'yyyyMMddHHmmssSSS'`` names new index files (default:
    the wall clock, as the broker does).  ``checkpoint``: a shared :class:`CheckpointWriter`
    (one is created if omitted).  Nothing reaches the disk durably before :meth:`flush`.
    """

    def __init__(self, store_root: str, config: StoreConfig, *, index_namer: Callable[[int], str] | None = None,
                 checkpoint: CheckpointWriter | None = None, journal=None, repair: bool = False,
                 batch_topics: set | None = None):
        self.root = store_root
        # topics dispatched into batch consume queues (§9; default: as the store at ``store_root`` declares them)
        self.batch_topics = batch_topics if batch_topics is not None else batch_topics_at(store_root)
        self._bcqs: dict[tuple[str, int], BatchConsumeQueueWriter] = {}
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
        # the consume-queue folder was empty when this dispatcher began (rebuild -j): a queue's files that exist
        # when its writer opens were made by a worker (.cqdirect), not left by a broker, so they are not recovered
        self.fresh_queues = False
        # the caller has proven that every consume-queue unit the records would get is already present (a recovery
        # plan predicting no new unit): the puts would all be skipped, so the queues are neither opened nor read and
        # each unit is counted as skipped, as the puts would count it (plain queues without ext only: see apply.py)
        self.queues_complete = False

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
                                                       journal=self.journal, strict_offsets=self.repair,
                                                       recover=not self.fresh_queues)
        return w

    def ext(self, topic: str, queue_id: int) -> ConsumeQueueExtWriter:
        key = (topic, queue_id)
        w = self._exts.get(key)
        if w is None:
            w = self._exts[key] = ConsumeQueueExtWriter(self.root, topic, queue_id, self.config,
                                                         journal=self.journal)
        return w

    def bcq(self, topic: str, queue_id: int) -> BatchConsumeQueueWriter:
        key = (topic, queue_id)
        w = self._bcqs.get(key)
        if w is None:
            w = self._bcqs[key] = BatchConsumeQueueWriter(self.root, topic, queue_id, self.config, journal=self.journal,
                                                          strict_offsets=self.repair)
        return w

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The broker's topicQueueTable entry for this queue (§13.8): its consume queue's max offset."""
        if topic in self.batch_topics:
            return self.bcq(topic, queue_id).next_offset
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
        """CommitLogDispatcherBuildConsumeQueue over a batch, grouped per queue (:mod:`.cqplan`); returns the
        store time of the last record it took (the checkpoint's logicsMsgTimestamp)."""
        stats = self.stats
        if self.queues_complete and b.cq_plan is None:  # only the rows taken are needed, not their groups and units
            _, taken, _, unsafe = taken_rows(b)
            self._report_unsafe(b, unsafe)
            if not len(taken):
                return None
            stats.cq_skipped += len(taken)
            return int(b.store_timestamp[int(taken[-1])])
        plan = b.cq_plan if b.cq_plan is not None else queue_plan(b)
        names = plan.names
        self._report_unsafe(b, plan.unsafe)
        if plan.last_row < 0:
            return None
        if self.queues_complete:
            stats.cq_skipped += int(plan.starts[-1])
            return int(b.store_timestamp[plan.last_row])
        ext_on = self.config.enableConsumeQueueExt
        rows, starts, units = plan.rows, plan.starts.tolist(), plan.units
        straight, first_offset = plan.straight.tolist(), plan.first_offset.tolist()
        first_end, last_end = plan.first_end.tolist(), plan.last_end.tolist()
        for g, (t, q) in enumerate(zip(plan.tids.tolist(), plan.qids.tolist())):
            topic = names[t]
            lo, hi = starts[g], starts[g + 1]
            if topic in self.batch_topics:  # BatchConsumeQueue.putMessagePositionInfoWrapper (§9.3)
                r = rows[lo:hi]
                base = b.queue_offset[r] if b.msg_base is None else b.msg_base[r]
                count = np.ones(len(r), np.int64) if b.batch_size is None else b.batch_size[r]
                done = self.bcq(topic, q).put_many(b.phy[r], b.size[r], b.tags_code[r], b.store_timestamp[r], base, count)
                stats.cq_units += done
                stats.bcq_units += done
                stats.cq_skipped += len(r) - done
                continue
            cq = self._queues.get((topic, q)) or self.queue(topic, q)
            if not ext_on:
                if straight[g] and cq.append_straight(units[lo:hi], first_offset[g], first_end[g], last_end[g]):
                    stats.cq_units += hi - lo
                    continue
                r = rows[lo:hi]
                done = cq.put_many(b.phy[r], b.size[r], b.tags_code[r], b.queue_offset[r])
                stats.cq_units += done
                stats.cq_skipped += len(r) - done
                continue
            # Writing the ext unit only for units the queue accepts keeps a re-dispatch
            # from leaving orphan ext units (Java writes it before the duplicate check).
            r = rows[lo:hi]
            ext = self.ext(topic, q)
            ts = b.store_timestamp[r].tolist()
            bms = [b.bitmap[i] for i in r.tolist()] if b.bitmap is not None else [b""] * len(r)
            for p, s, tg, o, st, bm in zip(b.phy[r].tolist(), b.size[r].tolist(), b.tags_code[r].tolist(),
                                           b.queue_offset[r].tolist(), ts, bms):
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
        return int(b.store_timestamp[plan.last_row])

    def _report_unsafe(self, b: DispatchBatch, unsafe: np.ndarray) -> None:
        """DISPATCH_UNSAFE_TOPIC for the rows ``unsafe`` (their topic cannot be a directory: not dispatched)."""
        for i in unsafe.tolist():
            self.stats.unsafe_topics += 1
            topic = b.topic_names[int(b.topic_ids[i])] if b.topic_ids is not None else b.topic[i]
            self.problems.append(Finding("DISPATCH_UNSAFE_TOPIC", "error", None, int(b.phy[i]),
                                         f"topic {topic!r} cannot be a consume queue directory; not dispatched"))

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
        key = queue_key(lt.name, lt.queue_id)
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
            if self.queues_complete:
                stats.cq_skipped += len(g)
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
        extra = LMQ_PROPS if self.multi_dispatch.enabled else ()
        codes, tags_bad, counts, kh, pv, slow = dispatch_columns(u8, h, tids, interner, self.delay_table, details=True,
                                                                 extra_names=extra)
        names = interner.topics()
        lmq = chunk_targets(self.multi_dispatch, u8, h, RowTopics(tids, names), pv=pv)
        batch = DispatchBatch(h.offsets + chunk.segment.start, h.totalSize, None, h.queueId, h.queueOffset, h.sysFlag,
                              h.storeTimestamp, codes, None, None, topic_ids=tids, topic_names=names, key_count=counts,
                              key_hashes=kh, strings=_ChunkStrings(u8, names, tids, pv, slow),
                              rows=np.arange(n, dtype=np.int64), lmq=lmq if len(lmq) else None)
        if self.batch_topics:
            bad = self._batch_columns(batch, u8, h, tids, names)
            tags_bad = tags_bad | bad
        if tags_bad.any():
            # checkMessageAndReturnSize fails on such a record; reput skips it by its size
            for i in np.flatnonzero(tags_bad).tolist():
                if i not in slow:
                    continue  # its batch fields do not parse (reported by _batch_columns)
                try:
                    tags_code(names[int(tids[i])], slow[i], int(h.storeTimestamp[i]), self.delay_table)
                except TagsCodeError as e:
                    self.problems.append(Finding("DISPATCH_BAD_DELAY", "error", None, int(batch.phy[i]), str(e)))
            batch = batch.take(np.flatnonzero(~tags_bad))
        if not self.queues_complete:  # no unit is written: the rows taken are counted without grouping them
            batch.cq_plan = queue_plan(batch)
        return batch

    def _batch_columns(self, batch: DispatchBatch, u8, h, tids, names) -> np.ndarray:
        """msgBaseOffset/batchSize of the chunk's records of batch topics (CommitLog.setBatchSizeIfNeeded): INNER_BASE
        and INNER_NUM when a record carries both, else QUEUEOFFSET and 1. Returns the records whose values Java
        cannot parse (its check fails on them: not dispatched)."""
        bad = np.zeros(len(h), dtype=bool)
        ids = [k for k, n in enumerate(names) if n in self.batch_topics]
        if not ids:
            return bad
        rows = np.flatnonzero(np.isin(tids, ids))
        if not len(rows):
            return bad
        base = np.asarray(h.queueOffset, np.int64).copy()
        num = np.ones(len(h), np.int64)
        base[rows], num[rows], unparsable = chunk_batch_fields(u8, h, rows)
        for i in rows[unparsable].tolist():
            bad[i] = True
            self.problems.append(Finding("DISPATCH_BAD_BATCH", "error", None, int(batch.phy[i]),
                                         "INNER_BASE/INNER_NUM of the record do not parse; not dispatched"))
        batch.msg_base, batch.batch_size = base, num
        return bad

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

    def written_ranges(self) -> list[tuple[int, int, int]]:
        """(descriptor, start, end) of the bytes written so far that will not change again in the files being
        written now: each queue's current file up to its write position, the current index file's entries (its
        header and slot table change until the end). For a caller that starts their write-back early."""
        out = []
        for w in self._queues.values():
            seg = w.files.current
            if seg is not None and seg.mm is not None and seg.start <= w.write_offset:
                out.append((seg.fd, 0, min(w.write_offset - seg.start, seg.size)))
        if self.index is not None and self.index.cur is not None and self.index.cur.seg.mm is not None:
            cur = self.index.cur
            out.append((cur.seg.fd, cur.entry_base, cur.entry_base + cur.index_count * INDEX_ENTRY_SIZE))
        return out

    def flush(self, checkpoint: bool = True) -> None:
        """Make every unit and entry written so far durable (then the checkpoint)."""
        for w in self._queues.values():
            w.flush()
        for w in self._exts.values():
            w.flush()
        for w in self._bcqs.values():
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
        for w in self._bcqs.values():
            w.close(flush=False)
        if self.index is not None:
            self.index.close(flush=False)
        self._bcqs.clear()
        self._queues.clear()
        self._exts.clear()
