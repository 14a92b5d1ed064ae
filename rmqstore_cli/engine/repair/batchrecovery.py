"""Recovery planning for batch consume queues (hooks of recovery.Planner; the broker's BatchConsumeQueue,
FORMAT.md §9.3).

The broker's steps: ``recover`` (from the third-last file, units up to the first failing the 46-byte validity
test; its maxPhysicOffset is the *start* of the last unit's record), ``truncateDirtyLogicFiles`` when the
queues reach past the recovered log's end (keep the units of records starting before it; unit 0 of the last
file is not tested) and re-dispatch (a unit is appended unless its record starts at or before the last one's).
Ours as well: every kept unit checked against its record (as verify does: size, topic, queue, tagsCode, store
time, INNER_BASE/INNER_NUM or QUEUEOFFSET/1, and msgBaseOffset continuing the previous unit); the queue is cut
at its first unit that disagrees and re-dispatched from the record whose msgBaseOffset is that queue offset,
units only ever written where they continue the queue (never shifted, never overlapping).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rmqstore_cli.formats.records import BCQ_UNIT_SIZE, TRANSACTION_COMMIT, TRANSACTION_NOT

from ..derived.batchcq import BCQ_DTYPE, BatchConsumeQueue, record_batch_fields, valid_units
from .plan import cut_files
from ..arrays import distinct_rows


@dataclass
class BatchQueueState:
    topic: str
    queue_id: int
    segments: list  # the files kept
    file_size: int
    end: int = 0  # logical byte position of the next unit
    max_phy: int = -1  # maxMsgPhyOffsetInCommitLog: start of the last unit's record
    max_offset: int | None = None  # last unit's msgBaseOffset + batchSize (None: no unit)
    min_offset: int | None = None  # first unit's msgBaseOffset

    def units(self) -> tuple[np.ndarray, list]:
        """The units up to ``end`` (BCQ_DTYPE) and the (segment, first unit index) of each file."""
        parts, where, at = [], [], 0
        for seg in self.segments:
            if seg.start >= self.end:
                break
            n = min(seg.size, self.file_size, self.end - seg.start) // BCQ_UNIT_SIZE
            arr = np.frombuffer(seg.buffer(), dtype=BCQ_DTYPE, count=n) if n > 0 else np.zeros(0, BCQ_DTYPE)
            parts.append(arr)
            where.append((seg, at))
            at += len(arr)
        return (np.concatenate(parts) if parts else np.zeros(0, BCQ_DTYPE)), where

    def set_last(self, units: np.ndarray) -> None:
        if len(units):
            last = units[-1]
            self.max_phy = int(last["phyOffset"])
            self.max_offset = int(last["msgBaseOffset"]) + int(last["batchSize"])
            self.min_offset = int(units[0]["msgBaseOffset"])
        else:
            self.max_phy, self.max_offset, self.min_offset = -1, None, None


def load_batch_queues(planner) -> None:
    planner.bqueues = {}
    planner.bcq_verdicts = {}
    for t, q in planner.store.batch_queues():
        bcq = BatchConsumeQueue(planner.store.root, t, q, planner.cfg)
        kept = planner._load_segments(bcq.segments, f"batchconsumequeue/{t}/{q}")
        planner.bqueues[(t, q)] = BatchQueueState(t, q, kept, bcq.file_size)


def recover_batch_queues(planner) -> None:
    """BatchConsumeQueue.recover on each queue, then truncateDirtyFiles at the end found."""
    for bs in planner.bqueues.values():
        segs = bs.segments
        if not segs:
            continue
        i = max(0, len(segs) - 3)
        while True:
            seg = segs[i]
            arr = _file_units(seg, bs.file_size)
            bad = np.flatnonzero(~valid_units(arr))
            n = int(bad[0]) if len(bad) else len(arr)
            pos = n * BCQ_UNIT_SIZE
            if pos == bs.file_size and i + 1 < len(segs):
                i += 1
                continue
            bs.end = seg.start + pos
            break
        units, _ = bs.units()
        bs.set_last(units)
        cut_batch_queue(planner, bs, bs.end, "batch consume queue recovery (the broker's valid-unit rule)")


def batch_max_physic(planner) -> list:
    return [bs.max_phy for bs in getattr(planner, "bqueues", {}).values()]


def cut_batch_queue(planner, bs: BatchQueueState, end: int, why: str) -> None:
    """truncateDirtyFiles(end) on a batch queue's files, plus our zeroed tail."""
    bs.segments = cut_files(planner, bs.segments, bs.file_size, end, f"{why}: file starts after the queue's end",
                            f"{why}: bytes after the last kept unit zeroed so they cannot reappear")
    bs.end = min(bs.end, end)


