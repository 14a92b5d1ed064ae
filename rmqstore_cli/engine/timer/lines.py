"""``dump timer --json`` encoded a chunk of units at a time: the same bytes as ``json_line`` of
report.py's rows (tests/test_timer_memory.py compares them), without a dict per unit. Each chunk's
columns become Python lists once; a line is one f-string; only the message's texts (topic, keys, uniq
key) go through json.dumps. Memory is one chunk's lines, whatever the timerlog's size."""

from __future__ import annotations

import json

import numpy as np

from rmqstore_cli.formats.timer import TIMER_UNIT_SIZE, magic_text

from .report import _unread_queue, _unread_queue_rows, deliver_window
from .store import MSG_OK, MSG_STATE_TEXT, TimerStore

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_escape = json.encoder.encode_basestring  # what _dumps does to a str (ensure_ascii=False)
BLOCK_LINES = 8192  # lines encoded and written at a time


def _qid_json(qid: str | None) -> str:
    """realQueueId as report._message_fields gives it: a number when the text is one."""
    if qid is not None and qid.lstrip("-").isdigit():
        try:
            return str(int(qid))
        except ValueError:
            pass
    return _dumps(qid)


def _json_texts(ts, m, name: str, rows: np.ndarray, as_json=None) -> list:
    """Property ``name`` of the resolved records ``rows`` as JSON values (``null`` when absent): one slice
    of the commitlog mapping per row, each distinct text escaped once."""
    as_json = as_json or (lambda t: _escape(t))
    starts, ends = m.spans[name]
    out, cache, bufs = [], {}, {}
    segs = ts.store.commitlog.segments.segments
    for s, e, g in zip(starts[rows].tolist(), ends[rows].tolist(), m.seg[rows].tolist()):
        if s < 0 or g < 0:
            out.append("null")
            continue
        buf = bufs.get(g)
        if buf is None:
            buf = bufs[g] = segs[g].buffer()
        raw = buf[s:e]
        j = cache.get(raw)
        if j is None:
            j = cache[raw] = as_json(raw.decode("utf-8", "replace"))
        out.append(j)
    return out


def _message_json(ts, m, rows: np.ndarray) -> list:
    """The message fields of report._message_fields, as a JSON tail per row (rows in MSG_OK state)."""
    cols = [_json_texts(ts, m, "REAL_TOPIC", rows), _json_texts(ts, m, "REAL_QID", rows, _qid_json),
            _json_texts(ts, m, "KEYS", rows), _json_texts(ts, m, "UNIQ_KEY", rows)]
    tout, qoff = m.timer_out[rows].tolist(), m.queue_offset[rows].tolist()
    return [f',"realTopic":{t},"realQueueId":{q},"keys":{k},"uniqKey":{u},"timerOutMs":{o if o >= 0 else "null"},'
            f'"timerQueueOffset":{qo}' for t, q, k, u, o, qo in zip(*cols, tout, qoff)]


def _topic_rows(ts, m, rows: np.ndarray, topic) -> np.ndarray:
    """``rows`` whose record's REAL_TOPIC is ``topic`` (all of them when no topic is asked)."""
    if topic is None:
        return rows
    rows = rows[m.state[rows] == MSG_OK]
    want = _escape(topic)
    return rows[np.array([t == want for t in _json_texts(ts, m, "REAL_TOPIC", rows)], bool)]


def _blocks(lines_of, rows: np.ndarray):
    """Encoded blocks of BLOCK_LINES lines: ``lines_of(part)`` gives a part's lines."""
    for lo in range(0, len(rows), BLOCK_LINES):
        yield "".join(lines_of(rows[lo:lo + BLOCK_LINES])).encode("utf-8")


def unit_lines(ts: TimerStore, *, since=None, until=None, topic=None, limit=None):
    """UTF-8 JSON Lines (``"type":"timerlog_unit"``) of report.unit_rows, a block of lines at a time."""
    left = limit
    magic_names: dict[int, str] = {}
    for sc in ts.scan():
        if left is not None and left <= 0:
            return
        u, m = sc.units, sc.msgs
        deliver, keep = deliver_window(sc, since, until)
        rows = _topic_rows(ts, m, keep, topic)
        if left is not None:
            rows = rows[:left]
            left -= len(rows)
        pending = ts.pending_mask(sc)

        def lines(part):
            cols = [a[part].tolist() for a in (u.pos, u.prevPos, u.magic, u.currWriteTime, u.delay, u.slot_time,
                                              u.offsetPy, u.sizePy, u.realTopicHash, deliver, pending, m.state)]
            ok = part[m.state[part] == MSG_OK]
            tails = iter(_message_json(ts, m, ok))
            for pos, prev, mg, cwt, delay, slot, offpy, sizepy, thash, dl, pend, state in zip(*cols):
                mt = magic_names.get(mg)
                if mt is None:
                    mt = magic_names[mg] = _dumps(magic_text(mg))
                yield (f'{{"type":"timerlog_unit","pos":{pos},"size":{TIMER_UNIT_SIZE},"prevPos":{prev},"magic":{mg},'
                       f'"magicText":{mt},"currWriteTime":{cwt},"delayMs":{delay},"slotTimeMs":{slot},'
                       f'"deliverTimeMs":{dl},"offsetPy":{offpy},"sizePy":{sizepy},"realTopicHash":{thash},'
                       f'"pending":{"true" if pend else "false"},"message":{_dumps(MSG_STATE_TEXT[state])}'
                       f'{next(tails) if state == MSG_OK else ""}}}\n')

        yield from _blocks(lines, rows)


def pending_lines(ts: TimerStore, *, since=None, until=None, topic=None, limit=None):
    """UTF-8 JSON Lines (``"type":"pending"``) of report.pending_rows, a block of lines at a time."""
    left = float("inf") if limit is None else limit
    unread = _unread_queue(ts)
    enqueued = np.zeros(len(unread[0]), bool) if unread is not None else None
    for sc in ts.scan():
        u, m = sc.units, sc.msgs
        if unread is not None and len(unread[0]):
            enqueued |= np.isin(unread[1], u.offsetPy)
        if left <= 0:
            return
        ok = m.state == MSG_OK
        deliver = np.where(ok & (m.timer_out > 0), m.timer_out, u.slot_time)
        keep = ts.pending_mask(sc)
        if since is not None:
            keep &= deliver >= since
        if until is not None:
            keep &= deliver <= until
        rows = _topic_rows(ts, m, np.flatnonzero(keep), topic)
        if left < len(rows):
            rows = rows[:int(left)]
        left -= len(rows)

        def lines(part):
            cols = [a[part].tolist() for a in (u.pos, u.slot_time, u.magic, deliver, m.state)]
            tails = iter(_message_json(ts, m, part[m.state[part] == MSG_OK]))
            for pos, slot, mg, dl, state in zip(*cols):
                yield (f'{{"type":"pending","source":"timerlog","pos":{pos},"slotTimeMs":{slot},'
                       f'"roll":{"true" if mg & 2 else "false"},"message":{_dumps(MSG_STATE_TEXT[state])}'
                       f'{next(tails) if state == MSG_OK else ""},"deliverTimeMs":{dl}}}\n')

        yield from _blocks(lines, rows)
    if unread is not None and left > 0:
        out = []
        for r in _unread_queue_rows(ts, unread, enqueued, since, until, topic):
            out.append(_dumps({"type": "pending", **r}) + "\n")
            left -= 1
            if left <= 0:
                break
        if out:
            yield "".join(out).encode("utf-8")
