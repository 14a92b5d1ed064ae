"""Verify: consume queues and ext files against the commitlog (Appendix B), and records the
broker should have dispatched but did not."""

from __future__ import annotations

import numpy as np

from formats.extaddr import MAX_ADDR, undecorate
from formats.records import CQ_FILLER, CQ_UNIT_SIZE, TRANSACTION_COMMIT, TRANSACTION_NOT

from .findings import Finding
from .verify_records import ERROR, INFO, _Agg, _cq_loc, _Records, _RefClassifier


def check_queue(store, topic: str, qid: int, recs: _Records, refs: _RefClassifier) -> tuple[list, int, np.ndarray]:
    """The consume-queue (+ ext) checks of ONE queue: (findings, units, phys of its non-filler units).
    Independent of every other queue, so a distributed verify can run one task per queue."""
    findings: list = []
    summary: dict = {}
    phys: list = []
    _check_consume_queues(store, recs, refs, findings, summary, queues=[(topic, qid)], unit_phys=phys)
    return findings, summary["consumeQueues"]["units"], phys[0]


class DispatchMarks:
    """Which records some consume-queue unit points at (one flag per record, set queue by queue), and the
    queues' high-water mark: what the dispatch-completeness check needs, without keeping the units."""

    def __init__(self, n_records: int):
        self.has_unit = np.zeros(n_records, dtype=bool)
        self.found_end_max: int | None = None  # end of the furthest record a unit points at
        self.phy_max: int | None = None  # the furthest unit's offset

    def add(self, phys: np.ndarray, idx: np.ndarray, found: np.ndarray, sizes: np.ndarray) -> None:
        """One queue's non-filler units: their offsets, record indexes and whether the record was found."""
        if not len(phys):
            return
        ri = idx[found]
        self.has_unit[ri] = True
        self.phy_max = max(self.phy_max if self.phy_max is not None else int(phys[0]), int(phys.max()))
        if len(ri):
            end = int((phys[found] + sizes[ri]).max())
            self.found_end_max = end if self.found_end_max is None else max(self.found_end_max, end)


