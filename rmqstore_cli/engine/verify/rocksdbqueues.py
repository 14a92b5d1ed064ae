"""Verify a RocksDB consume queue (5.3 ``storeType=defaultRocksDB``) against the commitlog.

The units are checked against their records exactly as file units are (:mod:`.windows`: the same compiled
kernels, window by window), fed from each queue's key range in blocks instead of from files. What only
the database has is checked here too: the ``offset`` column family's max/min entries against the units,
its dispatch checkpoint against the units and the log, and dispatch completeness from the checkpoint
(RocksDBMessageStore recovers the commitlog from ``getMaxPhyOffsetInConsumeQueue`` = the checkpoint and
dispatches every record from there again; a record before it without a unit is never dispatched).
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats import checkkernel
from rmqstore_cli.formats.extaddr import MAX_ADDR
from rmqstore_cli.formats.records import CQ_UNIT_FIELDS, TRANSACTION_COMMIT, TRANSACTION_NOT

from ..derived.consumequeue import CQ_DTYPE
from ..findings import Finding
from .queues import _no_record, _QueueScan, add_not_dispatched, check_found_units, dispatch_lag_finding
from .records import ERROR, INFO, WARNING, _Agg, _Records, _RefClassifier
from .windows import _SAMPLE_STEP, Deferred, Windows, _Missing

_UNIT_FIELDS = [n for n, _ in CQ_UNIT_FIELDS]


def _file_units(vals: np.ndarray) -> np.ndarray:
    """Database values -> the file unit layout the compiled checks read (the same three fields)."""
    out = np.empty(len(vals), dtype=CQ_DTYPE)
    for n in _UNIT_FIELDS:
        out[n] = vals[n]
    return out


def _runs(qofs: np.ndarray):
    """[a, b) index ranges of consecutive queue offsets."""
    cuts = (np.flatnonzero(np.diff(qofs) != 1) + 1).tolist()
    edges = [0] + cuts + [len(qofs)]
    return list(zip(edges[:-1], edges[1:]))


class RocksQueueWindows:
    """One queue of the database, checked window by window (the interface of :class:`.windows.QueueWindows`)."""

    def __init__(self, store, topic: str, qid: int, windows: Windows, findings: list):
        self.cq = cq = store.queue(topic, qid)
        self.scan = scan = _QueueScan(topic, qid, None)
        self.reach: list = []  # (first queue offset, units, first window, last window, samples) per run
        self.deferred = Deferred()
        self.last_found = -1
        self.units = 0
        self.phy_max: int | None = None
        self.first_offset: int | None = None
        self.last_offset: int | None = None
        self.max_unit: tuple | None = None  # (phy, size) of the unit at the max entry's offset
        self.min_unit: tuple | None = None
        mx, mn = cq.max_entry, cq.min_entry
        # without a max entry the broker serves nothing (RDB_MAX_OFFSET says so); its units are still
        # checked against their records, which are then not reported undispatched as well
        served_end = cq.max_offset if mx is not None else (1 << 63) - 1
        dirty, dirty_first = 0, None
        gaps, gap_first = 0, None
        # the broker's compaction filter drops units pointing before the commitlog's first file, in any order:
        # a gap is damage only after a unit pointing into the log (queue offsets follow the log)
        self.cl_min = cl_min = store.commitlog.min_offset
        prev = prev_phy = None
        bad: list = []
        for qofs, vals in cq.blocks(bad=bad):
            if self.first_offset is None and len(qofs):
                self.first_offset = int(qofs[0])
            for a, b in _runs(qofs):
                base = int(qofs[a])
                if prev is not None and base != prev + 1 and base < served_end and prev_phy >= cl_min:
                    gaps += base - prev - 1
                    gap_first = prev + 1 if gap_first is None else gap_first
                prev, prev_phy = int(qofs[b - 1]), int(vals["phyOffset"][b - 1])
                for want, attr in ((mx, "max_unit"), (mn, "min_unit")):
                    if want is not None and base <= want.cq_offset < base + (b - a):
                        v = vals[want.cq_offset - base + a]
                        setattr(self, attr, (int(v["phyOffset"]), int(v["size"])))
                # units at or past the max offset: dirty, the broker neither serves nor keeps them
                keep = max(0, min(b - a, served_end - base))
                if keep < b - a:
                    dirty += (b - a) - keep
                    dirty_first = base + keep if dirty_first is None else dirty_first
                if keep:
                    self._add_run(base, _file_units(vals[a:a + keep]), windows)
            self.last_offset = prev
        self._check_offsets(mx, mn, served_end, dirty, dirty_first, gaps, gap_first, findings)
        for key, reason in bad:
            scan.agg.add(scan.group, "RDB_UNIT_VALUE", ERROR, cq.directory, None, f"{topic}/{qid}: entry {key}: {reason}; "
                         "the broker cannot decode it", topic=topic, queueId=qid)
        self.reach.sort(key=lambda r: r[2])
        self._next, self._active, self._last_w = 0, [], -1

    def _add_run(self, base: int, units: np.ndarray, windows: Windows) -> None:
        n = len(units)
        self.units += n
        u8 = units.view(np.uint8)
        fillers, first_filler, real, phy_max, (lo, hi), before, samples = checkkernel.queue_file(u8, n, windows.starts,
                                                                                             _SAMPLE_STEP)
        if fillers and not self.scan.fillers:
            self.scan.first_filler = base + first_filler
        self.scan.fillers += fillers
        if not real:
            return
        self.phy_max = phy_max if self.phy_max is None else max(self.phy_max, phy_max)
        if len(before):
            self.deferred.add(base + before, units["phyOffset"][before].astype(np.int64))
        if hi is not None:
            self.reach.append((base, n, lo, hi, samples))

    def _check_offsets(self, mx, mn, served_end, dirty, dirty_first, gaps, gap_first, findings) -> None:
        cq, scan = self.cq, self.scan
        topic, qid, agg, group, where = scan.topic, scan.qid, scan.agg, scan.group, cq.directory
        name = f"{topic}/{qid}"
        if mx is None:
            if self.units or dirty:
                agg.add(group, "RDB_MAX_OFFSET", ERROR, where, None, f"{name}: units but no max entry in the offset "
                        "table: the broker sees an empty queue (max offset 0)", topic=topic, queueId=qid)
        elif self.max_unit is None and mx.phy_offset >= self.cl_min:  # else dropped with its expired record
            agg.add(group, "RDB_MAX_OFFSET", ERROR, where, None, f"{name}: the offset table's max entry names queue offset "
                    f"{mx.cq_offset}, which has no unit", topic=topic, queueId=qid, queueOffset=mx.cq_offset)
        elif self.max_unit is not None and self.max_unit[0] != mx.phy_offset:
            agg.add(group, "RDB_MAX_OFFSET", ERROR, where, None, f"{name}: the max entry says unit {mx.cq_offset} is at "
                    f"{mx.phy_offset}, the unit says {self.max_unit[0]}", topic=topic, queueId=qid,
                    queueOffset=mx.cq_offset, phyOffset=mx.phy_offset)
        if mn is not None:
            if mx is not None and mn.cq_offset > mx.cq_offset + 1:
                agg.add(group, "RDB_MIN_OFFSET", ERROR, where, None, f"{name}: min entry {mn.cq_offset} is past the max "
                        f"entry {mx.cq_offset} + 1", topic=topic, queueId=qid, queueOffset=mn.cq_offset)
            elif self.min_unit is not None and self.min_unit[0] != mn.phy_offset:
                agg.add(group, "RDB_MIN_OFFSET", ERROR, where, None, f"{name}: the min entry says unit {mn.cq_offset} is "
                        f"at {mn.phy_offset}, the unit says {self.min_unit[0]}", topic=topic, queueId=qid,
                        queueOffset=mn.cq_offset, phyOffset=mn.phy_offset)
        if gaps:
            agg.add(group, "RDB_UNIT_MISSING", ERROR, where, None, f"{name}: {gaps} queue offsets before the max offset have "
                    f"no unit (first: {gap_first}): the broker's range reads stop at the gap", topic=topic, queueId=qid,
                    queueOffset=gap_first, count=gaps)
        if dirty:
            findings.append(Finding("RDB_DIRTY_UNITS", INFO, where, None, f"{name}: {dirty} units at or past the max offset "
                                    f"{served_end} (first: {dirty_first}), left by a truncation: the broker neither serves "
                                    "nor keeps them (new units overwrite them)",
                                    {"topic": topic, "queueId": qid, "queueOffset": dirty_first, "count": dirty}))

    def _reaching(self, w: int) -> list:
        if w < self._last_w:
            self._next, self._active = 0, []
        self._last_w = w
        while self._next < len(self.reach) and self.reach[self._next][2] <= w:
            self._active.append(self.reach[self._next])
            self._next += 1
        self._active = [r for r in self._active if r[3] >= w]
        return self._active

    def window(self, w: int, windows: Windows, recs: _Records, marks: np.ndarray) -> int | None:
        """The units pointing into window ``w``, read again from the database (only those: the run's samples
        bound them); flags the records they find; returns the end of the furthest record found."""
        found_end = None
        for base, n, lo, hi, samples in self._reaching(w):
            first, stop = 0, n
            if samples is not None:
                ks, units = samples
                j0 = int(np.searchsorted(ks, w, side="left")) - 1
                j1 = int(np.searchsorted(ks, w, side="right"))
                first = int(units[j0]) if j0 >= 0 else 0
                stop = int(units[j1]) if j1 < len(units) else n
                if first >= stop:
                    continue
            got = list(self.cq.blocks(base + first, base + stop, block=stop - first))
            if not got or len(got[0][0]) != stop - first:
                continue  # the copy does not change: cannot happen, but never index past what was read
            arr = _file_units(got[0][1])
            sub = base + first
            nf, fl, fr, last_q, end = checkkernel.queue_window(arr.view(np.uint8), 0, stop - first, sub, *windows.bounds(w),
                                                               recs, recs.topic_ids.get(self.scan.topic, -1), self.scan.qid,
                                                               False, MAX_ADDR, marks)
            if len(nf):
                self.deferred.add(sub + nf, arr["phyOffset"][nf].astype(np.int64))
            if last_q < 0:
                continue
            self.last_found = max(self.last_found, last_q)
            found_end = end if found_end is None else max(found_end, end)
            if len(fl):
                check_found_units(self.cq, self.scan, sub + fl, arr["phyOffset"][fl].astype(np.int64),
                                  arr["size"][fl].astype(np.int64), arr["tagsCode"][fl].astype(np.int64), fr, recs)
        return found_end

    def finish(self, refs: _RefClassifier, findings: list) -> None:
        qofs, phy, status = self.deferred.resolve(refs, self.last_found)
        for j in np.flatnonzero(status == refs.MISSING).tolist():
            _no_record(self.scan.agg, self.cq, self.scan.group, int(qofs[j]), int(phy[j]))
        findings += self.scan.agg.findings()

    @property
    def max_record_end(self) -> int | None:
        """End of the record the max entry's unit points at (phy + size), None without one."""
        return None if self.max_unit is None else self.max_unit[0] + self.max_unit[1]


