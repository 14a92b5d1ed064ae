"""Plans that rewrite ``config/*.json`` offline: restore or rebuild damaged files, and set committed offsets.

A plan says, per file, what the broker would load now, what is written instead and why; the command
prints it and, unless --dry-run, applies it with :func:`apply_config_plan` (backup, lock held by the
caller, the broker's persist sequence, fsync). Written content is the broker's own format
(``formats.fastjson.dumps``), so the broker loads it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from rmqstore_cli.formats import fastjson
from rmqstore_cli.formats.message import RecordError

from ..config.files import (CONFIG_FILES, CONSUMER_OFFSETS, DELAY_OFFSETS, TABLE, TOPICS, ConfigFile, FileCopy,
                            read_config, as_long, write_config_file)
from ..config.offsets import SCHEDULE_TOPIC, all_bounds, next_pull
from ..errors import UsageError
from ..query.lookup import query_index
from ..query.timesearch import TimeSearch


@dataclass
class FileChange:
    name: str
    action: str  # restore-from-bak | rebuild | set-offsets
    why: str
    value: object
    details: list = field(default_factory=list)  # lines for the plan

    def as_json(self) -> dict:
        return {"file": self.name, "action": self.action, "why": self.why, "details": self.details}


@dataclass
class ConfigPlan:
    root: str
    changes: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    offsets: list = field(default_factory=list)  # offsets set: one row per queue

    def as_json(self) -> dict:
        return {"type": "config-plan", "changes": [c.as_json() for c in self.changes], "notes": self.notes,
                "offsets": self.offsets}


def _data_version(old, version: int) -> dict:
    """DataVersion.nextVersion(): counter + 1, timestamp now (fields in fastjson's alphabetical order)."""
    counter = 0
    if isinstance(old, dict) and isinstance(old.get("counter"), int):
        counter = old["counter"]
    dv = {"counter": counter + 1}
    if version >= 5 or (isinstance(old, dict) and "stateVersion" in old):
        dv["stateVersion"] = old.get("stateVersion", 0) if isinstance(old, dict) else 0
    dv["timestamp"] = int(time.time() * 1000)
    return dv


def _salvage(c: FileCopy):
    """What a cut-off or damaged copy still holds: the complete entries before the damage."""
    if c.text is None:
        return None
    v, _complete = fastjson.loads_partial(c.text)
    return v if isinstance(v, dict) else None


def _merge_tables(name: str, copies: list[FileCopy]) -> dict:
    """Entries salvaged from both copies; where both hold one, the newer file's (by mtime) wins."""
    merged: dict = {}
    for c in sorted(copies, key=lambda c: c.mtime_ms or 0):
        v = _salvage(c)
        t = v.get(TABLE[name]) if isinstance(v, dict) else None
        if not isinstance(t, dict):
            continue
        for k, x in t.items():
            if name == CONSUMER_OFFSETS and isinstance(x, dict) and isinstance(merged.get(k), dict):
                merged[k] = {**merged[k], **x}
            else:
                merged[k] = x
    return merged


def _rebuild(store, cf: ConfigFile, bounds: dict, clamp: bool, notes: list) -> FileChange:
    name = cf.name
    version = store.config.version
    table = _merge_tables(name, [cf.main, cf.bak])
    details = [f"{len(table)} entries salvaged from the readable part of {name} and {name}.bak"]
    old = _salvage(cf.main) or _salvage(cf.bak) or {}
    if name == CONSUMER_OFFSETS:
        # only what the broker can decode: numeric queue ids and offsets
        table = {k: {as_long(q): as_long(o) for q, o in v.items() if as_long(q) is not None and as_long(o) is not None}
                 for k, v in table.items() if isinstance(k, str) and isinstance(v, dict)}
        if clamp:
            for key, queues in table.items():
                topic = key.split("@", 1)[0]
                for q, off in list(queues.items()):
                    b = bounds.get((topic, q))
                    if b is None:
                        continue
                    fixed = min(max(off, b.min), b.max)
                    if fixed != off:
                        details.append(f"{key} queue {q}: {off} -> {fixed} (clamped into [{b.min}, {b.max}])")
                        queues[q] = fixed
        retry_groups = sorted({t[len("%RETRY%"):] for t, _ in bounds if t.startswith("%RETRY%")})
        known = {k.split("@")[1] for k in table if "@" in k}
        lost = [g for g in retry_groups if g not in known]
        if lost:
            notes.append(f"groups with a retry topic on disk but no offset left in either copy: {', '.join(lost)}; "
                         "they start from their consumeFromWhere position")
        value = {"offsetTable": table} if version < 5 else {"dataVersion": _data_version(old.get("dataVersion"), version),
                                                           "offsetTable": table}
    elif name == DELAY_OFFSETS:
        levels = {as_long(k): as_long(v) for k, v in table.items() if as_long(k) is not None and as_long(v) is not None}
        for (t, q), b in sorted(bounds.items()):
            if t == SCHEDULE_TOPIC and (q + 1) not in levels:
                off, how = delivered_prefix(store, q + 1, b.min, b.max)
                levels[q + 1] = off
                details.append(f"delay level {q + 1}: no offset left; {off} = {how} (schedule queue [{b.min}, {b.max}])")
        for lv, off in list(levels.items()):
            b = bounds.get((SCHEDULE_TOPIC, lv - 1))
            if b is not None and not b.min <= off <= b.max:
                levels[lv] = min(max(off, b.min), b.max)
                details.append(f"delay level {lv}: {off} -> {levels[lv]} (into the schedule queue's bounds, as the broker does)")
        value = {"offsetTable": dict(sorted(levels.items()))}
        if version >= 5:
            value = {"dataVersion": _data_version(old.get("dataVersion"), version), **value}
    elif name == TOPICS:
        table = {k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, dict)}
        queues: dict = {}
        for t, q in bounds:
            queues[t] = max(queues.get(t, 0), q + 1)
        for t, n in sorted(queues.items()):
            if t not in table and not t.startswith("%LMQ%"):
                table[t] = {"order": False, "perm": 6, "readQueueNums": n, "topicFilterType": "SINGLE_TAG",
                            "topicName": t, "topicSysFlag": 0, "writeQueueNums": n}
                details.append(f"topic {t}: {n} queues (from consumequeue/), perm 6, the broker's defaults otherwise")
        value = {"dataVersion": _data_version(old.get("dataVersion"), version), "topicConfigTable": table}
    else:  # GROUPS
        table = {k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, dict)}
        for t, _ in bounds:
            if t.startswith("%RETRY%"):
                g = t[len("%RETRY%"):]
                if g not in table:
                    table[g] = {"brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": True,
                                "consumeFromMinEnable": True, "groupName": g, "notifyConsumerIdsChangedEnable": True,
                                "retryMaxTimes": 16, "retryQueueNums": 1, "whichBrokerWhenConsumeSlowly": 1}
                    details.append(f"group {g}: from its retry topic, the broker's defaults")
        value = {"dataVersion": _data_version(old.get("dataVersion"), version), "subscriptionGroupTable": table}
    return FileChange(name, "rebuild", f"neither {name} nor {name}.bak decodes; rebuilt from what is left", value, details)


