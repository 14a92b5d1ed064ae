"""Verify in commitlog windows: one window's records at a time, never the whole log's.

Each window is the records starting in a fixed offset range inside one segment (phase 1 of
:mod:`.commitlog`, ``WINDOW_BYTES``: a 1 GiB production segment is many windows), as a small
:class:`~.records._Records`. The references into the log are routed to windows by the offset
they point at (window *w* owns ``[start_w, start_{w+1})``): every consume-queue unit and index entry
is checked against the records of the one window it points into, then the window is dropped. What
the checks need across windows is small and carried here: per queue and index file its finding
aggregate (first location by rank, so the order of windows does not matter), the highest reference
that found its record, the references that found none (resolved at the end, when the log's end is
known: lost tail, corrupt, explained); the store-time order across window boundaries; records no
unit points at (kept until the queues' high-water mark is known: normally none).

Record-independent checks (slot chains, slot table, header counts, holes, fillers, ext unit sizes)
run once per file before the walk. Findings, counts and messages equal the whole-log formulation
(:func:`.pipeline._verify_whole_log`), which stays for stores whose segments overlap.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats import checkkernel
from rmqstore_cli.formats.extaddr import MAX_ADDR
from rmqstore_cli.formats.indexchain import chain_block
from rmqstore_cli.formats.records import (CQ_UNIT_SIZE, INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE, TRANSACTION_COMMIT,
                             TRANSACTION_NOT)

from ..findings import Finding
from . import index as verify_index
from .commitlog import window_starts
from .index import _drop_pages, _last_live_entry
from .index import _no_record as _entry_no_record
from .queues import (_check_cq_holes, _check_ext_units, _no_record, _QueueFiles, _QueueScan, add_not_dispatched,
                     check_found_units, dispatch_high_water, dispatch_lag_finding)
from .records import ERROR, INFO, _Agg, _cq_loc, _Records, _RefClassifier


def segments_overlap(cl) -> bool:
    """Whether a segment's readable part reaches into the next one's (then records cannot be routed by offset)."""
    segs = cl.segments.segments
    fs = cl.segments.file_size
    return any(a.start + min(a.size, fs) > b.start for a, b in zip(segs, segs[1:]))


class Windows:
    """Window *w* owns the offsets ``[start_w, start_{w+1})``; the last one everything after its start. The
    windows are each segment's (:func:`.commitlog.window_starts`), numbered along the log."""

    def __init__(self, cl):
        fs = cl.segments.file_size
        parts = [window_starts(s, fs) for s in cl.segments.segments]
        self.starts = np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def bounds(self, w: int) -> tuple[int, int]:
        """The offsets ``[start, end)`` window ``w`` owns."""
        return int(self.starts[w]), int(self.starts[w + 1]) if w + 1 < len(self.starts) else (1 << 63) - 1

    def of(self, phys: np.ndarray) -> np.ndarray:
        """Window of each offset; -1 before the first segment."""
        return np.searchsorted(self.starts, phys, side="right") - 1


class Deferred:
    """References that found no record in their window, with their position in the queue or file."""

    def __init__(self):
        self.pos: list = []
        self.phy: list = []

    def add(self, pos: np.ndarray, phy: np.ndarray) -> None:
        if len(pos):
            self.pos.append(np.asarray(pos, np.int64))
            self.phy.append(np.asarray(phy, np.int64))

    def resolve(self, refs: _RefClassifier, last_found: int):
        """(positions, offsets, status) once the log's end is known: past the end is the lost tail only
        after the last reference that found its record (:meth:`_RefClassifier.classify`)."""
        if not self.pos:
            z = np.zeros(0, np.int64)
            return z, z, np.zeros(0, np.int8)
        pos, phy = np.concatenate(self.pos), np.concatenate(self.phy)
        order = np.argsort(pos, kind="stable")
        pos, phy = pos[order], phy[order]
        _, status = refs.classify_raw(phy)
        status[(status == refs.LOST) & (pos < last_found)] = refs.MISSING
        refs.lost_refs += int((status == refs.LOST).sum())
        return pos, phy, status


_SAMPLE_STEP = 1024  # units per sample of a queue file's window numbers


