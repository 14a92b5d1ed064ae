"""verify's checks of the timer store (stable ``TM_*`` codes, docs/timer.md).

One walk of the timerlog (compiled, chunked) with doEnqueue's wheel replayed beside it gives, for every
unit, the prevPos the broker wrote and, at the end, the wheel the timerlog builds; each chunk's units
are resolved against the commitlog. The on-disk wheel is then compared slot by slot with the replayed
one, the checkpoint with the timerlog's end and the timer queue, the metrics with the pending units.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats.timer import TIMER_UNIT_SIZE, WHEEL_FILE_SIZE, WHEEL_SLOTS

from ..findings import ERROR, INFO, WARNING, Finding
from .files import TimerLogWalk
from .report import pending_summary
from .store import (MSG_GONE, MSG_NOT_RECORD, MSG_OK, MSG_WRONG_SIZE, MSG_WRONG_TOPIC, TimerStore, Wheel)

DETAIL_LIMIT = 20  # findings of one code listed one by one; the rest are counted in one more finding


class _Sink:
    """Findings with a per-code cap (a damaged timerlog can have millions of bad units)."""

    def __init__(self, findings: list):
        self.findings = findings
        self.count: dict[str, int] = {}
        self.shown: dict[str, int] = {}  # listed one by one so far
        self.extra: dict[str, int] = {}  # counted without a Finding (see listed)
        self.first: dict[str, Finding] = {}

    def add(self, code, severity, path, offset, message, **extra) -> None:
        self.count[code] = self.count.get(code, 0) + 1
        shown = self.shown.get(code, 0)
        if shown < DETAIL_LIMIT:
            f = Finding(code, severity, path, offset, message, extra)
            self.findings.append(f)
            self.first.setdefault(code, f)
            self.shown[code] = shown + 1

    def listed(self, code: str, rows: np.ndarray) -> np.ndarray:
        """The first of ``rows`` that code still lists one by one; the others are only counted (a
        timerlog of millions of expired units costs no Python work per unit)."""
        room = max(0, DETAIL_LIMIT - self.shown.get(code, 0))
        if len(rows) > room:
            self.extra[code] = self.extra.get(code, 0) + len(rows) - room
        return rows[:room]

    def close(self) -> None:
        for code, n in self.count.items():
            n += self.extra.get(code, 0)
            if n > DETAIL_LIMIT:
                f = self.first[code]
                self.findings.append(Finding(code, f.severity, f.path, None,
                                             f"... and {n - DETAIL_LIMIT} more like it ({n} in all)", {"count": n}))


def check_timer_store(store, findings: list) -> dict:
    """Add the timer store's findings; returns verify's ``timer`` summary ({} when there is none)."""
    ts = TimerStore(store)
    try:
        if not ts.present:
            return {}
        return _check(ts, _Sink(findings))
    finally:
        ts.close()


def _check(ts: TimerStore, sink: _Sink) -> dict:
    findings = sink.findings
    findings += ts.timerlog.segments.problems
    walk = TimerLogWalk()
    wheel = Wheel.empty()
    floor = ts.timerlog.min_offset

    late = _LateUnits(ts)

    def checked():
        for sc in ts.scan(walk, wheel):
            _check_units(ts, sc, floor, sink)
            late.add(sc)
            yield sc

    summary = pending_summary(ts, chunks=checked())  # one walk: the unit checks and the pending counts
    _check_file_ends(ts, walk, sink)
    _check_wheel(ts, wheel, walk, sink, late)
    _check_checkpoint(ts, walk, sink)
    _check_metrics(ts, summary, sink)
    sink.close()
    return {"units": walk.units, "timerlogEnd": walk.data_end, "precisionMs": ts.precision_ms,
            "pending": summary["pending"], "pendingByTopic": summary["pendingByTopic"]}


def _where(ts: TimerStore, pos: int) -> tuple[str, int | None]:
    seg = ts.timerlog.segments.find(pos)
    return (seg.path, pos - seg.start) if seg else (ts.timerlog.directory, None)


def _check_units(ts: TimerStore, sc, floor: int, sink: _Sink) -> None:
    u, m = sc.units, sc.msgs
    read_from = ts.read_time_ms
    # prevPos: the slot's previous unit, as the replay of doEnqueue says; a chain that started in a
    # deleted file (prevPos below the first file) is history, not damage
    bad_prev = (u.prevPos != sc.expected_prev) & ~((sc.expected_prev == -1) & (u.prevPos >= 0) & (u.prevPos < floor))
    for i in sink.listed("TM_PREV_POS", np.flatnonzero(bad_prev)).tolist():
        path, off = _where(ts, int(u.pos[i]))
        sink.add("TM_PREV_POS", ERROR, path, off,
                 f"unit at {int(u.pos[i])} has prevPos {int(u.prevPos[i])}, but the previous unit of its slot "
                 f"({int(u.slot_time[i])} ms) is {int(sc.expected_prev[i])}: the slot's chain leaves it or breaks",
                 timerlogPos=int(u.pos[i]), prevPos=int(u.prevPos[i]), expectedPrevPos=int(sc.expected_prev[i]))
    pending = u.slot_time >= read_from
    codes = ((m.state == MSG_GONE) & pending, (m.state == MSG_GONE) & ~pending, m.state == MSG_WRONG_SIZE,
             m.state == MSG_NOT_RECORD, m.state == MSG_WRONG_TOPIC)
    shown = [sink.listed(code, np.flatnonzero(rows)) for code, rows in
             zip(("TM_MSG_GONE", "TM_MSG_EXPIRED", "TM_MSG_SIZE", "TM_MSG_OFFSET", "TM_MSG_TOPIC"), codes)]
    for i in np.sort(np.concatenate(shown)).tolist():
        st = int(m.state[i])
        path, off = _where(ts, int(u.pos[i]))
        where = f"unit at {int(u.pos[i])} points at commitlog offset {int(u.offsetPy[i])} size {int(u.sizePy[i])}"
        extra = dict(timerlogPos=int(u.pos[i]), offsetPy=int(u.offsetPy[i]), sizePy=int(u.sizePy[i]),
                     pending=bool(pending[i]))
        if st == MSG_GONE:
            if pending[i]:
                sink.add("TM_MSG_GONE", ERROR, path, off, f"{where}: no record there (the log ends before it or was "
                         "deleted); this pending message cannot be delivered", **extra)
            else:
                sink.add("TM_MSG_EXPIRED", INFO, path, off, f"{where}: no record there any more (already fired)", **extra)
        elif st == MSG_WRONG_SIZE:
            sink.add("TM_MSG_SIZE", ERROR, path, off, f"{where}: the record there has another size", **extra)
        elif st == MSG_NOT_RECORD:
            sink.add("TM_MSG_OFFSET", ERROR, path, off, f"{where}: not the start of a record (inside one, or garbage)",
                     **extra)
        elif st == MSG_WRONG_TOPIC:
            sink.add("TM_MSG_TOPIC", ERROR, path, off, f"{where}: the record there is not in rmq_sys_wheel_timer", **extra)
    ok = m.state == MSG_OK
    bad_hash = ok & m.has_topic & (m.topic_hash != u.realTopicHash)
    for i in sink.listed("TM_TOPIC_HASH", np.flatnonzero(bad_hash)).tolist():
        path, off = _where(ts, int(u.pos[i]))
        sink.add("TM_TOPIC_HASH", ERROR, path, off,
                 f"unit at {int(u.pos[i])} has real-topic hash {int(u.realTopicHash[i])}, but its record's REAL_TOPIC "
                 f"{m.text(ts.store, i, 'REAL_TOPIC')!r} hashes to {int(m.topic_hash[i])} (timer metrics go to the wrong topic)",
                 timerlogPos=int(u.pos[i]))
    for i in sink.listed("TM_NO_REAL_TOPIC", np.flatnonzero(ok & ~m.has_topic)).tolist():
        path, off = _where(ts, int(u.pos[i]))
        sink.add("TM_NO_REAL_TOPIC", ERROR, path, off, f"unit at {int(u.pos[i])}: its record has no REAL_TOPIC; the "
                 "timer cannot deliver it", timerlogPos=int(u.pos[i]))


def _check_file_ends(ts: TimerStore, walk: TimerLogWalk, sink: _Sink) -> None:
    fsize = ts.timerlog.file_size
    for k, end in enumerate(walk.ends):
        rel = end.end - end.start
        if end.kind == "blank":
            left = fsize - rel
            if end.blank_size != left or end.blank_zero != 0 or left >= TIMER_UNIT_SIZE + 16:
                sink.add("TM_BLANK", ERROR, end.path, rel,
                         f"end-of-file blank at {end.end}: size field {end.blank_size}, {left} bytes left"
                         f"{' (a unit still fitted)' if left >= TIMER_UNIT_SIZE + 16 else ''}", timerlogPos=end.end)
        elif end.kind in ("bad_size", "bad_magic"):
            what = "size is not 52" if end.kind == "bad_size" else "magic has bits outside the four flags"
            sink.add("TM_UNIT_SIZE" if end.kind == "bad_size" else "TM_UNIT_MAGIC", ERROR, end.path, rel,
                     f"unit at {end.end}: {what}; the broker's recovery truncates the timerlog here", timerlogPos=end.end)
        elif end.kind == "eof" and k + 1 < len(ts.timerlog.segments.segments):
            sink.add("TM_BLANK", ERROR, end.path, rel, f"file ends at {end.end} without an end-of-file blank",
                     timerlogPos=end.end)
    if walk.stop is not None:
        later = [s for s in ts.timerlog.segments if s.start > walk.stop.start]
        if later:
            sink.add("TM_NO_BLANK", ERROR, walk.stop.path, walk.stop.end - walk.stop.start,
                     f"the timerlog's units end at {walk.stop.end} but {len(later)} later file(s) exist: the broker's "
                     "recovery deletes them", timerlogPos=walk.stop.end)


class _LateUnits:
    """Units after timercheck's lastTimerLogFlushPos on a store that did not shut down cleanly. The
    broker keeps the wheel in memory and writes it out with each flush round (TimerWheel.flush), so the
    wheel on disk may not hold them yet; its recovery re-links those slots from the timerlog
    (recoverAndRevise). A slot that is exactly what it was before them is behind, not damaged."""

    LIMIT = 1 << 20  # past this many, no slot is excused (a checkpoint that far behind is not a flush lag)

    def __init__(self, ts: TimerStore):
        cp = ts.checkpoint
        self.on = cp.exists and ts.store.abort_exists
        self.flush_pos = cp.lastTimerLogFlushPos
        self.n = 0
        self.slots = None  # (time, prevPos of the first late unit, num change) per slot index, once one comes

    def add(self, sc) -> None:
        if not self.on:
            return
        sel = np.flatnonzero(sc.units.pos >= self.flush_pos)
        self.n += len(sel)
        if self.n > self.LIMIT:
            self.on, self.slots = False, None
        elif len(sel):
            from rmqstore_cli.formats import timerkernel as k

            if self.slots is None:
                self.slots = (np.full(WHEEL_SLOTS, -1, np.int64), np.zeros(WHEEL_SLOTS, np.int64),
                              np.zeros(WHEEL_SLOTS, np.int64))
            u = sc.units
            k.late_slots(sc.slot_units[sel], u.prevPos[sel], u.magic[sel], *self.slots)

    def before(self, t: int, first: int, num: int) -> tuple[int, int, int] | None:
        """(firstPos, lastPos, num) slot time ``t`` had before the late units (lastPos -1: it was empty);
        None when no late unit went there."""
        if not self.on or self.slots is None:
            return None
        time, prev, delta = self.slots
        i = t % WHEEL_SLOTS
        if time[i] != t:
            return None
        last = int(prev[i])
        return (first if last != -1 else -1, last, num - int(delta[i]))


def _check_wheel(ts: TimerStore, wheel: Wheel, walk: TimerLogWalk, sink: _Sink, late: _LateUnits) -> None:
    path = ts.wheel.path
    if not ts.wheel.exists:
        if walk.units:
            sink.add("TM_WHEEL_MISSING", ERROR, path, None, "timerwheel is missing but the timerlog holds units "
                     "(`rmqstore rebuild timer` writes it from the timerlog)")
        return
    if ts.wheel.size != WHEEL_FILE_SIZE:
        sink.add("TM_WHEEL_SIZE", ERROR, path, 0, f"timerwheel is {ts.wheel.size} bytes, not {WHEEL_FILE_SIZE}")
    seen = np.zeros(len(wheel.time), bool)  # the slot on disk holds the replayed time
    for idx, recs in ts.wheel.nonempty():
        exp_t = wheel.time[idx]
        t = recs["timeUnits"].astype(np.int64)
        seen[idx] = exp_t == t
        first, last, num = (recs[f].astype(np.int64) for f in ("firstPos", "lastPos", "num"))
        same = exp_t == t
        cut = wheel.cut[idx] == 1
        bad_num = same & ~cut & (num != wheel.num[idx])
        bad_pos = same & ((last != wheel.last[idx]) | (~cut & (first != wheel.first[idx])))
        # a slot no unit went to: fine when its chain is history (before the timerlog's first file)
        stray = ~same & (exp_t < t) & (last >= ts.timerlog.min_offset)
        for j in np.flatnonzero(bad_num | bad_pos | stray).tolist():
            i = int(idx[j])
            ms = int(t[j]) * ts.precision_ms
            extra = dict(slotIndex=i, timeMs=ms, firstPos=int(first[j]), lastPos=int(last[j]), num=int(num[j]))
            if stray[j]:
                sink.add("TM_SLOT_STRAY", ERROR, path, i * 32, f"slot {i} ({ms} ms) points at {int(last[j])} but no "
                         "timerlog unit belongs to it", **extra)
                continue
            want = dict(expectedFirstPos=int(wheel.first[i]), expectedLastPos=int(wheel.last[i]),
                        expectedNum=int(wheel.num[i]))
            pre = late.before(int(t[j]), int(wheel.first[i]), int(wheel.num[i]))
            if pre is not None and pre == (int(first[j]), int(last[j]), int(num[j])):
                sink.add("TM_WHEEL_BEHIND", INFO, path, i * 32, f"slot {i} ({ms} ms) lacks the units written after "
                         "the last flush (the broker stopped without shutting down); its recovery re-links the slot",
                         **extra, **want)
                continue
            if bad_num[j]:  # num feeds the timer's metrics and distribution, not the delivery walk
                sink.add("TM_SLOT_NUM", WARNING, path, i * 32, f"slot {i} ({ms} ms) says num {int(num[j])}, its chain has "
                         f"{int(wheel.num[i])} units", **extra, **want)
            if bad_pos[j]:
                sink.add("TM_SLOT_POS", ERROR, path, i * 32, f"slot {i} ({ms} ms) has firstPos {int(first[j])} lastPos "
                         f"{int(last[j])}; its chain runs {int(wheel.first[i])} .. {int(wheel.last[i])}", **extra, **want)
    # slots the timerlog fills that the wheel lacks: pending ones are never delivered
    read_units = ts.read_time_ms // ts.precision_ms
    missing = np.flatnonzero((wheel.time >= 0) & ~seen & (wheel.time >= read_units))
    for i in missing.tolist():
        ms = int(wheel.time[i]) * ts.precision_ms
        pre = late.before(int(wheel.time[i]), int(wheel.first[i]), int(wheel.num[i]))
        if pre is not None and pre[1] == -1:
            sink.add("TM_WHEEL_BEHIND", INFO, path, i * 32, f"slot {i} ({ms} ms) is not on disk yet: its units were "
                     "written after the last flush; the broker's recovery re-links the slot", slotIndex=i, timeMs=ms)
            continue
        sink.add("TM_SLOT_MISSING", ERROR, path, i * 32, f"slot {i} ({ms} ms) is empty but {int(wheel.num[i])} pending "
                 f"timerlog unit(s) belong to it (last at {int(wheel.last[i])}): they would never be delivered",
                 slotIndex=i, timeMs=ms, expectedLastPos=int(wheel.last[i]), expectedNum=int(wheel.num[i]))


def _check_checkpoint(ts: TimerStore, walk: TimerLogWalk, sink: _Sink) -> None:
    cp = ts.checkpoint
    if not cp.exists:
        if walk.units:
            sink.add("TM_CHECK_MISSING", WARNING, cp.path, None, "config/timercheck is missing: the broker restarts the "
                     "timer from the wheel's oldest time and queue offset 0")
        return
    if cp.lastTimerLogFlushPos > walk.data_end:
        sink.add("TM_CHECK_AHEAD", ERROR, cp.path, 8, f"lastTimerLogFlushPos {cp.lastTimerLogFlushPos} is past the "
                 f"timerlog's end {walk.data_end}", lastTimerLogFlushPos=cp.lastTimerLogFlushPos, timerlogEnd=walk.data_end)
    cq = ts.timer_queue()
    end = cq.bounds()[1] if cq is not None else 0
    for name, at in (("lastTimerQueueOffset", 16), ("masterTimerQueueOffset", 24)):
        v = getattr(cp, name)
        if v > end:
            # after a crash the queue may not hold what the timer read yet: the broker's recovery
            # re-dispatches it and clamps the offset to the queue
            sink.add("TM_CHECK_QUEUE", INFO if ts.store.abort_exists else WARNING, cp.path, at,
                     f"{name} {v} is past the end of the timer queue rmq_sys_wheel_timer/0 ({end}); the broker "
                     "clamps it to the queue at start", **{name: v, "queueEnd": end})
    if cp.lastTimerQueueOffset < end and walk.units:
        sink.add("TM_UNREAD", INFO, cp.path, 16, f"{end - cp.lastTimerQueueOffset} timer-queue record(s) after "
                 f"offset {cp.lastTimerQueueOffset} are not in the timerlog yet (the timer reads them on start)")


def _check_metrics(ts: TimerStore, summary: dict, sink: _Sink) -> None:
    tm = ts.metrics
    if tm.error:
        sink.add("TM_METRICS", WARNING, tm.path, None, f"{tm.error}; the broker starts with empty counts")
        return
    if not tm.exists:
        return
    pending = summary["pendingByTopic"]
    for topic in sorted(set(pending) | {t for t, c in tm.counts.items() if c}):
        have, says = pending.get(topic, 0), tm.counts.get(topic, 0)
        if have != says:
            # info: the broker persists the metrics now and then, not at shutdown (the clean sample's are
            # 27 s older than its stop), so a count can trail the timerlog on an undamaged store
            sink.add("TM_METRICS", INFO, tm.source or tm.path, None,
                     f"timermetrics counts {says} pending for {topic!r}, the timerlog holds {have} (the broker "
                     "persists these counts periodically)", topic=topic, metricsCount=says, pending=have)
