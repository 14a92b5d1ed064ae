"""Read-only answers about the timer store: its units with the message each points at, the wheel's
slots with their chains, the messages still pending (one per message, when they are due) and the
per-topic summary ``stats`` shows. Rows are plain dicts with stable camelCase names."""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats.timer import TIMER_UNIT_SIZE, magic_text

from .files import slot_json
from .store import MSG_OK, MSG_STATE_TEXT, TimerStore
from ..arrays import distinct

CHAIN_LIMIT = 100_000  # positions listed per slot chain (a damaged chain can loop)
MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
BUCKETS = ("overdue", "nextMinute", "nextHour", "nextDay", "later")


def deliver_window(sc, since=None, until=None) -> tuple[np.ndarray, np.ndarray]:
    """A scan chunk's deliver times (the message's TIMER_OUT_MS, else the unit's slot time) and the positions of
    the units delivered within [since, until]."""
    u, m = sc.units, sc.msgs
    deliver = np.where(m.timer_out >= 0, m.timer_out, u.slot_time)
    keep = np.ones(len(u), bool)
    if since is not None:
        keep &= deliver >= since
    if until is not None:
        keep &= deliver <= until
    return deliver, np.flatnonzero(keep)


def unit_rows(ts: TimerStore, *, since=None, until=None, topic=None):
    """Every timerlog unit in order with what it means and the message it points at."""
    for sc in ts.scan():
        u, m = sc.units, sc.msgs
        deliver, keep = deliver_window(sc, since, until)
        pending = ts.pending_mask(sc)
        for i in keep.tolist():
            real = m.text(ts.store, i, "REAL_TOPIC")
            if topic is not None and real != topic:
                continue
            row = {"pos": int(u.pos[i]), "size": TIMER_UNIT_SIZE, "prevPos": int(u.prevPos[i]), "magic": int(u.magic[i]),
                   "magicText": magic_text(int(u.magic[i])), "currWriteTime": int(u.currWriteTime[i]),
                   "delayMs": int(u.delay[i]), "slotTimeMs": int(u.slot_time[i]), "deliverTimeMs": int(deliver[i]),
                   "offsetPy": int(u.offsetPy[i]), "sizePy": int(u.sizePy[i]), "realTopicHash": int(u.realTopicHash[i]),
                   "pending": bool(pending[i]), "message": MSG_STATE_TEXT[int(m.state[i])]}
            if m.state[i] == MSG_OK:
                row.update(_message_fields(ts, m, i))
            yield row


def _message_fields(ts, m, i) -> dict:
    qid = m.text(ts.store, i, "REAL_QID")
    return {"realTopic": m.text(ts.store, i, "REAL_TOPIC"),
            "realQueueId": int(qid) if qid is not None and qid.lstrip("-").isdigit() else qid,
            "keys": m.text(ts.store, i, "KEYS"), "uniqKey": m.text(ts.store, i, "UNIQ_KEY"),
            "timerOutMs": int(m.timer_out[i]) if m.timer_out[i] >= 0 else None,
            "timerQueueOffset": int(m.queue_offset[i])}


def slot_rows(ts: TimerStore, chains: bool = True):
    """The wheel's non-empty slots, each with its chain walked from lastPos through prevPos."""
    for idx, recs in ts.wheel.nonempty():
        for i, rec in zip(idx.tolist(), recs):
            row = slot_json(i, rec, ts.precision_ms)
            if chains:
                chain, end = walk_chain(ts, row["lastPos"], row["timeMs"])
                row["chain"] = chain
                row["chainEnd"] = end
            yield row