def plan_config_repair(store, *, clamp_offsets: bool = False, files: dict | None = None) -> ConfigPlan:
    """Restore each damaged config file from a ``.bak`` that decodes, else rebuild it from what the store proves."""
    files = files if files is not None else read_config(store.root)
    plan = ConfigPlan(store.root)
    bounds = all_bounds(store)
    for name in CONFIG_FILES:
        cf = files[name]
        if cf.main.usable:
            continue
        if not cf.main.exists and not cf.bak.exists and not (cf.tmp is not None and cf.tmp.exists):
            continue
        state = "missing" if not cf.main.exists else "empty" if cf.main.empty else "does not decode"
        tmp = cf.tmp
        if tmp is not None and tmp.usable and (not cf.bak.usable or (tmp.mtime_ms or 0) >= (cf.bak.mtime_ms or 0)):
            # MixAll.string2File (4.9.3) writes FILE.tmp completely before it touches FILE: a .tmp that decodes is
            # the newest content, written by a persist that was cut before its rename
            plan.changes.append(FileChange(name, "restore-from-tmp", f"{name} {state}; {name}.tmp decodes and is the "
                                           "newest copy (a persist interrupted before its rename)", tmp.value))
            continue
        if cf.bak.usable:
            age = ""
            if cf.bak.mtime_ms is not None and cf.main.mtime_ms is not None:
                d = (cf.main.mtime_ms - cf.bak.mtime_ms) / 1000
                age = (f"; .bak is {d:.0f} s older than the main file: changes made after it are lost" if d >= 1 else
                       f"; .bak is {-d:.0f} s newer than the main file" if d <= -1 else "")
            plan.changes.append(FileChange(name, "restore-from-bak", f"{name} {state}; {name}.bak decodes (the broker "
                                           f"would load it){age}", cf.bak.value))
        else:
            plan.changes.append(_rebuild(store, cf, bounds, clamp_offsets, plan.notes))
    if clamp_offsets:
        co = files[CONSUMER_OFFSETS]
        if co.main.usable:  # offsets out of range in a good file: clamped too, when asked
            ch = _clamped_offsets(co, bounds, store.config.version)
            if ch is not None:
                plan.changes.append(ch)
    return plan


