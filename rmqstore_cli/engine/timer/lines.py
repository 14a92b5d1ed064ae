"""``dump timer --json`` encoded a chunk of units at a time: the same bytes as ``json_line`` of
report.py's rows (tests/test_timer_memory.py compares them), without a dict per unit. Each chunk's
columns become Python lists once; a line is one f-string; only the message's texts (topic, keys, uniq
key) go through json.dumps. Memory is one chunk's lines, whatever the timerlog's size."""

from __future__ import annotations

import json

import numpy as np

from rmqstore_cli.formats.timer import TIMER_UNIT_SIZE, magic_text

from .report import _unread_queue, _unread_queue_rows
from .store import MSG_OK, MSG_STATE_TEXT, TimerStore

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _qid_json(qid: str | None) -> str:
    """realQueueId as report._message_fields gives it: a number when the text is one."""
    if qid is not None and qid.lstrip("-").isdigit():
        try:
            return str(int(qid))
        except ValueError:
            pass
    return _dumps(qid)


def _message_json(ts, m, i: int, tout: int, qoff: int) -> str:
    text = m.text
    return (f',"realTopic":{_dumps(text(ts.store, i, "REAL_TOPIC"))},"realQueueId":{_qid_json(text(ts.store, i, "REAL_QID"))}'
            f',"keys":{_dumps(text(ts.store, i, "KEYS"))},"uniqKey":{_dumps(text(ts.store, i, "UNIQ_KEY"))}'
            f',"timerOutMs":{tout if tout >= 0 else "null"},"timerQueueOffset":{qoff}')


def unit_lines(ts: TimerStore, *, since=None, until=None, topic=None, limit=None):
    """UTF-8 JSON Lines (``"type":"timerlog_unit"``) of report.unit_rows, one bytes block per chunk."""
    left = limit
    magic_names: dict[int, str] = {}
    for sc in ts.scan():
        if left is not None and left <= 0:
            return
        u, m = sc.units, sc.msgs
        deliver = np.where(m.timer_out >= 0, m.timer_out, u.slot_time)
        keep = np.ones(len(u), bool)
        if since is not None:
            keep &= deliver >= since
        if until is not None:
            keep &= deliver <= until
        if topic is not None:
            keep &= m.state == MSG_OK
        pending = ts.pending_mask(sc)
        pos, prev, magic, cwt, delay, slot, offpy, sizepy, thash = (
            a.tolist() for a in (u.pos, u.prevPos, u.magic, u.currWriteTime, u.delay, u.slot_time, u.offsetPy, u.sizePy,
                                 u.realTopicHash))
        dl, pend, state, tout, qoff = deliver.tolist(), pending.tolist(), m.state.tolist(), m.timer_out.tolist(), \
            m.queue_offset.tolist()
        out = []
        for i in np.flatnonzero(keep).tolist():
            if topic is not None and m.text(ts.store, i, "REAL_TOPIC") != topic:
                continue
            mg = magic[i]
            mt = magic_names.get(mg)
            if mt is None:
                mt = magic_names[mg] = _dumps(magic_text(mg))
            line = (f'{{"type":"timerlog_unit","pos":{pos[i]},"size":{TIMER_UNIT_SIZE},"prevPos":{prev[i]},"magic":{mg},'
                    f'"magicText":{mt},"currWriteTime":{cwt[i]},"delayMs":{delay[i]},"slotTimeMs":{slot[i]},'
                    f'"deliverTimeMs":{dl[i]},"offsetPy":{offpy[i]},"sizePy":{sizepy[i]},"realTopicHash":{thash[i]},'
                    f'"pending":{"true" if pend[i] else "false"},"message":{_dumps(MSG_STATE_TEXT[state[i]])}')
            if state[i] == MSG_OK:
                line += _message_json(ts, m, i, tout[i], qoff[i])
            out.append(line + "}\n")
            if left is not None:
                left -= 1
                if left <= 0:
                    break
        if out:
            yield "".join(out).encode("utf-8")


def pending_lines(ts: TimerStore, *, since=None, until=None, topic=None, limit=None):
    """UTF-8 JSON Lines (``"type":"pending"``) of report.pending_rows, one bytes block per chunk."""
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
        if topic is not None:
            keep &= ok
        pos, slot, magic, dl, state, tout, qoff = (a.tolist() for a in (u.pos, u.slot_time, u.magic, deliver, m.state,
                                                                          m.timer_out, m.queue_offset))
        out = []
        for i in np.flatnonzero(keep).tolist():
            if topic is not None and m.text(ts.store, i, "REAL_TOPIC") != topic:
                continue
            line = (f'{{"type":"pending","source":"timerlog","pos":{pos[i]},"slotTimeMs":{slot[i]},'
                    f'"roll":{"true" if magic[i] & 2 else "false"},"message":{_dumps(MSG_STATE_TEXT[state[i]])}')
            if state[i] == MSG_OK:
                line += _message_json(ts, m, i, tout[i], qoff[i])
            out.append(f'{line},"deliverTimeMs":{dl[i]}}}\n')
            left -= 1
            if left <= 0:
                break
        if out:
            yield "".join(out).encode("utf-8")
    if unread is not None and left > 0:
        out = []
        for r in _unread_queue_rows(ts, unread, enqueued, since, until, topic):
            out.append(_dumps({"type": "pending", **r}) + "\n")
            left -= 1
            if left <= 0:
                break
        if out:
            yield "".join(out).encode("utf-8")
