"""The timer store read as the broker's TimerMessageStore reads it: the timerlog in order, the wheel
the units build (replayed like ``doEnqueue``), and the ``rmq_sys_wheel_timer`` record each unit points
at (``getMessageByCommitOffset``), resolved a chunk of units at a time with compiled kernels.

A unit is *pending* when its slot has not been read yet: slot time >= the checkpoint's lastReadTimeMs
(``TimerMessageStore.recover`` restarts reading there). A message owns one pending unit at most (a roll
unit is re-put, and re-enqueued, only when its slot fires); its delivery time is the record's
``TIMER_OUT_MS`` (a roll unit's slot is an intermediate stop).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rmqstore_cli.formats import propscan
from rmqstore_cli.formats.fast import R_OK, decode_headers, kernel_view
from rmqstore_cli.formats.records import MESSAGE_MAGICS
from rmqstore_cli.formats.timer import MAGIC_DELETE, MAGIC_ROLL, TIMER_TOPIC, WHEEL_SLOTS

from ..errors import UsageError
from .files import TimerCheckpoint, TimerLog, TimerLogWalk, TimerMetrics, TimerWheel, UnitChunk
from ..arrays import distinct

PROPS = ("REAL_TOPIC", "REAL_QID", "TIMER_OUT_MS", "UNIQ_KEY", "KEYS", "TIMER_ROLL_TIMES")
_TOPIC_BYTES = np.frombuffer(TIMER_TOPIC.encode(), np.uint8)

# What the record at a unit's offsetPy is (MessageState.state).
MSG_OK, MSG_GONE, MSG_NOT_RECORD, MSG_WRONG_SIZE, MSG_WRONG_TOPIC = 0, 1, 2, 3, 4
MSG_STATE_TEXT = {MSG_OK: "ok", MSG_GONE: "gone", MSG_NOT_RECORD: "not a record", MSG_WRONG_SIZE: "wrong size",
                  MSG_WRONG_TOPIC: "not a timer record"}


@dataclass
class MessageColumns:
    """Per unit: what its offsetPy/sizePy point at, and where the properties the timer reads are."""

    state: np.ndarray  # MSG_*
    topic_hash: np.ndarray  # int32 String.hashCode of REAL_TOPIC (0 when absent)
    has_topic: np.ndarray  # bool: REAL_TOPIC present
    timer_out: np.ndarray  # int64 TIMER_OUT_MS, -1 when absent
    queue_offset: np.ndarray  # int64 the record's queue offset in rmq_sys_wheel_timer
    seg: np.ndarray  # int32 commitlog segment index of the record, -1
    spans: dict  # prop -> (start, end) absolute positions in its segment, -1
    _buf: object = None
    _buf_seg: int = -1

    def text(self, store, i: int, name: str) -> str | None:
        s = int(self.spans[name][0][i])
        if s < 0 or self.seg[i] < 0:
            return None
        seg = int(self.seg[i])
        if seg != self._buf_seg:  # one buffer lookup per run of records in a segment
            self._buf, self._buf_seg = store.commitlog.segments.segments[seg].buffer(), seg
        return bytes(self._buf[s:int(self.spans[name][1][i])]).decode("utf-8", "replace")


def resolve_messages(store, offset_py: np.ndarray, size_py: np.ndarray) -> MessageColumns:
    """The record each (offsetPy, sizePy) names: a valid rmq_sys_wheel_timer record of that size, and
    its REAL_TOPIC / REAL_QID / TIMER_OUT_MS / UNIQ_KEY / KEYS (compiled header decode and property scan,
    grouped by commitlog segment)."""
    n = len(offset_py)
    state = np.full(n, MSG_GONE, np.int8)
    thash = np.zeros(n, np.int32)
    has_topic = np.zeros(n, bool)
    tout = np.full(n, -1, np.int64)
    qoff = np.full(n, -1, np.int64)
    segi = np.full(n, -1, np.int32)
    spans = {p: (np.full(n, -1, np.int64), np.full(n, -1, np.int64)) for p in PROPS}
    segs = store.commitlog.segments.segments
    if not n or not segs:
        return MessageColumns(state, thash, has_topic, tout, qoff, segi, spans)
    starts = np.array([s.start for s in segs], np.int64)
    which = np.searchsorted(starts, offset_py, side="right") - 1
    for si in distinct(which[which >= 0]).tolist():
        seg = segs[si]
        sel = np.flatnonzero((which == si) & (offset_py < seg.start + seg.size))
        if not len(sel):
            continue
        u8 = kernel_view(seg.buffer())
        rel = offset_py[sel] - seg.start
        h = decode_headers(u8, rel, u8)
        magic_ok = np.isin(h.magicCode, np.asarray(MESSAGE_MAGICS, np.int32))
        # gone: the whole span is zeros (a cut or zeroed tail); zeros inside a record are not enough
        zeros = (h.magicCode == 0) & (h.totalSize == 0)
        for j in np.flatnonzero(zeros).tolist():
            a = int(rel[j])
            zeros[j] = not u8[a:a + max(int(size_py[sel[j]]), 1)].any()
        st = np.where(zeros, MSG_GONE, MSG_NOT_RECORD).astype(np.int8)
        good = magic_ok & (h.reason == R_OK) & (rel + h.totalSize <= seg.size)
        st[good & (h.totalSize != size_py[sel])] = MSG_WRONG_SIZE
        fits = good & (h.totalSize == size_py[sel])
        tl = h.topicLength
        same_topic = fits & (tl == len(_TOPIC_BYTES))
        if same_topic.any():
            idx = np.flatnonzero(same_topic)
            got = u8[h.topicStart[idx][:, None] + np.arange(len(_TOPIC_BYTES))]
            same_topic[idx] = (got == _TOPIC_BYTES).all(axis=1)
        st[fits & ~same_topic] = MSG_WRONG_TOPIC
        st[same_topic] = MSG_OK
        state[sel] = st
        segi[sel] = si
        qoff[sel] = h.queueOffset
        ok = np.flatnonzero(st == MSG_OK)
        if not len(ok):
            continue
        pv = propscan.scan(u8, h.propsStart[ok], h.propsLength[ok], names=PROPS)
        at = sel[ok]
        for p in PROPS:
            spans[p][0][at] = pv.start[p]
            spans[p][1][at] = pv.end[p]
        rs, re_ = pv.start["REAL_TOPIC"], pv.end["REAL_TOPIC"]
        present = rs >= 0
        has_topic[at] = present
        thash[at] = np.where(present, propscan.java_hash_spans(u8, np.where(present, rs, 0), np.where(present, re_, 0))
                             .view(np.int32), 0)
        ts, te = pv.start["TIMER_OUT_MS"], pv.end["TIMER_OUT_MS"]
        tout[at] = _parse_ints(u8, ts, te)
    return MessageColumns(state, thash, has_topic, tout, qoff, segi, spans)


def _parse_ints(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Decimal ASCII spans as int64 (-1 when absent or not a plain number)."""
    out = np.full(len(starts), -1, np.int64)
    ok = (starts >= 0) & (ends > starts) & (ends - starts <= 18)
    if not ok.any():
        return out
    idx = np.flatnonzero(ok)
    width = int((ends[idx] - starts[idx]).max())
    pos = starts[idx][:, None] + np.arange(width)
    inside = pos < ends[idx][:, None]
    digits = u8[np.minimum(pos, len(u8) - 1)].astype(np.int64) - 48
    valid = ((digits >= 0) & (digits <= 9)) | ~inside
    val = np.zeros(len(idx), np.int64)
    for j in range(width):
        col = np.where(inside[:, j], digits[:, j], 0)
        val = np.where(inside[:, j], val * 10 + col, val)
    out[idx] = np.where(valid.all(axis=1), val, -1)
    return out


