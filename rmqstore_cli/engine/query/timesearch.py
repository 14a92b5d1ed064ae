"""Finding places in a store by store time, without reading everything before them.

Store times (STORETIMESTAMP) are taken inside the broker's append lock, so they do not go down
along the commitlog; every search here relies on that, as the broker does.

* ``log.storetime.commitlog_offset_at`` (in the log layer, which uses it for ``--since``/``--until``) — the
  physical offset of the first record stored at or after a time.
* :func:`queue_range_by_time` — the consume-queue units whose records were stored in a range.
* :class:`TimeSearch` / :func:`offset_by_time` — the broker's ``getOffsetInQueueByTime``:

4.9.3 (``ConsumeQueue.getOffsetInQueueByTime``): the file is the first whose last-modified time is at or
after the timestamp (else the last file); a binary search over that file's readable units, skipping units
below the commitlog's min offset, ends on a unit with exactly that store time, or else on the nearer
(in time) of the two neighbours, the earlier one on a tie; a unit whose store time cannot be read makes
the answer 0. No clamping.

5.3.3 (``ConsumeQueue.getOffsetInQueueByTime(ts, LOWER)`` + ``ConsumeQueueStore``): the file is the first
whose last unit's store time is at or after the timestamp (else the last file); in it, if the last unit
is older than the timestamp the answer is just past it, if the first unit is newer it is the file's first
offset; otherwise the binary search, and on an exact hit the search walks back to the first unit of that
store time; with no exact hit the unit just after the timestamp. The answer is clamped into [min, max].

Store times are read from the commitlog record each unit points at (``CommitLog.pickupStoreTimestamp``).
Read-only.
"""

from __future__ import annotations

import os
import struct

from rmqstore_cli.formats.records import CQ_UNIT_SIZE, SYSFLAG_BORNHOST_V6

from ..errors import StoreCorruptError
from ..config.offsets import queue_bounds

UNIT = CQ_UNIT_SIZE
_SYSFLAG_POS = 36


def _jdiv(a: int, b: int) -> int:
    """Java long division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


class _Reader:
    """CommitLog.pickupStoreTimestamp over one opened store (its valid end found once)."""

    def __init__(self, store, version: int, max_phy: int | None = None):
        self.cl = store.commitlog
        self.version = version
        self.min_phy = self.cl.min_offset
        if max_phy is None:
            end = self.cl.find_end(check_crc=False).stop
            max_phy = end.offset if end is not None else self.min_phy
        self.max_phy = max_phy

    def store_time(self, phy: int, size: int) -> int:
        """CommitLog.pickupStoreTimestamp: -1 when the broker cannot select [phy, phy+size)."""
        if phy < self.min_phy:
            return -1
        if self.version >= 5 and phy + size > self.max_phy:
            return -1
        seg = self.cl.segments.find(phy)
        if seg is None or size < 0:
            return -1
        pos = phy - seg.start
        readable = seg.size if seg.end <= self.max_phy else self.max_phy - seg.start  # the last file's wrote position
        if pos + size > readable:
            return -1
        buf = seg.buffer()
        if size < _SYSFLAG_POS + 4:
            raise StoreCorruptError(f"consume-queue unit points at {phy} with size {size}: too small to hold a store time "
                                    "(the broker's search fails on it)")
        (sysflag,) = struct.unpack_from(">i", buf, pos + _SYSFLAG_POS)
        at = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + (20 if sysflag & SYSFLAG_BORNHOST_V6 else 8)
        if at + 8 > size:
            raise StoreCorruptError(f"record at {phy} (size {size}) is too short for its store time")
        return struct.unpack_from(">q", buf, pos + at)[0]


def _files(store, topic: str, queue_id: int, end_offset: int):
    """(segment, readable bytes) per consume-queue file: full files, the last up to the queue's end."""
    q = store.queue(topic, queue_id)
    out = []
    end_bytes = end_offset * UNIT
    for seg in q.segments.segments:
        readable = max(0, min(q.file_size, seg.size, end_bytes - seg.start))
        out.append((seg, readable))
    return out, q.file_size


def _unit(seg, pos: int) -> tuple[int, int]:
    return struct.unpack_from(">qi", seg.buffer(), pos)


class TimeSearch:
    """getOffsetInQueueByTime over one opened store (the commitlog's end is found once)."""

    def __init__(self, store, version: int | None = None):
        self.store = store
        self.version = version or store.config.version
        self.reader = _Reader(store, self.version)

    def offset(self, topic: str, queue_id: int, timestamp: int) -> int:
        """The queue offset DefaultMessageStore.getOffsetInQueueByTime returns for this queue and time (ms)."""
        if self.store.rocksdb is not None:
            from .rocksdbqueue import offset_by_time as rocksdb_offset_by_time

            return rocksdb_offset_by_time(self.store.queue(topic, queue_id), timestamp)
        b = queue_bounds(self.store, topic, queue_id)
        files, file_size = _files(self.store, topic, queue_id, b.max)
        if not files:
            return 0
        min_logic = b.min * UNIT
        if self.version < 5:
            return _search_493(files, self.reader, min_logic, timestamp)
        r = _search_533(files, file_size, self.reader, min_logic, timestamp)
        return min(max(r, b.min), b.max)


