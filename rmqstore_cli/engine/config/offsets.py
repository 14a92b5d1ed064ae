"""Consumer offsets against the consume queues: the audit, and what a repair does to each group.

Mirrors the broker's lazy correction in ``DefaultMessageStore.getMessage`` (4.9.3 and 5.3.3): a pull at
a committed offset below the queue's min offset is moved to min (OFFSET_TOO_SMALL), above max is moved
to max (OFFSET_OVERFLOW_BADLY; 4.9.3 moves it to min instead when min is 0, so the whole queue is
delivered again), and any offset on an empty queue (max 0) is reset to 0 (NO_MESSAGE_IN_QUEUE). Nothing
is corrected at start, except delay offsets (``ScheduleMessageService.correctDelayOffset``, clamped
into the schedule queue's bounds). Read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import NotFoundError
from .files import (CONSUMER_OFFSETS, DELAY_OFFSETS, LMQ_CONSUMER_OFFSETS, TOPICS, ConfigFile, OffsetEntry,
                    consumer_offsets, delay_offsets, lmq_consumer_offsets, read_config, read_config_file,
                    topic_queue_count, topic_table)
from ..findings import SEVERITY_ORDER, Finding

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


@dataclass
class QueueBounds:
    """One consume queue as a pull sees it: getMinOffsetInQueue / getMaxOffsetInQueue and unit sizes."""

    min: int
    max: int
    first: int = 0  # queue offset of sizes[0]
    sizes: np.ndarray | None = None
    on_disk: bool = True

    def bytes_from(self, offset: int) -> int:
        """Bytes of the messages at queue offsets [offset, max) (consumer lag in bytes)."""
        if self.sizes is None or offset >= self.max:
            return 0
        i = max(offset - self.first, 0)
        return int(self.sizes[i:].sum())


def queue_bounds(store, topic: str, queue_id: int) -> QueueBounds:
    """min = the first valid unit pointing at or past the commitlog's min offset (correctMinOffset), else max;
    max = the end of the valid units (§7.4)."""
    u = store.queue(topic, queue_id).units()
    hi = int(u.end_offset)
    if len(u.queue_offsets) == 0:
        return QueueBounds(hi, hi, hi, np.zeros(0, np.int64))
    live = np.flatnonzero(u.phy >= store.commitlog.min_offset)
    lo = int(u.queue_offsets[live[0]]) if len(live) else hi
    return QueueBounds(lo, hi, int(u.queue_offsets[0]), u.size)


def batch_queue_bounds(store, topic: str, queue_id: int) -> QueueBounds:
    """A batch consume queue (§9): its offsets count messages, min/max from its first and last unit."""
    lo, hi, _ = store.batch_queue(topic, queue_id).bounds()
    return QueueBounds(lo, hi, lo, None)


def all_bounds(store) -> dict[tuple[str, int], QueueBounds]:
    out = {(t, q): queue_bounds(store, t, q) for t, q in store.queues()}
    out.update({(t, q): batch_queue_bounds(store, t, q) for t, q in store.batch_queues()})
    return out


def next_pull(offset: int, lo: int, hi: int, version: int) -> dict:
    """What the group's next pull does with its committed offset (DefaultMessageStore.getMessage)."""
    if hi == 0:
        if offset == 0:
            return {"nextPull": "none", "nextOffset": 0, "skipped": 0, "redelivered": 0, "code": None}
        return {"nextPull": "reset to 0", "nextOffset": 0, "skipped": 0, "redelivered": 0, "code": "CO_RESET_ZERO"}
    if offset < lo:
        return {"nextPull": "move to min", "nextOffset": lo, "skipped": lo - offset, "redelivered": 0, "code": "CO_BELOW_MIN"}
    if offset > hi:
        if version < 5 and lo == 0:
            return {"nextPull": "move to min (0)", "nextOffset": 0, "skipped": 0, "redelivered": hi, "code": "CO_ABOVE_MAX"}
        return {"nextPull": "move to max", "nextOffset": hi, "skipped": offset - hi, "redelivered": 0, "code": "CO_ABOVE_MAX"}
    return {"nextPull": "none", "nextOffset": offset, "skipped": 0, "redelivered": 0, "code": None}


