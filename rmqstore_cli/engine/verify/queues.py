"""Verify: consume queues and ext files against the commitlog (Appendix B), and records the
broker should have dispatched but did not."""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats import checkkernel
from rmqstore_cli.formats.extaddr import MAX_ADDR, undecorate
from rmqstore_cli.formats.records import CQ_FILLER, CQ_UNIT_SIZE, TRANSACTION_COMMIT, TRANSACTION_NOT

from ..arrays import packed_rows, queue_key
from ..derived.lmq import is_lmq, window_targets
from ..log.segments import data_extents
from ..findings import Finding
from .records import ERROR, INFO, WARNING, _Agg, _cq_loc, _Records, _RefClassifier


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

    def add(self, phys: np.ndarray, idx: np.ndarray, found: np.ndarray, sizes: np.ndarray, own: bool = True) -> None:
        """One queue's non-filler units: their offsets, record indexes and whether the record was found. ``own``:
        the units are their records' own (not an LMQ queue's, which would hide a record's missing own unit)."""
        if not len(phys):
            return
        ri = idx[found]
        if own:
            self.has_unit[ri] = True
        self.phy_max = max(self.phy_max if self.phy_max is not None else int(phys[0]), int(phys.max()))
        if len(ri):
            end = int((phys[found] + sizes[ri]).max())
            self.found_end_max = end if self.found_end_max is None else max(self.found_end_max, end)


def _check_consume_queues(store, recs: _Records, refs: _RefClassifier, findings: list, summary: dict,
                          queues: list | None = None, unit_phys: list | None = None) -> DispatchMarks:
    """Consume queue ↔ commitlog and ext ↔ consume queue (Appendix B), each queue read file by file;
    returns which records have a unit (``unit_phys``, when given, also receives each queue's non-filler
    unit offsets)."""
    marks = DispatchMarks(len(recs))
    queues = store.queues() if queues is None else queues
    n_units = 0
    ext_on = store.config.enableConsumeQueueExt
    for topic, qid in queues:
        cq = store.queue(topic, qid)
        findings += cq.segments.problems
        scan = _QueueScan(topic, qid, store.ext(topic, qid) if ext_on else None)
        files = _QueueFiles(cq)
        phys_parts = []
        for qofs, phy, size, tags in files:
            n_units += len(phy)
            if scan.ext is not None:
                scan.note_ext_refs(tags)
            phys_parts.append(_check_unit_block(cq, scan, qofs, phy, size, tags, recs, refs, marks))
        refs.lost_refs += sum(len(q) for q, _ in scan.pending_lost)
        if unit_phys is not None:
            unit_phys.append(np.concatenate(phys_parts) if phys_parts else np.zeros(0, np.int64))
        del phys_parts
        _check_cq_holes(cq, files.end_offset, scan.agg, scan.group)
        if scan.fillers:
            path, pos = _cq_loc(cq, scan.first_filler)
            # Recognised padding (§7.3): not a problem, but worth knowing when reading offsets.
            findings.append(Finding("CQ_FILLER", INFO, path, pos, f"{scan.fillers} pre-blank filler units (queue starts at a non-zero offset)",
                                    {"count": scan.fillers}))
        if scan.ext is not None:
            _check_ext_units(scan.ext, scan.agg, scan.group, findings, scan.last_ext)
        findings += scan.agg.findings()
    summary["consumeQueues"] = {"queues": len(queues), "units": n_units}
    return marks


