"""Verify: batch consume queues (``batchconsumequeue/``, FORMAT.md §9) against the commitlog.

Per queue, before the walk (no record needed): the units the broker's recovery keeps (valid test of §9.3,
first invalid unit ends the queue) must follow on from each other (``msgBaseOffset`` of a unit = the
previous unit's ``msgBaseOffset + batchSize``: the queue offsets a batch covers) and nothing may lie after
the end (BCQ_HOLE). Then window by window like the simple queues: each unit against the record it points
at (its TOTALSIZE, topic, queue id, transaction type, tagsCode, store time, and the record's INNER_BASE /
INNER_NUM, or its QUEUEOFFSET and 1 for a single message); records found are marked dispatched, so
dispatch completeness is counted per record (one unit per batch), not per message.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats.records import BCQ_UNIT_SIZE, TRANSACTION_COMMIT, TRANSACTION_NOT

from ..derived.batchcq import record_batch_fields
from .records import ERROR, _Agg, _RefClassifier
from .windows import Deferred


class BatchQueueCheck:
    """One batch consume queue, checked window by window (or once, with the whole log's records)."""

    def __init__(self, store, topic: str, qid: int, findings: list):
        self.store = store
        self.topic, self.qid = topic, qid
        self.bcq = bcq = store.batch_queue(topic, qid)
        findings += bcq.segments.problems
        self.agg = _Agg()
        self.group = (topic, qid)
        self.files = []  # (segment, units, phy int64, sorted) of each file the queue reaches
        self.units = 0
        self.phy_max: int | None = None
        prev_end = None
        for seg, n in bcq.valid_files():
            arr = bcq.file_units(seg)[:n]
            phy = arr["phyOffset"].astype(np.int64)
            self.files.append((seg, arr, phy, bool(n < 2 or (phy[1:] > phy[:-1]).all())))
            self.units += n
            if n:
                self.phy_max = int(phy.max()) if self.phy_max is None else max(self.phy_max, int(phy.max()))
                base = arr["msgBaseOffset"].astype(np.int64)
                nxt = base + arr["batchSize"]
                starts = np.concatenate([[prev_end if prev_end is not None else base[0]], nxt[:-1]])
                gap = np.flatnonzero(base != starts)
                if len(gap):
                    j = int(gap[0])
                    self._add("BCQ_OFFSET_GAP", seg, j, f"unit at msgBaseOffset {int(base[j])} follows a unit that ends at "
                              f"{int(starts[j])}: queue offsets {min(int(starts[j]), int(base[j]))}.."
                              f"{max(int(starts[j]), int(base[j])) - 1} are {'missing' if base[j] > starts[j] else 'covered twice'}",
                              rank=int(base[j]), queueOffset=int(base[j]), count=len(gap))
                prev_end = int(nxt[-1])
        self._check_hole()
        self.deferred = Deferred()
        self.last_found = -1

    def take_partial(self):
        """See :meth:`.windows.QueueWindows.take_partial`."""
        got = (self.agg, self.deferred, self.last_found)
        self.agg, self.deferred, self.last_found = _Agg(), Deferred(), -1
        return got if got[0] or got[1] or got[2] >= 0 else None

    def merge_partial(self, got) -> None:
        agg, deferred, last_found = got
        self.agg.merge(agg)
        self.deferred.merge(deferred)
        self.last_found = max(self.last_found, last_found)

    def _add(self, code, seg, unit: int, text: str, *, rank, count: int = 1, **extra) -> None:
        self.agg.add(self.group, code, ERROR, seg.path, unit * BCQ_UNIT_SIZE, text, rank=rank, topic=self.topic,
                     queueId=self.qid, **extra)
        if count > 1:
            self.agg.count[(self.group, code)] += count - 1

    def _check_hole(self) -> None:
        """Non-zero units after the queue's end: data the broker cannot reach."""
        segs = self.bcq.segments.segments
        if not self.files:
            return
        last_seg, arr, _, _ = self.files[-1]
        k = segs.index(last_seg)
        for j, seg in enumerate(segs[k:]):
            units = self.bcq.file_units(seg)
            rest = units[len(arr):] if j == 0 else units
            if len(rest) and np.frombuffer(rest.tobytes(), np.uint8).any():
                stop = len(arr) if j == 0 else 0
                bad = "" if j else f" (unit {len(arr)} fails the broker's validity test)"
                self._add("BCQ_HOLE", last_seg if j == 0 else seg, stop, f"units after the end of the batch queue{bad}: the "
                          "broker treats the queue as ending at the first invalid unit and cannot reach them", rank=None)
                return
        # a file after a gap in the file names is unreachable too
        names = [s.start for s in segs]
        if len(names) > k + 1 and any(b - a != self.bcq.file_size for a, b in zip(names[k:], names[k + 1:])):
            self._add("BCQ_HOLE", segs[-1], 0, "files after a gap in the batch queue's file names: the broker "
                      "cannot reach them", rank=None)

    def window(self, lo: int, hi: int, recs, marks: np.ndarray) -> int | None:
        """The units pointing into [lo, hi) against the records ``recs`` of that range; marks the records found;
        returns the end of the furthest record found."""
        found_end = None
        for seg, arr, phy, ordered in self.files:
            if ordered:
                a, b = int(np.searchsorted(phy, lo)), int(np.searchsorted(phy, hi))
                sel = np.arange(a, b, dtype=np.int64)
            else:
                sel = np.flatnonzero((phy >= lo) & (phy < hi))
            if not len(sel):
                continue
            idx, ok = recs.lookup(phy[sel])
            if not ok.all():
                self.deferred.add(seg.start // BCQ_UNIT_SIZE + sel[~ok], phy[sel[~ok]])
            sel, idx = sel[ok], idx[ok]
            if not len(sel):
                continue
            marks[idx] = True
            self.last_found = max(self.last_found, seg.start // BCQ_UNIT_SIZE + int(sel[-1]))
            end = int((phy[sel] + recs.c["size"][idx]).max())
            found_end = end if found_end is None else max(found_end, end)
            self._check_found(seg, arr, sel, idx, recs)
        return found_end

    def _check_found(self, seg, arr, sel, idx, recs) -> None:
        c = recs.c
        u = arr[sel]
        base, num, unparsable = record_batch_fields(self.store, recs, idx)
        tran = c["sysFlag"][idx] & 0xC
        checks = [
            ("CQ_SIZE", u["size"] != c["size"][idx], lambda j, r: f"size {int(u['size'][j])}, the record's TOTALSIZE is "
             f"{int(c['size'][r])}"),
            ("CQ_TOPIC", c["topic"][idx] != recs.topic_ids.get(self.topic, -1),
             lambda j, r: f"points at a record of topic {recs.topic(r)!r}"),
            ("CQ_QUEUE_ID", c["queueId"][idx] != self.qid, lambda j, r: f"points at a record of queue {int(c['queueId'][r])}"),
            ("CQ_TRAN_TYPE", (tran != TRANSACTION_NOT) & (tran != TRANSACTION_COMMIT),
             lambda j, r: "points at a prepared/rollback transaction record, which the broker never dispatches"),
            ("BCQ_BATCH_FIELDS", unparsable, lambda j, r: "the record's INNER_NUM/INNER_BASE do not parse (the broker "
             "reads the record as invalid)"),
            ("BCQ_BASE_OFFSET", u["msgBaseOffset"] != base, lambda j, r: f"msgBaseOffset {int(u['msgBaseOffset'][j])}, the "
             f"record's {'INNER_BASE' if num[j] != 1 or base[j] != c['queueOffset'][r] else 'QUEUEOFFSET'} is {int(base[j])}"),
            ("BCQ_BATCH_SIZE", u["batchSize"] != num, lambda j, r: f"batchSize {int(u['batchSize'][j])}, the record holds "
             f"{int(num[j])} message(s) (INNER_NUM)"),
            ("CQ_TAGS", ~c["tagsBad"][idx] & (u["tagsCode"] != c["tagsCode"][idx]),
             lambda j, r: f"tagsCode {int(u['tagsCode'][j])}, the record's TAGS give {int(c['tagsCode'][r])}"),
            ("BCQ_STORE_TIME", u["storeTime"] != c["storeTimestamp"][idx],
             lambda j, r: f"storeTime {int(u['storeTime'][j])}, the record's STORETIMESTAMP is {int(c['storeTimestamp'][r])}"),
        ]
        bad = np.zeros(len(sel), dtype=bool)
        for code, mask, text in checks:
            mask = np.asarray(mask, bool) & ~bad
            hit = np.flatnonzero(mask)
            if len(hit):
                j = int(hit[0])
                r = int(idx[j])
                qo = int(u["msgBaseOffset"][j])
                self._add(code, seg, int(sel[j]), f"unit at msgBaseOffset {qo}: {text(j, r)}", rank=qo, queueOffset=qo,
                          phyOffset=int(u["phyOffset"][j]), count=len(hit))
            bad |= mask

    def finish(self, refs: _RefClassifier, findings: list) -> None:
        pos, phy, status = self.deferred.resolve(refs, self.last_found)
        segs = {s.start // BCQ_UNIT_SIZE: s for s, _, _, _ in self.files}
        per_file = self.bcq.file_size // BCQ_UNIT_SIZE
        for p, ph in zip(pos[status == refs.MISSING].tolist(), phy[status == refs.MISSING].tolist()):
            seg = segs.get(p - p % per_file) if per_file else None
            if seg is None:
                continue
            self._add("CQ_NO_RECORD", seg, p - seg.start // BCQ_UNIT_SIZE, f"unit at file position "
                      f"{(p - seg.start // BCQ_UNIT_SIZE) * BCQ_UNIT_SIZE} points at {ph}, where no commitlog record starts",
                      rank=p, phyOffset=ph)
        findings += self.agg.findings()