def _clamped_offsets(co: ConfigFile, bounds: dict, version: int) -> FileChange | None:
    value = _copy(co.main.value)
    details = []
    for key, queues in (value.get("offsetTable") or {}).items():
        if not isinstance(queues, dict):
            continue
        topic = key.split("@", 1)[0]
        for q, off in queues.items():
            b = bounds.get((topic, as_long(q)))
            if b is None or as_long(off) is None:
                continue
            off = as_long(off)
            fixed = min(max(off, b.min), b.max)
            if fixed != off:
                queues[q] = fixed
                details.append(f"{key} queue {q}: {off} -> {fixed} (clamped into [{b.min}, {b.max}])")
    if not details:
        return None
    if "dataVersion" in value:
        value["dataVersion"] = _data_version(value["dataVersion"], version)
    return FileChange(CONSUMER_OFFSETS, "clamp-offsets", "committed offsets outside their queue's bounds (--clamp-offsets)",
                      value, details)


def _copy(v):
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    return v


# --- offsets set -----------------------------------------------------------------------------------


def plan_offsets_set(store, group: str, topic: str, queue: int | None, *, to_offset: int | None = None,
                     to_time: int | None = None, to_min: bool = False, to_max: bool = False,
                     files: dict | None = None) -> ConfigPlan:
    """New committed offsets for ``topic@group`` (one queue or all), like the broker's reset-offset admin call."""
    if sum(x is not None and x is not False for x in (to_offset, to_time, to_min or None, to_max or None)) != 1:
        raise UsageError("give exactly one of --to-offset, --to-time, --to-min, --to-max")
    if "@" in group or "@" in topic:
        raise UsageError("group and topic names cannot contain '@' (it separates them in consumerOffset.json)")
    files = files if files is not None else read_config(store.root)
    co = files[CONSUMER_OFFSETS]
    if co.source is None and (co.main.exists or co.bak.exists):
        raise UsageError(f"{co.name} and its .bak do not decode; run `rmqstore repair config` first")
    version = store.config.version
    bounds = all_bounds(store)
    key = f"{topic}@{group}"
    value = _copy(co.value) if co.source else ({"offsetTable": {}} if version < 5 else  # counter 0: bumped to 1 below
                                               {"dataVersion": {"counter": 0, "stateVersion": 0, "timestamp": 0},
                                                "offsetTable": {}})
    table = value.setdefault("offsetTable", {})
    current = table.get(key) if isinstance(table.get(key), dict) else {}
    disk_queues = sorted(q for t, q in bounds if t == topic)
    if queue is not None:
        queues = [queue]
    else:
        queues = sorted(set(disk_queues) | {int(q) for q in current})
    if not queues:
        raise UsageError(f"topic {topic} has no queues on disk and group {group} has no offsets for it")
    plan = ConfigPlan(store.root)
    new = dict(current)
    search = TimeSearch(store, version) if to_time is not None else None
    for q in queues:
        b = bounds.get((topic, q))
        lo, hi = (b.min, b.max) if b else (0, 0)
        if to_offset is not None:
            target = to_offset
        elif to_min:
            target = lo
        elif to_max:
            target = hi
        else:
            target = search.offset(topic, q, to_time) if b else 0
        old_key = next((k for k in current if int(k) == q), q)
        before = current.get(old_key)
        new[old_key] = target
        pull = next_pull(target, lo, hi, version)
        plan.offsets.append({"group": group, "topic": topic, "queueId": q, "before": before, "after": target,
                             "minOffset": lo, "maxOffset": hi, "nextPull": pull["nextPull"]})
        if pull["code"]:
            plan.notes.append(f"queue {q}: {target} is outside [{lo}, {hi}]; the next pull will {pull['nextPull']}")
    table[key] = dict(sorted(new.items(), key=lambda kv: int(kv[0])))
    if "dataVersion" in value:
        value["dataVersion"] = _data_version(value["dataVersion"], version)
    why = f"set committed offsets of group {group} on topic {topic}"
    plan.changes.append(FileChange(CONSUMER_OFFSETS, "set-offsets", why, value,
                                   [f"queue {r['queueId']}: {r['before']} -> {r['after']}" for r in plan.offsets]))
    return plan