class _QueueFiles:
    """A queue's valid units file by file, by the rules of :meth:`..derived.consumequeue.ConsumeQueue.units`
    (the first invalid unit, a file that is not full or a gap between files ends the queue); after the
    iteration ``end_offset`` is where the queue ends."""

    def __init__(self, cq):
        self.cq = cq
        segs = cq.segments.segments
        self.end_offset = segs[0].start // CQ_UNIT_SIZE if segs else 0
        self.files: list = []  # (segment, valid units) of each file read, to read it again

    def units(self, seg, n: int, first: int = 0) -> tuple:
        """(queue offsets, phy, size, tagsCode) of units ``first .. n-1`` of file ``seg``."""
        arr = self.cq.file_units(seg)[first:n]
        base = seg.start // CQ_UNIT_SIZE + first
        return (np.arange(base, base + len(arr), dtype=np.int64), arr["phyOffset"].astype(np.int64),
                arr["size"].astype(np.int64), arr["tagsCode"].astype(np.int64))

    def unit_bytes(self, seg) -> np.ndarray:
        """File ``seg``'s units as their bytes (20 per unit, big-endian fields), for the compiled checks."""
        return self.cq.file_units(seg).view(np.uint8)

    def units_at(self, seg, pos: np.ndarray) -> tuple:
        """(queue offsets, phy, size, tagsCode) of the units at positions ``pos`` of file ``seg``."""
        arr = self.cq.file_units(seg)[pos]
        return (seg.start // CQ_UNIT_SIZE + np.asarray(pos, np.int64), arr["phyOffset"].astype(np.int64),
                arr["size"].astype(np.int64), arr["tagsCode"].astype(np.int64))

    def valid_files(self):
        """(file, its valid units) of each file the queue reaches, in order (nothing decoded)."""
        for seg, n, _, _ in self._files(None):
            yield seg, n

    def scanned_files(self, starts: np.ndarray, step: int, max_addr: int):
        """:meth:`valid_files` with, per file, what :func:`checkkernel.queue_file_valid` found in the same pass over
        its units: (file, valid units, :func:`checkkernel.queue_file` of them, largest tagsCode <= ``max_addr`` or None)."""
        return self._files((starts, step, max_addr))

    def _files(self, scan):
        end, first = self.end_offset, True
        for seg in self.cq.segments.segments:
            arr = self.cq.file_units(seg)
            got = low_tags = None
            if scan is None:
                valid = (arr["phyOffset"] >= 0) & (arr["size"] > 0)
                bad = np.flatnonzero(~valid)
                n = int(bad[0]) if len(bad) else len(arr)
            else:
                n, got, low_tags = checkkernel.queue_file_valid(arr.view(np.uint8), len(arr), *scan)
            base = seg.start // CQ_UNIT_SIZE
            if base != end and not first:
                break  # gap between files: the queue's continuity is broken here
            first = False
            self.files.append((seg, n))
            yield seg, n, got, low_tags
            end = self.end_offset = base + n
            if n * CQ_UNIT_SIZE < self.cq.file_size:
                break

    def __iter__(self):
        for seg, n in self.valid_files():
            yield self.units(seg, n)


class _QueueScan:
    """What one queue's checks carry from file to file."""

    def __init__(self, topic: str, qid: int, ext):
        self.topic, self.qid, self.ext = topic, qid, ext
        self.group = (topic, qid)
        self.agg = _Agg()
        self.fillers = 0
        self.first_filler = 0
        self.pending_lost: list = []  # (queue offsets, phys) past the log's end not yet followed by a found unit
        self.last_ext: int | None = None  # the largest ext address a valid unit holds

    def note_ext_refs(self, tags: np.ndarray) -> None:
        refs = tags[tags <= MAX_ADDR]
        if len(refs):
            top = int(refs.max())
            self.last_ext = top if self.last_ext is None else max(self.last_ext, top)