def walk_chain(ts: TimerStore, last_pos: int, slot_ms: int) -> tuple[list[int], str]:
    """Positions from ``last_pos`` back through prevPos, and how the chain ended: ``-1`` (its first
    unit), ``history`` (into a deleted timerlog file), ``outside`` (past the timerlog), ``other slot``,
    ``loop`` or ``limit``. Compiled, a timerlog file at a time."""
    from rmqstore_cli.formats import timerkernel as k

    out = np.empty(CHAIN_LIMIT, np.int64)
    n, pos = 0, last_pos
    floor = ts.timerlog.min_offset
    slot_units = slot_ms // ts.precision_ms
    while True:
        seg = ts.timerlog.segments.find(pos) if pos >= floor else None
        if seg is None or pos < seg.start:
            u8, start = _NO_FILE, 0  # the kernel still says limit / loop / history / -1 first
        else:
            u8, start = np.frombuffer(seg.buffer(), np.uint8), seg.start
        n, pos, end = k.chain_in_file(u8, start, pos, slot_units, ts.precision_ms, floor, out, n)
        if end == k.CHAIN_OTHER_FILE:
            if u8 is _NO_FILE or start <= pos < start + len(u8):  # no file holds it, or it runs past the end
                return out[:n].tolist(), "outside"
            continue  # the next unit is in another file
        return out[:n].tolist(), _CHAIN_TEXT[end]


_NO_FILE = np.zeros(0, np.uint8)
_CHAIN_TEXT = {0: "-1", 1: "limit", 2: "loop", 3: "history", 5: "outside", 6: "other slot"}


def pending_rows(ts: TimerStore, *, since=None, until=None, topic=None):
    """One row per message not yet delivered: its pending unit (a rolled message counts once: see
    TimerStore.superseded), then the timer-queue records the timer has not read into the timerlog yet."""
    unread = _unread_queue(ts)
    enqueued = np.zeros(len(unread[0]), bool) if unread is not None else None
    for sc in ts.scan():
        u, m = sc.units, sc.msgs
        if unread is not None and len(unread[0]):
            enqueued |= np.isin(unread[1], u.offsetPy)
        for i in np.flatnonzero(ts.pending_mask(sc)).tolist():
            row = {"source": "timerlog", "pos": int(u.pos[i]), "slotTimeMs": int(u.slot_time[i]),
                   "roll": bool(u.magic[i] & 2), "message": MSG_STATE_TEXT[int(m.state[i])]}
            if m.state[i] == MSG_OK:
                row.update(_message_fields(ts, m, i))
            row["deliverTimeMs"] = row.get("timerOutMs") or int(u.slot_time[i])
            if _selected(row, since, until, topic):
                yield row
    if unread is not None:
        yield from _unread_queue_rows(ts, unread, enqueued, since, until, topic)


def _selected(row, since, until, topic) -> bool:
    t = row["deliverTimeMs"]
    return not ((since is not None and t < since) or (until is not None and t > until)
                or (topic is not None and row.get("realTopic") != topic))


def _unread_queue(ts: TimerStore):
    """(queue offsets, phy, size) of the timer-queue units past the checkpoint's lastTimerQueueOffset (only
    the files from there on are read; the units before it are not kept)."""
    cq = ts.timer_queue()
    if cq is None or not ts.checkpoint.exists:
        return None
    start = ts.checkpoint.lastTimerQueueOffset
    qs, ps, ss = [], [], []
    for base, arr in _queue_files(cq):
        n = len(arr)
        if base + n <= start:
            continue
        k = max(start - base, 0)
        qs.append(np.arange(base + k, base + n, dtype=np.int64))
        ps.append(arr["phyOffset"][k:].astype(np.int64))
        ss.append(arr["size"][k:].astype(np.int64))
    cat = lambda p: np.concatenate(p) if p else np.zeros(0, np.int64)  # noqa: E731
    return cat(qs), cat(ps), cat(ss)


def _queue_files(cq):
    """(first queue offset, valid units) per file, by ConsumeQueue.units' rules (the first invalid unit,
    a file not full or a gap between files ends the queue)."""
    from rmqstore_cli.engine.derived.consumequeue import CQ_UNIT_SIZE

    segs = cq.segments.segments
    end = segs[0].start // CQ_UNIT_SIZE if segs else 0
    for k, seg in enumerate(segs):
        base = seg.start // CQ_UNIT_SIZE
        if k and base != end:
            return
        arr = cq.file_units(seg)
        bad = np.flatnonzero((arr["phyOffset"] < 0) | (arr["size"] <= 0))
        n = int(bad[0]) if len(bad) else len(arr)
        yield base, arr[:n]
        end = base + n
        if n * CQ_UNIT_SIZE < cq.file_size:
            return