class QueueWindows:
    """One consume queue (+ ext), checked window by window."""

    def __init__(self, store, topic: str, qid: int, windows: Windows, findings: list):
        self.cq = cq = store.queue(topic, qid)
        findings += cq.segments.problems
        self.scan = _QueueScan(topic, qid, store.ext(topic, qid) if store.config.enableConsumeQueueExt else None)
        self.files = _QueueFiles(cq)
        self.reach: list = []  # (segment, units, first window, last window) per file with real units
        self.deferred = Deferred()
        self.last_found = -1
        self.units = 0
        self.phy_max: int | None = None
        scan = self.scan
        for seg, n in self.files.valid_files():
            self.units += n
            if not n:
                continue
            if scan.ext is not None:
                scan.note_ext_refs(cq.file_units(seg)["tagsCode"][:n])
            fillers, first_filler, real, phy_max, (lo, hi), before, samples = checkkernel.queue_file(
                self.files.unit_bytes(seg), n, windows.starts, _SAMPLE_STEP)
            # samples (units in log order, the normal case: each window's units are one run): every
            # _SAMPLE_STEP-th unit's window, enough to find a window's run with two binary searches, a few
            # bytes per thousand units whatever the number of windows a file spans
            if fillers:
                if not scan.fillers:
                    scan.first_filler = seg.start // CQ_UNIT_SIZE + first_filler
                scan.fillers += fillers
            if not real:
                continue
            self.phy_max = phy_max if self.phy_max is None else max(self.phy_max, phy_max)
            if len(before):
                qofs, phy, _, _ = self.files.units_at(seg, before)
                self.deferred.add(qofs, phy)
            if hi is not None:
                self.reach.append((seg, n, lo, hi, samples))
        _check_cq_holes(cq, self.files.end_offset, scan.agg, scan.group)
        if scan.fillers:
            path, pos = _cq_loc(cq, scan.first_filler)
            # Recognised padding (§7.3): not a problem, but worth knowing when reading offsets.
            findings.append(Finding("CQ_FILLER", INFO, path, pos, f"{scan.fillers} pre-blank filler units (queue starts at a "
                                    "non-zero offset)", {"count": scan.fillers}))
        if scan.ext is not None:
            _check_ext_units(scan.ext, scan.agg, scan.group, findings, scan.last_ext)
        self.reach.sort(key=lambda r: r[2])
        self._next = 0  # reach[:_next] became active (first window reached); _active: those not yet past
        self._active: list = []
        self._last_w = -1

    def _reaching(self, w: int) -> list:
        """The files whose units point into window ``w``'s range of windows. Windows come in log order, so
        this is a sweep (a file joins at its first window and leaves after its last), not a pass over every
        file of the queue for every window."""
        if w < self._last_w:  # out of order: start the sweep again
            self._next, self._active = 0, []
        self._last_w = w
        while self._next < len(self.reach) and self.reach[self._next][2] <= w:
            self._active.append(self.reach[self._next])
            self._next += 1
        self._active = [r for r in self._active if r[3] >= w]
        return self._active

    def window(self, w: int, windows: Windows, recs: _Records, marks: np.ndarray) -> int | None:
        """Units pointing into window ``w`` (records ``recs``); flags the records they find in ``marks``;
        returns the end of the furthest record found."""
        found_end = None
        for seg, n, lo, hi, samples in self._reaching(w):
            first, stop = 0, n
            if samples is not None:
                ks, units = samples
                j0 = int(np.searchsorted(ks, w, side="left")) - 1  # last sample before the window
                j1 = int(np.searchsorted(ks, w, side="right"))  # first sample after it
                first = int(units[j0]) if j0 >= 0 else 0
                stop = int(units[j1]) if j1 < len(units) else n
                if first >= stop:
                    continue
            nf, fl, fr, last_q, end = checkkernel.queue_window(self.files.unit_bytes(seg), first, stop, seg.start // CQ_UNIT_SIZE,
                                                               *windows.bounds(w), recs, recs.topic_ids.get(self.scan.topic, -1),
                                                               self.scan.qid, self.scan.ext is not None, MAX_ADDR, marks)
            if len(nf):
                qofs, phy, _, _ = self.files.units_at(seg, nf)
                self.deferred.add(qofs, phy)
            if last_q < 0:
                continue
            self.last_found = max(self.last_found, last_q)
            found_end = end if found_end is None else max(found_end, end)
            if len(fl):  # units some field of which differs from their record's: the rules say which
                qofs, phy, size, tags = self.files.units_at(seg, fl)
                check_found_units(self.cq, self.scan, qofs, phy, size, tags, fr, recs)
        return found_end

    def finish(self, refs: _RefClassifier, findings: list) -> None:
        qofs, phy, status = self.deferred.resolve(refs, self.last_found)
        for j in np.flatnonzero(status == refs.MISSING).tolist():
            _no_record(self.scan.agg, self.cq, self.scan.group, int(qofs[j]), int(phy[j]))
        findings += self.scan.agg.findings()


