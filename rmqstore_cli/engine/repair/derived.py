"""Derived files checked against the records they describe, for loss-free recovery.

The broker's own recovery trusts a consume-queue unit as soon as ``phy >= 0 and size > 0``
(§7.4) and an index file as long as its header counts look sane; a unit of random bytes can
pass that test. Recovery here also asks whether each unit *agrees with its record* (the same
joins ``verify`` makes, Appendix B): a unit whose record does not start at its phyOffset, or
has another size, topic, queue, QUEUEOFFSET, transaction type or tagsCode (through its ext
unit when ext is on) is damage. A queue is cut at its first such unit and re-dispatched from
the record whose QUEUEOFFSET is that position, so every unit lands where its record says.

Read-only; the Planner (recovery.py) turns the answers into actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rmqstore_cli.formats.extaddr import MAX_ADDR, undecorate
from rmqstore_cli.formats.records import CQ_FILLER, TRANSACTION_COMMIT, TRANSACTION_NOT
from ..arrays import distinct_rows


@dataclass
class QueueVerdict:
    """One queue's first lie (or first missing unit) and how re-dispatch can mend it."""

    topic: str
    queue_id: int
    cut_offset: int  # first queue offset that is wrong or missing (units from here are rewritten)
    code: str | None  # why the unit at cut_offset is wrong (verify's code); None: units are only missing
    detail: str
    redispatch_phy: int | None  # the record whose QUEUEOFFSET is cut_offset (None: the log has none)
    records_after: int  # dispatchable records of the queue with QUEUEOFFSET >= cut_offset
    contiguous_until: int  # re-dispatch can fill queue offsets [cut_offset, contiguous_until)
    ext_cut: int | None = None  # ext logical offset from which ext units are rewritten
    last_kept_end: int = -1  # maxPhysicOffset after the cut (end of the last kept unit's record)
    agree_after: int = 0  # units after the first lie that still agree (the broker keeps them up to its end)

    @property
    def lies(self) -> bool:
        return self.code is not None

    @property
    def refused(self) -> str | None:
        """Why re-dispatch cannot fill everything the log holds for this queue (no shifting)."""
        if self.records_after and self.contiguous_until < self.cut_offset + self.records_after:
            if self.redispatch_phy is not None and self.contiguous_until == self.cut_offset:
                return (f"the record with queue offset {self.cut_offset} of {self.topic}/{self.queue_id} (at "
                        f"{self.redispatch_phy}) lies before the queue's kept units in the log (records out of place); "
                        "a re-dispatch would skip it as already present")
            if self.redispatch_phy is None:
                return (f"the commitlog has no record with queue offset {self.cut_offset} of {self.topic}/"
                        f"{self.queue_id} although {self.records_after} later ones exist; units are never shifted")
            return (f"the commitlog has no record with queue offset {self.contiguous_until} of {self.topic}/"
                    f"{self.queue_id} although later offsets exist: a re-dispatch that never shifts units would end "
                    f"the queue at {self.contiguous_until} and leave "
                    f"{self.cut_offset + self.records_after - self.contiguous_until} records after the gap without units")
        return None


