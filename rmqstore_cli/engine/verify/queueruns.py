"""Every consume queue's units of a window, found and checked together.

A broker carries thousands of queues, and a window (a few MB of the log) holds a few units of each. What was
per queue and window in Python (finding the file's run of units that points into the window, slicing it,
applying the kernel's answer) is here a handful of numpy operations over a table of every queue file, so a
window costs the same few calls whether the store has 16 queues or 16,000; Python is left only for the rare
units the kernel flags or cannot place.

The broker has no counterpart: its ``ReputMessageService`` writes each unit as it dispatches a record. This is
the check that reads them back, grouped by the window of the log they point into.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats import checkkernel
from rmqstore_cli.formats.checkkernel import RUN_EXT, RUN_ORDERED, RUN_OTHERS
from rmqstore_cli.formats.extaddr import MAX_ADDR
from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from ..arrays import queue_key, sampled_runs
from ..derived.lmq import window_targets, window_targets_by_record
from ..log.segments import QUEUE_FILES
from .records import _Records
from .windows import QueueWindows, Windows

# A run of at least this many units is checked in its file's own bytes; shorter runs are copied into batches of
# about this many units (copying a unit costs a few ns, a kernel call of its own tens of us; a batch's copy and
# room for its results stay a few hundred KB, whatever the number of queues)
BATCH_UNITS = 8192

_NONE = np.zeros(0, np.int64)
# units an ordered file's first round reads in its first window; later, its last window's, half more and _MARGIN
_GUESS = 64
_MARGIN = 16


class QueueRuns:
    """The consume queues' checks of one walk (:class:`~.windows.QueueWindows` each), window by window.

    Each file that holds real units is an *entry*, numbered in the queues' order and, within a queue, in its
    files' order: results are applied in that order, as one queue after the other would. An entry reaches the
    windows ``lo .. hi``; a window's run of its units is found from the file's samples (every ``_SAMPLE_STEP``-th
    unit's window), all entries' samples in one sorted key column ``entry * stride + window + 1``, so one
    ``searchsorted`` places every active file's run. Queues of another kind (the RocksDB store's) check their
    own units."""

    def __init__(self, queues: list, to_others: list, windows: Windows):
        self.windows = windows
        self.own = [(q, lmq) for q, lmq in zip(queues, to_others) if not isinstance(q, QueueWindows)]
        self.queues = qs = [q for q in queues if isinstance(q, QueueWindows)]
        lmqs = [lmq for q, lmq in zip(queues, to_others) if isinstance(q, QueueWindows)]
        self.stride = stride = len(windows.starts) + 2  # sample windows -1 .. n-1, shifted by one, and a spare
        topics: dict = {}
        cols: dict = {k: [] for k in ("queue", "n", "lo", "hi", "base", "topic", "qid", "flags", "s0", "s1")}
        self.segs: list = []
        keys, units = [], []
        at = 0
        for qi, (q, lmq) in enumerate(zip(qs, lmqs)):
            tix = topics.setdefault(q.scan.topic, len(topics))
            for seg, n, lo, hi, samples in q.reach:
                flags = ((RUN_EXT if q.scan.ext is not None else 0) | (RUN_OTHERS if lmq else 0)
                         | (RUN_ORDERED if samples is not None else 0))
                e = len(self.segs)
                self.segs.append(seg)
                if samples is None:
                    s0 = s1 = -1
                else:
                    ks, us = samples
                    keys.append(np.asarray(ks, np.int64) + (e * stride + 1))
                    units.append(np.asarray(us, np.int64))
                    s0, s1 = at, at + len(ks)
                    at = s1
                for k, v in (("queue", qi), ("n", n), ("lo", lo), ("hi", hi), ("base", seg.start // CQ_UNIT_SIZE),
                             ("topic", tix), ("qid", q.scan.qid), ("flags", flags), ("s0", s0), ("s1", s1)):
                    cols[k].append(v)
        self.topics = topics
        self.e = {k: np.asarray(v, np.int64) for k, v in cols.items()}
        self.keys = np.concatenate(keys) if keys else _NONE
        self.units = np.concatenate(units) if units else _NONE
        self.by_lo = np.argsort(self.e["lo"], kind="stable")
        self.lo_sorted = self.e["lo"][self.by_lo]
        self.last = np.full(len(qs), -1, np.int64)  # highest queue offset found per queue since the last settle
        self._restart()

    def _restart(self) -> None:
        self._next = 0  # by_lo[:_next] joined (reached their first window)
        self._active = _NONE  # the joined entries not yet past their last window, in entry order
        self._last_w = -1
        self._bytes: list = [None] * len(self.segs)  # an active entry's units as bytes
        self.cursor = np.zeros(len(self.segs), np.int64)  # an ordered file's units before it point into past windows
        self.guess = np.full(len(self.segs), _GUESS, np.int64)  # units an ordered file's next run reads first

    def __getstate__(self):  # no file's bytes travel
        state = dict(self.__dict__)
        state["_bytes"] = [None] * len(self.segs)
        return state

    def _reaching(self, w: int) -> np.ndarray:
        """The entries whose units may point into window ``w``: a sweep in log order (an entry joins at its first
        window and leaves after its last), started again if the windows go back (a ``-j`` worker's next segment)."""
        if w < self._last_w:
            self._restart()
        if QUEUE_FILES.let_go:
            self._bytes = [None] * len(self.segs)  # views kept before files were let go: they would keep them mapped
        self._last_w = w
        e, active = self.e, self._active
        upto = int(np.searchsorted(self.lo_sorted, w, "right"))
        if upto > self._next:
            joined = self.by_lo[self._next:upto]
            self._next = upto
            if not QUEUE_FILES.let_go:
                for k in joined.tolist():
                    self._bytes[k] = self._view(k)
            active = np.sort(np.concatenate([active, joined]))
        left = e["hi"][active] < w
        if left.any():
            for k in active[left].tolist():
                self._bytes[k] = None
            active = active[~left]
        self._active = active
        return active

    def _view(self, k: int) -> memoryview:
        """Entry ``k``'s units as bytes: a memoryview (slicing one and joining the slices costs a third of numpy's)."""
        return memoryview(self.queues[self.e["queue"][k]].files.unit_bytes(self.segs[k]))

    def _held(self, k: int) -> memoryview:
        """Entry ``k``'s view, kept for the windows it reaches while every queue file stays mapped; once the process
        lets queue files go (segments.QUEUE_FILES: more queue files than descriptors), taken for the moment only,
        so that a file let go is unmapped and its descriptor closed."""
        mv = self._bytes[k]
        if mv is None:
            mv = self._view(k)
            if not QUEUE_FILES.let_go:
                self._bytes[k] = mv
        return mv

    def _runs(self, w: int) -> tuple:
        """(entries, first unit, end unit) of each non-empty run of units that may point into window ``w``: from the
        samples, and for an ordered file from where the previous window's run ended (its cursor)."""
        a = self._reaching(w)
        e = self.e
        first, stop = sampled_runs(a, w, self.keys, self.units, e["s0"], e["s1"], e["n"], self.cursor, self.stride)
        keep = stop > first
        return a[keep], first[keep], stop[keep]

    def window(self, w: int, recs: _Records, marks: np.ndarray, others: np.ndarray) -> int | None:
        """The units pointing into window ``w`` against its records ``recs``: the records found are flagged in
        ``marks``, or in ``others`` for an LMQ queue. Returns the end of the furthest record found.

        An ordered file's run is read in rounds: first as many units as its last window held and half more, then,
        while the kernel saw no unit past the window, twice as many again, up to what the samples allow. Samples
        are a thousand units apart; a queue of a busy broker holds a few dozen units a window."""
        found_end = None
        for q, lmq in self.own:
            end = q.window(w, self.windows, recs, others if lmq else marks)
            if end is not None:
                found_end = end if found_end is None else max(found_end, end)
        ids, first, limit = self._runs(w)
        if not len(ids):
            return found_end
        e = self.e
        tid_of = np.full(len(self.topics) + 1, -1, np.int64)
        for name, t in recs.topic_ids.items():
            k = self.topics.get(name)
            if k is not None:
                tid_of[k] = t
        lmq_key, targets = self._lmq_keys(ids, recs)
        fields = np.stack([e["base"][ids], tid_of[e["topic"][ids]], e["qid"][ids], e["flags"][ids], lmq_key], 1)
        ordered = (e["flags"][ids] & RUN_ORDERED) != 0
        last_q = np.full(len(ids), -1, np.int64)
        far = np.full(len(ids), -1, np.int64)
        past = limit.copy()
        reported: list = []  # per call: (runs' places among ids, not found rows, flagged rows)
        todo = np.arange(len(ids))
        lo = first
        hi = np.where(ordered & (limit - first < BATCH_UNITS), np.minimum(limit, first + self.guess[ids]), limit)
        while len(todo):
            got_q, got_far, got_past = self._check(w, recs, marks, others, todo, ids, lo, hi, fields, reported, targets)
            np.maximum.at(last_q, todo, got_q)
            np.maximum.at(far, todo, got_far)
            more = ordered[todo] & (got_past == hi) & (hi < limit[todo])  # no unit past the window yet: read on
            done = ~more
            past[todo[done]] = got_past[done]
            todo, lo = todo[more], hi[more]
            hi = np.minimum(limit[todo], lo + np.maximum(2 * (lo - first[todo]), 1))
        if reported:
            self._took(ids, last_q, reported, recs)
        o = ids[ordered]
        self.cursor[o] = past[ordered]  # every real unit before it points into this window or an earlier one
        span = past[ordered] - first[ordered]
        self.guess[o] = np.maximum(span + span // 2 + _MARGIN, 1)
        hit = last_q >= 0
        if hit.any():
            np.maximum.at(self.last, e["queue"][ids[hit]], last_q[hit])
            top = int(far[hit].max())
            found_end = top if found_end is None else max(found_end, top)
        return found_end

    def _lmq_keys(self, ids: np.ndarray, recs: _Records) -> tuple:
        """(each run's multi-dispatch key or -1, the window's targets by record or None): the kernel lets an LMQ
        queue's unit pass when its record names the queue at the unit's offset, so only the units that disagree reach
        the rules in Python (:func:`.queues.check_found_units`, whose ``_lmq_match`` is the same test)."""
        e = self.e
        key = np.full(len(ids), -1, np.int64)
        lmq = (e["flags"][ids] & RUN_OTHERS) != 0
        if not lmq.any():
            return key, None
        name_ids = window_targets(recs)[3]
        name_of = np.full(len(self.topics) + 1, -1, np.int64)
        for name, t in self.topics.items():
            k = name_ids.get(name)
            if k is not None:
                name_of[t] = k
        nid = name_of[e["topic"][ids]]
        named = lmq & (nid >= 0)
        if not named.any():
            return key, None
        key[named] = queue_key(nid[named], e["qid"][ids][named])
        return key, window_targets_by_record(recs)

    def _check(self, w: int, recs: _Records, marks, others, todo: np.ndarray, ids: np.ndarray, lo: np.ndarray,
               hi: np.ndarray, fields: np.ndarray, reported: list, targets) -> tuple:
        """Units ``lo .. hi-1`` of the runs ``todo`` (places among ``ids``) checked in few kernel calls: a long run in
        its file's own bytes, the short ones copied into batches. Returns their found rows' columns."""
        ws, we = self.windows.bounds(w)
        n = hi - lo
        rows = np.column_stack([lo * CQ_UNIT_SIZE, n, lo, fields[todo]])
        out = np.empty((len(todo), 3), np.int64)

        def call(u8, at: np.ndarray, call_rows: np.ndarray) -> None:
            nf, fl, found = checkkernel.queue_runs(u8, call_rows, ws, we, recs, MAX_ADDR, marks, others, targets)
            out[at] = found
            if nf.shape[1] or fl.shape[1]:
                reported.append((todo[at], nf, fl))

        held = self._held
        long = n >= BATCH_UNITS
        for j in np.flatnonzero(long).tolist():
            call(np.frombuffer(held(int(ids[todo[j]])), np.uint8), np.array([j]), rows[j:j + 1])
        short = np.flatnonzero(~long)
        if len(short):
            pick = zip(ids[todo[short]].tolist(), lo[short].tolist(), hi[short].tolist())
            if QUEUE_FILES.let_go:  # copies: a slice would keep its file mapped until the batch is joined
                parts = [held(k)[f * CQ_UNIT_SIZE:t * CQ_UNIT_SIZE].tobytes() for k, f, t in pick]
            else:
                parts = [held(k)[f * CQ_UNIT_SIZE:t * CQ_UNIT_SIZE] for k, f, t in pick]
            before = np.cumsum(n[short]) - n[short]  # units of the short runs ahead of each
            batch = before // BATCH_UNITS
            cuts = np.flatnonzero(batch[1:] != batch[:-1]) + 1
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(short)]):
                sel = short[a:b]
                brows = rows[sel]
                brows[:, 0] = (before[a:b] - before[a]) * CQ_UNIT_SIZE
                call(np.frombuffer(parts[a] if b - a == 1 else b"".join(parts[a:b]), np.uint8), sel, brows)
        return out[:, 0], out[:, 1], out[:, 2]

    def _took(self, ids: np.ndarray, last_q: np.ndarray, reported: list, recs: _Records) -> None:
        """The runs with units the kernel could not place or flagged, handed to their queues in entry order."""
        run_nf = np.concatenate([places[nf[0]] for places, nf, _ in reported])
        pos_nf = np.concatenate([nf[1] for _, nf, _ in reported]).astype(np.int64)
        run_fl = np.concatenate([places[fl[0]] for places, _, fl in reported])
        pos_fl = np.concatenate([fl[1] for _, _, fl in reported]).astype(np.int64)
        rec_fl = np.concatenate([fl[2] for _, _, fl in reported]).astype(np.int64)
        o_nf, o_fl = np.argsort(run_nf, kind="stable"), np.argsort(run_fl, kind="stable")
        run_nf, pos_nf = run_nf[o_nf], pos_nf[o_nf]
        run_fl, pos_fl, rec_fl = run_fl[o_fl], pos_fl[o_fl], rec_fl[o_fl]
        for j in np.union1d(run_nf, run_fl).tolist():
            k = int(ids[j])
            a, b = np.searchsorted(run_nf, [j, j + 1])
            c, d = np.searchsorted(run_fl, [j, j + 1])
            self.queues[self.e["queue"][k]].took(self.segs[k], pos_nf[a:b], pos_fl[c:d], rec_fl[c:d],
                                                 int(last_q[j]), recs)

    def settle(self) -> None:
        """The highest queue offsets found since the last call, handed to the queues (before their partial results
        are taken or they finish)."""
        for i in np.flatnonzero(self.last >= 0).tolist():
            q = self.queues[i]
            q.last_found = max(q.last_found, int(self.last[i]))
        self.last[:] = -1
