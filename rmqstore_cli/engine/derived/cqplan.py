"""The consume-queue units of a dispatch batch, grouped per queue and packed, before any file is touched.

CommitLogDispatcherBuildConsumeQueue takes the records of transaction type NOT or COMMIT (§14); each queue's
units are independent of the others, so a batch's units are sorted by (topic, queue) once and packed as
20-byte units in that order. Per queue group the plan also says whether the group is *straight*: record ends
strictly increasing and queue offsets consecutive. A straight group whose first queue offset is the queue's
write position and whose first record ends past the queue's max physical offset is exactly what
ConsumeQueueWriter.put would append unit after unit, so the writer copies its packed bytes in one go
(:meth:`Dispatcher._dispatch_cq`); any other group goes through the unit rules.

The plan is made where the batch is made: in a ``rebuild -j`` worker, so the parent only copies bytes.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats.records import CQ_UNIT_SIZE, TRANSACTION_COMMIT, TRANSACTION_NOT

from ..arrays import queue_key
from .consumequeue import CQ_DTYPE


def unsafe_topic_dir(topic: str) -> bool:
    """A topic that cannot be used as a directory name inside ``consumequeue/``."""
    return (not topic) or "/" in topic or "\x00" in topic or topic in (".", "..")


class QueuePlan:
    """Rows of the batch's consume-queue units grouped per (topic, queue), in (topic id, queue id) order.

    ``tids`` index ``names``; ``rows[starts[g]:starts[g + 1]]`` are group g's records in log order; ``units`` the same records packed;
    ``tids``/``qids`` the group's topic id and queue id; ``straight``, ``first_offset`` (queue offset * 20),
    ``first_end`` and ``last_end`` (record ends) what the writer checks; ``unsafe`` the rows whose topic cannot
    be a directory (not dispatched, reported); ``last_row`` the last row taken (its store time goes to the
    checkpoint), -1 when none is."""

    __slots__ = ("names", "rows", "starts", "tids", "qids", "units", "straight", "first_offset", "first_end", "last_end",
                 "unsafe", "last_row")

    def group_count(self) -> int:
        return len(self.tids)


def taken_rows(b) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
    """(topic names, rows a consume queue takes, their topic ids, unsafe rows) of a batch: the records of transaction
    types NOT and COMMIT whose topic can be a directory, in log order (``unsafe``: the others of those types)."""
    t = b.sysflag & 0xC
    sel = np.flatnonzero((t == TRANSACTION_NOT) | (t == TRANSACTION_COMMIT))
    if b.topic_ids is not None:
        names = b.topic_names
        tid = b.topic_ids[sel].astype(np.int64)
    else:
        names = list(dict.fromkeys(b.topic))
        ids = {name: k for k, name in enumerate(names)}
        tid = np.fromiter(map(ids.__getitem__, b.topic), dtype=np.int64, count=len(b))[sel]
    unsafe = np.zeros(0, np.int64)
    bad_ids = [k for k, name in enumerate(names) if unsafe_topic_dir(name)]
    if bad_ids and len(sel):
        bad = np.isin(tid, bad_ids)
        unsafe = sel[bad]
        sel, tid = sel[~bad], tid[~bad]
    return names, sel, tid, unsafe


def queue_plan(b) -> QueuePlan:
    """The :class:`QueuePlan` of a :class:`~.dispatchbatch.DispatchBatch`."""
    p = QueuePlan()
    p.names, sel, tid, p.unsafe = taken_rows(b)
    p.last_row = int(sel[-1]) if len(sel) else -1
    qid = b.queue_id[sel]
    key = queue_key(tid, qid)
    if not len(key) or (key == key[0]).all():
        order = None
        rows = sel
        ks = key
    else:
        order = np.argsort(_dense(tid, qid, key), kind="stable")
        rows = sel[order]
        ks = key[order]
    n = len(rows)
    cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
    p.starts = np.concatenate(([0], cuts, [n])).astype(np.int64) if n else np.zeros(1, np.int64)
    firsts = p.starts[:-1]
    p.rows = rows.astype(np.int32) if len(b) < 2**31 else rows  # rows of one chunk: half the bytes through a -j pipe
    p.tids = tid[firsts] if order is None else tid[order][firsts]
    p.qids = b.queue_id[rows[firsts]]
    phy, size, qo = b.phy[rows], b.size[rows], b.queue_offset[rows]
    units = np.empty(n, dtype=CQ_DTYPE)
    units["phyOffset"] = phy
    units["size"] = size
    units["tagsCode"] = b.tags_code[rows]
    p.units = units
    end = phy + size
    # a pair of neighbours inside one group breaks straightness when ends do not increase or offsets skip
    broken = np.flatnonzero((end[1:] <= end[:-1]) | (qo[1:] != qo[:-1] + 1))
    straight = np.ones(len(firsts), dtype=bool)
    if len(broken):
        g = np.searchsorted(p.starts, broken, side="right") - 1  # group of the pair's first unit
        inside = broken + 1 < p.starts[g + 1]
        straight[g[inside]] = False
    p.straight = straight
    p.first_offset = qo[firsts] * CQ_UNIT_SIZE
    p.first_end = end[firsts]
    p.last_end = end[p.starts[1:] - 1] if n else np.zeros(0, np.int64)
    return p


def _dense(tid: np.ndarray, qid: np.ndarray, key: np.ndarray) -> np.ndarray:
    """``key`` ((topic id, queue id as unsigned)) as small numbers in the same order when they fit in 16 bits (a
    chunk holds a few queues): numpy's stable sort of uint16 is a radix sort, several times faster."""
    q = qid & 0xFFFFFFFF
    lo = int(q.min())
    span = int(q.max()) - lo + 1
    if (int(tid.max()) + 1) * span > 1 << 16:
        return key
    return (tid * span + (q - lo)).astype(np.uint16)