@dataclass
class RecordTable:
    """Columns of the records the recovered log holds (phy < end), as verify's phase 1 reads them
    without CRC (re-dispatch does not check CRCs either), plus per-queue positions."""

    recs: object  # verify.records._Records, cut to phy < end
    reports: list
    end: int
    _by_queue: dict = field(default_factory=dict)
    _lmq: object = None  # derived.lmq.LmqTargets of the records (row = record index), built on first use
    _lmq_by_queue: dict = field(default_factory=dict)

    def times(self) -> tuple[int, int | None, int]:
        """(records, newest store time, newest store time of a record a consume queue takes (0: none))."""
        c = self.recs.c
        if not len(self.recs):
            return 0, None, 0
        tran = c["sysFlag"] & 0xC
        cq_ts = c["storeTimestamp"][(tran == 0) | (tran == 8)]
        return len(self.recs), int(c["storeTimestamp"].max()), int(cq_ts.max()) if len(cq_ts) else 0

    def queue_records(self, topic: str, qid: int) -> np.ndarray:
        """Indexes (log order) of the dispatchable records of one queue."""
        key = (topic, qid)
        got = self._by_queue.get(key)
        if got is None:
            c = self.recs.c
            tid = self.recs.topic_ids.get(topic, -1)
            tran = c["sysFlag"] & 0xC
            ok = (c["topic"] == tid) & (c["queueId"] == qid) & ((tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT))
            got = self._by_queue[key] = np.flatnonzero(ok)
        return got


    def lmq(self):
        """Every record's multi-dispatch units (§14.3), ``row`` = record index."""
        if self._lmq is None:
            from ..derived.lmq import LmqTargets, MultiDispatchRule, record_targets

            cfg = self.recs.store.config
            self._lmq = record_targets(self.recs.store, self.recs) if MultiDispatchRule.checked(cfg) else LmqTargets.empty()
        return self._lmq

    def lmq_entries(self, topic: str, qid: int) -> tuple[np.ndarray, np.ndarray]:
        """(record indexes in log order, the queue offsets they name) of the multi-dispatch units of one queue:
        records of NOT/COMMIT type whose properties name it."""
        key = (topic, qid)
        got = self._lmq_by_queue.get(key)
        if got is None:
            lt = self.lmq()
            if not len(lt) or topic not in lt.names:
                got = (np.zeros(0, np.int64), np.zeros(0, np.int64))
            else:
                m = (lt.name == lt.names.index(topic)) & (lt.queue_id == qid)
                rows, qo = lt.row[m], lt.queue_offset[m]
                tran = self.recs.c["sysFlag"][rows] & 0xC
                ok = (tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)
                got = (rows[ok], qo[ok])
            self._lmq_by_queue[key] = got
        return got

    def lmq_queues(self) -> set:
        """(name, queue id) of every queue some record multi-dispatches to."""
        lt = self.lmq()
        if not len(lt):
            return set()
        pairs = distinct_rows(np.stack([lt.name, lt.queue_id], 1))
        return {(lt.names[int(n)], int(q)) for n, q in pairs.tolist()}

    def queue_entries(self, topic: str, qid: int) -> tuple[np.ndarray, np.ndarray]:
        """(record indexes in log order, queue offset each is due at) of every unit the queue should hold:
        its own records' units and the multi-dispatch units naming it."""
        mine = self.queue_records(topic, qid)
        qo = self.recs.c["queueOffset"][mine].astype(np.int64)
        lrows, lqo = self.lmq_entries(topic, qid)
        if not len(lrows):
            return mine, qo
        rows = np.concatenate([mine, lrows])
        qo = np.concatenate([qo, lqo])
        order = np.argsort(rows, kind="stable")
        return rows[order], qo[order]


def record_table(store, end: int) -> RecordTable:
    """Every record before ``end`` (verify's per-segment pass, CRC not checked)."""
    segs = store.commitlog.segments.segments
    return table_of(store, [i for i, s in enumerate(segs) if s.start < end], end)


def table_of(store, segments: list, end: int) -> RecordTable:
    """The records before ``end`` of the commitlog segments numbered ``segments``, as ``record_table``."""
    from ..verify.commitlog import verify_segments

    return table_of_reports(store, verify_segments(store.commitlog, segments, check_crc=False), end)


def table_of_reports(store, reports: list, end: int) -> RecordTable:
    """``record_table`` of the records in verify's ``reports`` (whole segments or windows), cut at ``end``."""
    from ..verify.records import _Records

    recs = _Records(store, reports)
    n = int(np.searchsorted(recs.phy, end))
    if n < len(recs.phy):
        recs.c = {k: v[:n] for k, v in recs.c.items()}
        recs.phy = recs.c["phy"]
        recs.seg = recs.seg[:n]
        recs.key_start = recs.key_start[:n]
    recs.invalid = recs.invalid[recs.invalid < end]
    return RecordTable(recs, reports, end)