def _check_consume_queues(store, recs: _Records, refs: _RefClassifier, findings: list, summary: dict,
                          queues: list | None = None, unit_phys: list | None = None) -> DispatchMarks:
    """Consume queue ↔ commitlog and ext ↔ consume queue (Appendix B); returns which records have a unit
    (``unit_phys``, when given, also receives each queue's non-filler unit offsets)."""
    marks = DispatchMarks(len(recs))
    queues = store.queues() if queues is None else queues
    n_units = 0
    ext_on = store.config.enableConsumeQueueExt
    for topic, qid in queues:
        cq = store.queue(topic, qid)
        findings += cq.segments.problems
        u = cq.units()
        n_units += len(u.phy)
        agg = _Agg()
        group = (topic, qid)
        _check_cq_holes(cq, u, agg, group)
        filler = (u.phy == CQ_FILLER[0]) & (u.size == CQ_FILLER[1]) & (u.tags == CQ_FILLER[2])
        real = np.flatnonzero(~filler)
        if filler.any():
            first = int(u.queue_offsets[np.flatnonzero(filler)[0]])
            path, pos = _cq_loc(cq, first)
            # Recognised padding (§7.3): not a problem, but worth knowing when reading offsets.
            findings.append(Finding("CQ_FILLER", INFO, path, pos, f"{int(filler.sum())} pre-blank filler units (queue starts at a non-zero offset)",
                                    {"count": int(filler.sum())}))
        phys = u.phy[real]
        if unit_phys is not None:
            unit_phys.append(phys)
        idx, status = refs.classify(phys)
        marks.add(phys, idx, status == refs.FOUND, recs.c["size"])
        want_tid = recs.topic_ids.get(topic, -1)
        ext = store.ext(topic, qid) if ext_on else None
        ext_refs = []
        for j in np.flatnonzero(status == refs.MISSING).tolist():
            qo = int(u.queue_offsets[real[j]])
            path, pos = _cq_loc(cq, qo)
            agg.add(group, "CQ_NO_RECORD", ERROR, path, pos, f"unit {qo} points at {int(phys[j])}, where no commitlog record starts",
                    topic=topic, queueId=qid, queueOffset=qo)
        ok = np.flatnonzero(status == refs.FOUND)
        ri = idx[ok]
        uu = real[ok]
        c = recs.c
        tran = c["sysFlag"][ri] & 0xC
        checks = [
            ("CQ_SIZE", c["size"][ri] != u.size[uu], lambda j, r: f"size {int(u.size[j])}, the record's TOTALSIZE is {int(c['size'][r])}"),
            ("CQ_TOPIC", c["topic"][ri] != want_tid, lambda j, r: f"points at a record of topic {recs.topic(r)!r}"),
            ("CQ_QUEUE_ID", c["queueId"][ri] != qid, lambda j, r: f"points at a record of queue {int(c['queueId'][r])}"),
            ("CQ_QUEUE_OFFSET", c["queueOffset"][ri] != u.queue_offsets[uu],
             lambda j, r: f"points at a record whose QUEUEOFFSET is {int(c['queueOffset'][r])} (queue offsets not contiguous)"),
            ("CQ_TRAN_TYPE", (tran != TRANSACTION_NOT) & (tran != TRANSACTION_COMMIT),
             lambda j, r: "points at a prepared/rollback transaction record, which the broker never dispatches"),
        ]
        bad = np.zeros(len(ok), dtype=bool)
        for code, mask, text in checks:
            mask = mask & ~bad
            if code in ("CQ_TOPIC", "CQ_QUEUE_ID", "CQ_QUEUE_OFFSET") and mask.any():
                mask = mask & ~_lmq_match(recs, ri, u.queue_offsets[uu], topic, mask)
            for k in np.flatnonzero(mask).tolist():
                j, r = int(uu[k]), int(ri[k])
                qo = int(u.queue_offsets[j])
                path, pos = _cq_loc(cq, qo)
                agg.add(group, code, ERROR, path, pos, f"unit {qo}: {text(j, r)}", topic=topic, queueId=qid, queueOffset=qo,
                        phyOffset=int(u.phy[j]))
            bad |= mask
        # tagsCode (after ext indirection): units that passed the rest, records whose DELAY parses
        # (CL_DELAY_PROPERTY already says why the others cannot be checked).
        k = np.flatnonzero(~bad)
        k = k[~c["tagsBad"][ri[k]]]
        stored = u.tags[uu[k]]
        expected = c["tagsCode"][ri[k]]
        via_ext = (stored <= MAX_ADDR) if ext is not None else np.zeros(len(k), dtype=bool)
        for m in np.flatnonzero(via_ext).tolist():
            j, r = int(uu[k[m]]), int(ri[k[m]])
            ext_refs.append((int(u.queue_offsets[j]), int(stored[m]), r, int(expected[m])))
        wrong = np.flatnonzero(~via_ext & (stored != expected))
        if len(wrong):
            m = int(wrong[0])
            j = int(uu[k[m]])
            qo = int(u.queue_offsets[j])
            path, pos = _cq_loc(cq, qo)
            agg.add(group, "CQ_TAGS", ERROR, path, pos, f"unit {qo}: tagsCode {int(stored[m])}, the record's TAGS give "
                    f"{int(expected[m])}", topic=topic, queueId=qid, queueOffset=qo, phyOffset=int(u.phy[j]))
            agg.count[(group, "CQ_TAGS")] += len(wrong) - 1
        if ext is not None:
            _check_ext(ext, cq, ext_refs, recs, agg, group, findings)
        findings += agg.findings()
    summary["consumeQueues"] = {"queues": len(queues), "units": n_units}
    return marks


def _lmq_match(recs: _Records, ri, queue_offsets, topic: str, mask) -> np.ndarray:
    """Units of a multi-dispatch (LMQ) queue point at other topics' records (§14.3)."""
    out = np.zeros(len(ri), dtype=bool)
    for k in np.flatnonzero(mask).tolist():
        p = recs.props(int(ri[k]))
        names = p.get("INNER_MULTI_DISPATCH", "").split(",")
        offs = p.get("INNER_MULTI_QUEUE_OFFSET", "").split(",")
        if topic in names and len(names) == len(offs):
            out[k] = offs[names.index(topic)] == str(int(queue_offsets[k]))
    return out


