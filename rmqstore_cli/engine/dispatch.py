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

Not covered: LMQ multi-dispatch (``INNER_MULTI_DISPATCH``), BatchConsumeQueue topics and
filter bitmaps (``enableCalcFilterBitMap``): ext units are written without a bitmap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from formats.extaddr import is_ext_addr
from formats.message import decode_utf8
from formats.properties import parse_properties
from formats.records import TRANSACTION_COMMIT, TRANSACTION_NOT
from formats.tags import TagsCodeError, tags_code

from .checkpointwriter import CheckpointWriter
from .config import StoreConfig
from .cqwriter import ConsumeQueueExtWriter, ConsumeQueueWriter
from .findings import Finding
from .indexwriter import IndexWriter


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


@dataclass
class DispatchStats:
    records: int = 0
    cq_units: int = 0
    cq_skipped: int = 0  # already present (idempotent re-dispatch) or out of order
    ext_units: int = 0
    index_entries: int = 0
    unsafe_topics: int = 0


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
                 checkpoint: CheckpointWriter | None = None):
        self.root = store_root
        self.config = config
        self.checkpoint = checkpoint if checkpoint is not None else CheckpointWriter(store_root)
        self._queues: dict[tuple[str, int], ConsumeQueueWriter] = {}
        self._exts: dict[tuple[str, int], ConsumeQueueExtWriter] = {}
        self.index = (IndexWriter(store_root, config, namer=index_namer, on_file_full=self._index_file_full)
                      if config.messageIndexEnable else None)
        self.stats = DispatchStats()
        self.problems: list[Finding] = []
        self.delay_table = config.delay_table
        self.last_dispatched_end = -1  # phy + size of the last record dispatched

    # --- per-queue writers (opened lazily, state recovered from disk) --------------------------

    def queue(self, topic: str, queue_id: int) -> ConsumeQueueWriter:
        key = (topic, queue_id)
        w = self._queues.get(key)
        if w is None:
            w = self._queues[key] = ConsumeQueueWriter(self.root, topic, queue_id, self.config)
        return w

    def ext(self, topic: str, queue_id: int) -> ConsumeQueueExtWriter:
        key = (topic, queue_id)
        w = self._exts.get(key)
        if w is None:
            w = self._exts[key] = ConsumeQueueExtWriter(self.root, topic, queue_id, self.config)
        return w

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The broker's topicQueueTable entry for this queue (§13.8): its consume queue's max offset."""
        return self.queue(topic, queue_id).next_offset

    # --- dispatch ------------------------------------------------------------------------------

    def dispatch(self, req: DispatchRequest) -> None:
        self.dispatch_many((req,))

    def dispatch_many(self, reqs: Sequence[DispatchRequest]) -> None:
        """Dispatch records in commitlog order (same result as one ``dispatch`` per record)."""
        if not reqs:
            return
        ext_on = self.config.enableConsumeQueueExt
        stats = self.stats
        logics_ts = None
        queues = self._queues
        for req in reqs:
            t = req.sysflag & 0xC
            if t != TRANSACTION_NOT and t != TRANSACTION_COMMIT:
                continue
            if unsafe_topic_dir(req.topic):
                stats.unsafe_topics += 1
                self.problems.append(Finding("DISPATCH_UNSAFE_TOPIC", "error", None, req.phy,
                                             f"topic {req.topic!r} cannot be a consume queue directory; not dispatched"))
                continue
            cq = queues.get((req.topic, req.queue_id)) or self.queue(req.topic, req.queue_id)
            tags = req.tags_code
            if ext_on:
                # Writing the ext unit only for units the queue accepts keeps a re-dispatch
                # from leaving orphan ext units (Java writes it before the duplicate check).
                if not cq.accepts(req.phy, req.size, req.queue_offset):
                    stats.cq_skipped += 1
                    logics_ts = req.store_timestamp
                    continue
                addr = self.ext(req.topic, req.queue_id).put(tags, req.store_timestamp, req.bitmap)
                if is_ext_addr(addr):
                    tags = addr
                    stats.ext_units += 1
            if cq.put(req.phy, req.size, tags, req.queue_offset):
                stats.cq_units += 1
            else:
                stats.cq_skipped += 1
            logics_ts = req.store_timestamp
        if self.index is not None:
            before = self.index.entries_written
            self.index.build(reqs)
            stats.index_entries += self.index.entries_written - before
        stats.records += len(reqs)
        last = reqs[-1]
        self.last_dispatched_end = last.phy + last.size
        if logics_ts is not None:
            self.checkpoint.set(logicsMsgTimestamp=logics_ts)

    def requests_from_chunk(self, chunk) -> list[DispatchRequest]:
        """DispatchRequests for the records of a :class:`commitlog.Chunk` (reput's parse, §13.3)."""
        h = chunk.headers
        buf = chunk.buf
        base = chunk.segment.start
        out = []
        cols = zip(h.offsets.tolist(), h.totalSize.tolist(), h.queueId.tolist(), h.queueOffset.tolist(),
                   h.sysFlag.tolist(), h.storeTimestamp.tolist(), h.topicStart.tolist(), h.topicLength.tolist(),
                   h.propsStart.tolist(), h.propsLength.tolist())
        for off, size, qid, qoff, sysflag, ts, t0, tl, p0, pl in cols:
            topic = decode_utf8(bytes(buf[t0 : t0 + tl]))
            props = parse_properties(decode_utf8(bytes(buf[p0 : p0 + pl]))) if pl > 0 else {}
            try:
                code = tags_code(topic, props, ts, self.delay_table)
            except TagsCodeError as e:
                # checkMessageAndReturnSize fails on such a record; reput skips it by its size
                self.problems.append(Finding("DISPATCH_BAD_DELAY", "error", None, base + off, str(e)))
                continue
            out.append(DispatchRequest(base + off, size, topic, qid, qoff, sysflag, ts, code,
                                       props.get("UNIQ_KEY"), props.get("KEYS")))
        return out

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