class IndexWindows:
    """One complete index file: record-independent checks now, the entry → record checks window by window."""

    def __init__(self, f, windows: Windows):
        self.f = f
        self.agg = agg = _Agg()
        self.h = h = f.header()
        self.deferred = Deferred()
        self.last_found = -1
        self.first_ts = self.last_ts = None
        self.reach: list = []  # (first entry, end entry, first window, last window) per block
        self.out_of_order = None
        count = h.indexCount if h.indexCount > 0 else 1
        if count > f.entries:
            agg.add(f.path, "IDX_HEADER", ERROR, f.path, 36, f"indexCount {h.indexCount} exceeds maxIndexNum {f.entries}")
            count = f.entries
        last_live = _last_live_entry(f, max(count, 1))
        if last_live is not None:
            # entries the header does not count: the broker's queries never reach them
            agg.add(f.path, "IDX_HEADER", ERROR, f.path, 36, f"indexCount {h.indexCount}, but entry "
                    f"{last_live} is written: the broker does not see entries past the count")
        self.count = count
        self.entries = max(count - 1, 0)
        if count <= 1:
            return
        base = INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE
        epos = self.epos
        raw = f.entry_table(count).view(np.uint8)
        buf = f.segment.buffer()
        last = np.zeros(f.slots, dtype=np.int32)  # newest entry per slot so far: the expected slot table
        prev_phy = None
        first_phy = last_phy = 0
        for a in range(1, count, verify_index._ENTRY_BLOCK):
            b = min(a + verify_index._ENTRY_BLOCK, count)
            kh, phy, _, prev = checkkernel.entry_columns(raw, a, b)
            _drop_pages(buf, base + a * INDEX_ENTRY_SIZE, (b - a) * INDEX_ENTRY_SIZE)
            if a == 1:
                first_phy = int(phy[0])
            last_phy = int(phy[-1])
            if self.out_of_order is None:
                if prev_phy is not None and prev_phy > int(phy[0]):
                    self.out_of_order = (a - 1, prev_phy, a, int(phy[0]))
                else:
                    k = np.flatnonzero(phy[:-1] > phy[1:])[:1].tolist()
                    if k:
                        self.out_of_order = (a + k[0], int(phy[k[0]]), a + k[0] + 1, int(phy[k[0] + 1]))
            prev_phy = int(phy[-1])
            bad_pos, bad_exp = chain_block(kh, prev, a, f.slots, last)
            for k, want in zip(bad_pos.tolist(), bad_exp.tolist()):
                e = a + k
                agg.add(f.path, "IDX_CHAIN", ERROR, f.path, epos(e), f"entry {e} links to {int(prev[k])}, expected "
                        f"{want} (the previous entry with the same hash slot)", entry=e)
            for k in np.flatnonzero(kh < 0).tolist():
                e = a + k
                agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(e), f"entry {e} has a negative key hash {int(kh[k])}",
                        entry=e, rank=(0, e))
            k = windows.of(phy)
            before = k < 0
            self.deferred.add(np.flatnonzero(before) + a, phy[before])
            if not before.all():
                self.reach.append((a, b, int(k[~before].min()), int(k.max())))
        verify_index.check_slot_table(agg, f, h, buf, last, first_phy, last_phy)
        del last

    def epos(self, e: int) -> int:
        return INDEX_HEADER_SIZE + self.f.slots * INDEX_SLOT_SIZE + int(e) * INDEX_ENTRY_SIZE

    def window(self, w: int, windows: Windows, recs: _Records) -> None:
        f, h, agg, epos = self.f, self.h, self.agg, self.epos
        if not self.reach:
            return
        raw = f.entry_table(self.count).view(np.uint8)
        buf = f.segment.buffer()
        base = INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE
        ts = recs.c["storeTimestamp"]
        for a, b, lo, hi in self.reach:
            if not lo <= w <= hi:
                continue
            kh, phy, diff, _ = checkkernel.entry_columns(raw, a, b)
            _drop_pages(buf, base + a * INDEX_ENTRY_SIZE, (b - a) * INDEX_ENTRY_SIZE)
            nf, fl, fr, first, last = checkkernel.index_window(kh, phy, diff, a, *windows.bounds(w), recs, h.beginTimestamp)
            self.deferred.add(nf + a, phy[nf])
            if first is None:
                continue
            self.last_found = max(self.last_found, last[0] + a)
            if a == 1 and first[0] == 0:
                self.first_ts = int(ts[first[1]])
            if b == self.count and last[0] == b - a - 1:
                self.last_ts = int(ts[last[1]])
            if len(fl):  # entries that differ from their record somehow: the rules say how
                verify_index.check_found_entries(agg, f, h, epos, recs, a, fl, fr, kh, phy, diff)

    def finish(self, refs: _RefClassifier, findings: list) -> None:
        f, h, agg = self.f, self.h, self.agg
        if self.count > 1:
            ents, phy, status = self.deferred.resolve(refs, self.last_found)
            for j in np.flatnonzero(status == refs.MISSING).tolist():
                _entry_no_record(agg, f, self.epos(ents[j]), int(ents[j]), int(phy[j]))
            verify_index.check_header_times(agg, f, h, self.epos, self.first_ts, self.last_ts, self.out_of_order)
        findings += agg.findings()


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
        key = (self.tid.astype(np.int64) << 32) | (self.qid.astype(np.int64) & 0xFFFFFFFF)
        _, first, counts = np.unique(key, return_index=True, return_counts=True)
        for i, n in zip(first.tolist(), counts.tolist()):
            yield (self.names[int(self.tid[i])], int(self.qid[i]), int(n), int(self.phy[i]), int(self.seg[i]),
                   int(self.qoff[i]))