def _check_cq_holes(cq, u, agg: _Agg, group) -> None:
    """Non-zero units after the end of a queue: data the broker can no longer reach."""
    segs = cq.segments.segments
    if not segs:
        return
    end_pos = u.end_offset * CQ_UNIT_SIZE
    for seg in segs:
        if seg.start + seg.size <= end_pos:
            continue
        arr = cq.file_units(seg)
        first = max(0, (end_pos - seg.start) // CQ_UNIT_SIZE)
        rest = arr[first:]
        nz = np.flatnonzero((rest["phyOffset"] != 0) | (rest["size"] != 0) | (rest["tagsCode"] != 0))
        if len(nz):
            pos = (first + int(nz[0])) * CQ_UNIT_SIZE
            # located at the break (the first invalid unit), where the damage is, not at the stranded units
            end_seg = cq.segments.find(end_pos) or seg
            agg.add(group, "CQ_HOLE", ERROR, end_seg.path, end_pos - end_seg.start, f"units after the end of the queue at offset "
                    f"{u.end_offset} (next non-zero unit at {seg.name}+{pos}): the broker "
                    "treats the queue as ending at the first invalid unit and cannot reach them", topic=group[0], queueId=group[1])
            return


def _check_ext(ext, cq, ext_refs, recs: _Records, agg: _Agg, group, findings: list) -> None:
    findings += ext.segments.problems
    for qo, addr, r, expected in ext_refs:
        unit = ext.get(addr)
        path, pos = _cq_loc(cq, qo)
        if unit is None:
            agg.add(group, "EXT_UNREADABLE", ERROR, path, pos, f"unit {qo}: ext address {addr} cannot be read", queueOffset=qo,
                    extOffset=undecorate(addr))
            continue
        if unit["tagsCode"] != expected:
            agg.add(group, "EXT_TAGS", ERROR, path, pos, f"unit {qo}: ext tagsCode {unit['tagsCode']}, the record's TAGS give {expected}",
                    queueOffset=qo, extOffset=unit["offset"])
        elif unit["msgStoreTime"] != int(recs.c["storeTimestamp"][r]):
            agg.add(group, "EXT_STORE_TIME", ERROR, path, pos, f"unit {qo}: ext msgStoreTime {unit['msgStoreTime']} differs from the "
                    f"record's STORETIMESTAMP {int(recs.c['storeTimestamp'][r])}", queueOffset=qo, extOffset=unit["offset"])
    for unit in ext.units():
        if unit["size"] != 20 + unit["bitMapSize"] or unit["bitMapSize"] < 0:
            seg = ext.segments.find(unit["offset"])
            agg.add(group, "EXT_SIZE", ERROR, seg.path if seg else ext.directory, unit["offset"] - (seg.start if seg else 0),
                    f"ext unit size {unit['size']} does not equal 20 + bitMapSize {unit['bitMapSize']}")


def _check_dispatch(store, recs: _Records, marks: DispatchMarks, findings: list) -> None:
    """Records the broker should have put into a consume queue but did not."""
    if not len(recs):
        return
    tran = recs.c["sysFlag"] & 0xC
    missing = np.flatnonzero(((tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)) & ~marks.has_unit)
    del tran
    if not len(missing):
        return
    # maxPhysicOffset of the queues: the broker re-dispatches everything from there at start (§13.1).
    high = dispatch_high_water(marks.found_end_max, marks.phy_max)
    lag = missing[recs.phy[missing] >= high]
    old = missing[recs.phy[missing] < high]
    if len(lag):
        path, pos = recs.location(int(lag[0]))
        findings.append(dispatch_lag_finding(path, pos, int(len(lag)), int(recs.phy[lag[0]])))
    agg = _Agg()
    for i in old.tolist():
        path, pos = recs.location(i)
        add_not_dispatched(agg, path, pos, recs.topic(i), int(recs.c["queueId"][i]), int(recs.phy[i]), int(recs.c["queueOffset"][i]))
    findings += agg.findings()


def dispatch_high_water(found_ends_max: int | None, units_phy_max: int | None) -> int:
    """maxPhysicOffset of the queues: the broker re-dispatches everything from there at start (§13.1).
    The end of the furthest unit that points at a record; without any, the furthest unit's offset."""
    if found_ends_max is not None:
        return found_ends_max
    return units_phy_max if units_phy_max is not None else 0


def dispatch_lag_finding(path: str, pos: int, count: int, phy: int) -> Finding:
    return Finding("CQ_DISPATCH_LAG", INFO, path, pos, f"{count} records after the consume queues' high-water mark "
                   "are not dispatched yet; the broker dispatches them when it starts", {"count": count, "phyOffset": phy})


def add_not_dispatched(agg: _Agg, path: str, pos: int, topic: str, qid: int, phy: int, queue_offset: int, count: int = 1) -> None:
    """CQ_NOT_DISPATCHED for the first missing record of a queue (``count`` of them when merging partial results)."""
    agg.add((topic, qid), "CQ_NOT_DISPATCHED", ERROR, path, pos, f"record of {topic}/{qid} (queue offset {queue_offset}) is "
            "missing from its consume queue; the broker will not dispatch it again", topic=topic, queueId=qid, phyOffset=phy,
            queueOffset=queue_offset)
    agg.count[((topic, qid), "CQ_NOT_DISPATCHED")] += count - 1
