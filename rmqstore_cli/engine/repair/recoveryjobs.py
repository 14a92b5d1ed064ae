"""``recover -j`` / ``truncate -j``: recovery's commitlog walk (§13.4, CommitLog.recoverAbnormally /
recoverNormally) with whole segments walked by forked workers.

Records never cross a segment file and the broker's walk goes from one file into the next only past a BLANK
at its end, so each segment can be walked alone from its start, with the same record test (CRC included), as
the one walk would reach it. The workers hand back, in log order, what the walk's sinks gather: the running
:class:`~..log.walk.LogTally` of the segment and the inputs of the consume-queue put prediction (per dispatched
record: offset, size, topic, queue id, QUEUEOFFSET; the rules themselves are sequential per queue, so they run
here, as :class:`~..derived.dispatchpredict.DispatchPrediction` runs them in one walk). This process folds the
segments in in order and stops where the one walk stops: the first segment that does not end in a BLANK
(or the last one); what workers made past it is dropped unread.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats import fast

from ..arrays import queue_key, queue_of_key
from ..derived.dispatchpredict import DispatchPrediction
from ..log.walk import LogTally, WalkStop, broker_walk
from .probes import SegmentFrom

HAND_OVER = 1 << 16  # dispatched records a worker gathers before handing them over (~2.6 MB)
CHUNK = 8192  # records per chunk of a worker's walk (broker_walk's default)


class _PredictionInputs(DispatchPrediction):
    """In a worker: the records DispatchPrediction would run its put rules on, kept (not applied) and handed over
    in log order; topic ids are this segment's own, sent with their names.

    A record its queue already holds a unit for by the rules' first test (it ends at or before the queue's
    maxPhysicOffset as the walk found it: ``proto.state``, the state before any record, inherited by the fork) is
    not handed over: that maxPhysicOffset only grows as the rules run, so the rules skip the record whatever the
    records before it did. After a crash the queues are mostly complete: the workers hand over only the records
    past each queue's last unit, not every record of the log."""

    def __init__(self, proto: DispatchPrediction):
        super().__init__({}, proto.multi_dispatch, {}, ())
        self.held = 0
        self.initial = proto.state
        self._names: list = []
        self._limits: dict = {}  # (segment's topic id, queue id) -> the queue's maxPhysicOffset before any record

    def _limit(self, key: int) -> int:
        got = self._limits.get(key)
        if got is None:
            tid, qid = queue_of_key(key)  # the state's keys hold the queue id signed
            if tid >= len(self._names):
                self._names = [None] * len(self.topics)
                for name, v in self.topics.items():
                    self._names[v] = name
            st = self.initial.get((self._names[tid], qid))
            got = self._limits[key] = int(st[1]) if st is not None else -(1 << 62)  # a new queue: every record counts
        return got

    def add(self, phy, size, tid, qid, qo) -> None:
        phy, size, tid, qid, qo = (np.asarray(a, np.int64) for a in (phy, size, tid, qid, qo))
        if len(phy):
            keys, inv = np.unique(queue_key(tid, qid), return_inverse=True)
            limit = np.asarray([self._limit(k) for k in keys.tolist()], np.int64)[inv]
            keep = phy + size > limit
            if not keep.all():
                rows = np.flatnonzero(keep)
                phy, size, tid, qid, qo = phy[rows], size[rows], tid[rows], qid[rows], qo[rows]
        if not len(phy):
            return
        self._parts.append((phy, size, tid, qid, qo))
        self.held += len(phy)

    def flush(self) -> None:  # the rules run in the main process
        pass

    def take(self) -> tuple:
        names = [None] * len(self.topics)
        for k, v in self.topics.items():
            names[v] = k
        out = (self.count, names, self._parts)
        self.count, self._parts, self.held = 0, [], 0
        return out


def _feed(pred: DispatchPrediction, inputs: tuple) -> None:
    count, names, parts = inputs
    pred.count += count
    if not parts:
        return
    ids = np.asarray([pred.topics.setdefault(n, len(pred.topics)) for n in names], np.int64)
    for phy, size, tid, qid, qo in parts:
        pred.add(phy, size, ids[tid], qid, qo)


class _SegmentWalked:
    """A segment's last item: its tally, the rest of its prediction inputs and where its walk stopped."""

    def __init__(self, tally: LogTally, inputs, stop: WalkStop):
        self.tally, self.inputs, self.stop = tally, inputs, stop


def _walk_segment(i: int, segments, cfg, version: int, start_index: int, check_crc: bool, proto):
    k = start_index + i
    seg = segments[k]
    tally = LogTally()
    coll = _PredictionInputs(proto) if proto is not None else None

    def sink(seg_start, buf, h):
        tally(seg_start, buf, h)
        if coll is not None:
            coll(seg_start, buf, h)
            return coll.held >= HAND_OVER
        return False

    pos = 0
    while True:
        stop = broker_walk([SegmentFrom(seg, pos) if pos else seg], cfg, version, 0, check_crc, sink, chunk=CHUNK)
        if stop.kind == fast.STOP_CHUNK:
            yield coll.take()
            pos = stop.offset - seg.start
            continue
        stop.segment_index, stop.position = k, stop.offset - seg.start
        yield _SegmentWalked(tally, coll.take() if coll is not None else None, stop)
        return


def broker_walk_jobs(segments, cfg, version: int, start_index: int, check_crc: bool, tally: LogTally,
                     pred: DispatchPrediction | None, jobs: int) -> WalkStop:
    """``broker_walk(segments, cfg, version, start_index, check_crc, sink)`` with ``sink`` = ``tally`` then
    ``pred`` (if any), the segments walked by ``jobs`` forked processes: the same stop, tally and prediction.
    ``pred`` must not predict batch consume queues (their puts need the record bytes: the caller walks alone)."""
    from rmqstore_cli.formats.warmup import warm_up

    from ..parallel import stream_segments

    warm_up()  # the compiled kernels loaded once here, before the fork
    n = len(segments) - start_index
    k = start_index
    # a worker through its segment takes the next one nobody has (each segment is walked from its start alone)
    stream = stream_segments(_walk_segment, n, jobs, segments, cfg, version, start_index, check_crc, pred, balance=True)
    try:
        for item in stream:
            if not isinstance(item, _SegmentWalked):
                _feed(pred, item)
                continue
            tally.merge(item.tally)
            if pred is not None:
                _feed(pred, item.inputs)
            stop = item.stop
            if stop.kind == fast.STOP_BLANK and k + 1 < len(segments):
                k += 1
                continue
            return stop
    finally:
        stream.close()
    raise AssertionError("the walk of the last segment ends it")  # pragma: no cover