def _unread_queue_rows(ts: TimerStore, unread, enqueued, since, until, topic):
    """The unread records no timerlog unit points at yet (after a crash the timer may have enqueued
    records its checkpoint does not count)."""
    from .store import resolve_messages

    qoff, phy, size = (a[~enqueued] for a in unread)
    if not len(qoff):
        return
    m = resolve_messages(ts.store, phy, size)
    for j in range(len(qoff)):
        if m.state[j] != MSG_OK:
            continue
        row = {"source": "timerQueue", "timerQueueOffset": int(qoff[j]), "message": "ok", **_message_fields(ts, m, j)}
        row["deliverTimeMs"] = row.get("timerOutMs") or 0
        if _selected(row, since, until, topic):
            yield row


def pending_summary(ts: TimerStore, stop_at: int | None = None, chunks=None) -> dict:
    """Pending messages per real topic and when they are due, relative to the timer's read time
    (the checkpoint's lastReadTimeMs): overdue / next minute / hour / day / later. Columns only."""
    ref = ts.read_time_ms
    per_hash: dict[int, int] = {}
    names: dict[int, str] = {}
    buckets = np.zeros(len(BUCKETS), np.int64)
    for row_hash, deliver in _pending_columns(ts, names, stop_at, chunks):
        h, c = np.unique(row_hash, return_counts=True)
        for k, v in zip(h.tolist(), c.tolist()):
            per_hash[k] = per_hash.get(k, 0) + v
        d = deliver - ref
        buckets += np.array([(d < 0).sum(), ((d >= 0) & (d < MINUTE)).sum(), ((d >= MINUTE) & (d < HOUR)).sum(),
                             ((d >= HOUR) & (d < DAY)).sum(), (d >= DAY).sum()], np.int64)
    per_topic: dict[str, int] = {}
    for k, v in per_hash.items():
        name = names.get(k, f"<hash {k}>")
        per_topic[name] = per_topic.get(name, 0) + v
    return {"referenceTimeMs": ref, "pending": int(sum(per_topic.values())),
            "pendingByTopic": dict(sorted(per_topic.items())), "dueIn": dict(zip(BUCKETS, buckets.tolist()))}


def _pending_columns(ts: TimerStore, names: dict, stop_at: int | None = None, chunks=None):
    """(real-topic hash, delivery time) of the pending units, a chunk at a time; ``names`` learns the
    topic name of each hash from its first unit (one string per distinct topic); ``stop_at``: only the
    units before that timerlog position; ``chunks``: ScannedChunks another pass is making (verify)."""
    for sc in (chunks if chunks is not None else ts.scan(stop_at=stop_at)):
        u, m = sc.units, sc.msgs
        sel = np.flatnonzero(ts.pending_mask(sc))
        if not len(sel):
            continue
        h = np.where(m.has_topic[sel], m.topic_hash[sel], u.realTopicHash[sel]).astype(np.int64)
        for k in distinct(h).tolist():
            if k not in names:
                i = sel[np.flatnonzero(h == k)[0]]
                t = m.text(ts.store, int(i), "REAL_TOPIC")
                if t is not None:
                    names[k] = t
        deliver = np.where(m.timer_out[sel] >= 0, m.timer_out[sel], u.slot_time[sel])
        yield h, deliver


def timer_stats(store) -> dict:
    """``stats``' timer section ({} without a timer store): units, the timer queue, pending messages per
    real topic and when they are due, and what timermetrics says."""
    from .store import TIMER_TOPIC

    ts = TimerStore(store)
    try:
        if not ts.present:
            return {}
        s = pending_summary(ts)
        cq = ts.timer_queue()
        lo, end, _ = cq.bounds() if cq is not None else (0, 0, None)
        records = end - lo
        return {"precisionMs": ts.precision_ms, "timerlogFiles": len(ts.timerlog.segments),
                "timerQueue": {"topic": TIMER_TOPIC, "records": records,
                               "readOffset": ts.checkpoint.lastTimerQueueOffset if ts.checkpoint.exists else None},
                **s, "metrics": dict(sorted(ts.metrics.counts.items()))}
    finally:
        ts.close()
