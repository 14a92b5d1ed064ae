"""Finding places in a store by store time, without reading everything before them.

Store times (STORETIMESTAMP) are taken inside the broker's append lock, so they do not go down
along the commitlog (FORMAT.md §2.1, field 11); both searches rely on that, as the broker does.

* :func:`commitlog_offset_at` — the physical offset of the first record stored at or after a
  time: a binary search over the segments by their first record's store time, then one walk of
  the segment it lands in (record boundaries only; no CRC) and a binary search over its records.
* :func:`queue_offset_by_time` — the broker's ``ConsumeQueue.getOffsetInQueueByTime`` for each
  version: a binary search over consume-queue units that reads the store time of the record each
  unit points at (``CommitLog.pickupStoreTimestamp``).
"""

from __future__ import annotations

import numpy as np

from formats import fast
from formats.records import CQ_UNIT_SIZE, MAGIC_V1, MAGIC_V2

LOWER, UPPER = "lower", "upper"  # the broker's BoundaryType (5.x)


def _first_time(seg) -> int | None:
    """Store time of the record at the start of a segment, or None when it holds no record."""
    if seg.size < 8:
        return None
    buf = seg.buffer()
    w = fast.walk(buf, 0, min(seg.size, 1 << 20), max_records=1)
    if not len(w.offsets):
        return None
    h = fast.decode_headers(buf, w.offsets[:1])
    return int(h.storeTimestamp[0]) if h.reason[0] == fast.R_OK else None


def commitlog_offset_at(commitlog, timestamp: int) -> int | None:
    """Absolute offset of the first record whose store time is >= ``timestamp``.

    None when every record is older. Only the segment the answer lies in is walked (and the
    first record of ~log2(segments) others is read), so the cost does not grow with the log.
    """
    segs = [s for s in commitlog.segments.segments if s.size]
    if not segs:
        return None
    firsts = [None] * len(segs)

    def first(i: int) -> float:
        if firsts[i] is None:
            t = _first_time(segs[i])
            firsts[i] = float("inf") if t is None else t
        return firsts[i]

    # Last segment whose first record is older than the time: the answer is in it or just after it.
    lo, hi = 0, len(segs) - 1
    if first(0) >= timestamp:
        return segs[0].start if first(0) != float("inf") else None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if first(mid) < timestamp:
            lo = mid
        else:
            hi = mid - 1
    for k in range(lo, len(segs)):
        seg = segs[k]
        if k > lo:
            return seg.start if first(k) != float("inf") else None
        buf = seg.buffer()
        w = fast.walk(buf, 0, seg.size, commitlog.magics(False))
        if not len(w.offsets):
            continue
        h = fast.decode_headers(buf, w.offsets)
        ok = h.reason == fast.R_OK
        bad = np.flatnonzero(~ok)
        n = int(bad[0]) if len(bad) else len(h)  # the log ends at the first invalid record
        times = h.storeTimestamp[:n]
        i = int(np.searchsorted(times, timestamp, side="left"))
        if i < n:
            return seg.start + int(h.offsets[i])
        if n < len(h) or w.kind != fast.STOP_BLANK:
            return None  # the log ends in this segment
    return None


def pickup_store_timestamp(commitlog, phy: int, size: int, max_offset: int) -> int:
    """The broker's ``CommitLog.pickupStoreTimestamp``: -1 outside [min offset, max offset]."""
    if phy < commitlog.min_offset or phy + size > max_offset:
        return -1
    seg = commitlog.segments.find(phy)
    if seg is None:
        return -1
    pos = phy - seg.start
    if pos + fast.FIXED_V4_SIZE > seg.size:
        return -1
    h = fast.decode_headers(seg.buffer(), np.array([pos], dtype=np.int64))
    return int(h.storeTimestamp[0])


