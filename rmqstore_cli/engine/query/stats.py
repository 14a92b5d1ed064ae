"""Store statistics from commitlog header columns (no per-record dicts).

The result is a plain dict (see :func:`compute_stats` for the shape) so that another engine
(the Spark job) can produce the same thing: feed :class:`StatsAccumulator` with columns,
``merge`` partial accumulators, then ``result()``.

Categories per record (shares are over all records of the topic/queue):
  retry          topic starts with ``%RETRY%`` or RECONSUMETIMES > 0
  dlq            topic starts with ``%DLQ%``
  scheduled      topic ``SCHEDULE_TOPIC_XXXX`` (delay-level redirect, §14.2)
  transactional  transaction type PREPARED/COMMIT/ROLLBACK, or a half / op-half topic
Queue offsets (min/max) count only records the broker dispatches to a consume queue
(transaction type NOT or COMMIT, §2.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rmqstore_cli.formats.fast import Headers

from ..arrays import queue_key
from ..derived.dispatchcolumns import topic_ids
from ..derived.lmq import LMQ_PREFIX
from ..timer.presence import may_be_present as timer_may_be_present
from .timecounts import TimeCounts

SIZE_BINS = 32  # bin k counts records with 2**k <= size < 2**(k+1)
TIMELINE_BINS = 60
SECOND_KEYS_LIMIT = 100_000  # beyond this many distinct time keys the timeline coarsens (ms -> s -> min); a dict of 100k keys is ~10 MB
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_TOPICS = ("RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC")
TX_MASK = 0x0C
TX_PREPARED, TX_COMMIT = 0x04, 0x08
I64_MAX = np.iinfo(np.int64).max
I64_MIN = np.iinfo(np.int64).min
_QUEUE_FIELDS = ("count", "bytes", "minQueueOffset", "maxQueueOffset", "firstStoreTimestamp", "lastStoreTimestamp",
                 "retry", "dlq", "scheduled", "transactional", "messages")
INNER_BATCH = 0x80  # SYSFLAG_INNER_BATCH: one record holds INNER_NUM messages (§2.8)


@dataclass
class StatsAccumulator:
    """Running per-topic/queue aggregates; ``add`` one chunk of columns at a time, ``merge`` partials."""

    topics: dict[str, int] = field(default_factory=dict)
    # one row per (topic id, queueId), sorted by the key (topic id << 32 | queueId): _QUEUE_FIELDS as columns.
    # A broker with thousands of queues has thousands in every chunk: a Python step per queue and chunk cost
    # more than the walk (5 us a record at 8192 queues)
    queue_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    queue_rows: np.ndarray = field(default_factory=lambda: np.zeros((0, len(_QUEUE_FIELDS)), np.int64))
    size_hist: np.ndarray = field(default_factory=lambda: np.zeros(SIZE_BINS, np.int64))
    times: TimeCounts = field(default_factory=TimeCounts)  # store time // time_unit_ms -> records
    time_unit_ms: int = 1  # ms; coarsened to seconds, then minutes, when there are too many distinct keys

    @property
    def seconds(self) -> dict[int, int]:
        """{store time // time_unit_ms: records} (a copy)."""
        return self.times.as_dict()

    def add_chunk(self, buf, h: Headers) -> None:
        if len(h):
            self.add_columns(topic_ids(buf, h, self.topics), h.queueId, h.queueOffset, h.totalSize,
                             h.storeTimestamp, h.sysFlag, h.reconsumeTimes, inner_messages(buf, h))

    def add_columns(self, tid, queue_id, queue_offset, size, store_ts, sysflag, reconsume, messages=None) -> None:
        """``messages``: how many messages each record holds (INNER_NUM of an inner batch; default 1): a batch
        queue's offsets count messages, so its queue offsets run to QUEUEOFFSET + messages - 1."""
        tid = np.asarray(tid, np.int64)
        qid = np.asarray(queue_id, np.int64)
        size = np.asarray(size, np.int64)
        ts = np.asarray(store_ts, np.int64)
        sysflag = np.asarray(sysflag, np.int64)
        is_retry_t, is_dlq_t, is_sched_t, is_trans_t = self._topic_kinds()
        tx = sysflag & TX_MASK
        dispatched = (tx == 0) | (tx == TX_COMMIT)
        retry = is_retry_t[tid] | (np.asarray(reconsume) > 0)
        transactional = is_trans_t[tid] | (tx != 0)
        qoff = np.asarray(queue_offset, np.int64)
        msgs = np.ones(len(tid), np.int64) if messages is None else np.asarray(messages, np.int64)
        key = queue_key(tid, qid)
        groups, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        order = np.argsort(inv, kind="stable")
        starts = np.searchsorted(inv[order], np.arange(len(groups)))
        g = len(groups)
        part = np.empty((g, len(_QUEUE_FIELDS)), np.int64)
        part[:, 0] = np.bincount(inv, minlength=g)
        part[:, 1] = np.bincount(inv, weights=size, minlength=g)
        part[:, 2] = np.minimum.reduceat(np.where(dispatched, qoff, I64_MAX)[order], starts)
        part[:, 3] = np.maximum.reduceat(np.where(dispatched, qoff + msgs - 1, I64_MIN)[order], starts)
        part[:, 4] = np.minimum.reduceat(ts[order], starts)
        part[:, 5] = np.maximum.reduceat(ts[order], starts)
        for col, flags in ((6, retry), (7, is_dlq_t[tid]), (8, is_sched_t[tid]), (9, transactional)):
            part[:, col] = np.bincount(inv, weights=flags.astype(np.int64), minlength=g)
        part[:, 10] = np.bincount(inv, weights=msgs, minlength=g)
        self._merge_rows(groups.astype(np.int64), part)
        bins = np.clip(np.floor(np.log2(np.maximum(size, 1))).astype(np.int64), 0, SIZE_BINS - 1)
        self.size_hist += np.bincount(bins, minlength=SIZE_BINS)
        self.times.add(*np.unique(ts // self.time_unit_ms, return_counts=True))
        self._bound_keys()

    def _bound_keys(self) -> None:
        """Coarsen (ms -> s -> min -> ...) until at most SECOND_KEYS_LIMIT time keys are left: the finest unit at
        which the records seen have that few keys, whatever order they came in (so partial accumulators merge
        to what one walk gives)."""
        while len(self.times) > SECOND_KEYS_LIMIT:
            self._coarsen(1000 if self.time_unit_ms == 1 else 60)

    def _topic_kinds(self) -> np.ndarray:
        """Per topic id: retry, DLQ, scheduled and transactional topic (4 rows), made for the topics added since
        the last chunk only."""
        kinds = self.__dict__.get("_kinds", np.zeros((4, 0), bool))
        have = kinds.shape[1]
        if have < len(self.topics):
            names = sorted(self.topics, key=self.topics.get)[have:]
            more = np.array([[t.startswith("%RETRY%") for t in names], [t.startswith("%DLQ%") for t in names],
                             [t == SCHEDULE_TOPIC for t in names], [t in TRANS_TOPICS for t in names]], bool)
            kinds = np.concatenate([kinds, more.reshape(4, -1)], axis=1)
            self.__dict__["_kinds"] = kinds
        return kinds

    def _merge_rows(self, keys: np.ndarray, part: np.ndarray) -> None:
        """Fold rows ``part`` of the queues ``keys`` (sorted, distinct) into the table: sums, and the lowest and
        highest offsets and store times; a queue not yet seen gets its row at its place in the key order."""
        known = self.queue_keys
        pos = np.searchsorted(known, keys)
        hit = pos < len(known)
        hit[hit] = known[pos[hit]] == keys[hit]
        if hit.any():
            rows, p = pos[hit], part[hit]
            t = self.queue_rows
            t[rows, 0:2] += p[:, 0:2]
            t[rows, 6:] += p[:, 6:]
            for col in (2, 4):
                t[rows, col] = np.minimum(t[rows, col], p[:, col])
            for col in (3, 5):
                t[rows, col] = np.maximum(t[rows, col], p[:, col])
        if not hit.all():
            at, new = pos[~hit], ~hit
            self.queue_keys = np.insert(known, at, keys[new])
            self.queue_rows = np.insert(self.queue_rows, at, part[new], axis=0)

    @property
    def queues(self) -> dict[tuple[int, int], list]:
        """{(topic id, queueId): the _QUEUE_FIELDS values} (a copy)."""
        return {(k >> 32, k & 0xFFFFFFFF): row for k, row in zip(self.queue_keys.tolist(), self.queue_rows.tolist())}

    def _coarsen(self, factor: int) -> None:
        self.times.coarsen(factor)
        self.time_unit_ms *= factor

    def merge(self, other: "StatsAccumulator") -> None:
        """Fold a partial accumulator (another chunk range / Spark partition) into this one."""
        remap = np.zeros(len(other.topics), np.int64)
        for name, oid in other.topics.items():
            remap[oid] = self.topics.setdefault(name, len(self.topics))
        keys = other.queue_keys
        if len(keys):
            keys = queue_key(remap[keys >> 32], keys)
            order = np.argsort(keys, kind="stable")
            self._merge_rows(keys[order], other.queue_rows[order])
        self.size_hist += other.size_hist
        while other.time_unit_ms > self.time_unit_ms:
            self._coarsen(other.time_unit_ms // self.time_unit_ms)
        self.times.merge(other.times, self.time_unit_ms // other.time_unit_ms)
        self._bound_keys()

    def result(self) -> dict:
        names = {v: k for k, v in self.topics.items()}
        rows = []
        for (tid, qid), p in sorted(self.queues.items(), key=lambda kv: (names[kv[0][0]], kv[0][1])):
            r = {"topic": names[tid], "queueId": qid if qid < (1 << 31) else qid - (1 << 32)}
            r.update(dict(zip(_QUEUE_FIELDS, p)))
            if r["minQueueOffset"] == I64_MAX:
                r["minQueueOffset"] = r["maxQueueOffset"] = None  # nothing dispatched (e.g. only PREPARED)
            for c in ("retry", "dlq", "scheduled", "transactional"):
                r[c + "Share"] = r[c] / r["count"] if r["count"] else 0.0
            rows.append(r)
        total = sum(r["count"] for r in rows)
        return {
            "records": total,
            "messages": sum(r["messages"] for r in rows),  # an inner batch record counts its INNER_NUM messages
            "bytes": sum(r["bytes"] for r in rows),
            "firstStoreTimestamp": min((r["firstStoreTimestamp"] for r in rows), default=None),
            "lastStoreTimestamp": max((r["lastStoreTimestamp"] for r in rows), default=None),
            "topics": len({r["topic"] for r in rows}),
            "queues": rows,
            "sizeHistogram": {"binsLog2": list(range(SIZE_BINS)), "counts": self.size_hist.tolist()},
            "timeline": timeline(self.times, self.time_unit_ms),
        }


def inner_messages(buf, h: Headers) -> np.ndarray | None:
    """Messages per record: INNER_NUM for inner-batch records carrying INNER_NUM and INNER_BASE (what the broker
    counts in a batch queue, CommitLog.getMessageNum), 1 for the rest; None when the chunk has no inner batch."""
    batch = np.flatnonzero(np.asarray(h.sysFlag) & INNER_BATCH)
    if not len(batch):
        return None
    from rmqstore_cli.formats import fast, propscan

    u8 = fast.kernel_view(buf)
    out = np.ones(len(h), np.int64)
    pv = propscan.scan(u8, h.propsStart[batch], h.propsLength[batch], names=("INNER_NUM", "INNER_BASE"))
    for k in np.flatnonzero((pv.start["INNER_NUM"] >= 0) & (pv.start["INNER_BASE"] >= 0)).tolist():
        text = bytes(u8[int(pv.start["INNER_NUM"][k]):int(pv.end["INNER_NUM"][k])])
        if text.isdigit() and 0 < int(text) < 1 << 15:
            out[batch[k]] = int(text)
    return out


def timeline(buckets: TimeCounts, unit_ms: int, bins: int = TIMELINE_BINS) -> dict:
    """Records per time bucket: ``bins`` buckets of a whole number of ``unit_ms`` from the first record."""
    if not len(buckets):
        return {"startMs": None, "bucketMs": unit_ms, "counts": []}
    keys = buckets.keys
    lo, hi = int(keys[0]), int(keys[-1])
    width = max(1, math.ceil((hi - lo + 1) / bins))
    per_bin = np.zeros((hi - lo) // width + 1, np.int64)
    np.add.at(per_bin, (keys - lo) // width, buckets.counts)
    counts = per_bin.tolist()
    return {"startMs": lo * unit_ms, "bucketMs": width * unit_ms, "counts": counts}


def compute_stats(store, since: int | None = None, until: int | None = None, jobs: int = 1) -> dict:
    """Walk the commitlog once (CommitLog.scan chunks) and add store-wide facts (whole store with ``jobs`` > 1:
    the segments walked by worker processes, :mod:`.statsjobs`; the same result).

    With ``since``/``until`` (epoch ms, inclusive) only records stored in that range are counted;
    the walk starts at the segment the range starts in (binary search by store time) and ends
    where it ends.

    Shape: the keys of :meth:`StatsAccumulator.result` plus ``commitlog`` (min/max offset, files,
    stop kind, BLANK count and dead bytes), ``index`` (one row per file: used entries, fullness)
    and ``consumeQueueLag`` (one row per consume queue on disk); ``timer`` when the store has a 5.x timer
    store (pending messages per real topic and when they are due, whatever the time range).
    """
    from ..log.commitlog import ScanResult
    from .statsjobs import scan_parallel, splits

    acc = StatsAccumulator()
    res = ScanResult()
    if since is None and until is None and jobs > 1 and splits(store.commitlog):
        scan_parallel(store.commitlog, acc, res, jobs)
    elif since is None and until is None:
        for chunk in store.commitlog.scan(check_crc=False, result=res, stop_at_invalid=False):
            acc.add_chunk(chunk.buf, chunk.headers)
    else:
        _add_time_range(store, acc, res, since, until)
    out = acc.result()
    segs = store.commitlog.segments.segments
    out["commitlog"] = {
        "minOffset": store.commitlog.min_offset if segs else 0,
        "maxOffset": res.stop.offset if res.stop else 0,
        "files": len(segs),
        "fileSize": store.config.mappedFileSizeCommitLog,
        "stop": res.stop.kind if res.stop else ("until" if until is not None else None),
        "blankCount": len(res.blanks),
        "blankBytes": int(sum(size for _, size in res.blanks)),
    }
    out["index"] = index_stats(store)
    timed = since is not None or until is not None
    # Lag compares queues with the whole log: meaningless for a slice of it.
    out["consumeQueueLag"] = [] if timed else queue_lag(store, out["queues"])
    if store.rocksdb is not None and not timed:
        out["rocksdbConsumeQueue"] = rocksdb_summary(store, out["commitlog"]["maxOffset"])
    out["lmqQueues"] = lmq_queues(store)
    if timed:
        out["timeRange"] = {"since": since, "until": until}
    timer = {}
    if timer_may_be_present(store):  # the timer modules load only for a store that may have a timer store
        from ..timer.report import timer_stats

        timer = timer_stats(store)
    if timer:
        out["timer"] = timer
    return out


def _add_time_range(store, acc: StatsAccumulator, res, since: int | None, until: int | None) -> None:
    cl = store.commitlog
    start, end, any_ = cl.time_window(since, until)
    if not any_:
        return
    segs = cl.segments.segments
    start_index = 0
    if start is not None:
        start_index = max((k for k, s in enumerate(segs) if s.start <= start), default=0)
    lo = I64_MIN if since is None else since
    hi = I64_MAX if until is None else until
    for chunk in cl.scan(start_index=start_index, check_crc=False, result=res, stop_at_invalid=False):
        h = chunk.headers
        phy = chunk.phy
        keep = (h.storeTimestamp >= lo) & (h.storeTimestamp <= hi)
        if start is not None:
            keep &= phy >= start
        if end is not None:
            keep &= phy < end
        if keep.all():
            acc.add_chunk(chunk.buf, h)
        elif keep.any():
            acc.add_chunk(chunk.buf, h.select(keep))
        if end is not None and len(phy) and phy[-1] >= end:
            break


def index_stats(store) -> list[dict]:
    cfg = store.config
    rows = []
    for f in store.index.files:
        h = f.header()
        used = max(h.indexCount, 1) - 1
        rows.append({
            "name": f.name, "size": f.size, "complete": f.complete, "entries": used,
            "capacity": cfg.maxIndexNum - 1, "fullness": used / (cfg.maxIndexNum - 1) if cfg.maxIndexNum > 1 else 0.0,
            "hashSlotCount": h.hashSlotCount, "slotFullness": h.hashSlotCount / cfg.maxHashSlotNum,
            "beginTimestamp": h.beginTimestamp, "endTimestamp": h.endTimestamp,
            "beginPhyOffset": h.beginPhyOffset, "endPhyOffset": h.endPhyOffset,
        })
    return rows


def rocksdb_summary(store, log_end: int) -> dict:
    """The RocksDB consume queue's dispatch checkpoint (getMaxPhyOffsetInConsumeQueue) and how far the log is
    ahead of it (the bytes the broker's next start dispatches)."""
    db = store.rocksdb
    cp = db.checkpoint
    return {"directory": db.directory, "queues": len(db.queues()), "checkpoint": cp,
            "dispatchBehindBytes": None if cp is None else max(0, log_end - cp)}


def queue_lag(store, queue_rows: list[dict]) -> list[dict]:
    """Consume queue end vs the commitlog: messages the reput would still have to dispatch. Batch consume queues
    are compared in messages (their offsets count messages); LMQ queues are left to :func:`lmq_queues`."""
    cl_next = {(r["topic"], r["queueId"]): (None if r["maxQueueOffset"] is None else r["maxQueueOffset"] + 1)
               for r in queue_rows}
    on_disk = {k for k in store.queues() if not k[0].startswith(LMQ_PREFIX)}
    batch = set(store.batch_queues())
    rows = []
    for topic, qid in sorted(on_disk | batch | {k for k, v in cl_next.items() if v is not None}):
        cq_end = cq_min = cq_phy_end = None
        if (topic, qid) in batch:
            cq_min, cq_end, last_phy = store.batch_queue(topic, qid).bounds()
            cq_phy_end = last_phy if last_phy >= 0 else None  # the broker keeps the last record's start here
        elif (topic, qid) in on_disk:
            cq_min, cq_end, cq_phy_end = store.queue(topic, qid).bounds()
        nxt = cl_next.get((topic, qid))
        row = {
            "topic": topic, "queueId": qid, "cqMinOffset": cq_min, "cqMaxOffset": cq_end, "cqMaxPhysicOffset": cq_phy_end,
            "commitlogMaxQueueOffset": nxt,
            "lagMessages": None if nxt is None else nxt - (cq_end or 0),
        }
        if (topic, qid) in batch:
            row["queueType"] = "BatchCQ"
        rows.append(row)
    return rows


def lmq_queues(store) -> list[dict]:
    """The LMQ queues (multi-dispatch, §14.3) apart: they hold no records of their own, only units of other
    topics' records, so they have no commitlog side to lag behind."""
    rows = []
    for topic, qid in store.queues():
        if topic.startswith(LMQ_PREFIX):
            cq_min, cq_end, cq_phy_end = store.queue(topic, qid).bounds()
            rows.append({"topic": topic, "queueId": qid, "cqMinOffset": cq_min, "cqMaxOffset": cq_end,
                         "cqMaxPhysicOffset": cq_phy_end})
    return rows
