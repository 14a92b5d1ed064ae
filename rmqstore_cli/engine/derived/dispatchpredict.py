"""Which consume-queue units a re-dispatch writes (the put rules of §7.5), predicted for the
recovery plan without writing anything and without keeping records.

The Dispatcher (engine/derived/dispatch.py) does the puts for real; this module runs the same rules on
the records of ``[from, end)`` as a walk hands them over, batch by batch, keeping per queue only
its state: the next queue offset, maxPhysicOffset, the first offset written into an empty queue
and whether the queue still has no file. A unit is only written at its record's QUEUEOFFSET
(never shifted as §7.5 would allow).
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats import fast

from ..arrays import queue_key
from ..log.walk import cq_dispatched
from .dispatchcolumns import VerifyTopicIds
from .batchcq import chunk_batch_fields
from .lmq import RowTopics, chunk_targets

BATCH = 1 << 18  # records buffered before the per-queue rules run (bounded, a few MB)


class DispatchPrediction:
    """Walk sink. ``state``: {(topic, queueId): [next offset, maxPhysicOffset, first offset written
    into an empty queue, queue has no file]}, updated in place."""

    def __init__(self, state: dict, multi_dispatch=None, batch_state: dict | None = None, batch_topics=()):
        self.state = state
        self.multi_dispatch = multi_dispatch  # a lmq.MultiDispatchRule: the records' LMQ units are predicted too
        # batch consume queues (§9.3): {(topic, queueId): [max offset or None, maxMsgPhyOffset]}, updated in place
        self.batch_state = batch_state if batch_state is not None else {}
        self.batch_topics = set(batch_topics)
        self.topics: dict[str, int] = {}
        self.count = 0  # records re-dispatched (every transaction type)
        self.new_units: dict = {}
        self._parts: list = []
        self._held = 0
        self._verify_ids = VerifyTopicIds()

    def __call__(self, seg_start: int, buf, h: fast.Headers, topics=None) -> None:
        """``topics``: what verify's walk found for the chunk (verify.commitlog.ChunkTopics), or None: its topic ids
        and multi-dispatch flags spare the grouping of the topics and the property scan for LMQ targets."""
        self.count += len(h)
        keep = cq_dispatched(h.sysFlag)
        if not keep.any():
            return
        whole = keep.all()
        h = h.select(keep) if not whole else h
        tid = self._verify_ids(buf, h, self.topics, topics, None if whole else keep)
        phy = h.offsets + seg_start
        if self.batch_topics:
            ids = [v for k, v in self.topics.items() if k in self.batch_topics]
            batch = np.isin(tid, ids) if ids else np.zeros(len(h), bool)
            if batch.any():
                self._batch(fast.kernel_view(buf), h, np.flatnonzero(batch), phy, tid)
                plain = np.flatnonzero(~batch)
                self.add(phy[plain], h.totalSize[plain], tid[plain], h.queueId[plain], h.queueOffset[plain])
            else:
                self.add(phy, h.totalSize, tid, h.queueId, h.queueOffset)
        else:
            self.add(phy, h.totalSize, tid, h.queueId, h.queueOffset)
        if (self.multi_dispatch is not None and self.multi_dispatch.enabled
                and (topics is None or topics.multi[keep].any())):  # none carries both properties: no LMQ unit
            names = {v: k for k, v in self.topics.items()}
            lt = chunk_targets(self.multi_dispatch, fast.kernel_view(buf), h, RowTopics(tid, names))
            if len(lt):  # multi-dispatch units (§14.3): queues of their own, so after the records' units is right
                ids = np.asarray([self.topics.setdefault(n, len(self.topics)) for n in lt.names], np.int64)
                self.add(phy[lt.row], h.totalSize[lt.row], ids[lt.name], lt.queue_id, lt.queue_offset)

    def _batch(self, u8, h, rows: np.ndarray, phy: np.ndarray, tid: np.ndarray) -> None:
        """The batch queue puts of the records ``rows`` (log order), as the repair's strict writer does them:
        skipped when the record starts at or before the last unit's, refused unless it continues the queue."""
        base, num, bad = chunk_batch_fields(u8, h, rows)
        names = {v: k for k, v in self.topics.items()}
        for r, b, n, unparsable in zip(rows.tolist(), base.tolist(), num.tolist(), bad.tolist()):
            if unparsable:
                continue
            key = (names[int(tid[r])], int(h.queueId[r]))
            st = self.batch_state.setdefault(key, [None, -1])
            p = int(phy[r])
            if p <= st[1] or (st[0] is not None and b != st[0]):
                continue
            st[0], st[1] = b + n, p
            self.new_units[key] = self.new_units.get(key, 0) + 1

    def add(self, phy, size, tid, qid, qo) -> None:
        """Consume-queue records in log order (``tid``: ids in ``self.topics``)."""
        self._parts.append((np.asarray(phy, np.int64), np.asarray(size, np.int64), np.asarray(tid, np.int64),
                            np.asarray(qid, np.int64), np.asarray(qo, np.int64)))
        self._held += len(phy)
        if self._held >= BATCH:
            self.flush()

    def flush(self) -> None:
        if not self._parts:
            return
        phy, size, tid, qid, qo = (np.concatenate(c) for c in zip(*self._parts))
        self._parts, self._held = [], 0
        if not len(phy):  # only empty parts (a chunk none of whose records the rules act on)
            return
        names = {v: k for k, v in self.topics.items()}
        key = queue_key(tid, qid)
        order = np.argsort(key, kind="stable")  # per queue, log order kept
        skey = key[order]
        cuts = np.flatnonzero(np.diff(skey)) + 1
        for grp in np.split(order, cuts):
            g0 = int(grp[0])
            self._queue((names[int(tid[g0])], int(qid[g0])), phy[grp], size[grp], qo[grp])

    def _queue(self, k, phy: np.ndarray, size: np.ndarray, qo: np.ndarray) -> None:
        st = self.state.get(k)
        if st is None:  # a queue the store has no directory for: it starts at its first record's offset
            st = self.state[k] = [int(qo[0]), -1, int(qo[0]), False]
        # Already present (p + size <= maxPhysicOffset): records do not overlap and come in log order,
        # so after the first record past the initial maxPhysicOffset every later one is past it too,
        # and past every accepted one's end.
        live = np.flatnonzero(phy + size > st[1])
        if not len(live):
            return
        phy, size, qo = phy[live], size[live], qo[live]
        if st[3]:  # the first unit of a queue without files opens the file holding its offset (§7.3)
            st[0] = st[2] = int(qo[0])
            st[3] = False
        cur, accepted, last = 0, 0, -1
        n = len(qo)
        rounds = 0
        while cur < n:
            rounds += 1
            if rounds > 64:  # offsets far from consecutive (damage): one pass, record by record
                for j, q in enumerate(qo[cur:].tolist(), cur):
                    if q == st[0]:
                        st[0] += 1
                        accepted += 1
                        last = j
                break
            hit = np.flatnonzero(qo[cur:] == st[0])
            if not len(hit):
                break
            j = cur + int(hit[0])
            run = qo[j:] - (st[0] + np.arange(n - j, dtype=np.int64))
            brk = np.flatnonzero(run)
            r = int(brk[0]) if len(brk) else n - j
            st[0] += r
            accepted += r
            last = j + r - 1
            cur = j + r
        if accepted:
            st[1] = int(phy[last] + size[last])
            self.new_units[k] = self.new_units.get(k, 0) + accepted
