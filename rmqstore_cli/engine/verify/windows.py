"""Verify in commitlog windows: one window's records at a time, never the whole log's.

Each window is the records starting in a fixed offset range inside one segment (phase 1 of
:mod:`.commitlog`, ``WINDOW_BYTES``: a 1 GiB production segment is many windows), or in one process those of a
run of small segments (``GROUP_BYTES``: a 64 KiB segment holds a few records), as a small
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

from bisect import bisect_left, bisect_right

import numpy as np

from rmqstore_cli.formats import entrykernel
from rmqstore_cli.formats.checkkernel import _last_offset
from rmqstore_cli.formats.extaddr import MAX_ADDR
from rmqstore_cli.formats.records import CQ_UNIT_SIZE, INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE

from ..findings import Finding
from . import index as verify_index
from .commitlog import grouped_windows, holding_window, window_starts
from .index import _drop_pages, _last_live_entry
from .index import _no_record as _entry_no_record
from .dispatch import DispatchWindows, _Missing  # noqa: F401 (callers import them from here)
from .queues import _check_cq_holes, _check_ext_units, _no_record, _QueueFiles, _QueueScan, check_found_units
from .records import ERROR, INFO, _Agg, _cq_loc, _Records, _RefClassifier


def segments_overlap(cl) -> bool:
    """Whether a segment's readable part reaches into the next one's (then records cannot be routed by offset)."""
    segs = cl.segments.segments
    fs = cl.segments.file_size
    return any(a.start + min(a.size, fs) > b.start for a, b in zip(segs, segs[1:]))


class Windows:
    """Window *w* owns the offsets ``[start_w, start_{w+1})``; the last one everything after its start. The
    windows are each segment's (:func:`.commitlog.window_starts`), numbered along the log; ``grouped``: runs of
    small segments share one (:func:`.commitlog.grouped_windows`), and :meth:`of_report` says which window a
    report of the log's numbering belongs to."""

    def __init__(self, cl, grouped: bool = False):
        if grouped:
            self.starts, self.group = grouped_windows(cl.segments.segments, cl.segments.file_size)
        else:
            fs = cl.segments.file_size
            parts = [window_starts(s, fs) for s in cl.segments.segments]
            self.starts = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            self.group = None

    def bounds(self, w: int) -> tuple[int, int]:
        """The offsets ``[start, end)`` window ``w`` owns."""
        return int(self.starts[w]), int(self.starts[w + 1]) if w + 1 < len(self.starts) else (1 << 63) - 1

    def of(self, phys: np.ndarray) -> np.ndarray:
        """Window of each offset; -1 before the first segment."""
        return np.searchsorted(self.starts, phys, side="right") - 1

    def of_report(self, index: int) -> tuple[int, bool]:
        """(the window holding the log's window ``index``, whether ``index`` is the last one it holds)."""
        return holding_window(self.group, index)

    def members(self, w: int) -> range:
        """The log's windows that window ``w`` holds."""
        if self.group is None:
            return range(w, w + 1)
        a, b = np.searchsorted(self.group, [w, w + 1]).tolist()
        return range(a, b)