def check_queue(table: RecordTable, topic: str, qid: int, units: np.ndarray, first_offset: int, end_offset: int,
                ext=None) -> QueueVerdict | None:
    """``units``: the queue's units for queue offsets [first_offset, end_offset) (CQ dtype, what the
    broker's recovery keeps). Returns None when every unit agrees and nothing is missing."""
    recs = table.recs
    c = recs.c
    n = len(units)
    phy = units["phyOffset"].astype(np.int64)
    size = units["size"].astype(np.int64)
    tags = units["tagsCode"].astype(np.int64)
    pos = first_offset + np.arange(n, dtype=np.int64)
    filler = (phy == CQ_FILLER[0]) & (size == CQ_FILLER[1]) & (tags == CQ_FILLER[2])
    real = ~filler
    if real.any():  # pre-blank fillers only before the first real unit (§7.3)
        first_real = int(np.argmax(real))
        real[first_real:] = True
        filler[first_real:] = False
    idx, found = recs.lookup(phy)
    # Units behind the commitlog's first file point at records the cleaner deleted (FORMAT 13.10): the broker
    # keeps them and its correctMinOffset starts the queue after them; they are neither checked nor lying.
    real &= ~(~found & (phy >= 0) & (phy < recs.store.commitlog.min_offset))
    bad = np.zeros(n, dtype=bool)
    why = np.zeros(n, dtype=np.int8)
    codes = ["", "CQ_NO_RECORD", "CQ_SIZE", "CQ_TOPIC", "CQ_QUEUE_ID", "CQ_QUEUE_OFFSET", "CQ_TRAN_TYPE", "CQ_TAGS",
             "EXT_UNREADABLE", "EXT_TAGS", "EXT_STORE_TIME", "EXT_SIZE", "EXT_ORDER"]

    def mark(mask, code):
        new = mask & ~bad
        why[new] = codes.index(code)
        bad[:] |= new

    mark(real & ~found, "CQ_NO_RECORD")
    if not len(recs.phy):  # no record left (e.g. the log's files are gone): every real unit is already bad;
        c = {k: np.zeros(1, v.dtype) for k, v in c.items()}  # one dummy row keeps the gathers below valid
        idx = np.zeros(n, dtype=np.int64)
    tran = c["sysFlag"][idx] & 0xC
    want_tid = recs.topic_ids.get(topic, -2)
    lrows, lqo = table.lmq_entries(topic, qid)
    # a multi-dispatch unit: its record names this queue, at this offset (§14.3); its topic is the record's own
    via_lmq = _names_at(lrows, lqo, idx, pos) if len(lrows) else np.zeros(n, dtype=bool)
    mark(real & (c["size"][idx] != size), "CQ_SIZE")
    mark(real & ~via_lmq & (c["topic"][idx] != want_tid), "CQ_TOPIC")
    mark(real & ~via_lmq & (c["queueId"][idx] != qid), "CQ_QUEUE_ID")
    mark(real & ~via_lmq & (c["queueOffset"][idx] != pos), "CQ_QUEUE_OFFSET")
    mark(real & (tran != TRANSACTION_NOT) & (tran != TRANSACTION_COMMIT), "CQ_TRAN_TYPE")
    checkable = real & ~bad & ~c["tagsBad"][idx]
    expected = c["tagsCode"][idx]
    via_ext = (tags <= MAX_ADDR) if ext is not None else np.zeros(n, dtype=bool)
    mark(checkable & ~via_ext & (tags != expected), "CQ_TAGS")
    basic_bad = bad.copy()
    ext_units: dict[int, dict] = {}
    if ext is not None:
        last_addr = None
        for j in np.flatnonzero(real & ~bad & via_ext).tolist():
            u = ext.get(int(tags[j]))
            ext_units[j] = u
            if u is None:
                mark(_one(n, j), "EXT_UNREADABLE")
            elif u["size"] != 20 + u["bitMapSize"] or u["bitMapSize"] < 0:
                mark(_one(n, j), "EXT_SIZE")
            elif checkable[j] and u["tagsCode"] != int(expected[j]):
                mark(_one(n, j), "EXT_TAGS")
            elif u["msgStoreTime"] != int(c["storeTimestamp"][idx[j]]):
                mark(_one(n, j), "EXT_STORE_TIME")
            elif last_addr is not None and u["offset"] <= last_addr:
                mark(_one(n, j), "EXT_ORDER")
            if bad[j]:
                break  # only the first lie matters; later units are rewritten anyway
            last_addr = u["offset"]
    cut = int(pos[np.argmax(bad)]) if bad.any() else end_offset
    # The records that belong at [cut, ...): their QUEUEOFFSETs must follow on from cut.
    mine, qo = table.queue_entries(topic, qid)
    after, qa = mine[qo >= cut], qo[qo >= cut]
    if not bad.any() and not len(after):
        return None
    k = int(np.argmax(bad)) if bad.any() else n
    kept_real = np.flatnonzero(real[:k])
    last_end = int(phy[kept_real[-1]] + size[kept_real[-1]]) if len(kept_real) else -1
    redispatch, contiguous = tail_redispatch(qa, recs.phy[after], c["size"][after].astype(np.int64), cut, last_end)
    code = codes[int(why[k])] if bad.any() else None
    detail = ""
    if code:
        detail = (f"unit {cut} (phyOffset {int(phy[k])}, size {int(size[k])}, tagsCode {int(tags[k])}) disagrees with "
                  f"the commitlog: {code}")
    ext_cut = None
    if ext is not None:
        kept_ext = [j for j in kept_real.tolist() if tags[j] <= MAX_ADDR]
        if kept_ext:
            u = ext_units.get(kept_ext[-1]) or ext.get(int(tags[kept_ext[-1]]))
            ext_cut = (u["offset"] + u["size"]) if u else undecorate(int(tags[kept_ext[-1]]))
        else:
            ext_cut = 0
    agree_after = int((real & ~basic_bad)[k + 1:].sum()) if bad.any() else 0
    return QueueVerdict(topic, qid, cut, code, detail, redispatch, len(after), contiguous, ext_cut, last_end, agree_after)


