"""Verify window by window: dispatch completeness (records no consume-queue unit points at).

The broker's ``ReputMessageService`` dispatches every record after the consume queues' high-water mark
again at start (§13.1); a dispatchable record before the mark without a unit is never dispatched
(CQ_NOT_DISPATCHED), one from the mark on is merely late (CQ_DISPATCH_LAG). Each window's missing records
are reduced to a :class:`WindowMissing` summary (per-queue rows, first/last offsets, the split at the
window's own furthest find) where the window is checked — in this process, or in a ``-j`` worker — and
:class:`DispatchWindows` judges the summaries in log order.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats.records import TRANSACTION_COMMIT, TRANSACTION_NOT

from ..arrays import queue_key
from .queues import add_not_dispatched, dispatch_high_water, dispatch_lag_finding
from .records import _Agg, _Records


class _Missing:
    """Some records of one window that no unit points at (columns, log order)."""

    def __init__(self, recs: _Records, idx: np.ndarray):
        self.phy, self.seg = recs.phy[idx], recs.seg[idx]
        self.tid, self.qid, self.qoff = recs.c["topic"][idx], recs.c["queueId"][idx], recs.c["queueOffset"][idx]
        self.names = recs.topics

    def __len__(self) -> int:
        return len(self.phy)

    def take(self, mask: np.ndarray) -> "_Missing":
        out = _Missing.__new__(_Missing)
        out.phy, out.seg, out.tid, out.qid, out.qoff = (a[mask] for a in (self.phy, self.seg, self.tid, self.qid, self.qoff))
        out.names = self.names
        return out

    def per_queue(self):
        """(topic, queueId, count, first phy, its segment, its queue offset) per queue, lowest offset first."""
        if not len(self.phy):
            return
        key = queue_key(self.tid.astype(np.int64), self.qid.astype(np.int64))
        _, first, counts = np.unique(key, return_index=True, return_counts=True)
        for i, n in zip(first.tolist(), counts.tolist()):
            yield (self.names[int(self.tid[i])], int(self.qid[i]), int(n), int(self.phy[i]), int(self.seg[i]),
                   int(self.qoff[i]))

    def head(self) -> tuple | None:
        """(first offset, its segment, count), None when empty."""
        return (int(self.phy[0]), int(self.seg[0]), len(self)) if len(self) else None


class WindowMissing:
    """One window's dispatchable records without a unit, as a few numbers and one row per queue: what
    :class:`DispatchWindows` needs of the window, small enough to come back from a worker process.

    ``found_end`` is the end of the furthest record a unit found in the window (None: no unit did); for
    such a window the records are also split at it (``below_rows`` / ``rest``), which is where the mark falls
    when it is the last window with a find. ``cols`` keeps the records themselves (in process only), so any
    other mark can still be applied."""

    __slots__ = ("n", "first_phy", "first_seg", "last_phy", "rows", "found_end", "below_rows", "rest", "cols")

    def __init__(self, recs: _Records, marks: np.ndarray, found_end: int | None, keep_cols: bool):
        tran = recs.c["sysFlag"] & 0xC
        missing = _Missing(recs, np.flatnonzero(((tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)) & ~marks))
        self.n = len(missing)
        self.found_end = found_end
        self.first_phy = int(missing.phy[0]) if self.n else None
        self.first_seg = int(missing.seg[0]) if self.n else None
        self.last_phy = int(missing.phy[-1]) if self.n else None
        self.rows = list(missing.per_queue())
        self.below_rows, self.rest = [], None
        if found_end is not None and self.n:
            below = missing.phy < found_end
            self.below_rows = list(missing.take(below).per_queue())
            self.rest = missing.take(~below).head()
        self.cols = missing if keep_cols else None


class NotMergeable(Exception):
    """The window summaries cannot say what the records would: the caller verifies in one process instead."""


class DispatchWindows:
    """Records no consume-queue unit points at, window by window, judged against the queues' high-water
    mark (the broker re-dispatches everything after it at start, §13.1): before it CQ_NOT_DISPATCHED per
    queue, from it CQ_DISPATCH_LAG. Memory stays bounded whatever the log (even with no consume queue at
    all): the mark is the end of the furthest record a unit found, which lies in the last window with
    such a unit, so only that window's summary split at its own furthest find is kept apart. Every other
    window is kept as per-queue summaries merged across windows (one row per queue, not per queue and
    window: a 1 TB log is 16k windows): the windows before the last find are before the mark whatever it
    becomes; a later window is judged against the mark it would be if no later window finds a unit (the
    furthest find so far, or else the furthest unit's offset, ``phy_max``, known before the walk), and
    moved before the mark if a later window does find one. The one window that mark falls inside is read
    again at the end. Windows must be given in log order (:meth:`add`)."""

    def __init__(self, phy_max: int | None):
        self.phy_max = phy_max  # the furthest real unit's offset over every queue
        self.found_end_max: int | None = None
        self.detail: WindowMissing | None = None  # the last window where a unit found its record
        self.old: dict = {}  # per-queue rows judged before the mark
        self._reset_after()

    def _reset_after(self) -> None:
        # windows after the last find: before / inside (at most one) / from the mark it would be
        self.after_before: dict = {}
        self.after_inside: tuple | None = None  # (first phy, window, per-queue rows)
        self.after_from: tuple | None = None  # (first phy, its segment, count)
        self.after_from_rows: dict = {}

    @staticmethod
    def _merge(into: dict, rows) -> None:
        """Per-queue rows (topic, queueId, count, first phy, its segment, its queue offset) summed per queue."""
        for row in rows:
            key = (row[0], row[1])
            got = into.get(key)
            if got is None:
                into[key] = row
            else:
                first = got if got[3] <= row[3] else row
                into[key] = (*first[:2], got[2] + row[2], *first[3:])

    def window(self, recs: _Records, marks: np.ndarray, found_end: int | None, w: int) -> None:
        """Window ``w``'s records ``recs``, ``marks`` flagging those a unit found."""
        self.add(WindowMissing(recs, marks, found_end, keep_cols=True), w)

    def add(self, s: WindowMissing, w: int) -> None:
        """Window ``w``'s summary (windows in log order)."""
        if s.found_end is not None:
            # everything kept so far lies before this window's found record: before the mark, whatever it becomes
            if self.detail is not None:
                self._merge(self.old, self.detail.rows)
            self._merge(self.old, self.after_before.values())
            self._merge(self.old, self.after_from_rows.values())
            if self.after_inside is not None:
                self._merge(self.old, self.after_inside[2])
            self._reset_after()
            self.found_end_max = s.found_end if self.found_end_max is None else max(self.found_end_max, s.found_end)
            self.detail = s
        elif s.n:
            mark = dispatch_high_water(self.found_end_max, self.phy_max)
            if s.last_phy < mark:
                self._merge(self.after_before, s.rows)
            elif s.first_phy >= mark:
                if self.after_from is None:
                    self.after_from = (s.first_phy, s.first_seg, 0)
                f0, s0, n0 = self.after_from
                self.after_from = (f0, s0, n0 + s.n)
                self._merge(self.after_from_rows, s.rows)
            else:
                self.after_inside = (s.first_phy, w, s.rows)

    _reread = None

    def reread_with(self, reread) -> None:
        """``reread(window number) -> _Records`` gives one window's records again (the rare case above)."""
        self._reread = reread

    def finish(self, cl, findings: list) -> None:
        segs = cl.segments.segments
        high = dispatch_high_water(self.found_end_max, self.phy_max)
        old = dict(self.old)
        lag_first, lag_count = None, 0

        def lag(head: tuple | None) -> None:
            nonlocal lag_first, lag_count
            if head is None:
                return
            if lag_first is None:
                lag_first = (head[1], head[0])
            lag_count += head[2]

        d = self.detail
        if d is not None and d.n:  # the mark lies in this window
            if d.cols is not None:
                below = d.cols.phy < high
                self._merge(old, d.cols.take(below).per_queue())
                lag(d.cols.take(~below).head())
            elif high == d.found_end:
                self._merge(old, d.below_rows)
                lag(d.rest)
            else:  # an earlier window's record ends after this one's furthest find (records overlap)
                raise NotMergeable("the high-water mark is not the last window's furthest find")
        self._merge(old, self.after_before.values())
        if self.after_inside is not None:  # the mark falls inside this window: judge its records one by one
            recs = self._reread(self.after_inside[1])
            # no unit found a record here (else the mark would be a found end), so none is marked
            m = WindowMissing(recs, np.zeros(len(recs), dtype=bool), None, keep_cols=True).cols
            below = m.phy < high
            self._merge(old, m.take(below).per_queue())
            lag(m.take(~below).head())
        if self.after_from is not None:
            lag((self.after_from[0], self.after_from[1], self.after_from[2]))
        if lag_count:
            s = segs[lag_first[0]]
            findings.append(dispatch_lag_finding(s.path, lag_first[1] - s.start, lag_count, lag_first[1]))
        agg = _Agg()
        for topic, qid, n, phy, seg, qoff in sorted(old.values(), key=lambda r: r[3]):
            s = segs[seg]
            add_not_dispatched(agg, s.path, phy - s.start, topic, qid, phy, qoff, n)
        findings += agg.findings()

