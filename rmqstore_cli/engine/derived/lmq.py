"""Multi-dispatch / LMQ (FORMAT.md §14.3): which extra consume-queue units a record gets.

Mirrors the broker's ``MultiDispatchUtils.checkMultiDispatchQueue`` (which records) and
``ConsumeQueue.multiDispatchLmqQueue`` / ``doDispatchLmqQueue`` (which units): for a record of a
topic that is not ``%RETRY%…``, ``rmq_sys_…`` or ``SCHEDULE_TOPIC_XXXX`` whose properties hold a
non-blank ``INNER_MULTI_DISPATCH`` and ``INNER_MULTI_QUEUE_OFFSET``, both split on ``,`` (Java's
``String.split``: trailing empty pieces dropped); lists of different lengths dispatch nothing; a name
holding the path separator is skipped; each other name gets the unit ``(phy, TOTALSIZE, plain
tagsCode)`` at the offset named at the same position, in queue 0 when ``enableLmq`` is on and the
name starts with ``%LMQ%`` (else in the record's own queue id). An offset Java's ``Long.parseLong``
rejects throws there, so the names after it get nothing.

The settings: ``enableMultiDispatch`` gates dispatch, ``enableLmq`` the queue-0 rule. When the
broker's settings are not given, the records decide: ``INNER_MULTI_QUEUE_OFFSET`` is only stored by
a broker that assigned LMQ offsets, i.e. one with both settings on.
"""

from __future__ import annotations

import re

import numpy as np

from rmqstore_cli.formats import propscan
from rmqstore_cli.formats.message import decode_utf8
from rmqstore_cli.formats.properties import parse_properties
from rmqstore_cli.formats.tags import SCHEDULE_TOPIC
from ..arrays import distinct, queue_key

LMQ_PREFIX = "%LMQ%"
RETRY_PREFIX = "%RETRY%"
SYSTEM_PREFIX = "rmq_sys_"
DISPATCH_PROP, OFFSET_PROP = propscan.MULTI_DISPATCH_PROPS  # INNER_MULTI_DISPATCH, INNER_MULTI_QUEUE_OFFSET
LMQ_PROPS = (DISPATCH_PROP, OFFSET_PROP)
LMQ_QUEUE_ID = 0
_LONG = re.compile(r"[+-]?[0-9]+\Z")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


def is_lmq(name: str) -> bool:
    return name.startswith(LMQ_PREFIX)


class MultiDispatchRule:
    """The two settings, as the broker's dispatch reads them (see the module docstring)."""

    def __init__(self, config):
        explicit = getattr(config, "explicit", set())
        self.enabled = bool(config.enableMultiDispatch) if "enableMultiDispatch" in explicit else True
        known = explicit | set(getattr(config, "inferred", {}))
        self.lmq_queue_zero = bool(config.enableLmq) if "enableLmq" in known else True

    @staticmethod
    def checked(config) -> bool:
        """Whether checks look for multi-dispatch in every record (verify, recovery's derived check): the setting
        given, or inferred from %LMQ% queues on disk. Dispatch itself also follows records carrying the offsets
        when nothing is given; a check that walked every record's properties on every store would cost each
        classic store a second property scan."""
        return bool(config.enableMultiDispatch)

    @staticmethod
    def topic_takes_part(topic: str) -> bool:
        """isNeedHandleMultiDispatch's topic exclusions."""
        return not (topic.startswith(RETRY_PREFIX) or topic.startswith(SYSTEM_PREFIX) or topic == SCHEDULE_TOPIC)

    def targets(self, topic: str, queue_id: int, names: str | None, offsets: str | None) -> list[tuple[str, int, int]]:
        """(queue name, queue id, queue offset) of every extra unit the record gets, in property order."""
        if not self.enabled or not names or not offsets or not names.strip() or not offsets.strip():
            return []
        if not self.topic_takes_part(topic):
            return []
        qs, os_ = _java_split(names), _java_split(offsets)
        if len(qs) != len(os_):
            return []
        out = []
        for name, off in zip(qs, os_):
            if "/" in name:
                continue
            if not _LONG.match(off):
                break  # NumberFormatException: the rest of the list is not dispatched
            value = int(off)
            if not _LONG_MIN <= value <= _LONG_MAX:
                break
            qid = LMQ_QUEUE_ID if (self.lmq_queue_zero and is_lmq(name)) else queue_id
            out.append((name, qid, value))
        return out