def queue_offset_by_time(store, topic: str, queue_id: int, timestamp: int, *, version: int | None = None,
                         boundary: str = LOWER, max_phy_offset: int | None = None) -> int:
    """The queue offset the broker answers for ``timestamp`` (``getOffsetInQueueByTime``).

    5.x (``BoundaryType`` LOWER by default): the first unit stored at or after the time (UPPER:
    the last at or before it), clamped into the queue's [min, max] offsets. 4.9.3: the unit whose
    store time is nearest (the earlier one on a tie), no clamp; its file is picked by modification
    time on a live broker, approximated here by the store time of each file's last unit.
    """
    version = store.config.version if version is None else version
    cq = store.queue(topic, queue_id)
    units = cq.units()
    if max_phy_offset is None:
        res = store.commitlog.find_end(check_crc=False)
        max_phy_offset = res.stop.offset if res.stop else 0
    files = _queue_files(cq, units)
    if not files:
        return 0
    if version >= 5:
        seg = _file_by_time_v5(store.commitlog, cq, files, timestamp, boundary, max_phy_offset)
        off = _search_v5(store.commitlog, cq, seg, units, timestamp, boundary, max_phy_offset)
        return max(min_queue_offset(units, store.commitlog), min(off, units.end_offset))
    # 4.9.3 takes the first file whose modification time is at or after the time. On a live broker
    # that is when the file's last unit was written; copies and restores lose it, so the store time
    # of each file's last unit stands in for it (what 5.x reads instead of the file time).
    seg = _file_by_time_v5(store.commitlog, cq, files, timestamp, LOWER, max_phy_offset)
    return _search_v4(store.commitlog, cq, seg, units, timestamp, max_phy_offset)


def _queue_files(cq, units):
    return [s for s in cq.segments.segments if s.size]


