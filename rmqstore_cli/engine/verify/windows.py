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

from array import array
from bisect import bisect_left, bisect_right

import numpy as np

from rmqstore_cli.formats import checkkernel, entrykernel
from rmqstore_cli.formats.checkkernel import RUN_EXT, RUN_OTHERS, _last_offset
from rmqstore_cli.formats.extaddr import MAX_ADDR
from rmqstore_cli.formats.records import CQ_UNIT_SIZE, INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE

from ..findings import Finding
from . import index as verify_index
from .commitlog import window_starts
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
        self.reach: list = []  # (segment, units, first window, last window) per file with real units
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
                if samples is not None:  # bisect on 8-byte arrays: a window's run is found in a few hundred ns
                    samples = (_int64s(samples[0]), _int64s(samples[1]))
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
        self._ends = -1  # the lowest last window among the active files: none leaves before it
        self._bytes: dict = {}  # file start -> its units' bytes, while the file is active

    def __getstate__(self):  # the checks travel to -j workers before the walk: no file's bytes go with them
        state = dict(self.__dict__)
        state["_bytes"] = {}
        return state

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

    def _reaching(self, w: int) -> list:
        """The files whose units point into window ``w``'s range of windows. Windows come in log order, so
        this is a sweep (a file joins at its first window and leaves after its last), not a pass over every
        file of the queue for every window."""
        if w < self._last_w:  # out of order: start the sweep again
            self._next, self._active, self._ends = 0, [], -1
            self._bytes.clear()
        self._last_w = w
        reach, active = self.reach, self._active
        while self._next < len(reach) and reach[self._next][2] <= w:
            active.append(reach[self._next])
            self._ends = reach[self._next][3] if self._ends < 0 else min(self._ends, reach[self._next][3])
            self._next += 1
        if self._ends < w and active:  # some file's units end before this window
            for r in active:
                if r[3] < w:
                    self._bytes.pop(r[0].start, None)
            active = self._active = [r for r in active if r[3] >= w]
            self._ends = min((r[3] for r in active), default=-1)
        return active

    def runs(self, w: int):
        """(file, first unit, end unit, the file's units' bytes) of each run of units that may point into window ``w``."""
        for seg, n, lo, hi, samples in self._reaching(w):
            first, stop = 0, n
            if samples is not None:
                ks, units = samples
                j0 = bisect_left(ks, w) - 1  # last sample before the window
                j1 = bisect_right(ks, w)  # first sample after it
                first = units[j0] if j0 >= 0 else 0
                stop = units[j1] if j1 < len(units) else n
                if first >= stop:
                    continue
            u8 = self._bytes.get(seg.start)
            if u8 is None:
                u8 = self._bytes[seg.start] = self.files.unit_bytes(seg)
            yield seg, first, stop, u8

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

    def window(self, w: int, windows: Windows, recs: _Records, marks: np.ndarray) -> int | None:
        """Units pointing into window ``w`` (records ``recs``); flags the records they find in ``marks``;
        returns the end of the furthest record found."""
        return check_queues(w, windows, recs, [self], [False], marks, marks)

    def finish(self, refs: _RefClassifier, findings: list) -> None:
        qofs, phy, status = self.deferred.resolve(refs, self.last_found)
        for j in np.flatnonzero(status == refs.MISSING).tolist():
            _no_record(self.scan.agg, self.cq, self.scan.group, int(qofs[j]), int(phy[j]))
        findings += self.scan.agg.findings()


# A run of at least this many units is checked in its file's own bytes; shorter runs are copied into batches of
# about this many units (copying a unit costs a few ns, a kernel call of its own tens of us; a batch's copy and
# room for its results stay a few hundred KB, whatever the number of queues)
BATCH_UNITS = 8192


def check_queues(w: int, windows: Windows, recs: _Records, queues: list, to_others: list, marks: np.ndarray,
                 others: np.ndarray) -> int | None:
    """The units of ``queues`` pointing into window ``w`` against its records ``recs``, in few kernel calls: the
    queues' short runs of units batched (a broker's thousands of queues hold a few units each per window), each
    long run in its own. The records found are flagged in ``marks``, or in ``others`` for a queue whose
    ``to_others`` is set (LMQ units). Returns the end of the furthest record found. Queues of another kind (the
    RocksDB store's) check their own units."""
    ws, we = windows.bounds(w)
    topic_ids = recs.topic_ids
    order: list = []  # [queue, file, call, row] of each run, in the queues' order
    results: list = []  # per call: (not found, flagged, highest queue offsets, furthest ends, runs of each)
    batch: list = []  # the batch being filled: (bytes, row, order entry) of its runs
    filled = 0

    def call(u8, rows: list) -> int:
        nf, fl, found = checkkernel.queue_runs(u8, np.array(rows, np.int64), ws, we, recs, MAX_ADDR, marks, others)
        results.append((nf, fl, found[:, 0].tolist(), found[:, 1].tolist(), _by_run(nf), _by_run(fl)))
        return len(results) - 1

    def flush() -> None:
        at, rows = 0, []
        for u8, row, entry in batch:
            row[0] = at
            at += row[1] * CQ_UNIT_SIZE
            rows.append(row)
        k = call(np.concatenate([u8 for u8, _, _ in batch]) if len(batch) > 1 else batch[0][0], rows)
        for j, (_, _, entry) in enumerate(batch):
            entry[2], entry[3] = k, j
        batch.clear()

    found_end = None
    for q, lmq in zip(queues, to_others):
        if not isinstance(q, QueueWindows):
            end = q.window(w, windows, recs, others if lmq else marks)
            if end is not None:
                found_end = end if found_end is None else max(found_end, end)
            continue
        tid = topic_ids.get(q.scan.topic, -1)
        flags = (RUN_EXT if q.scan.ext is not None else 0) | (RUN_OTHERS if lmq else 0)
        qid = q.scan.qid
        for seg, first, stop, u8 in q.runs(w):
            n = stop - first
            row = [first * CQ_UNIT_SIZE, n, first, seg.start // CQ_UNIT_SIZE, tid, qid, flags]
            if n >= BATCH_UNITS:
                order.append([q, seg, call(u8, [row]), 0])
                continue
            entry = [q, seg, -1, -1]
            order.append(entry)
            batch.append((u8[first * CQ_UNIT_SIZE:stop * CQ_UNIT_SIZE], row, entry))
            filled += n
            if filled >= BATCH_UNITS:
                flush()
                filled = 0
    if batch:
        flush()
    for q, seg, k, row in order:
        nf, fl, last_q, far, nf_at, fl_at = results[k]
        if nf_at or fl_at:
            a, b = nf_at.get(row, (0, 0))
            c, d = fl_at.get(row, (0, 0))
            if not q.took(seg, nf[1, a:b], fl[1, c:d], fl[2, c:d], last_q[row], recs):
                continue
        elif last_q[row] < 0:
            continue
        else:
            q.last_found = max(q.last_found, last_q[row])
        end = far[row]
        found_end = end if found_end is None else max(found_end, end)
    return found_end


def _int64s(values: np.ndarray) -> array:
    out = array("q")
    out.frombytes(np.ascontiguousarray(values, np.int64).tobytes())
    return out


def _by_run(rows: np.ndarray) -> dict:
    """run -> (first, end) column of ``rows``, whose first row holds the run numbers in order."""
    if not rows.shape[1]:
        return {}
    k = rows[0]
    cut = np.flatnonzero(k[1:] != k[:-1]) + 1
    firsts = [0] + cut.tolist()
    ends = cut.tolist() + [len(k)]
    return {int(k[a]): (a, b) for a, b in zip(firsts, ends)}


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