def apply_config_plan(root: str, plan: ConfigPlan, backup) -> list[str]:
    """Write every file of the plan (the caller holds the lock and made ``backup``); returns the steps."""
    steps = []
    for ch in plan.changes:
        bad_main = ch.action in ("restore-from-bak", "restore-from-tmp", "rebuild")
        res = write_config_file(root, ch.name, ch.value, backup=backup, keep_previous_as_bak=not bad_main,
                                keep_order=ch.action in ("restore-from-bak", "restore-from-tmp"))
        steps += res.steps
    return steps


def config_dir_exists(root: str) -> bool:
    return os.path.isdir(os.path.join(root, "config"))


def delivered_prefix(store, level: int, lo: int, hi: int) -> tuple[int, str]:
    """The first offset of schedule queue ``level - 1`` in [lo, hi] whose message the store does not show delivered.

    The schedule service delivers a level's queue in order, re-putting each due message under its ``REAL_TOPIC``
    with the same ``UNIQ_KEY`` (indexed under that topic); a message is proven delivered when such a record
    follows it. Binary search over the delivered prefix, through the index (``(offset, how)``).
    """
    if hi <= lo:
        return lo, "empty queue"
    q = store.queue(SCHEDULE_TOPIC, level - 1)

    def delivered(k: int) -> bool:
        unit = q.unit_at(k)
        if unit is None:
            return False
        try:
            msg = store.commitlog.read(unit[0], with_body=False)
        except (RecordError, ValueError):
            return False
        props = msg.get("properties") or {}
        topic, key = props.get("REAL_TOPIC"), props.get("UNIQ_KEY")
        if not topic or not key:
            return False
        ans = query_index(store, topic, key, begin=int(msg.get("storeTimestamp", 0)))
        return any(m["offset"] > unit[0] for m in ans.matches)

    a, b = lo, hi  # invariant: every offset < a is delivered; b is undelivered (or the end)
    while a < b:
        mid = (a + b) // 2
        if delivered(mid):
            a = mid + 1
        else:
            b = mid
    return a, "first message not shown delivered (no re-put copy with its UNIQ_KEY under its REAL_TOPIC)"
