"""Repairs of the 5.x timer store, planned like every repair (changes listed first, bytes backed up
before they are overwritten) and ending with a timer store verify finds nothing in.

What the broker's ``TimerMessageStore.recover`` does at start, and what is planned here:

* it walks the timerlog from the checkpoint's flush position (one file back) and truncates it at the
  first unit whose size or magic is wrong (``recoverAndRevise``): so does :func:`plan_timer_repair`;
* it re-links the wheel's slots to the units it read (``TimerWheel.reviseSlot``): here the whole wheel
  is replayed from the timerlog (``doEnqueue``'s bookkeeping), which also repairs num and firstPos
  (``rebuild timer`` is that step alone);
* units whose record is gone are kept by the broker and skipped when their slot fires (the message is
  lost; after the commitlog grows again the offset names another record). When the commitlog is cut
  (``recover``/``truncate``), the units at the timerlog's tail whose records lie past the new end are cut
  too, like the broker's own truncation of a timerlog tail; their messages went with the commitlog.
  A unit in the middle whose record is gone is left (reported);
* the timer queue offsets are clamped to the timer queue (``recover`` clamps currQueueOffset to the
  queue's max offset), the flush position to the timerlog's end.

Beyond the broker: a unit whose prevPos does not name the previous unit of its slot gets it back (the
broker would walk into another slot's chain and lose the rest of this one); a unit whose offsetPy points
into the record of its own size in the timer queue is pointed at that record's start; timermetrics is
rewritten with the pending counts when a cut drops pending messages.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from rmqstore_cli.formats.timer import (TIMER_CHECKPOINT_DTYPE, TIMER_SLOT_SIZE, TIMER_UNIT_SIZE, WHEEL_FILE_SIZE, encode_slot)

from ..timer.files import TimerLogWalk
from ..timer.report import pending_summary
from ..timer.store import MSG_NOT_RECORD, MSG_OK, MSG_WRONG_SIZE, TimerStore, Wheel, resolve_messages


@dataclass
class TimerEdit:
    path: str
    offset: int
    data: bytes
    why: str

    def as_json(self) -> dict:
        return {"action": "timer_write", "path": self.path, "offset": self.offset, "length": len(self.data), "why": self.why}


@dataclass
class TimerRepair:
    edits: list = field(default_factory=list)  # TimerEdit
    cut_at: int | None = None  # timerlog position: units from here on are removed
    cut_units: int = 0
    move_files: list = field(default_factory=list)  # timerlog files wholly past the cut
    new_wheel: bool = False  # write a fresh timerwheel file (missing or wrong size)
    metrics: dict | None = None  # timingCount to write to config/timermetrics
    notes: list = field(default_factory=list)
    left: list = field(default_factory=list)  # what the repair cannot fix (one line each)
    fixed_units: set = field(default_factory=set)  # timerlog positions of the units edited
    cut_pending_after: int = 0  # pending units past a damaged unit the cut is at
    cut_pending: dict = field(default_factory=dict)  # real topic -> pending messages the cut drops

    @property
    def empty(self) -> bool:
        return not (self.edits or self.cut_at is not None or self.move_files or self.new_wheel or self.metrics is not None)

    def actions(self) -> list[dict]:
        out = [e.as_json() for e in self.edits[:50]]
        if len(self.edits) > 50:
            out.append({"action": "timer_write", "why": f"... and {len(self.edits) - 50} more"})
        if self.cut_at is not None:
            out.append({"action": "timer_cut", "offset": self.cut_at,
                        "why": f"{self.cut_units} timerlog unit(s) from {self.cut_at} point past the commitlog's end "
                               "or follow a unit the broker's recovery stops at"})
        out += [{"action": "move_aside", "path": p, "why": "timerlog file past the cut"} for p in self.move_files]
        if self.new_wheel:
            out.append({"action": "timer_wheel", "why": "timerwheel written anew from the timerlog"})
        if self.metrics is not None:
            out.append({"action": "timer_metrics", "why": "timermetrics counts set to the pending messages",
                        "timingCount": self.metrics})
        return out


def plan_timer_repair(store, *, commitlog_end: int | None = None, queue_end: int | None = None,
                      units: bool = True, wheel_only: bool = False) -> TimerRepair:
    """The changes that make the timer store consistent with the commitlog (ending at ``commitlog_end``
    after the repair, the timer queue at ``queue_end``); ``wheel_only``: the wheel alone (rebuild timer)."""
    ts = TimerStore(store)
    try:
        rep = TimerRepair()
        if not ts.present:
            return rep
        cut_at, stop = _cut_position(ts, commitlog_end, wheel_only)
        while not wheel_only and cut_at is not None and _restore_unit(ts, cut_at, rep):
            cut_at, stop = _cut_position(ts, commitlog_end, wheel_only)  # the walk goes on past it now
        wheel = Wheel.empty()
        floor = ts.timerlog.min_offset
        for sc in ts.scan(TimerLogWalk(), wheel, resolve=False, stop_at=cut_at):
            if wheel_only or not units:
                continue
            u = sc.units
            bad = np.flatnonzero((u.prevPos != sc.expected_prev)
                                 & ~((sc.expected_prev == -1) & (u.prevPos >= 0) & (u.prevPos < floor)))
            for i in bad.tolist():
                path, off = _where(ts, int(u.pos[i]))
                rep.edits.append(TimerEdit(path, off + 4, int(sc.expected_prev[i]).to_bytes(8, "big", signed=True),
                                           f"unit {int(u.pos[i])}: prevPos {int(u.prevPos[i])} -> {int(sc.expected_prev[i])}"))
                rep.fixed_units.add(int(u.pos[i]))
            _repoint(ts, u, rep)
        if cut_at is not None:
            rep.cut_at = cut_at
            rep.cut_units = stop
            if not stop:  # a damaged unit the walk stops at: what lies after it is not walked
                rep.cut_units, rep.cut_pending_after = _units_after(ts, cut_at)
            rep.move_files = [s.path for s in ts.timerlog.segments if s.start >= cut_at]
        _plan_wheel(ts, wheel, rep)
        if not wheel_only:
            _plan_checkpoint(ts, rep, cut_at, queue_end)
            _plan_metrics(ts, rep, cut_at)
        return rep
    finally:
        ts.close()


def _where(ts: TimerStore, pos: int) -> tuple[str, int]:
    seg = ts.timerlog.segments.find(pos)
    return seg.path, pos - seg.start


def _cut_position(ts: TimerStore, commitlog_end: int | None, wheel_only: bool) -> tuple[int | None, int]:
    """(where the timerlog is cut, units removed): after the last unit whose record the commitlog still
    holds when a tail of units points past its end, else at the first unit the broker's recovery stops
    at (size or magic wrong); None when nothing is cut."""
    if wheel_only:
        return None, 0
    walk = TimerLogWalk()
    last_kept_end = ts.timerlog.min_offset
    positions = []  # (first pos, count) per chunk, to count what a cut removes
    for ch in ts.timerlog.walk(walk):
        positions.append(ch.pos)
        kept = np.ones(len(ch), bool) if commitlog_end is None else (ch.offsetPy + ch.sizePy <= commitlog_end)
        if kept.any():
            last_kept_end = int(ch.pos[np.flatnonzero(kept)[-1]]) + TIMER_UNIT_SIZE
    stop_bad = walk.stop is not None and walk.stop.kind in ("bad_size", "bad_magic")
    if commitlog_end is not None and positions and last_kept_end <= int(positions[-1][-1]):
        cut = last_kept_end
    elif stop_bad:
        cut = walk.stop.end
    else:
        return None, 0
    return cut, int(sum(int((p >= cut).sum()) for p in positions))


def _units_after(ts: TimerStore, pos: int) -> tuple[int, int]:
    """(units, pending units) that look whole after the damaged unit at ``pos``: what a cut there drops."""
    from rmqstore_cli.formats.timer import TIMER_UNIT_DTYPE

    units = pending = 0
    for seg in ts.timerlog.segments:
        if seg.start + seg.size <= pos:
            continue
        start = pos + TIMER_UNIT_SIZE - seg.start if seg.start <= pos else 0
        count = max(seg.size - start, 0) // TIMER_UNIT_SIZE
        if not count:
            continue
        a = np.frombuffer(seg.buffer(), TIMER_UNIT_DTYPE, count=count, offset=start)
        magic = a["magic"].astype(np.int64)
        whole = (a["size"] == TIMER_UNIT_SIZE) & ((magic | 0xF) == 0xF) & (magic != 0)
        slot = a["currWriteTime"].astype(np.int64) + a["delay"].astype(np.int64)
        units += int(whole.sum())
        pending += int((whole & (slot >= ts.read_time_ms) & ((magic & 4) == 0)).sum())
        del a
    return units, pending


def _restore_unit(ts: TimerStore, pos: int, rep: TimerRepair) -> bool:
    """A unit the broker's recovery would stop at (size or magic wrong) whose other fields still name a
    timer record of its real topic gets its size and magic back (magic: default, plus roll when the
    record's delivery time is after the unit's slot), so the units after it are kept. False: it cannot."""
    from rmqstore_cli.formats.timer import MAGIC_DEFAULT, MAGIC_ROLL, encode_unit, magic_ok

    unit = ts.timerlog.read_unit(pos)
    if unit is None or (unit["size"] == TIMER_UNIT_SIZE and magic_ok(unit["magic"])) or pos in rep.fixed_units:
        return False
    if unit["size"] == 0 and unit["magic"] == 0 and unit["offsetPy"] == 0:
        return False  # zeros: the end of the data, not a damaged unit
    m = resolve_messages(ts.store, np.array([unit["offsetPy"]], np.int64), np.array([unit["sizePy"]], np.int64))
    if m.state[0] != MSG_OK or not m.has_topic[0] or m.topic_hash[0] != unit["realTopicHash"]:
        return False
    if unit["currWriteTime"] % ts.precision_ms or unit["currWriteTime"] <= 0:
        return False
    slot = unit["currWriteTime"] + unit["delay"]
    magic = unit["magic"] if magic_ok(unit["magic"]) else MAGIC_DEFAULT | (MAGIC_ROLL if m.timer_out[0] > slot else 0)
    data = encode_unit(**{**unit, "size": TIMER_UNIT_SIZE, "magic": magic})
    path, at = _where(ts, pos)
    rep.edits.append(TimerEdit(path, at, data, f"unit {pos}: size {unit['size']} magic {unit['magic']} -> "
                               f"{TIMER_UNIT_SIZE} {magic} (its other fields name the timer record at {unit['offsetPy']})"))
    rep.fixed_units.add(pos)
    ts.timerlog.patches[pos] = data
    return True


def _repoint(ts: TimerStore, u, rep: TimerRepair) -> None:
    """Units whose offsetPy lands inside a timer-queue record of their own size: point at its start."""
    m = resolve_messages(ts.store, u.offsetPy, u.sizePy)
    bad = np.flatnonzero((m.state == MSG_NOT_RECORD) | (m.state == MSG_WRONG_SIZE))
    if not len(bad):
        return
    cq = ts.timer_queue()
    if cq is None:
        rep.left.append(f"{len(bad)} unit(s) point at no record and there is no timer queue to find theirs in")
        return
    q = cq.units()
    order = np.argsort(q.phy, kind="stable")
    phy, size = q.phy[order].astype(np.int64), q.size[order].astype(np.int64)
    for i in bad.tolist():
        off = int(u.offsetPy[i])
        j = int(np.searchsorted(phy, off, side="right")) - 1
        if j >= 0 and phy[j] < off < phy[j] + size[j] and size[j] == u.sizePy[i]:
            cand = resolve_messages(ts.store, phy[j:j + 1], size[j:j + 1])
            if cand.state[0] == MSG_OK and (not cand.has_topic[0] or cand.topic_hash[0] == u.realTopicHash[i]):
                path, at = _where(ts, int(u.pos[i]))
                rep.edits.append(TimerEdit(path, at + 28, int(phy[j]).to_bytes(8, "big", signed=True),
                                           f"unit {int(u.pos[i])}: offsetPy {off} -> {int(phy[j])} (the start of the "
                                           "timer record it points into)"))
                rep.fixed_units.add(int(u.pos[i]))
                continue
        rep.left.append(f"unit {int(u.pos[i])}: offsetPy {off} names no record and no timer record of size "
                        f"{int(u.sizePy[i])} holds it")


def _plan_wheel(ts: TimerStore, wheel: Wheel, rep: TimerRepair) -> None:
    """Slot writes that make the wheel the replayed one (slots whose chain began in a deleted file keep
    their num and firstPos); slots pointing into the timerlog that no unit fills are cleared."""
    path = ts.wheel.path
    if not ts.wheel.exists or ts.wheel.size != WHEEL_FILE_SIZE:
        rep.new_wheel = True
        disk_time = np.zeros(len(wheel.time), np.int64)
        disk = None
    else:
        disk = ts.wheel.slots()
        disk_time = disk["timeUnits"].astype(np.int64)
    used = wheel.time >= 0
    floor = ts.timerlog.min_offset
    for i in np.flatnonzero(used).tolist():
        t, first, last, num = int(wheel.time[i]), int(wheel.first[i]), int(wheel.last[i]), int(wheel.num[i])
        if disk is not None and wheel.cut[i] and disk_time[i] == t:
            first, num = int(disk["firstPos"][i]), int(disk["num"][i])
        want = encode_slot(timeUnits=t, firstPos=first, lastPos=last, num=num, magic=0)
        have = disk[i].tobytes() if disk is not None else b""
        if want != have:
            rep.edits.append(TimerEdit(path, i * TIMER_SLOT_SIZE, want, f"slot {i} ({t * ts.precision_ms} ms): "
                                       f"firstPos {first} lastPos {last} num {num}"))
    if disk is not None:
        # the same rule as verify's TM_SLOT_STRAY
        nonempty = (disk_time != 0) | (disk["firstPos"] != 0) | (disk["lastPos"] != 0) | (disk["num"] != 0)
        stray = np.flatnonzero(nonempty & (wheel.time < disk_time) & (disk["lastPos"].astype(np.int64) >= floor))
        for i in stray.tolist():
            rep.edits.append(TimerEdit(path, i * TIMER_SLOT_SIZE, bytes(TIMER_SLOT_SIZE),
                                       f"slot {i}: no timerlog unit belongs to it (cleared)"))


def _plan_checkpoint(ts: TimerStore, rep: TimerRepair, cut_at: int | None, queue_end: int | None) -> None:
    cp = ts.checkpoint
    walk_end = cut_at
    if walk_end is None:
        w = TimerLogWalk()
        for _ in ts.timerlog.walk(w):
            pass
        walk_end = w.data_end
    if cp.exists:
        if queue_end is None:
            cq = ts.timer_queue()
            queue_end = cq.units().end_offset if cq is not None else 0
        for name, limit in (("lastTimerLogFlushPos", walk_end), ("lastTimerQueueOffset", queue_end),
                            ("masterTimerQueueOffset", queue_end)):
            v = getattr(cp, name)
            at = TIMER_CHECKPOINT_DTYPE.fields[name][1]
            if v > limit:
                rep.edits.append(TimerEdit(cp.path, at, int(limit).to_bytes(8, "big", signed=True),
                                           f"timercheck {name} {v} -> {limit}"))


def _plan_metrics(ts: TimerStore, rep: TimerRepair, cut_at: int | None) -> None:
    """timermetrics counts set to the pending messages the timerlog keeps, when they differ."""
    if cut_at is not None:
        before = pending_summary(ts)["pendingByTopic"]
    pending = pending_summary(ts, stop_at=cut_at)["pendingByTopic"]
    if cut_at is not None:
        rep.cut_pending = {t: n - pending.get(t, 0) for t, n in before.items() if n - pending.get(t, 0)}
    if not ts.metrics.exists or ts.metrics.error or not (rep.cut_pending or rep.cut_pending_after):
        return  # counts that merely trail the timerlog are the broker's to revise (TM_METRICS is info)
    rep.metrics = pending


# verify's TM_* codes a timer repair removes whatever it touches; the unit codes only for the units
# it edits or cuts
WHEEL_CODES = {"TM_SLOT_NUM", "TM_SLOT_POS", "TM_SLOT_STRAY", "TM_SLOT_MISSING", "TM_WHEEL_MISSING", "TM_WHEEL_SIZE"}
UNIT_CODES = {"TM_PREV_POS", "TM_MSG_GONE", "TM_MSG_OFFSET", "TM_MSG_SIZE", "TM_MSG_TOPIC", "TM_TOPIC_HASH",
              "TM_NO_REAL_TOPIC"}


def timer_verdict(rep: "TimerRepair | None", f: dict, wheel_only: bool = False) -> tuple[str, str]:
    """('fixed' | 'left', why) for one TM_* finding (``entry`` form) under this repair."""
    code = f.get("code")
    if rep is None:
        return "left", "the plan does not change the timer store"
    if code in WHEEL_CODES:
        return "fixed", "the wheel is written from the timerlog"
    if wheel_only:
        return "left", "`rebuild timer` rewrites the wheel only (`rmqstore recover` repairs units and timercheck)"
    pos = f.get("timerlogPos")
    if code in UNIT_CODES or code in ("TM_UNIT_SIZE", "TM_UNIT_MAGIC", "TM_NO_BLANK"):
        if pos is not None and rep.cut_at is not None and pos >= rep.cut_at:
            return "fixed", "the timerlog is cut before this unit"
        if pos in rep.fixed_units:
            return "fixed", "the unit is rewritten"
        return "left", "a unit this plan cannot repair"
    if code in ("TM_CHECK_AHEAD", "TM_CHECK_QUEUE"):
        return "fixed", "timercheck is clamped to the timerlog and the timer queue"
    return "left", "not repaired by this plan"


def plan_timer_for_recovery(planner) -> None:
    """recover / truncate: the timer store made consistent with the commitlog the plan leaves (an action
    of kind ``timer`` on the plan, the repair itself in ``plan.timer_repair``)."""
    from rmqstore_cli.formats.timer import TIMER_TOPIC

    st, plan = planner.store, planner.plan
    end = (plan.commitlog or {}).get("recoveredEnd")
    queue_end = (getattr(planner, "qstate", None) or {}).get((TIMER_TOPIC, 0), [None])[0]
    rep = plan_timer_repair(st, commitlog_end=end, queue_end=queue_end)
    plan.timer_repair = rep
    if rep.cut_pending:
        why = ("their records lie past the new commitlog end and go with it" if end is not None
               and rep.cut_at is not None and _cut_is_past_end(st, rep.cut_at, end) else
               "they follow a unit the broker's recovery stops at (it truncates the timerlog there too)")
        plan.notes.append(f"the timerlog is cut at {rep.cut_at}: {sum(rep.cut_pending.values())} pending timer "
                          f"message(s) lose their unit; {why} "
                          f"({', '.join(f'{t}: {n}' for t, n in sorted(rep.cut_pending.items()))})")
    if rep.cut_pending_after or (rep.cut_at is not None and not rep.cut_pending and rep.cut_units):
        plan.notes.append(f"the timerlog is cut at the damaged unit at {rep.cut_at} (its fields name no timer record, "
                          f"so it cannot be restored), as the broker's recovery cuts it: {rep.cut_units} later unit(s) "
                          f"go, {rep.cut_pending_after} of them pending (their bytes go to the backup folder)")
    for line in rep.left[:20]:
        plan.notes.append(f"timer store: {line} (left as it is)")
    if not rep.empty:
        planner.act("timer", os.path.join(st.root, "timerlog"), "timer store made consistent with the commitlog the "
                    "plan leaves (TimerMessageStore.recover, plus the repairs it lacks)", extra={"timer": rep.actions()})


def _cut_is_past_end(store, cut_at: int, commitlog_end: int) -> bool:
    """The unit at the cut points past the commitlog's end (else the cut is at a bad unit)."""
    ts = TimerStore(store)
    try:
        unit = ts.timerlog.read_unit(cut_at)
        return unit is not None and unit["offsetPy"] + unit["sizePy"] > commitlog_end
    finally:
        ts.close()