class Deferred:
    """References that found no record in their window, with their position in the queue or file."""

    def __init__(self):
        self.pos: list = []
        self.phy: list = []

    def add(self, pos: np.ndarray, phy: np.ndarray) -> None:
        if len(pos):
            self.pos.append(np.asarray(pos, np.int64))
            self.phy.append(np.asarray(phy, np.int64))

    def __bool__(self) -> bool:
        return bool(self.pos)

    def merge(self, later: "Deferred") -> None:
        self.pos += later.pos
        self.phy += later.phy

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
        self.reach: list = []  # (segment, units, first window, last window, samples or None) per file with real units
        self.deferred = Deferred()
        self.last_found = -1
        self.units = 0
        self.phy_max: int | None = None
        scan = self.scan
        for seg, n, got, low_tags in self.files.scanned_files(windows.starts, _SAMPLE_STEP, MAX_ADDR):
            self.units += n
            if not n:
                continue
            if scan.ext is not None and low_tags is not None:
                scan.last_ext = low_tags if scan.last_ext is None else max(scan.last_ext, low_tags)
            fillers, first_filler, real, phy_max, (lo, hi), before, samples = got
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
        self.reach.sort(key=lambda r: r[2])  # the windows a file's units reach (:class:`.queueruns.QueueRuns`)

    def take_partial(self):
        """What the windows checked since the last call added (findings, unresolved units, furthest find), or
        None if nothing; starts afresh. A ``-j`` worker sends it; :meth:`merge_partial` folds it in, in log order."""
        got = (self.scan.agg, self.deferred, self.last_found)
        self.scan.agg, self.deferred, self.last_found = _Agg(), Deferred(), -1
        return got if got[0] or got[1] or got[2] >= 0 else None

    def merge_partial(self, got) -> None:
        agg, deferred, last_found = got
        self.scan.agg.merge(agg)
        self.deferred.merge(deferred)
        self.last_found = max(self.last_found, last_found)

    def took(self, seg, not_found: np.ndarray, flagged: np.ndarray, flagged_recs: np.ndarray, last_q: int,
             recs: _Records) -> bool:
        """What the kernel found for one run of ``seg``'s units (file positions); False when no unit found its record."""
        if len(not_found):
            qofs, phy, _, _ = self.files.units_at(seg, not_found)
            self.deferred.add(qofs, phy)
        if last_q < 0:
            return False
        self.last_found = max(self.last_found, last_q)
        if len(flagged):  # units some field of which differs from their record's: the rules say which
            qofs, phy, size, tags = self.files.units_at(seg, flagged)
            check_found_units(self.cq, self.scan, qofs, phy, size, tags, flagged_recs, recs)
        return True

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
        self.span = None
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
        first_phy = 0
        for a in range(1, count, verify_index._ENTRY_BLOCK):
            b = min(a + verify_index._ENTRY_BLOCK, count)
            blk = entrykernel.index_entries(raw, a, b, f.slots, windows.starts, last, prev_phy)
            _drop_pages(buf, base + a * INDEX_ENTRY_SIZE, (b - a) * INDEX_ENTRY_SIZE)
            if a == 1:
                first_phy = blk.first_phy
            prev_phy = blk.last_phy
            if self.out_of_order is None:
                self.out_of_order = blk.out_of_order
            # the block's first finding of each kind, the rest counted: what adding each would keep (no rank
            # for IDX_CHAIN: the first added stays; IDX_KEY_HASH ranks by entry, the block's first is its lowest)
            if len(blk.bad_pos):
                e, want, prev = int(blk.bad_pos[0]), int(blk.bad_exp[0]), int(blk.bad_prev[0])
                agg.add(f.path, "IDX_CHAIN", ERROR, f.path, epos(e), f"entry {e} links to {prev}, expected "
                        f"{want} (the previous entry with the same hash slot)", entry=e)
                agg.count[(f.path, "IDX_CHAIN")] += len(blk.bad_pos) - 1
            if len(blk.neg_pos):
                e = int(blk.neg_pos[0])
                agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(e), f"entry {e} has a negative key hash {int(blk.neg_kh[0])}",
                        entry=e, rank=(0, e))
                agg.count[(f.path, "IDX_KEY_HASH")] += len(blk.neg_pos) - 1
            self.deferred.add(blk.before_pos, blk.before_phy)
            if blk.windows is not None:
                self.reach.append((a, b, *blk.windows))
        verify_index.check_slot_table(agg, f, h, buf, last, first_phy, prev_phy)
        del last
        # the windows the entries point into, first to last: the other windows skip this file unmapped
        self.span = (min(r[2] for r in self.reach), max(r[3] for r in self.reach)) if self.reach else None

    def take_partial(self):
        """As :meth:`QueueWindows.take_partial`, with the store times of the file's first and last entries' records."""
        got = (self.agg, self.deferred, self.last_found, self.first_ts, self.last_ts)
        self.agg, self.deferred, self.last_found, self.first_ts, self.last_ts = _Agg(), Deferred(), -1, None, None
        return got if got[0] or got[1] or got[2] >= 0 or got[3] is not None or got[4] is not None else None

    def merge_partial(self, got) -> None:
        agg, deferred, last_found, first_ts, last_ts = got
        self.agg.merge(agg)
        self.deferred.merge(deferred)
        self.last_found = max(self.last_found, last_found)
        self.first_ts = first_ts if first_ts is not None else self.first_ts
        self.last_ts = last_ts if last_ts is not None else self.last_ts

    def epos(self, e: int) -> int:
        return INDEX_HEADER_SIZE + self.f.slots * INDEX_SLOT_SIZE + int(e) * INDEX_ENTRY_SIZE

    def _ranges(self, w: int, windows: Windows) -> list:
        """The runs of entries that may point into window ``w``, as (first entry, end). Entries in commitlog order
        (no IDX_ORDER: the normal case) are one run, found by two binary searches in the file's offsets: each entry
        is then read once by the window passes, not once per window its block reaches. Otherwise, the runs of
        consecutive entry blocks whose entries point into the window (the range pass skips the others)."""
        if self.out_of_order is None:
            col = self.f.entry_table(self.count)["phyOffset"]
            ws, we = windows.bounds(w)
            n = len(col)
            a = bisect_left(col, ws, 1, n)
            b = bisect_right(col, int(_last_offset(we)), a, n)
            return [[a, b]] if b > a else []
        out: list = []
        for a, b, lo, hi in self.reach:
            if lo <= w <= hi:
                if out and out[-1][1] == a:
                    out[-1][1] = b
                else:
                    out.append([a, b])
        return out

    def window(self, w: int, windows: Windows, recs: _Records, held: np.ndarray | None = None) -> None:
        """The entries pointing into window ``w`` against its records ``recs``; ``held`` (one per record), if given,
        gets one added per entry found at the record (:class:`.indexcoverage.IndexCoverage` reads it)."""
        f, h, agg, epos = self.f, self.h, self.agg, self.epos
        if not self.reach or not self.span[0] <= w <= self.span[1]:
            return
        raw = f.entry_table(self.count).view(np.uint8)
        buf = f.segment.buffer()
        base = INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE
        ts = recs.c["storeTimestamp"]
        for a, b in self._ranges(w, windows):
            (nf, nf_phy), (fl, fr, fkh, fphy, fdiff), first, last = entrykernel.index_range(raw, a, b, *windows.bounds(w), recs,
                                                                                        h.beginTimestamp, held)
            _drop_pages(buf, base + a * INDEX_ENTRY_SIZE, (b - a) * INDEX_ENTRY_SIZE)
            self.deferred.add(nf, nf_phy)
            if first is None:
                continue
            self.last_found = max(self.last_found, last[0])
            if first[0] == 1:
                self.first_ts = int(ts[first[1]])
            if last[0] == self.count - 1:
                self.last_ts = int(ts[last[1]])
            if len(fl):  # entries that differ from their record somehow: the rules say how
                verify_index.check_found_entries(agg, f, h, epos, recs, fl, fr, fkh, fphy, fdiff)

    def finish(self, refs: _RefClassifier, findings: list) -> None:
        f, h, agg = self.f, self.h, self.agg
        if self.count > 1:
            ents, phy, status = self.deferred.resolve(refs, self.last_found)
            for j in np.flatnonzero(status == refs.MISSING).tolist():
                _entry_no_record(agg, f, self.epos(ents[j]), int(ents[j]), int(phy[j]))
            verify_index.check_header_times(agg, f, h, self.epos, self.first_ts, self.last_ts, self.out_of_order)
        findings += agg.findings()