def _unit(cq, seg, pos: int) -> tuple[int, int]:
    u = cq.file_units(seg)[pos // CQ_UNIT_SIZE]
    return int(u["phyOffset"]), int(u["size"])


def _written(cq, seg, units) -> int:
    """Bytes of valid units in the file (the broker's wrote position after recovery)."""
    start_q = seg.start // CQ_UNIT_SIZE
    n = int(np.count_nonzero((units.queue_offsets >= start_q) & (units.queue_offsets < start_q + cq.file_size // CQ_UNIT_SIZE)))
    return n * CQ_UNIT_SIZE


def min_queue_offset(units, commitlog) -> int:
    """The broker's ``minLogicOffset / 20`` after ``correctMinOffset``: the first unit that points
    into the part of the log that still exists (the queue's max offset when none does)."""
    live = np.flatnonzero(units.phy >= commitlog.min_offset)
    return int(units.queue_offsets[live[0]]) if len(live) else int(units.end_offset)


def _jdiv(a: int, b: int) -> int:
    """Java's long division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _file_by_time_v5(commitlog, cq, files, ts, boundary, max_phy):
    starts, stops = [], []
    for i, seg in enumerate(files):
        phy, size = _unit(cq, seg, 0)
        t = pickup_store_timestamp(commitlog, phy, size, max_phy)
        starts.append(t if t > 0 else -1)
        if i < len(files) - 1:
            phy, size = _unit(cq, seg, cq.file_size - CQ_UNIT_SIZE)
            t = pickup_store_timestamp(commitlog, phy, size, max_phy)
            stops.append(t if t > 0 else -1)
    if boundary == LOWER:
        for i, seg in enumerate(files[:-1]):
            if stops[i] >= ts:
                return seg
        return files[-1]
    for i in range(len(files) - 1, -1, -1):
        if starts[i] <= ts:
            return files[i]
    return None


def _search_v5(commitlog, cq, seg, units, ts, boundary, max_phy) -> int:
    if seg is None:
        return 0
    min_phy = commitlog.min_offset
    file_from = seg.start
    low = max(0, min_queue_offset(units, commitlog) * CQ_UNIT_SIZE - file_from)
    rng = _written(cq, seg, units) or cq.file_size
    ceiling = rng - CQ_UNIT_SIZE
    floor = low
    high = ceiling
    if ceiling < 0:
        return file_from // CQ_UNIT_SIZE

    def time_at(pos: int) -> int:
        phy, size = _unit(cq, seg, pos)
        return pickup_store_timestamp(commitlog, phy, size, max_phy)

    if time_at(ceiling) < ts:
        return (file_from + ceiling + (CQ_UNIT_SIZE if boundary == LOWER else 0)) // CQ_UNIT_SIZE
    if time_at(floor) > ts:
        return file_from // CQ_UNIT_SIZE if boundary == LOWER else 0
    target = left = right = -1
    while high >= low:
        mid = (low + high) // (2 * CQ_UNIT_SIZE) * CQ_UNIT_SIZE
        phy, size = _unit(cq, seg, mid)
        if phy < min_phy:
            low = mid + CQ_UNIT_SIZE
            left = mid
            continue
        t = pickup_store_timestamp(commitlog, phy, size, max_phy)
        if t < 0:
            return 0
        if t == ts:
            target = mid
            break
        if t > ts:
            high = mid - CQ_UNIT_SIZE
            right = mid
        else:
            low = mid + CQ_UNIT_SIZE
            left = mid
    if target != -1:
        step = -CQ_UNIT_SIZE if boundary == LOWER else CQ_UNIT_SIZE
        pos = target
        while floor <= pos + step <= ceiling and time_at(pos + step) == ts:
            pos += step
        offset = pos
    else:
        offset = right if boundary == LOWER else left
    return _jdiv(file_from + offset, CQ_UNIT_SIZE)


def _search_v4(commitlog, cq, seg, units, ts, max_phy) -> int:
    min_phy = commitlog.min_offset
    file_from = seg.start
    low = max(0, min_queue_offset(units, commitlog) * CQ_UNIT_SIZE - file_from)
    # 4.9.3 searches the file's whole readable range (its wrote position after recovery).
    high = (_written(cq, seg, units) or 0) - CQ_UNIT_SIZE
    target = left = right = -1
    left_t = right_t = -1
    while high >= low:
        mid = (low + high) // (2 * CQ_UNIT_SIZE) * CQ_UNIT_SIZE
        phy, size = _unit(cq, seg, mid)
        if phy < min_phy:
            low = mid + CQ_UNIT_SIZE
            left = mid
            continue
        t = pickup_store_timestamp(commitlog, phy, size, max_phy)
        if t < 0:
            return 0
        if t == ts:
            target = mid
            break
        if t > ts:
            high = mid - CQ_UNIT_SIZE
            right, right_t = mid, t
        else:
            low = mid + CQ_UNIT_SIZE
            left, left_t = mid, t
    if target != -1:
        offset = target
    elif left_t == -1:
        offset = right
    elif right_t == -1:
        offset = left
    else:
        offset = right if abs(ts - left_t) > abs(ts - right_t) else left
    return _jdiv(file_from + offset, CQ_UNIT_SIZE)


__all__ = ["commitlog_offset_at", "queue_offset_by_time", "pickup_store_timestamp", "LOWER", "UPPER", "MAGIC_V1",
           "MAGIC_V2"]


def queue_range_by_time(store, units, since: int | None, until: int | None,
                        max_phy_offset: int | None = None) -> tuple[int, int]:
    """Indexes [lo, hi) into ``units`` (a :class:`~.consumequeue.QueueUnits`) of the units whose
    record was stored in [since, until]: two binary searches reading ~2·log2(n) store times.
    Units pointing below the log's start count as older than any time, past its end as newer."""
    from bisect import bisect_left, bisect_right

    cl = store.commitlog
    if max_phy_offset is None:
        res = cl.find_end(check_crc=False)
        max_phy_offset = res.stop.offset if res.stop else 0
    n = len(units.phy)

    def time_of(i: int) -> float:
        phy, size = int(units.phy[i]), int(units.size[i])
        if phy < cl.min_offset:
            return float("-inf")
        t = pickup_store_timestamp(cl, phy, size, max_phy_offset)
        return float("inf") if t < 0 else t

    lo = 0 if since is None else bisect_left(range(n), since, key=time_of)
    hi = n if until is None else bisect_right(range(n), until, key=time_of)
    return lo, max(lo, hi)