class DispatchWindows:
    """Records no consume-queue unit points at, window by window, judged against the queues' high-water
    mark (the broker re-dispatches everything after it at start, §13.1): before it CQ_NOT_DISPATCHED per
    queue, from it CQ_DISPATCH_LAG. Memory stays bounded whatever the log (even with no consume queue at
    all): the mark is the end of the furthest record a unit found, which lies in the last window with
    such a unit, so only that window's missing records are kept as columns. Every other window is kept as
    per-queue summaries merged across windows (one row per queue, not per queue and window: a 1 TB log is
    16k windows): the windows before the last find are before the mark whatever it becomes; a later window
    is judged against the mark it would be if no later window finds a unit (the furthest find so far, or
    else the furthest unit's offset, ``phy_max``, known before the walk), and moved before the mark if a later
    window does find one. The one window that mark falls inside is read again at the end."""

    def __init__(self, phy_max: int | None):
        self.phy_max = phy_max  # the furthest real unit's offset over every queue
        self.found_end_max: int | None = None
        self.detail: _Missing | None = None  # the last window where a unit found its record
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
        tran = recs.c["sysFlag"] & 0xC
        missing = _Missing(recs, np.flatnonzero(((tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)) & ~marks))
        if found_end is not None:
            # everything kept so far lies before this window's found record: before the mark, whatever it becomes
            if self.detail is not None:
                self._merge(self.old, self.detail.per_queue())
            self._merge(self.old, self.after_before.values())
            self._merge(self.old, self.after_from_rows.values())
            if self.after_inside is not None:
                self._merge(self.old, self.after_inside[2])
            self._reset_after()
            self.found_end_max = found_end if self.found_end_max is None else max(self.found_end_max, found_end)
            self.detail = missing
        elif len(missing):
            mark = dispatch_high_water(self.found_end_max, self.phy_max)
            first, last = int(missing.phy[0]), int(missing.phy[-1])
            if last < mark:
                self._merge(self.after_before, missing.per_queue())
            elif first >= mark:
                if self.after_from is None:
                    self.after_from = (first, int(missing.seg[0]), 0)
                f0, s0, n0 = self.after_from
                self.after_from = (f0, s0, n0 + len(missing))
                self._merge(self.after_from_rows, missing.per_queue())
            else:
                self.after_inside = (first, w, list(missing.per_queue()))

    _reread = None

    def reread_with(self, reread) -> None:
        """``reread(window number) -> _Records`` gives one window's records again (the rare case above)."""
        self._reread = reread

    def finish(self, cl, findings: list) -> None:
        segs = cl.segments.segments
        high = dispatch_high_water(self.found_end_max, self.phy_max)
        old = dict(self.old)
        lag_first, lag_count = None, 0

        def lag(first_phy: int, seg: int, count: int) -> None:
            nonlocal lag_first, lag_count
            if lag_first is None:
                lag_first = (seg, first_phy)
            lag_count += count

        if self.detail is not None and len(self.detail):  # the mark lies in this window
            below = self.detail.phy < high
            self._merge(old, self.detail.take(below).per_queue())
            rest = self.detail.take(~below)
            if len(rest):
                lag(int(rest.phy[0]), int(rest.seg[0]), len(rest))
        self._merge(old, self.after_before.values())
        if self.after_inside is not None:  # the mark falls inside this window: judge its records one by one
            recs = self._reread(self.after_inside[1])
            tran = recs.c["sysFlag"] & 0xC
            # no unit found a record here (else the mark would be a found end), so none is marked
            m = _Missing(recs, np.flatnonzero((tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)))
            below = m.phy < high
            self._merge(old, m.take(below).per_queue())
            rest = m.take(~below)
            if len(rest):
                lag(int(rest.phy[0]), int(rest.seg[0]), len(rest))
        if self.after_from is not None:
            lag(self.after_from[0], self.after_from[1], self.after_from[2])
        if lag_count:
            s = segs[lag_first[0]]
            findings.append(dispatch_lag_finding(s.path, lag_first[1] - s.start, lag_count, lag_first[1]))
        agg = _Agg()
        for topic, qid, n, phy, seg, qoff in sorted(old.values(), key=lambda r: r[3]):
            s = segs[seg]
            add_not_dispatched(agg, s.path, phy - s.start, topic, qid, phy, qoff, n)
        findings += agg.findings()
