"""recover's plan on a broker with LMQ queues: the multi-dispatch units a window's records give (FORMAT.md §14.3),
as columns. Those at or past their queue's end join the queue's tail (what a re-dispatch writes); all of them let
an LMQ queue's unit that points at another topic's record agree with it (derived_windows._check_units). Python
runs per queue a window's records name, not per unit: a broker's LMQ records each name several queues."""

from __future__ import annotations

import numpy as np

from ..arrays import packed_rows, queue_key


def collect_lmq_tails(t, disp: np.ndarray, lt, queues: dict, tails: dict) -> "NamedUnits":
    """The multi-dispatch units of the window's dispatchable records (``lt``): those at or past their queue's end
    join its tail (what a re-dispatch writes), a part per queue in record order; returns them all for the unit
    checks. Python per queue the window's records name, not per unit."""
    ok = disp[lt.row]
    row, name, qid, qo = lt.row[ok], lt.name[ok], lt.queue_id[ok], lt.queue_offset[ok]
    named = NamedUnits(lt.names, row, name, qid, qo)
    if not len(row):
        return named
    keys, first, which = np.unique(named.target_key, return_index=True, return_inverse=True)
    which = which.ravel()
    ends = np.empty(len(keys), np.int64)  # a queue's end: its units below it exist, the rest join its tail
    queue_of = []
    for i, f in enumerate(first.tolist()):
        key = (lt.names[int(name[f])], int(qid[f]))
        queue_of.append(key)
        ends[i] = queues[key][0].max_offset if key in queues else np.iinfo(np.int64).min
    joins = np.flatnonzero(qo >= ends[which])
    if not len(joins):
        return named
    by_queue = joins[np.argsort(which[joins], kind="stable")]  # each queue's units together, in record order
    grouped = which[by_queue]
    cut = (np.flatnonzero(grouped[1:] != grouped[:-1]) + 1).tolist()
    for a, b in zip([0] + cut, cut + [len(by_queue)]):
        g = by_queue[a:b]
        r = row[g]
        tails.setdefault(queue_of[int(grouped[a])], []).append((t.phy[r], t.c["size"][r].astype(np.int64), qo[g]))
    return named


class NamedUnits:
    """(queue, record, queue offset) of a window's multi-dispatch units, for the unit checks: an LMQ queue's unit
    agrees when its record names the queue at the unit's offset (§14.3)."""

    def __init__(self, names: list, row: np.ndarray, name: np.ndarray, qid: np.ndarray, qo: np.ndarray):
        self.number = {n: i for i, n in enumerate(names)}
        self.target_key = queue_key(name, qid)
        self.packed = packed_rows(self.target_key, row, qo)

    def __len__(self) -> int:
        return len(self.packed)

    def key(self, queue: tuple) -> int:
        """The target key of ``queue`` (topic, queue id), -1 when no unit names it."""
        k = self.number.get(queue[0])
        return -1 if k is None else queue_key(k, queue[1])

    def holds(self, key: np.ndarray, row: np.ndarray, qo: np.ndarray) -> np.ndarray:
        """Whether each (queue key, record, queue offset) is one of the units (False for key -1)."""
        return (key >= 0) & np.isin(packed_rows(key, row, qo), self.packed)