SEVERITY = {"CO_BELOW_MIN": "info", "CO_ABOVE_MAX": "warning", "CO_RESET_ZERO": "warning",
            "CO_UNKNOWN_TOPIC": "info", "CO_UNKNOWN_QUEUE": "info", "DO_OUT_OF_RANGE": "info", "CFG_TOPIC_MISSING": "warning"}


def _explain(row: dict) -> str:
    c, g, t, q = row["code"], row["group"], row["topic"], row["queueId"]
    head = f"group {g} topic {t} queue {q}: committed offset {row['committed']} "
    if c == "CO_BELOW_MIN":
        return head + (f"is below the queue's min {row['minOffset']}: the next pull moves it to {row['minOffset']}; "
                       f"{row['skipped']} messages skipped (already expired or deleted)")
    if c == "CO_ABOVE_MAX":
        if row["redelivered"]:
            return head + (f"is above the queue's max {row['maxOffset']}: the next pull (4.9.3, min 0) moves it to 0; "
                           f"{row['redelivered']} messages delivered again")
        return head + (f"is above the queue's max {row['maxOffset']}: the next pull moves it to {row['maxOffset']}; up to "
                       f"{row['skipped']} messages skipped (those written at queue offsets {row['maxOffset']}.."
                       f"{row['committed'] - 1} before the group pulls)")
    if c == "CO_RESET_ZERO":
        return head + "on an empty queue (max 0): the next pull resets it to 0"
    if c == "CO_UNKNOWN_TOPIC":
        return head + "names a topic that no longer exists (no consume queue, not in topics.json): pulls are refused"
    if c == "CO_UNKNOWN_QUEUE":
        return head + f"names a queue the topic does not have ({row.get('queueNums')} queues in topics.json)"
    return head


@dataclass
class Audit:
    """The consumer offsets and config files read against the store: rows, findings and the files read."""

    rows: list  # one per committed offset
    delay_rows: list
    findings: list
    files: dict  # name -> ConfigFile
    offsets_source: str | None  # path of the consumerOffset.json copy read, None if none


def audit_offsets(store, files: dict | None = None, bounds: dict | None = None) -> Audit:
    """Every committed offset and delay offset against its queue's bounds, with findings."""
    files = files if files is not None else read_config(store.root)
    version = store.config.version
    co: ConfigFile = files[CONSUMER_OFFSETS]
    tcf: ConfigFile = files[TOPICS]
    topics = topic_table(tcf) if tcf.source else None
    lmq_cf = files.get(LMQ_CONSUMER_OFFSETS) or read_config_file(store.root, LMQ_CONSUMER_OFFSETS)
    if bounds is None:  # consume queues are read only when there are offsets to check
        bounds = all_bounds(store) if (co.source or files[DELAY_OFFSETS].source or lmq_cf.source) else {}
    on_disk = store.queues() + store.batch_queues()
    disk_topics = {t for t, _ in on_disk}
    rows, findings = [], []
    src = co.main.path if co.source == "main" else co.bak.path if co.source == "bak" else None
    for e in consumer_offsets(co):
        rows.append(_row(e, bounds, topics, disk_topics, version))
    lsrc = lmq_cf.main.path if lmq_cf.source == "main" else lmq_cf.bak.path if lmq_cf.source == "bak" else None
    for e in lmq_consumer_offsets(lmq_cf):  # LMQ groups: their own file, queue 0 of an LMQ queue (§14.3)
        rows.append(dict(_row(e, bounds, topics, disk_topics, version), lmq=True))
    for r in rows:
        if r["code"]:
            findings.append(Finding(r["code"], SEVERITY[r["code"]], lsrc if r.get("lmq") else src, None, _explain(r),
                                    {k: r[k] for k in ("group", "topic", "queueId", "committed", "minOffset", "maxOffset",
                                                       "nextOffset", "skipped", "redelivered")}))
    delay_rows = []
    dcf = files[DELAY_OFFSETS]
    dsrc = dcf.main.path if dcf.source == "main" else dcf.bak.path if dcf.source == "bak" else None
    for level, off in delay_offsets(dcf).items():
        b = bounds.get((SCHEDULE_TOPIC, level - 1))
        lo, hi = (b.min, b.max) if b else (0, 0)
        fixed = min(max(off, lo), hi)
        r = {"level": level, "queueId": level - 1, "committed": off, "minOffset": lo, "maxOffset": hi,
             "correctedAtStart": fixed, "pending": max(hi - fixed, 0)}
        delay_rows.append(r)
        if fixed != off:
            findings.append(Finding("DO_OUT_OF_RANGE", "info", dsrc, None,
                                    f"delay level {level}: offset {off} is outside {SCHEDULE_TOPIC} queue {level - 1} "
                                    f"[{lo}, {hi}]; the broker corrects it to {fixed} at start", {"level": level, **r}))
    if topics is not None:
        tsrc = tcf.main.path if tcf.source == "main" else tcf.bak.path
        for t in sorted(disk_topics - set(topics)):
            if t.startswith("%LMQ%"):
                continue  # light message queues are not topics of topics.json
            n = sum(1 for tt, _ in on_disk if tt == t)
            findings.append(Finding("CFG_TOPIC_MISSING", "warning", tsrc, None,
                                    f"topic {t} has {n} queue(s) on disk but is not in topics.json: the broker refuses "
                                    "pulls for it (TOPIC_NOT_EXIST) until it is created again", {"topic": t}))
    return Audit(rows, delay_rows, findings, files, src)