def offset_by_time(store, topic: str, queue_id: int, timestamp: int, version: int | None = None) -> int:
    """One search (see :class:`TimeSearch` for many on one store)."""
    return TimeSearch(store, version).offset(topic, queue_id, timestamp)


def _search_493(files, rd: _Reader, min_logic: int, ts: int) -> int:
    seg, readable = files[-1]
    for s, r in files:
        if os.stat(s.path).st_mtime_ns // 1_000_000 >= ts:  # File.lastModified()
            seg, readable = s, r
            break
    low = min_logic - seg.start if min_logic > seg.start else 0
    found = _bisect(seg, rd, low, readable - UNIT, ts)
    if found is None:
        return 0
    target, left, left_v, right, right_v = found
    if target != -1:
        off = target
    elif left_v == -1:
        off = right
    elif right_v == -1:
        off = left
    else:
        off = right if abs(ts - left_v) > abs(ts - right_v) else left
    return _jdiv(seg.start + off, UNIT)


def _search_533(files, file_size: int, rd: _Reader, min_logic: int, ts: int) -> int:
    # getConsumeQueueMappedFileByTime(LOWER): stop time = store time of a full file's last unit
    chosen = files[-1]
    for i, (s, r) in enumerate(files[:-1]):
        if r >= file_size:
            phy, size = _unit(s, file_size - UNIT)
            stop = rd.store_time(phy, size)
            if stop > 0 and stop >= ts:
                chosen = (s, r)
                break
    seg, readable = chosen
    wrote = readable
    rng = wrote if (wrote != 0 and wrote != file_size) else file_size
    if rng > readable:  # selectMappedBuffer(0, range) past the wrote position: no buffer
        return 0
    low = min_logic - seg.start if min_logic > seg.start else 0
    ceiling = rng - UNIT
    floor = low
    high = ceiling
    phy, size = _unit(seg, ceiling)
    if rd.store_time(phy, size) < ts:
        return _jdiv(seg.start + ceiling + UNIT, UNIT)
    phy, size = _unit(seg, floor)
    if rd.store_time(phy, size) > ts:
        return _jdiv(seg.start, UNIT)
    found = _bisect(seg, rd, low, high, ts)
    if found is None:
        return 0
    target, _, _, right, _ = found  # (the broker's leftOffset only matters for its UPPER boundary)
    if target != -1:
        off = target
        while off - UNIT >= floor:
            phy, size = _unit(seg, off - UNIT)
            if rd.store_time(phy, size) != ts:
                break
            off -= UNIT
    else:
        off = right
    return _jdiv(seg.start + off, UNIT)


def _bisect(seg, rd: _Reader, low: int, high: int, ts: int):
    """Both versions' binary search over the units at byte positions [low, high] of one consume-queue
    file: (unit with store time ``ts`` or -1, last unit below it (or skipped as before the log's start),
    its time, first unit above it, its time; -1 when none); None when a unit's record cannot be read
    (the broker then answers 0)."""
    target = left = right = -1
    left_v = right_v = -1
    while high >= low:
        mid = (low + high) // (2 * UNIT) * UNIT
        phy, size = _unit(seg, mid)
        if phy < rd.min_phy:
            low = mid + UNIT
            left = mid
            continue
        t = rd.store_time(phy, size)
        if t < 0:
            return None
        if t == ts:
            target = mid
            break
        if t > ts:
            high = mid - UNIT
            right, right_v = mid, t
        else:
            low = mid + UNIT
            left, left_v = mid, t
    return target, left, left_v, right, right_v


def queue_range_by_time(store, units, since: int | None, until: int | None,
                        max_phy_offset: int | None = None) -> tuple[int, int]:
    """Indexes [lo, hi) into ``units`` (a :class:`~..derived.consumequeue.QueueUnits`) of the units whose
    record was stored in [since, until]: two binary searches reading ~2·log2(n) store times.
    Units pointing below the log's start count as older than any time, past its end as newer."""
    from bisect import bisect_left, bisect_right

    reader = _Reader(store, 5, max_phy_offset)
    n = len(units.phy)

    def time_of(i: int) -> float:
        phy, size = int(units.phy[i]), int(units.size[i])
        if phy < reader.min_phy:
            return float("-inf")
        try:
            t = reader.store_time(phy, size)
        except StoreCorruptError:
            t = -1
        return float("inf") if t < 0 else t

    lo = 0 if since is None else bisect_left(range(n), since, key=time_of)
    hi = n if until is None else bisect_right(range(n), until, key=time_of)
    return lo, max(lo, hi)
