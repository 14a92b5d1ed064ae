"""The commitlog searched by store time (the broker's ``CommitLog.pickupStoreTimestamp`` along the log).

Store times (STORETIMESTAMP) are taken inside the broker's append lock, so they do not go down along the
commitlog: :func:`commitlog_offset_at` is a binary search over the segments by their first record's store
time, then one walk of the segment it lands in (record boundaries only; no CRC), in pieces of
``SEARCH_PIECE`` records so that memory does not grow with the segment, and a binary search over them.
Read-only.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats import fast


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


SEARCH_PIECE = 1 << 16  # records decoded at once when searching a segment by store time


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
        pos, seen = 0, False
        while True:  # in pieces: a broker's 1 GiB segment of small messages holds millions of records
            w = fast.walk(buf, pos, seg.size, commitlog.magics(False), max_records=SEARCH_PIECE)
            if len(w.offsets):
                seen = True
                h = fast.decode_headers(buf, w.offsets)
                bad = np.flatnonzero(h.reason != fast.R_OK)
                n = int(bad[0]) if len(bad) else len(h)  # the log ends at the first invalid record
                i = int(np.searchsorted(h.storeTimestamp[:n], timestamp, side="left"))
                if i < n:
                    return seg.start + int(h.offsets[i])
                if n < len(h):
                    return None  # the log ends in this segment
            if w.kind != fast.STOP_CHUNK or not len(w.offsets):
                break
            pos = w.stop
        if seen and w.kind != fast.STOP_BLANK:
            return None  # the log ends in this segment
    return None
