"""Queries on a RocksDB consume queue: its units as dump rows, and the queue offset the broker answers for a
store time (RocksDBConsumeQueueTable#binarySearchInCQByTime). The queue itself: :mod:`..derived.rocksdbqueue`."""

from __future__ import annotations

import numpy as np

from ..derived.rocksdbqueue import RocksDBConsumeQueue


def unit_rows(cq: RocksDBConsumeQueue, start: int | None = None, stop: int | None = None,
              since: int | None = None, until: int | None = None):
    """Dump rows of one queue's units in [start, stop) (default: every unit of its key range), block by block.

    ``since``/``until`` select by the store time the unit carries. Units at or past the max offset are
    marked ``dirty``: the broker neither serves them nor keeps them (it writes over them)."""
    max_off = cq.max_offset
    for qofs, vals in cq.blocks(start or 0, stop):
        keep = np.ones(len(qofs), dtype=bool)
        st = vals["storeTime"]
        if since is not None:
            keep &= st >= since
        if until is not None:
            keep &= st <= until
        idx = np.flatnonzero(keep)
        cols = (qofs[idx].tolist(), vals["phyOffset"][idx].tolist(), vals["size"][idx].tolist(),
                vals["tagsCode"][idx].tolist(), st[idx].tolist())
        for qo, phy, size, tags, t in zip(*cols):
            row = {"topic": cq.topic, "queueId": cq.queue_id, "queueOffset": qo, "phyOffset": phy, "size": size,
                   "tagsCode": tags, "storeTime": t}
            if qo >= max_off:
                row["dirty"] = True
            yield row


def offset_by_time(cq: RocksDBConsumeQueue, timestamp: int, lower: bool = True) -> int:
    """The queue offset the broker answers for a store time (RocksDBConsumeQueueTable#binarySearchInCQByTime
    with BoundaryType LOWER or UPPER, clamped to [min, max] like DefaultMessageStore#getOffsetInQueueByTime)."""
    mx = cq.max_entry
    lo_bound, hi_bound = cq.min_offset(), cq.max_offset
    if mx is None:
        return min(max(0, lo_bound), hi_bound)
    high, low = mx.cq_offset, lo_bound
    ceiling, floor = high, low
    min_phy = cq.db._min_phy_offset()

    def store_time(off: int):
        u = cq.unit_value(off)
        return None if u is None else u

    def clamp(r: int) -> int:
        return min(max(r, lo_bound), hi_bound)

    u = store_time(ceiling)
    if u is not None and u[3] < timestamp:
        return clamp(ceiling + 1 if lower else ceiling)
    u = store_time(floor)
    if u is not None and u[3] > timestamp:
        return clamp(floor if lower else 0)
    target = left = right = -1
    while high >= low:
        mid = low + ((high - low) >> 1)
        u = store_time(mid)
        if u is None:
            low = mid + 1
            continue
        if u[0] < min_phy:
            low, left = mid + 1, mid
            continue
        t = u[3]
        if t < 0:
            return clamp(0)
        if t == timestamp:
            target = mid
            break
        if t > timestamp:
            high, right = mid - 1, mid
        else:
            low, left = mid + 1, mid
    if target == -1:
        return clamp(right if lower else left)
    step, edge = (-1, floor) if lower else (1, ceiling)
    while (target + step >= edge) if lower else (target + step <= edge):  # neighbours with the same store time
        u = store_time(target + step)
        if u is None or u[3] != timestamp:
            break
        target += step
    return clamp(target)