class CheckpointDispatch:
    """Dispatch completeness from the database's checkpoint (the interface of :class:`.windows.DispatchWindows`):
    a dispatchable record before it without a unit is never dispatched again (CQ_NOT_DISPATCHED); from it on,
    the broker dispatches at its next start (CQ_DISPATCH_LAG). The mark is known before the walk, so each
    window is judged at once and only per-queue summaries are kept."""

    def __init__(self, checkpoint: int | None):
        self.mark = checkpoint if checkpoint is not None else 0
        self.old: dict = {}
        self.lag_first: tuple | None = None  # (segment, phy)
        self.lag_count = 0

    def reread_with(self, reread) -> None:  # the mark is fixed: no window is read again
        pass

    def window(self, recs: _Records, marks: np.ndarray, found_end, w: int) -> None:
        tran = recs.c["sysFlag"] & 0xC
        missing = _Missing(recs, np.flatnonzero(((tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)) & ~marks))
        if not len(missing):
            return
        below = missing.phy < self.mark
        from .windows import DispatchWindows

        DispatchWindows._merge(self.old, missing.take(below).per_queue())
        rest = missing.take(~below)
        if len(rest):
            if self.lag_first is None:
                self.lag_first = (int(rest.seg[0]), int(rest.phy[0]))
            self.lag_count += len(rest)

    def finish(self, cl, findings: list) -> None:
        segs = cl.segments.segments
        if self.lag_count:
            s = segs[self.lag_first[0]]
            f = dispatch_lag_finding(s.path, self.lag_first[1] - s.start, self.lag_count, self.lag_first[1])
            f.message = (f"{self.lag_count} records from the RocksDB consume queue's dispatch checkpoint {self.mark} on "
                         "have no unit yet; the broker dispatches them when it starts")
            findings.append(f)
        agg = _Agg()
        for topic, qid, n, phy, seg, qoff in sorted(self.old.values(), key=lambda r: r[3]):
            s = segs[seg]
            add_not_dispatched(agg, s.path, phy - s.start, topic, qid, phy, qoff, n)
        findings += agg.findings()