def _check_unit_block(cq, scan: _QueueScan, qofs, uphy, usize, utags, recs: _Records, refs: _RefClassifier,
                      marks: DispatchMarks) -> np.ndarray:
    """The units of one consume-queue file (queue offsets ``qofs``); returns the offsets of its non-filler units.
    Findings a later file may precede are added with their queue offset as rank."""
    agg, group = scan.agg, scan.group
    filler = (uphy == CQ_FILLER[0]) & (usize == CQ_FILLER[1]) & (utags == CQ_FILLER[2])
    if filler.any():
        if not scan.fillers:
            scan.first_filler = int(qofs[np.flatnonzero(filler)[0]])
        scan.fillers += int(filler.sum())
    real = np.flatnonzero(~filler)
    phys = uphy[real]
    idx, status = refs.classify_raw(phys)
    found_at = np.flatnonzero(status == refs.FOUND)
    if len(found_at):
        # a reference past the end followed by a found one is corrupt, not the lost tail (:meth:`_RefClassifier.classify`)
        status[np.flatnonzero(status[: found_at[-1]] == refs.LOST)] = refs.MISSING
        for qs, ps in scan.pending_lost:
            for qo, p in zip(qs.tolist(), ps.tolist()):
                _no_record(agg, cq, group, qo, p)
        scan.pending_lost = []
    lost = np.flatnonzero(status == refs.LOST)
    if len(lost):
        scan.pending_lost.append((qofs[real[lost]], phys[lost]))
    marks.add(phys, idx, status == refs.FOUND, recs.c["size"], own=not is_lmq(scan.topic))
    for j in np.flatnonzero(status == refs.MISSING).tolist():
        _no_record(agg, cq, group, int(qofs[real[j]]), int(phys[j]))
    ok = np.flatnonzero(status == refs.FOUND)
    uu = real[ok]
    check_found_units(cq, scan, qofs[uu], uphy[uu], usize[uu], utags[uu], idx[ok], recs)
    return phys


def check_found_units(cq, scan: _QueueScan, qofs, uphy, usize, utags, ri, recs: _Records) -> None:
    """Units (queue offsets ``qofs``, fields ``uphy``/``usize``/``utags``) whose offset is record ``ri`` of ``recs``:
    the unit against the record. Findings are ranked by queue offset, so any order of calls gives the same."""
    agg, group, topic, qid = scan.agg, scan.group, scan.topic, scan.qid
    c = recs.c
    tran = c["sysFlag"][ri] & 0xC
    checks = [
        ("CQ_SIZE", c["size"][ri] != usize, lambda j, r: f"size {int(usize[j])}, the record's TOTALSIZE is {int(c['size'][r])}"),
        ("CQ_TOPIC", c["topic"][ri] != recs.topic_ids.get(topic, -1), lambda j, r: f"points at a record of topic {recs.topic(r)!r}"),
        ("CQ_QUEUE_ID", c["queueId"][ri] != qid, lambda j, r: f"points at a record of queue {int(c['queueId'][r])}"),
        ("CQ_QUEUE_OFFSET", c["queueOffset"][ri] != qofs,
         lambda j, r: f"points at a record whose QUEUEOFFSET is {int(c['queueOffset'][r])} (queue offsets not contiguous)"),
        ("CQ_TRAN_TYPE", (tran != TRANSACTION_NOT) & (tran != TRANSACTION_COMMIT),
         lambda j, r: "points at a prepared/rollback transaction record, which the broker never dispatches"),
    ]
    bad = np.zeros(len(ri), dtype=bool)
    named = None  # units whose record multi-dispatches to this queue at their offset (found once, when first needed)
    for code, mask, text in checks:
        mask = mask & ~bad
        if code in ("CQ_TOPIC", "CQ_QUEUE_ID", "CQ_QUEUE_OFFSET") and mask.any():
            if named is None:
                named = _lmq_match(recs, ri, qofs, topic, qid)
            mask = mask & ~named
        for j in np.flatnonzero(mask).tolist():
            r = int(ri[j])
            qo = int(qofs[j])
            path, pos = _cq_loc(cq, qo)
            agg.add(group, code, ERROR, path, pos, f"unit {qo}: {text(j, r)}", topic=topic, queueId=qid, queueOffset=qo,
                    phyOffset=int(uphy[j]), rank=qo)
        bad |= mask
    # tagsCode (after ext indirection): units that passed the rest, records whose DELAY parses
    # (CL_DELAY_PROPERTY already says why the others cannot be checked).
    k = np.flatnonzero(~bad)
    k = k[~c["tagsBad"][ri[k]]]
    stored = utags[k]
    expected = c["tagsCode"][ri[k]]
    ext = scan.ext
    via_ext = (stored <= MAX_ADDR) if ext is not None else np.zeros(len(k), dtype=bool)
    ext_refs = []
    for m in np.flatnonzero(via_ext).tolist():
        j, r = int(k[m]), int(ri[k[m]])
        ext_refs.append((int(qofs[j]), int(stored[m]), r, int(expected[m])))
    wrong = np.flatnonzero(~via_ext & (stored != expected))
    if len(wrong):
        m = int(wrong[0])
        j = int(k[m])
        qo = int(qofs[j])
        path, pos = _cq_loc(cq, qo)
        agg.add(group, "CQ_TAGS", ERROR, path, pos, f"unit {qo}: tagsCode {int(stored[m])}, the record's TAGS give "
                f"{int(expected[m])}", topic=topic, queueId=qid, queueOffset=qo, phyOffset=int(uphy[j]), rank=qo)
        agg.count[(group, "CQ_TAGS")] += len(wrong) - 1
    if ext_refs:
        _check_ext_refs(ext, cq, ext_refs, recs, agg, group)


