"""Every kept consume-queue file's units, handed out window by window to recovery's derived check.

The broker's recovery (``ConsumeQueue.recover``) keeps each queue's valid units; the derived check tests those that
point into a window of the log against the window's records (:mod:`.derived_windows`). A broker carries thousands
of queues and a 1 TB log has ~16,000 windows, so what each file holds for each window is neither stored up front
(a table of queues x windows) nor looked up with a Python step per queue and window: each file keeps a sample of
its units' windows (every ``SAMPLE_STEP``-th unit) and, while its units rise with the log (the broker writes them in
log order), a cursor where the last window's units ended. A window's units of every file are read in rounds, as
many as the file held in its last window and half more, then twice as many while the last one read is still
inside the window, and tested together.
"""

from __future__ import annotations

import numpy as np

from ..arrays import sampled_runs
from ..log import segments

SAMPLE_STEP = 1024  # units per sample of a file's window numbers: 16 bytes per thousand units
_GUESS = 64  # units a file's first round reads in its first window; later, its last window's, half more and _MARGIN
_MARGIN = 16
_NONE = np.zeros(0, np.int64)
_NO_REAL = np.iinfo(np.int64).max


class WindowUnits:
    """The kept units of every queue file, by window (windows numbered as verify numbers them, starts
    ``wbounds``). :meth:`add` each file, then :meth:`runs` gives a window's units, one round after the other."""

    def __init__(self, wbounds: np.ndarray):
        self.wbounds = wbounds
        self.stride = len(wbounds) + 2  # sample windows -1 .. n-1, shifted by one, and a spare
        self.keys: list = []  # queue keys
        self._key_index: dict = {}
        self.views: list = []  # per file: its units' bytes (memoryview), to join a window's slices cheaply
        self.sources: list = []  # per file: (segment, file size) to map it again from, or None
        self.dtype = None
        self._cols: dict = {k: [] for k in ("key", "first", "n", "first_real", "lo", "hi", "ordered", "s0", "s1")}
        self._keys: list = []
        self._units: list = []
        self._at = 0

    def add(self, key, first: int, units: np.ndarray, phy: np.ndarray, first_real: int | None, span: tuple,
            source: tuple | None = None) -> None:
        """One file: queue offset ``first`` of its unit 0, its kept ``units`` (phyOffset, size, tagsCode) and their
        phyOffsets as int64 (``phy``), the queue's first real unit (queue offset, None if none), ``span`` the first
        and last window its real units point into (() when none does). ``source``: (segment, file size) the units
        are mapped from: the file is then not kept in view (segments.QUEUE_FILES may let it go), but mapped when
        a window reads it."""
        if not span:
            return
        e = len(self.views)
        k = self._key_index.setdefault(key, len(self.keys))
        if k == len(self.keys):
            self.keys.append(key)
        self.dtype = units.dtype
        self.views.append(None if source is not None else memoryview(np.ascontiguousarray(units).view(np.uint8)))
        self.sources.append(None if source is None else (*source, len(units)))
        w = np.searchsorted(self.wbounds, phy, side="right") - 1
        r0 = len(phy) if first_real is None else min(max(0, first_real - first), len(phy))
        w[:r0] = -1  # pre-blank fillers (§7.3): before every window
        ordered = not (len(w) > 1 and (w[1:] < w[:-1]).any())
        s0 = s1 = -1
        if ordered:  # every SAMPLE_STEP-th unit's window: a window's units lie between two samples
            ks = w[::SAMPLE_STEP]
            self._keys.append(ks + (e * self.stride + 1))
            self._units.append(np.arange(0, len(phy), SAMPLE_STEP, dtype=np.int64))
            s0, s1 = self._at, self._at + len(ks)
            self._at = s1
        for name, v in (("key", k), ("first", first), ("n", len(phy)),
                        ("first_real", _NO_REAL if first_real is None else first_real), ("lo", span[0]),
                        ("hi", span[1]), ("ordered", int(ordered)), ("s0", s0), ("s1", s1)):
            self._cols[name].append(v)

    def done(self) -> None:
        """Every file added: the table made."""
        self.e = {k: np.asarray(v, np.int64) for k, v in self._cols.items()}
        self.sample_keys = np.concatenate(self._keys) if self._keys else _NONE
        self.sample_units = np.concatenate(self._units) if self._units else _NONE
        del self._cols, self._keys, self._units
        self.cursor = np.zeros(len(self.views), np.int64)  # an ordered file's units before it point before the window
        self.guess = np.full(len(self.views), _GUESS, np.int64)
        self._last_k = -1

    def _view(self, x: int) -> memoryview:
        """File ``x``'s kept units as bytes: its view, or (a file added with its source) mapped now, and kept in view
        only while no queue file has been let go."""
        v = self.views[x]
        if v is None:
            seg, file_size, n = self.sources[x]
            from .probes import queue_file_units

            v = memoryview(np.ascontiguousarray(queue_file_units(seg, file_size)[:n]).view(np.uint8))
            if not segments.QUEUE_FILES.let_go:
                self.views[x] = v
        return v

    def _bounds(self, k: int) -> tuple:
        """(files reaching window ``k``, first unit, end unit) that can hold its units: from the samples and cursors."""
        e = self.e
        files = np.flatnonzero((e["lo"] <= k) & (e["hi"] >= k))
        first, stop = sampled_runs(files, k, self.sample_keys, self.sample_units, e["s0"], e["s1"], e["n"], self.cursor,
                                   self.stride)
        keep = stop > first
        return files[keep], first[keep], stop[keep]

    def runs(self, k: int, chunk: int):
        """Window ``k``'s units in parts of about ``chunk`` units, each (units, file of each unit, queue offset of
        each unit): every kept unit that points into the window is in one part (others may be too: the caller
        selects by offset)."""
        if k < self._last_k:  # a -j worker's next segment: its cursors say nothing about earlier windows
            self.cursor[:] = 0
            self.guess[:] = _GUESS
        self._last_k = k
        if segments.QUEUE_FILES.let_go:  # views kept before files were let go would keep them mapped
            self.views = [None if src is not None else v for v, src in zip(self.views, self.sources)]
        files, first, limit = self._bounds(k)
        if not len(files):
            return
        e = self.e
        wend = int(self.wbounds[k + 1]) if k + 1 < len(self.wbounds) else _NO_REAL
        size = self.dtype.itemsize
        ordered = e["ordered"][files] == 1
        todo = np.arange(len(files))
        lo = first
        top = np.where(ordered, np.minimum(limit, first + self.guess[files]), limit)
        past = limit.copy()
        while len(todo):
            consumed = np.empty(len(todo), np.int64)  # units read before the first one past the window
            last_in = np.zeros(len(todo), bool)  # the last unit read does not point past the window
            n = top - lo
            before = np.cumsum(n) - n
            part = before // max(chunk, 1)
            cuts = np.flatnonzero(part[1:] != part[:-1]) + 1
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(todo)]):
                sel = np.arange(a, b)
                f = files[todo[sel]]
                view = self._view
                pick = zip(f.tolist(), lo[sel].tolist(), top[sel].tolist())
                if segments.QUEUE_FILES.let_go:  # copies: a slice would keep its file mapped until the join
                    got = b"".join([view(x)[s * size:t * size].tobytes() for x, s, t in pick])
                else:
                    got = b"".join([view(x)[s * size:t * size] for x, s, t in pick])
                units = np.frombuffer(got, self.dtype)
                which = np.repeat(f, n[sel])  # every run holds a unit at least
                starts = np.cumsum(n[sel]) - n[sel]
                pos = e["first"][which] + np.repeat(lo[sel] - starts, n[sel]) + np.arange(len(units), dtype=np.int64)
                yield units, which, pos
                # an ordered file's units up to this window (fillers first) come before every one past it
                inside = (pos < e["first_real"][which]) | (units["phyOffset"].astype(np.int64) < wend)
                consumed[sel] = np.add.reduceat(inside.astype(np.int64), starts)
                last_in[sel] = inside[starts + n[sel] - 1]
            more = ordered[todo] & last_in & (top < limit[todo])
            done = ~more
            past[todo[done]] = (lo + consumed)[done]
            todo, lo = todo[more], top[more]
            top = np.minimum(limit[todo], lo + np.maximum(2 * (lo - first[todo]), 1))
        o = files[ordered]
        self.cursor[o] = past[ordered]
        span = past[ordered] - first[ordered]
        self.guess[o] = np.maximum(span + span // 2 + _MARGIN, 1)