def _java_split(text: str) -> list[str]:
    """``String.split(",")``: trailing empty strings removed."""
    parts = text.split(",")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


class LmqTargets:
    """The extra units of many records as columns: ``row`` (index of the record in its batch), ``name``
    (index into ``names``), ``queue_id``, ``queue_offset``; rows in record order, each record's names in
    property order."""

    __slots__ = ("row", "name", "queue_id", "queue_offset", "names")

    def __init__(self, row, name, queue_id, queue_offset, names):
        self.row = np.asarray(row, np.int64)
        self.name = np.asarray(name, np.int64)
        self.queue_id = np.asarray(queue_id, np.int64)
        self.queue_offset = np.asarray(queue_offset, np.int64)
        self.names = names

    def __len__(self) -> int:
        return len(self.row)

    @classmethod
    def empty(cls) -> "LmqTargets":
        return cls([], [], [], [], [])

    @classmethod
    def from_lists(cls, per_record: list[tuple[int, list]]) -> "LmqTargets":
        """From [(row, [(name, qid, offset), ...]), ...]."""
        ids: dict[str, int] = {}
        row, name, qid, qo = [], [], [], []
        for r, ts in per_record:
            for n, q, o in ts:
                row.append(r)
                name.append(ids.setdefault(n, len(ids)))
                qid.append(q)
                qo.append(o)
        return cls(row, name, qid, qo, list(ids))

    def take_rows(self, keep_rows: np.ndarray) -> "LmqTargets":
        """Only the targets of the records at positions ``keep_rows`` (sorted), renumbered to their new positions."""
        keep_rows = np.asarray(keep_rows, np.int64)
        pos = np.searchsorted(keep_rows, self.row)
        hit = (pos < len(keep_rows)) & (keep_rows[np.minimum(pos, max(len(keep_rows) - 1, 0))] == self.row) \
            if len(keep_rows) else np.zeros(len(self.row), bool)
        return LmqTargets(pos[hit], self.name[hit], self.queue_id[hit], self.queue_offset[hit], self.names)


class RowTopics:
    """Each record's topic as an id into ``names`` (``ids[i]``), as :func:`chunk_targets` takes them: called with a
    record's index it gives its topic (``names[ids[i]]``), and which records' topics take part in multi-dispatch is
    decided per topic rather than per record."""

    def __init__(self, ids: np.ndarray, names):
        self.ids, self.names = ids, names

    def __call__(self, i: int) -> str:
        return self.names[int(self.ids[i])]

    def take_part(self, rows: np.ndarray) -> np.ndarray:
        ids = np.asarray(self.ids)[rows]
        if not len(ids):
            return np.zeros(0, bool)
        uniq, inv = np.unique(ids, return_inverse=True)
        return np.asarray([MultiDispatchRule.topic_takes_part(self.names[t]) for t in uniq.tolist()], bool)[inv]


def chunk_targets(rule: MultiDispatchRule, u8: np.ndarray, h, topic_of_row: RowTopics, rows: np.ndarray | None = None,
                  pv: propscan.PropValues | None = None) -> LmqTargets:
    """The extra units of the records of decoded headers ``h`` over buffer ``u8`` (``topic_of_row``: their
    topics). ``rows``: only those records (default: all). The two properties are
    located for the whole chunk at once (compiled scan; ``pv``: a scan of the chunk that already located
    them); only records carrying both are decoded."""
    if not rule.enabled or not len(h):
        return LmqTargets.empty()
    if pv is None or DISPATCH_PROP not in pv.start:
        pv = propscan.scan(u8, h.propsStart, h.propsLength, names=LMQ_PROPS)
    has = (pv.start[DISPATCH_PROP] >= 0) & (pv.start[OFFSET_PROP] >= 0)
    if rows is not None:
        sel = np.zeros(len(h), bool)
        sel[np.asarray(rows, np.int64)] = True
        has &= sel
    if not has.any():
        return LmqTargets.empty()
    return _targets(rule, u8, h, topic_of_row, pv, has)