def apply_timer_repair(rep: TimerRepair, root: str, backup) -> list[str]:
    """Carry out the planned changes, every overwritten byte saved in ``backup`` first."""
    from ..log.mappedfile import fsync_path
    from .fileops import last_nonzero, zero_range

    steps = []
    if rep.new_wheel:
        path = os.path.join(root, "timerwheel")
        if os.path.exists(path):
            backup.move(path, "timerwheel of the wrong size")
        backup.mark("created", path="timerwheel")
        with open(path, "wb") as f:
            f.truncate(WHEEL_FILE_SIZE)
        steps.append("timerwheel created")
    if rep.cut_at is not None:
        for p in rep.move_files:
            if os.path.exists(p):
                backup.move(p, "timerlog file past the cut")
        for seg_path in sorted(os.listdir(os.path.join(root, "timerlog"))):
            p = os.path.join(root, "timerlog", seg_path)
            start = int(seg_path) if seg_path.isdigit() else -1
            size = os.path.getsize(p)
            if start <= rep.cut_at < start + size:
                rel = rep.cut_at - start
                end = last_nonzero(p, rel)
                if end > rel:
                    backup.save_range(p, rel, end - rel)
                    zero_range(p, rel, end)
        steps.append(f"timerlog cut at {rep.cut_at} ({rep.cut_units} units)")
    by_path: dict[str, list] = {}
    for e in rep.edits:
        by_path.setdefault(e.path, []).append(e)
    for path, edits in by_path.items():
        for e in edits:
            backup.save_range(path, e.offset, len(e.data))
        with open(path, "r+b") as f:
            for e in edits:
                f.seek(e.offset)
                f.write(e.data)
            f.flush()
            os.fsync(f.fileno())
        steps.append(f"{len(edits)} write(s) to {os.path.relpath(path, root)}")
    if rep.metrics is not None:
        _write_metrics(root, rep.metrics, backup)
        steps.append("timermetrics counts set to the pending messages")
    fsync_path(root, True)
    return steps


def _write_metrics(root: str, counts: dict, backup) -> None:
    """config/timermetrics (and .bak) with the given counts, the rest of the file kept."""
    for name in ("timermetrics", "timermetrics.bak"):
        path = os.path.join(root, "config", name)
        if not os.path.exists(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
        except ValueError:
            obj = {}
        backup.save_file(path)
        old = obj.get("timingCount") or {}
        obj["timingCount"] = {t: {"count": c, "timeStamp": (old.get(t) or {}).get("timeStamp", 0)} for t, c in sorted(counts.items())}
        data = json.dumps(obj, separators=(",", ":")).encode()
        with open(path, "r+b") as f:
            f.truncate(0)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