def truncate_batch_queues(planner) -> None:
    """BatchConsumeQueue.truncateDirtyLogicFiles(end) when the queues reach past the recovered end."""
    end = planner.end
    for bs in planner.bqueues.values():
        if not planner.cl_kept:
            for seg in bs.segments:
                planner.move_aside(seg.path, "no commitlog files left: the broker destroys every consume queue")
            bs.segments, bs.end = [], 0
            bs.set_last(np.zeros(0, BCQ_DTYPE))
            continue
        if planner.max_cq < end or not bs.segments:
            continue
        units, _ = bs.units()
        keep = len(units)
        if len(units):
            # unit 0 of the last file is not tested (§13.7 in its batch form): every earlier unit of the queue is
            # valid (recovery kept them), so the first unit whose record starts at or past the end is the cut
            past = np.flatnonzero(units["phyOffset"] >= end)
            keep = int(past[0]) if len(past) else len(units)
        if keep < len(units):
            new_end = _position_of(bs, keep)
            cut_batch_queue(planner, bs, new_end, f"batch consume queue truncation at commitlog offset {end}")
            bs.end = new_end
            bs.set_last(units[:keep])


def _position_of(bs: BatchQueueState, k: int) -> int:
    """Logical byte position of unit ``k`` of the queue (units are packed file after file)."""
    per = bs.file_size // BCQ_UNIT_SIZE
    first = bs.segments[0].start if bs.segments else 0
    return first + (k // per) * bs.file_size + (k % per) * BCQ_UNIT_SIZE


def check_batch_queues(planner) -> None:
    """Every batch queue's kept units against the records of the recovered log; cut at the first that disagrees.
    Window by window while every unit agrees (the usual case); the whole record table decides otherwise."""
    if not planner.bqueues and not planner.store.batch_topics():
        return
    if _windowed(planner):
        return
    table = planner.record_table
    recs = table.recs
    c = recs.c
    batch_topics = planner.store.batch_topics()
    keys = set(planner.bqueues)
    if len(recs):
        tran = c["sysFlag"] & 0xC
        disp = np.flatnonzero((tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT))
        for tid, q in distinct_rows(np.stack([c["topic"][disp].astype(np.int64),
                                                   c["queueId"][disp].astype(np.int64)], 1)).tolist():
            if recs.topics[tid] in batch_topics:
                keys.add((recs.topics[tid], int(q)))
    for key in sorted(keys):
        bs = planner.bqueues.get(key)
        if bs is None:
            bs = planner.bqueues[key] = BatchQueueState(key[0], key[1], [], planner.cfg.mapperFileSizeBatchConsumeQueue)
        _check_one(planner, table, bs)


def _unit_codes(store, recs, bs: BatchQueueState, units: np.ndarray, idx: np.ndarray, found: np.ndarray) -> tuple:
    """(bad, code) per unit: verify's checks of each unit against the record it points at (``idx``, ``found``:
    recs.lookup of its phyOffset) and against the unit before it. Units of records in commitlog files already
    cleaned (before the log's first file) are the broker's and kept."""
    c = recs.c
    phy = units["phyOffset"].astype(np.int64)
    expired = ~found & (phy < store.commitlog.min_offset)
    bad = ~found & ~expired
    code = np.where(bad, "CQ_NO_RECORD", "").astype(object)
    if len(units) and len(recs):
        base, num, unparsable = record_batch_fields(store, recs, np.where(found, idx, 0))
        tran = c["sysFlag"][idx] & 0xC
        prev_end = np.concatenate([[units["msgBaseOffset"][0]], (units["msgBaseOffset"] + units["batchSize"])[:-1]])
        for name, mask in (
                ("CQ_SIZE", units["size"] != c["size"][idx]),
                ("CQ_TOPIC", c["topic"][idx] != recs.topic_ids.get(bs.topic, -2)),
                ("CQ_QUEUE_ID", c["queueId"][idx] != bs.queue_id),
                ("CQ_TRAN_TYPE", (tran != TRANSACTION_NOT) & (tran != TRANSACTION_COMMIT)),
                ("BCQ_BATCH_FIELDS", unparsable),
                ("BCQ_BASE_OFFSET", units["msgBaseOffset"] != base),
                ("BCQ_BATCH_SIZE", units["batchSize"] != num),
                ("CQ_TAGS", ~c["tagsBad"][idx] & (units["tagsCode"] != c["tagsCode"][idx])),
                ("BCQ_STORE_TIME", units["storeTime"] != c["storeTimestamp"][idx]),
                ("BCQ_OFFSET_GAP", units["msgBaseOffset"] != prev_end)):
            new = np.asarray(mask, bool) & ~bad & (found | (name == "BCQ_OFFSET_GAP"))
            code[new] = name
            bad |= new
    return bad, code


def _queue_records(store, recs, bs: BatchQueueState) -> tuple:
    """(phy, msgBaseOffset, batchSize) in log order of the queue's dispatchable records whose batch fields parse."""
    c = recs.c
    tid = recs.topic_ids.get(bs.topic, -2)
    tran = c["sysFlag"] & 0xC
    mine = np.flatnonzero((c["topic"] == tid) & (c["queueId"] == bs.queue_id)
                          & ((tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)))
    rbase, rnum, rbad = record_batch_fields(store, recs, mine)
    return recs.phy[mine][~rbad], rbase[~rbad], rnum[~rbad]


def _check_one(planner, table, bs: BatchQueueState) -> None:
    recs = table.recs
    units, _ = bs.units()
    idx, found = recs.lookup(units["phyOffset"].astype(np.int64))
    bad, code = _unit_codes(planner.store, recs, bs, units, idx, found)
    _decide(planner, bs, units, bad, code, *_queue_records(planner.store, recs, bs))


def _decide(planner, bs: BatchQueueState, units, bad, code, rphy, rbase, rnum) -> None:
    """The queue's verdict from its units' checks (``bad``, ``code``) and its records (log order; at least those
    covering offsets from the queue's end on): where it is cut, from which record it is re-dispatched."""
    n = len(units)
    phy = units["phyOffset"].astype(np.int64)
    k = int(np.argmax(bad)) if bad.any() else n
    cut_offset = (int(units["msgBaseOffset"][k - 1]) + int(units["batchSize"][k - 1])) if k else None
    if cut_offset is None:  # nothing kept: the queue starts at its first unit's offset, or its first record's
        cut_offset = int(units["msgBaseOffset"][0]) if n and not bad[0] else (int(rbase.min()) if len(rbase) else 0)
    last_phy = int(phy[k - 1]) if k else -1
    after = rbase >= cut_offset
    rphy, rbase, rnum = rphy[after], rbase[after], rnum[after]
    mine = rphy
    if k == n and not len(mine):
        return
    # what a strict re-dispatch writes: from the record continuing the queue, each next one that continues it
    at = np.flatnonzero(rbase == cut_offset)
    redispatch, until = None, cut_offset
    if len(at):
        j = int(at[0])
        redispatch = int(rphy[j])
        expect = cut_offset
        for b, m, p in zip(rbase[j:].tolist(), rnum[j:].tolist(), rphy[j:].tolist()):
            if b != expect or p <= last_phy:
                break
            expect = b + m
        until = expect
    covered = int((rbase + rnum).max()) if len(rbase) else cut_offset
    lies = k < n
    detail = ""
    if lies:
        u = units[k]
        detail = (f"unit at msgBaseOffset {int(u['msgBaseOffset'])} (phyOffset {int(u['phyOffset'])}, batchSize "
                  f"{int(u['batchSize'])}) disagrees with the commitlog: {code[k]}")
    refused = None
    if len(mine) and until < covered:
        refused = (f"the commitlog has no record starting at queue offset {until} of {bs.topic}/{bs.queue_id} although "
                   f"later ones exist; batch units are never shifted")
    planner.bcq_verdicts[(bs.topic, bs.queue_id)] = {
        "cut_offset": cut_offset, "code": code[k] if lies else None, "detail": detail, "redispatch": redispatch,
        "until": until, "refused": refused, "units_after": n - k}
    if refused:
        planner.plan.notes.append(f"batch queue {bs.topic}/{bs.queue_id}: " + (detail + "; " if lies else "") + refused
                                  + "; the queue is left as the broker leaves it (refused)")
        planner.plan.refused_queues.append({"topic": bs.topic, "queueId": bs.queue_id, "reason": refused,
                                            "firstBadOffset": cut_offset, "code": code[k] if lies else None})
        return
    if lies:
        planner.plan.notes.append(f"batch queue {bs.topic}/{bs.queue_id}: {detail}; the broker's validity test keeps it; "
                                  f"we cut the queue there and re-dispatch from the record whose msgBaseOffset is "
                                  f"{cut_offset}" + (f" (at {redispatch})" if redispatch is not None else
                                                     " (the log holds none: the queue ends there)"))
        pos = _position_of(bs, k)
        cut_batch_queue(planner, bs, pos, f"unit at msgBaseOffset {int(units[k]['msgBaseOffset'])} disagrees with its record")
        bs.end = pos
        bs.set_last(units[:k])
    elif redispatch is not None:
        planner.plan.notes.append(f"batch queue {bs.topic}/{bs.queue_id} lacks units from queue offset {cut_offset} "
                                  f"(commitlog offset {redispatch}) on; we re-dispatch from there")


def batch_dispatch_starts(planner, broker_from: int) -> list:
    """Commitlog offsets the batch queues need re-dispatched from (below the broker's own start, or after a cut)."""
    out = []
    for v in getattr(planner, "bcq_verdicts", {}).values():
        if v["redispatch"] is not None and not v["refused"] and (v["redispatch"] < broker_from or v["code"]):
            out.append(v["redispatch"])
    return out


def batch_queue_state(planner) -> dict:
    """{(topic, queueId): [max offset or None, maxMsgPhyOffset]} for the dispatch prediction."""
    return {k: [bs.max_offset, bs.max_phy] for k, bs in getattr(planner, "bqueues", {}).items()}


def batch_summary(planner, bstate: dict) -> list:
    rows = []
    for (t, q), (max_off, max_phy) in sorted(bstate.items()):
        bs = planner.bqueues.get((t, q))
        min_off = bs.min_offset if bs is not None and bs.min_offset is not None else max_off
        rows.append({"topic": t, "queueId": q, "queueType": "BatchCQ", "minOffset": min_off or 0,
                     "maxOffset": max_off or 0, "maxPhysicOffset": max_phy})
    return rows


def _file_units(seg, file_size: int) -> np.ndarray:
    n = min(seg.size, file_size) // BCQ_UNIT_SIZE
    return np.frombuffer(seg.buffer(), dtype=BCQ_DTYPE, count=n) if n > 0 else np.zeros(0, BCQ_DTYPE)


def _windowed(planner) -> bool:
    """:func:`check_batch_queues` one commitlog window at a time (verify's windows, CRC not checked, as the record
    table reads them): each window's units checked against its records, and of each queue only its records from its
    end on kept. False (nothing decided) as soon as a unit disagrees or points outside the log: then the whole table
    says where to cut."""
    from .derived_windows import _window_bounds, _window_tables

    store, end = planner.store, planner.end
    cl = store.commitlog
    segs = [seg for seg in cl.segments.segments if seg.start < end]
    if any(a.start + a.size > b.start for a, b in zip(segs, segs[1:])):
        return False
    states = {}
    for key, bs in planner.bqueues.items():
        units, _ = bs.units()
        phy = units["phyOffset"].astype(np.int64)
        if len(units) > 1 and (units["msgBaseOffset"][1:] != (units["msgBaseOffset"] + units["batchSize"])[:-1]).any():
            return False  # BCQ_OFFSET_GAP
        states[key] = (bs, units, phy, phy < cl.min_offset)  # last: unit accounted for (found, or its file cleaned)
    batch_topics = store.batch_topics()
    tails: dict = {}  # key -> [(phy, msgBaseOffset, batchSize) arrays] of records from the queue's end on
    limits = np.asarray([min(seg.start + seg.size, end) for seg in segs], np.int64)
    for _, lo, hi, t in _window_tables(store, segs, _window_bounds(cl, segs), limits, end):
        for key, (bs, units, phy, seen) in states.items():
            sel = np.flatnonzero((phy >= lo) & (phy < hi) & ~seen)
            if not len(sel):
                continue
            idx, found = t.lookup(phy[sel])
            if not found.all():
                return False
            bad, code = _unit_codes(store, t, bs, units[sel], idx, found)
            if (bad & (code != "BCQ_OFFSET_GAP")).any():  # continuity was checked on the whole queue above
                return False
            seen[sel] = True
        c = t.c
        tran = c["sysFlag"] & 0xC
        ids = [i for name, i in t.topic_ids.items() if name in batch_topics]
        rows = np.flatnonzero(np.isin(c["topic"], ids) & ((tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)))
        if not len(rows):
            continue
        base, num, unparsable = record_batch_fields(store, t, rows)
        rows, base, num = rows[~unparsable], base[~unparsable], num[~unparsable]
        key_of = [(t.topics[int(c["topic"][r])], int(c["queueId"][r])) for r in rows.tolist()]
        for key in set(key_of):
            m = np.asarray([k == key for k in key_of])
            st = states.get(key)
            if st is not None and st[0].max_offset is not None:
                m &= base >= st[0].max_offset
            if m.any():
                tails.setdefault(key, []).append((t.phy[rows[m]], base[m], num[m]))
    if any(not st[3].all() for st in states.values()):
        return False  # a unit points past the records of the recovered log
    for key in sorted(set(states) | set(tails)):
        st = states.get(key)
        bs = st[0] if st is not None else planner.bqueues.setdefault(
            key, BatchQueueState(key[0], key[1], [], planner.cfg.mapperFileSizeBatchConsumeQueue))
        units = st[1] if st is not None else np.zeros(0, BCQ_DTYPE)
        parts = tails.get(key, [])
        cat = (lambda j: np.concatenate([p[j] for p in parts]) if parts else np.zeros(0, np.int64))  # noqa: E731
        _decide(planner, bs, units, np.zeros(len(units), bool), np.zeros(len(units), object), cat(0), cat(1), cat(2))
    return True