def check_database(store, queues: list, data_end: int, findings: list) -> dict:
    """The database's own entries and its checkpoint against the units and the log; returns the summary part."""
    db = store.rocksdb
    for code, message, extra in db.problems:
        findings.append(Finding(code, ERROR, db.directory, None, message + "; the broker ignores it", dict(extra)))
    cp = db.checkpoint
    units = sum(q.units for q in queues)
    ends = [q.max_record_end for q in queues if q.max_record_end is not None]
    if not db.present:
        pass
    elif not db.has_offset_family:
        findings.append(Finding("RDB_CHECKPOINT", ERROR, db.directory, None, "the database has no `offset` column family: "
                                "no queue has a max offset and the dispatch checkpoint is missing"))
    elif cp is None:
        if units:
            findings.append(Finding("RDB_CHECKPOINT", ERROR, db.directory, None, "no dispatch checkpoint (CHECKPOINT_TOPIC) "
                                    "in the offset table although queues hold units: the broker recovers the commitlog "
                                    "from offset 0"))
    else:
        if cp > data_end:
            findings.append(Finding("RDB_CHECKPOINT", ERROR, db.directory, None, f"the dispatch checkpoint {cp} is past the "
                                    f"end of the commitlog ({data_end}): it claims records the log does not hold",
                                    {"checkpoint": cp, "phyOffset": data_end}))
        if ends and max(ends) > cp:
            findings.append(Finding("RDB_CHECKPOINT", WARNING, db.directory, None, f"a queue's last unit ends at {max(ends)}, "
                                    f"past the dispatch checkpoint {cp}: those records are dispatched again at start",
                                    {"checkpoint": cp, "phyOffset": max(ends)}))
    return {"rocksdb": {"directory": db.directory, "files": db.files, "checkpoint": cp,
                        "columnFamilies": list(getattr(db, "column_families", []))}}