def _row(e: OffsetEntry, bounds: dict, topics: dict | None, disk_topics: set, version: int) -> dict:
    row = {"group": e.group, "topic": e.topic, "queueId": e.queue_id, "committed": e.offset}
    if e.suffix:
        row["suffix"] = e.suffix
    b = bounds.get((e.topic, e.queue_id))
    known_topic = e.topic in disk_topics or (topics is not None and e.topic in topics)
    qn = topic_queue_count(topics[e.topic]) if topics is not None and e.topic in topics else None
    if b is None:
        b = QueueBounds(0, 0, 0, None, on_disk=False)
    row.update(minOffset=b.min, maxOffset=b.max)
    if not known_topic:
        row.update(nextPull="refused (no such topic)", nextOffset=e.offset, skipped=0, redelivered=0,
                   lagMessages=0, lagBytes=0, code="CO_UNKNOWN_TOPIC")
        return row
    if not b.on_disk and qn is not None and e.queue_id >= qn:
        row.update(nextPull="refused (no such queue)", nextOffset=e.offset, skipped=0, redelivered=0,
                   lagMessages=0, lagBytes=0, code="CO_UNKNOWN_QUEUE", queueNums=qn)
        return row
    p = next_pull(e.offset, b.min, b.max, version)
    row.update(p)
    start = p["nextOffset"]
    row["lagMessages"] = max(b.max - start, 0)
    row["lagBytes"] = b.bytes_from(start)
    return row


# --- what a repair does to each group -----------------------------------------------------------------


def bounds_after_plan(before: dict, plan) -> dict[tuple[str, int], tuple[int, int]]:
    """Queue (min, max) once a recover/truncate plan is applied (its summary's queues; others unchanged)."""
    after = {k: (b.min, b.max) for k, b in before.items()}
    for q in plan.summary.get("queues", []):
        after[(q["topic"], q["queueId"])] = (q["minOffset"], q["maxOffset"])
    return after


def consumer_impact(entries: list[OffsetEntry], before: dict, after: dict, version: int) -> list[dict]:
    """Every committed offset a change puts out of range: before -> after bounds, the next pull, the messages
    the group skips or gets again, and unread messages the change removes. ``before``/``after`` map
    (topic, queueId) to (min, max) (or QueueBounds)."""
    out = []
    for e in entries:
        b = before.get((e.topic, e.queue_id))
        a = after.get((e.topic, e.queue_id))
        if a is None:
            continue
        bl, bh = (b.min, b.max) if isinstance(b, QueueBounds) else (b or (0, 0))
        al, ah = (a.min, a.max) if isinstance(a, QueueBounds) else a
        pb, pa = next_pull(e.offset, bl, bh, version), next_pull(e.offset, al, ah, version)
        if pa["code"] is None or (pa == pb and (bl, bh) == (al, ah)):
            continue
        out.append({"group": e.group, "topic": e.topic, "queueId": e.queue_id, "committed": e.offset,
                    "before": [bl, bh], "after": [al, ah], "nextPull": pa["nextPull"], "nextOffset": pa["nextOffset"],
                    "skipped": pa["skipped"], "redelivered": pa["redelivered"],
                    "unreadRemoved": max(0, bh - max(e.offset, ah, bl)), "code": pa["code"]})
    return out