def tail_redispatch(qa: np.ndarray, phy: np.ndarray, size: np.ndarray, cut: int, last_end: int) -> tuple:
    """(the record whose QUEUEOFFSET is ``cut`` or None, how far a strict re-dispatch fills the queue) from
    the queue's records with QUEUEOFFSET >= cut (``qa``, ``phy``, ``size``, in log order); ``last_end``: end
    of the last kept unit's record (maxPhysicOffset after the cut)."""
    at = np.flatnonzero(qa == cut)
    redispatch = int(phy[at[0]]) if len(at) else None
    # contiguous: in log order from that record, offsets cut, cut+1, ... (what strict re-dispatch writes)
    contiguous = cut
    if redispatch is not None:
        seq = qa[int(at[0]):]
        exp = cut + np.arange(len(seq), dtype=np.int64)
        brk = np.flatnonzero(seq != exp)
        contiguous = cut + (int(brk[0]) if len(brk) else len(seq))
        if redispatch + int(size[at[0]]) <= last_end:
            # the record lies before the last kept unit's (records out of place in the log): the put rule
            # (§7.5, phy + size <= maxPhysicOffset: already present) would skip it
            contiguous = cut
    return redispatch, contiguous


def _names_at(lrows: np.ndarray, lqo: np.ndarray, idx: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """For each unit (record ``idx``, queue offset ``pos``): does the record multi-dispatch to this queue at that
    offset (``lrows``/``lqo``: the queue's multi-dispatch entries, record indexes ascending)."""
    out = np.zeros(len(idx), dtype=bool)
    at = np.searchsorted(lrows, idx, side="left")
    for _ in range(2):  # a record may name the queue twice
        ok = at < len(lrows)
        j = np.minimum(at, len(lrows) - 1)
        out |= ok & (lrows[j] == idx) & (lqo[j] == pos)
        at = at + 1
    return out


def _one(n: int, j: int) -> np.ndarray:
    m = np.zeros(n, dtype=bool)
    m[j] = True
    return m


def in_file_order(found: list, files: list) -> list:
    """Index findings in ``files`` order, then by offset and code: the whole-table check and the windowed one
    (derived_windows) aggregate in different orders, and the plan names a file's first finding."""
    rank = {f.path: i for i, f in enumerate(files)}
    return sorted(found, key=lambda x: (rank.get(x.path, len(rank)), x.offset if x.offset is not None else -1, x.code))