@dataclass
class Wheel:
    """The wheel the timerlog builds (doEnqueue replayed), one entry per slot index."""

    time: np.ndarray  # slot time / precision, -1 where no unit went
    first: np.ndarray
    last: np.ndarray
    num: np.ndarray
    cut: np.ndarray  # 1: the chain starts before the timerlog's first file

    @classmethod
    def empty(cls) -> "Wheel":
        return cls(np.full(WHEEL_SLOTS, -1, np.int64), np.full(WHEEL_SLOTS, -1, np.int64),
                   np.full(WHEEL_SLOTS, -1, np.int64), np.zeros(WHEEL_SLOTS, np.int64), np.zeros(WHEEL_SLOTS, np.int8))


@dataclass
class ScannedChunk:
    """A chunk of timerlog units as the scan yields it, with the wheel's expectations and their messages."""

    units: UnitChunk
    expected_prev: np.ndarray
    slot_units: np.ndarray  # slot time / precision
    msgs: MessageColumns | None


class TimerStore:
    """The timer store of one broker store root (read side of TimerMessageStore)."""

    def __init__(self, store):
        self.store = store
        cfg = store.config
        self.root = store.root
        self.timerlog = TimerLog(store.root, cfg.mappedFileSizeTimerLog)
        self.wheel = TimerWheel(store.root)
        self.checkpoint = TimerCheckpoint.read(store.root)
        self.metrics = TimerMetrics.read(store.root)
        self.precision_ms, self.precision_source = self._precision(cfg)
        self._superseded: np.ndarray | None = None

    @property
    def present(self) -> bool:
        return bool(self.timerlog.segments.segments) or self.wheel.exists or self.checkpoint.exists

    def _precision(self, cfg) -> tuple[int, str]:
        """timerPrecisionMs: given, else what a used wheel slot and its last unit imply, else the default."""
        if "timerPrecisionMs" in cfg.explicit:
            if cfg.timerPrecisionMs <= 0:
                raise UsageError(f"timerPrecisionMs={cfg.timerPrecisionMs}: the timer precision must be positive")
            return cfg.timerPrecisionMs, "given"
        slices = self.wheel.nonempty()
        try:
            for idx, recs in slices:
                for i, t, last in zip(idx.tolist(), recs["timeUnits"].tolist(), recs["lastPos"].tolist()):
                    unit = self.timerlog.read_unit(int(last))
                    if t <= 0 or unit is None:
                        continue
                    slot_ms = unit["currWriteTime"] + unit["delay"]
                    p = slot_ms // t
                    if p > 0 and slot_ms // p == t and (slot_ms // p) % WHEEL_SLOTS == i:
                        return int(p), "inferred: a wheel slot's time and its last unit"
                break
        finally:
            slices.close()
        return cfg.timerPrecisionMs, "default"

    @property
    def read_time_ms(self) -> int:
        """Where the timer restarts reading (the checkpoint's lastReadTimeMs; 0 without one)."""
        return self.checkpoint.lastReadTimeMs if self.checkpoint.exists else 0

    def scan(self, walk: TimerLogWalk | None = None, wheel: Wheel | None = None, resolve: bool = True,
             stop_at: int | None = None):
        """Yield ScannedChunks in timerlog order with the replayed prevPos and (``resolve``) the records;
        ``stop_at``: only the units before this timerlog position (what a cut keeps)."""
        from rmqstore_cli.formats import timerkernel as k

        wheel = wheel if wheel is not None else Wheel.empty()
        floor = self.timerlog.min_offset
        for ch in self.timerlog.walk(walk):
            if stop_at is not None:
                ch = ch.select(ch.pos < stop_at)
                if not len(ch):
                    break
            slot_units = ch.slot_time // self.precision_ms
            exp = np.empty(len(ch), np.int64)
            k.replay_wheel(ch.pos, ch.prevPos, ch.magic, slot_units, floor, wheel.time, wheel.first, wheel.last,
                           wheel.num, wheel.cut, exp)
            msgs = resolve_messages(self.store, ch.offsetPy, ch.sizePy) if resolve else None
            yield ScannedChunk(ch, exp, slot_units, msgs)

    def pending_mask(self, sc: ScannedChunk) -> np.ndarray:
        """Units whose slot has not been read, that deliver (or re-roll) a message (not delete marks),
        without the roll units a later unit of the same message supersedes."""
        mask = (sc.units.slot_time >= self.read_time_ms) & ((sc.units.magic & MAGIC_DELETE) == 0)
        sup = self.superseded()
        if len(sup):
            mask &= ~np.isin(sc.units.pos, sup)
        return mask

    def superseded(self) -> np.ndarray:
        """Timerlog positions of pending roll units whose message already has a later unit: the broker
        fired the roll's slot and enqueued the re-put, but its checkpoint (lastReadTimeMs) was not moved
        past the slot before it stopped. Only units between the read clock and the write clock (the newest
        currWriteTime) can be such a pair, so only those are resolved: memory stays small."""
        if self._superseded is not None:
            return self._superseded
        read = self.read_time_ms
        newest = -1
        for ch in self.timerlog.walk():
            newest = max(newest, int(ch.currWriteTime.max()))
        # columns only: (UNIQ_KEY hash, position) of the candidate roll units and of the later units
        old_h, old_p, new_h, new_p = [], [], [], []
        for ch in self.timerlog.walk():
            pending = (ch.slot_time >= read) & ((ch.magic & MAGIC_DELETE) == 0)
            old = pending & ((ch.magic & MAGIC_ROLL) != 0) & (ch.slot_time <= newest)
            new = pending & ~old & (ch.currWriteTime >= read)
            sel = np.flatnonzero(old | new)
            if not len(sel) or not old.any() and not old_h:
                continue
            m = resolve_messages(self.store, ch.offsetPy[sel], ch.sizePy[sel])
            h = self._key_hashes(m, "UNIQ_KEY")
            keyed = h != 0
            is_old = old[sel] & keyed
            is_new = ~old[sel] & keyed
            old_h.append(h[is_old])
            old_p.append(ch.pos[sel][is_old])
            new_h.append(h[is_new])
            new_p.append(ch.pos[sel][is_new])
        self._superseded = self._pairs(old_h, old_p, new_h, new_p)
        return self._superseded

    def _key_hashes(self, m: MessageColumns, name: str) -> np.ndarray:
        """64-bit hash of property ``name``'s text per resolved record (0: absent), a commitlog segment
        at a time."""
        from rmqstore_cli.formats import timerkernel as k

        out = np.zeros(len(m.seg), np.int64)
        starts, ends = m.spans[name]
        for si in distinct(m.seg[(m.seg >= 0) & (starts >= 0)]).tolist():
            at = np.flatnonzero((m.seg == si) & (starts >= 0))
            u8 = kernel_view(self.store.commitlog.segments.segments[si].buffer())
            got = np.empty(len(at), np.int64)
            k.hash_spans64(u8, starts[at], ends[at], got)
            out[at] = got
        return out

    def _pairs(self, old_h, old_p, new_h, new_p) -> np.ndarray:
        """Old units with a later unit of the same key: each key's last later position, looked up for
        every old unit; a hash match is confirmed on the two keys' text."""
        cat = lambda p: np.concatenate(p) if p else np.zeros(0, np.int64)  # noqa: E731
        oh, op, nh, np_ = cat(old_h), cat(old_p), cat(new_h), cat(new_p)
        if not len(oh) or not len(nh):
            return np.zeros(0, np.int64)
        order = np.lexsort((np_, nh))
        nh, np_ = nh[order], np_[order]
        last = np.r_[nh[1:] != nh[:-1], True]  # the last (largest position) of each key
        keys, key_last = nh[last], np_[last]
        at = np.minimum(np.searchsorted(keys, oh), len(keys) - 1)
        hit = np.flatnonzero((keys[at] == oh) & (op < key_last[at]))
        if not len(hit):
            return np.zeros(0, np.int64)
        olds, news = op[hit], key_last[at[hit]]
        same = self._texts(olds, "UNIQ_KEY") == self._texts(news, "UNIQ_KEY")
        return distinct(olds[same])

    def _texts(self, positions: np.ndarray, name: str) -> np.ndarray:
        units = [self.timerlog.read_unit(int(p)) for p in positions.tolist()]
        m = resolve_messages(self.store, np.array([u["offsetPy"] for u in units], np.int64),
                             np.array([u["sizePy"] for u in units], np.int64))
        return np.array([m.text(self.store, j, name) for j in range(len(units))], object)

    def timer_queue(self):
        """The rmq_sys_wheel_timer queue 0, or None."""
        if (TIMER_TOPIC, 0) in set(self.store.queues()):
            return self.store.queue(TIMER_TOPIC, 0)
        return None

    def close(self) -> None:
        self.timerlog.close()
        self.wheel.close()