def _targets(rule, u8, h, topic_of_row, pv, has) -> LmqTargets:
    """The targets of the records ``has``: those in ASCII parsed in array operations (:mod:`.lmqparse`), the rest
    by the rule in Python; numbered as :meth:`LmqTargets.from_lists` numbers them."""
    from .lmqparse import parse

    rows = np.flatnonzero(has)
    if not rule.enabled or not len(rows):
        return LmqTargets.empty()
    part = topic_of_row.take_part(rows)
    fast = rows[part & pv.ascii[rows]]
    (rec, name, qid, qo), names, left = parse(
        u8, (pv.start[DISPATCH_PROP][fast], pv.end[DISPATCH_PROP][fast]),
        (pv.start[OFFSET_PROP][fast], pv.end[OFFSET_PROP][fast]), np.asarray(h.queueId)[fast], rule.lmq_queue_zero)
    slow = np.zeros(len(has), bool)
    slow[rows[part & ~pv.ascii[rows]]] = True
    slow[fast[left]] = True
    if not slow.any():
        row = fast[rec]
    else:
        ids = {n: k for k, n in enumerate(names)}
        extra = [(i, ids.setdefault(n, len(ids)), q, o) for i, ts in _per_record(rule, u8, h, topic_of_row, pv, slow)
                 for n, q, o in ts]
        names = list(ids)
        if extra:
            e_row, e_name, e_qid, e_qo = (np.asarray(c, np.int64) for c in zip(*extra))
            row = np.concatenate([fast[rec], e_row])
            order = np.argsort(row, kind="stable")  # record order; a record's targets come from one side only
            row, name = row[order], np.concatenate([name, e_name])[order]
            qid, qo = np.concatenate([qid, e_qid])[order], np.concatenate([qo, e_qo])[order]
        else:
            row = fast[rec]
    if len(name):  # names numbered in the order they first appear, as from_lists numbers them
        _, first = np.unique(name, return_index=True)
        used = np.unique(name)
        order = used[np.argsort(first, kind="stable")]
        renum = np.empty(len(names), np.int64)
        renum[order] = np.arange(len(order))
        name = renum[name]
        names = [names[j] for j in order.tolist()]
    else:
        names = []
    return LmqTargets(row, name, qid, qo, names)


def _per_record(rule, u8, h, topic_of_row, pv, has) -> list:
    per_record = []
    for i in np.flatnonzero(has).tolist():
        if pv.ascii[i]:
            names = bytes(u8[int(pv.start[DISPATCH_PROP][i]):int(pv.end[DISPATCH_PROP][i])]).decode("ascii")
            offs = bytes(u8[int(pv.start[OFFSET_PROP][i]):int(pv.end[OFFSET_PROP][i])]).decode("ascii")
        else:
            s, n = int(h.propsStart[i]), int(h.propsLength[i])
            props = parse_properties(decode_utf8(bytes(u8[s:s + n])))
            names, offs = props.get(DISPATCH_PROP), props.get(OFFSET_PROP)
        ts = rule.targets(topic_of_row(i), int(h.queueId[i]), names, offs)
        if ts:
            per_record.append((i, ts))
    return per_record


def record_targets(store, recs, rule: MultiDispatchRule | None = None, only: np.ndarray | None = None) -> LmqTargets:
    """The extra units of every record of a verify record table (``verify.records._Records``; ``only``: of those
    record indexes): ``row`` is the record's index there. Each segment's records are decoded again (headers
    only, then the two properties located by the compiled scan)."""
    from rmqstore_cli.formats import fast

    rule = rule or MultiDispatchRule(store.config)
    if not rule.enabled or not len(recs):
        return LmqTargets.empty()
    segs = store.commitlog.segments.segments
    per_record = []
    ids: dict[str, int] = {}  # names numbered as they first appear, segment after segment
    pick = np.arange(len(recs), dtype=np.int64) if only is None else distinct(np.asarray(only, np.int64))
    for k in distinct(recs.seg[pick]).tolist():
        rows = pick[recs.seg[pick] == k]
        seg = segs[k]
        buf = seg.buffer()
        u8 = fast.kernel_view(buf)
        h = fast.decode_headers(buf, recs.phy[rows] - seg.start)
        pv = propscan.scan(u8, h.propsStart, h.propsLength, names=LMQ_PROPS)
        has = (pv.start[DISPATCH_PROP] >= 0) & (pv.start[OFFSET_PROP] >= 0)
        if has.any():
            lt = _targets(rule, u8, h, RowTopics(recs.c["topic"][rows], recs.topics), pv, has)
            to_global = np.asarray([ids.setdefault(n, len(ids)) for n in lt.names], np.int64)
            per_record.append((rows[lt.row], to_global[lt.name], lt.queue_id, lt.queue_offset))
    if not per_record:
        return LmqTargets.empty()
    return LmqTargets(*(np.concatenate([p[c] for p in per_record]) for c in range(4)), list(ids))