def _no_record(agg: _Agg, cq, group, qo: int, phy: int) -> None:
    path, pos = _cq_loc(cq, qo)
    agg.add(group, "CQ_NO_RECORD", ERROR, path, pos, f"unit {qo} points at {phy}, where no commitlog record starts",
            topic=group[0], queueId=group[1], queueOffset=qo, rank=qo)


def _lmq_match(recs: _Records, ri, queue_offsets, topic: str, qid: int) -> np.ndarray:
    """Units of a multi-dispatch (LMQ) queue point at other topics' records (§14.3): a unit agrees when its record
    multi-dispatches to this queue at this offset (derived.lmq's rules; the records' properties decoded once)."""
    out = np.zeros(len(ri), dtype=bool)
    if not len(ri):
        return out
    lt, keys, order, name_ids = window_targets(recs)
    name = name_ids.get(topic)
    if name is None:
        return out
    key = queue_key(name, qid)
    mine = order[np.searchsorted(keys, key):np.searchsorted(keys, key, side="right")]
    named = packed_rows(lt.row[mine], lt.queue_offset[mine])
    return np.isin(packed_rows(np.asarray(ri), np.asarray(queue_offsets)), named)


def _check_cq_holes(cq, end_offset: int, agg: _Agg, group) -> None:
    """Non-zero units after the end of a queue: data the broker can no longer reach."""
    segs = cq.segments.segments
    if not segs:
        return
    end_pos = end_offset * CQ_UNIT_SIZE
    for seg in segs:
        if seg.start + seg.size <= end_pos:
            continue
        arr = cq.file_units(seg)
        first = max(0, (end_pos - seg.start) // CQ_UNIT_SIZE)
        rest = arr[first:].view(np.uint8)  # a unit's three fields are all its 20 bytes: non-zero field = non-zero byte
        at = _first_non_zero(seg.path, rest, first * CQ_UNIT_SIZE, seg.data_extents(first * CQ_UNIT_SIZE, first * CQ_UNIT_SIZE + len(rest)))
        if at is not None:
            pos = (first + at // CQ_UNIT_SIZE) * CQ_UNIT_SIZE
            # located at the break (the first invalid unit), where the damage is, not at the stranded units
            end_seg = cq.segments.find(end_pos) or seg
            agg.add(group, "CQ_HOLE", ERROR, end_seg.path, end_pos - end_seg.start, f"units after the end of the queue at offset "
                    f"{end_offset} (next non-zero unit at {seg.name}+{pos}): the broker "
                    "treats the queue as ending at the first invalid unit and cannot reach them", topic=group[0], queueId=group[1])
            return


def _first_non_zero(path: str, rest: np.ndarray, base: int, extents: list | None = None) -> int | None:
    """Index in ``rest`` (the file's bytes from ``base`` on) of its first non-zero byte, or None. Only the file's
    data extents are read (``extents``: those inside the range when the caller has them, else
    :func:`..log.segments.data_extents`): past its last unit a queue file is a hole or reserved blocks (the
    broker's sparse pre-allocation, our ``posix_fallocate``), which read as zeros. A broker with thousands of
    queues has as many ~6 MB files; reading each one's zeros cost ~1 ms of CPU and its page faults."""
    if extents is None:
        extents = data_extents(path, base, base + len(rest))
    for lo, hi in extents:
        part = rest[lo - base:hi - base]
        if np.count_nonzero(part):
            return lo - base + int(np.flatnonzero(part)[0])
    return None


def _check_ext_refs(ext, cq, ext_refs, recs: _Records, agg: _Agg, group) -> None:
    """Units whose tagsCode is an ext address (one file's worth): the ext unit against the record."""
    for qo, addr, r, expected in ext_refs:
        unit = ext.get(addr)
        path, pos = _cq_loc(cq, qo)
        if unit is None:
            agg.add(group, "EXT_UNREADABLE", ERROR, path, pos, f"unit {qo}: ext address {addr} cannot be read", queueOffset=qo,
                    extOffset=undecorate(addr), rank=qo)
            continue
        if unit["tagsCode"] != expected:
            agg.add(group, "EXT_TAGS", ERROR, path, pos, f"unit {qo}: ext tagsCode {unit['tagsCode']}, the record's TAGS give {expected}",
                    queueOffset=qo, extOffset=unit["offset"], rank=qo)
        elif unit["msgStoreTime"] != int(recs.c["storeTimestamp"][r]):
            agg.add(group, "EXT_STORE_TIME", ERROR, path, pos, f"unit {qo}: ext msgStoreTime {unit['msgStoreTime']} differs from the "
                    f"record's STORETIMESTAMP {int(recs.c['storeTimestamp'][r])}", queueOffset=qo, extOffset=unit["offset"], rank=qo)


def _check_ext_units(ext, agg: _Agg, group, findings: list, last_ext: int | None) -> None:
    """The ext files' own problems, unit sizes, and units after the one the queue's last unit references."""
    findings += ext.segments.problems
    if last_ext is None:
        refs_end = 0
    else:
        ref = ext.get(last_ext)
        refs_end = ref["offset"] + ref["size"] if ref is not None else None  # unreadable: EXT_UNREADABLE says so
    for unit in ext.units():
        if unit["size"] != 20 + unit["bitMapSize"] or unit["bitMapSize"] < 0:
            seg = ext.segments.find(unit["offset"])
            agg.add(group, "EXT_SIZE", ERROR, seg.path if seg else ext.directory, unit["offset"] - (seg.start if seg else 0),
                    f"ext unit size {unit['size']} does not equal 20 + bitMapSize {unit['bitMapSize']}")
        if refs_end is not None and unit["offset"] >= refs_end:
            seg = ext.segments.find(unit["offset"] - unit["offset"] % ext.file_size)
            agg.add(group, "EXT_UNREFERENCED", WARNING, seg.path if seg else ext.directory,
                    unit["offset"] - (seg.start if seg else 0),
                    f"ext unit at {unit['offset']} lies after the last one the consume queue references "
                    + (f"(which ends at {refs_end})" if last_ext is not None else "(it references none)")
                    + ": left by a cut of the queue or a crash between the ext put and the unit's; "
                    + ("the broker's next start cuts the ext there" if last_ext is not None else
                       "the broker keeps it and writes new units after it"),
                    topic=group[0], queueId=group[1], extOffset=unit["offset"])


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