@dataclass
class QueuesAfter:
    """A plan-like view of queue bounds measured after a change (``rebuild`` applies without a plan)."""

    version: int
    summary: dict


def measured_after(store) -> QueuesAfter:
    return QueuesAfter(store.config.version, {"queues": [{"topic": t, "queueId": q, "minOffset": b.min, "maxOffset": b.max}
                                                         for (t, q), b in all_bounds(store).items()]})


def plan_consumer_impact(store, plan, files: dict | None = None, before: dict | None = None) -> dict:
    """Consumer impact of a recover/truncate plan (or a :class:`QueuesAfter`) on this store: the one engine
    entry the commands call. ``before`` defaults to the store's queue bounds now."""
    files = files if files is not None else read_config(store.root)
    co = files[CONSUMER_OFFSETS]
    entries = consumer_offsets(co)
    lmq_cf = files.get(LMQ_CONSUMER_OFFSETS) or read_config_file(store.root, LMQ_CONSUMER_OFFSETS)
    entries += lmq_consumer_offsets(lmq_cf)  # LMQ groups (lmqConsumerOffset.json): LMQ queues are cut and rebuilt too
    if not entries:
        return {"type": "consumer-impact", "offsetsFile": None if co.source is None else co.name, "groups": []}
    before = before if before is not None else all_bounds(store)
    after = bounds_after_plan(before, plan)
    return {"type": "consumer-impact", "offsetsFile": co.name,
            "groups": consumer_impact(entries, before, after, plan.version)}


def add_config_audit(store, result) -> None:
    """Adds the config-file and consumer-offset findings to a :class:`VerifyResult` (the ``verify`` command)."""
    from .files import config_findings

    files = read_config(store.root)
    extra = config_findings(files) + audit_offsets(store, files).findings
    if not extra:
        return
    result.findings += extra
    result.findings.sort(key=lambda f: (SEVERITY_ORDER.get(f.severity, 3), f.path or "",
                                        f.offset if f.offset is not None else -1, f.code))
    result.summary["findings"] = {s: sum(1 for f in result.findings if f.severity == s) for s in ("error", "warning", "info")}


def offsets_for_stats(store) -> dict:
    """The ``stats`` report's consumer part: ``consumerOffsets`` (one row per group/topic/queue) and ``delayOffsets``."""
    a = audit_offsets(store)
    return {"consumerOffsets": a.rows, "delayOffsets": a.delay_rows, "consumerOffsetsFile": a.offsets_source}


def group_offsets(store, group: str) -> dict[tuple[str, int], int]:
    """{(topic, queueId): committed offset} of one consumer group, from the consumerOffset.json copy the
    broker loads (``ConsumerOffsetManager.offsetTable["topic@group"]``; the next queue offset the group
    consumes). 5.x broadcast entries (``topic@group@...``) belong to single clients and are left out."""
    co: ConfigFile = read_config(store.root)[CONSUMER_OFFSETS]
    if co.source is None:
        raise NotFoundError(f"{store.root} has no config/consumerOffset.json (nor a .bak) the broker would load: "
                            "no group has committed offsets")
    found = {(e.topic, e.queue_id): e.offset for e in consumer_offsets(co) if e.group == group and not e.suffix}
    if not found:
        groups = sorted({e.group for e in consumer_offsets(co)})
        raise NotFoundError(f"group {group!r} has no committed offset in {co.main.path if co.source == 'main' else co.bak.path}"
                            f" (groups there: {', '.join(groups) or 'none'})")
    return found