def window_targets(recs) -> tuple[LmqTargets, np.ndarray, np.ndarray, dict]:
    """The extra units of every record of a verify record table (one window), made once per table and kept on
    it: the targets, their (name, queue id) keys sorted, the order that sorts them, and {name: index}. Each LMQ
    queue's units are matched against these, and the multi-dispatch check walks them: the records' properties
    were decoded again for every LMQ queue reaching the window (~0.5 ms a queue, plus each record's names and
    offsets parsed once per queue it names)."""
    got = recs.__dict__.get("_lmq_window_targets")
    if got is None:
        lt = record_targets(recs.store, recs)
        key = queue_key(lt.name, lt.queue_id)
        order = np.argsort(key, kind="stable")
        got = recs.__dict__["_lmq_window_targets"] = (lt, key[order], order, {n: i for i, n in enumerate(lt.names)})
    return got


def window_targets_by_record(recs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The window's targets (:func:`window_targets`) grouped by record, as the compiled queue check reads them
    (``checkkernel.queue_runs``): (first, key, queue offset), record ``r``'s targets at ``first[r] ..
    first[r + 1] - 1``, key :func:`..arrays.queue_key` of (name, queue id) with the names numbered as
    :func:`window_targets`' {name: index}. Made once per table and kept on it."""
    got = recs.__dict__.get("_lmq_targets_by_record")
    if got is None:
        lt = window_targets(recs)[0]
        by_row = np.argsort(lt.row, kind="stable")
        first = np.zeros(len(recs) + 1, np.int64)
        np.cumsum(np.bincount(lt.row, minlength=len(recs)), out=first[1:])
        key = queue_key(lt.name[by_row], lt.queue_id[by_row])
        got = recs.__dict__["_lmq_targets_by_record"] = (
            first, np.ascontiguousarray(key, np.int64), np.ascontiguousarray(lt.queue_offset[by_row], np.int64))
    return got


def append_side_on(config) -> bool:
    """Does the broker's append assign LMQ offsets (5.x: ``enableLmq``)? Given or inferred from the store's
    LMQ queues; off by default, as in the broker."""
    return bool(config.enableLmq) if ("enableLmq" in config.explicit or "enableLmq" in config.inferred) else False


def wraps_lmq(topic: str, props: dict) -> bool:
    """MessageExtBrokerInner.needDispatchLMQ: a non-blank INNER_MULTI_DISPATCH on a topic that allows LMQ."""
    names = props.get(DISPATCH_PROP)
    return bool(names and names.strip()) and MultiDispatchRule.topic_takes_part(topic)


def lmq_names(props: dict) -> list[str]:
    return _java_split(props.get(DISPATCH_PROP, ""))


def wrapped_properties(props_str: str, offsets: list[int | None]) -> str:
    """The properties string the 5.x append stores for an LMQ message (LmqDispatch.wrapLmqDispatch, then
    CommitLog.handlePropertiesForLmqMsg): the message's map (the send's string parsed into a HashMap of
    capacity 128, in string order) gets ``INNER_MULTI_QUEUE_OFFSET`` = the offsets joined by ``,`` (empty for a
    non-LMQ name), ``WAIT`` is removed and put back (so it moves to the end of its bucket, and stays), and the
    map is serialised again in HashMap order. Checked against every LMQ put of stores/lmq-5.3.3."""
    from rmqstore_cli.formats.java_hashmap import hashmap_order
    from rmqstore_cli.formats.properties import serialize_properties

    props = parse_properties(props_str)
    keys = list(props)
    if OFFSET_PROP not in props:
        keys.append(OFFSET_PROP)
    props[OFFSET_PROP] = ",".join("" if o is None else str(o) for o in offsets)
    if "WAIT" in props:
        keys.remove("WAIT")
        keys.append("WAIT")
    return serialize_properties([(k, props[k]) for k in hashmap_order(keys, 128)], 5)


def lmq_queue_names(root: str, dirname: str = "consumequeue") -> list[str]:
    """The ``%LMQ%`` queue directories of a store."""
    import os

    try:
        return sorted(n for n in os.listdir(os.path.join(root, dirname)) if is_lmq(n))
    except OSError:
        return []
