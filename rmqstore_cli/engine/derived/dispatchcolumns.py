"""Verify phase 1, per chunk of valid records: what the broker's dispatch would compute for each
record (topic id, tagsCode, index key hashes), as columns, so the cross-checks are numpy joins.

The common case (ASCII properties, topic not SCHEDULE_TOPIC_XXXX) is computed for the whole chunk
at once with :mod:`formats.propscan`; every other record goes through the one-at-a-time rules
(:func:`formats.properties.parse_properties`, :func:`formats.tags.tags_code`), so both agree.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats import propscan
from rmqstore_cli.formats.hashing import index_key, index_key_hash, java_hash
from rmqstore_cli.formats.message import decode_utf8
from rmqstore_cli.formats.properties import parse_properties
from rmqstore_cli.formats.tags import SCHEDULE_TOPIC, TagsCodeError, tags_code


_FEW_GROUPS = 48  # up to this many topics in a chunk, a step per topic costs less than the array operations
_ROW_BYTES = 128  # topics compared as rows up to this length (the broker's topic names are at most 127 bytes)


class TopicInterner:
    """Topic bytes -> small ids, per walk of the log (or of a segment, in a ``-j`` worker; ids are remapped by name
    when reports are merged).

    A chunk's topic groups whose topic is already known are matched in a few array operations: by their
    (Java hash, length) key in a sorted table of the known topics' keys, then byte for byte against that topic.
    Only topics not yet in the table, and keys two known topics share, take a Python step each: a broker with
    thousands of topics has thousands in every chunk, and a step per topic and chunk cost more than the walk."""

    def __init__(self):
        self.ids: dict[bytes, int] = {}
        self._names: list[str] = []  # the topics decoded, in id order
        self.prefix: list[int] = []  # uint32 java hash of "topic#" per id
        self.schedule: list[bool] = []
        self._key_of: list[int] = []  # per id: its (hash << 16 ^ length) key as the chunk passes computed it
        self._keys = np.zeros(0, np.int64)  # the known keys, sorted, one entry per key
        self._key_ids = np.zeros(0, np.int64)  # the (first) id with that key
        self._rows = np.zeros((0, 1), np.uint8)  # every known topic's bytes, a row per id, zero-padded
        self._indexed = 0  # topics in the table (the first ones by id); later ones are found through the dict

    def intern_chunk(self, u8: np.ndarray, buf, h) -> np.ndarray:
        ts, tl = h.topicStart, np.maximum(h.topicLength, 0)
        if not len(ts):
            return np.zeros(0, np.int32)
        group, firsts = propscan.group_spans(u8, ts, tl)  # equal topic bytes, compared byte for byte
        fs, fl = ts[firsts], tl[firsts]
        return self.group_ids(u8, fs, fl, propscan.java_hash_spans(u8, fs, fs + fl))[group]

    def group_ids(self, u8: np.ndarray, fs: np.ndarray, fl: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """The ids of a chunk's topic groups (each group's first topic at ``u8[fs:fs+fl]``, its Java hash over bytes
        ``hashes``); new topics get their ids in (hash, length) order, as before the grouping was compiled."""
        fs, fl = np.asarray(fs, np.int64), np.asarray(fl, np.int64)
        key = (hashes.astype(np.int64) << 16) ^ fl  # the low 16 bits are the length: equal keys, equal lengths
        out = np.full(len(fs), -1, dtype=np.int32)
        if len(self._keys) and len(fs) > _FEW_GROUPS:
            at = np.minimum(np.searchsorted(self._keys, key), len(self._keys) - 1)
            cand = np.where(self._keys[at] == key, self._key_ids[at], -1)
            width = self._rows.shape[1]
            sel = np.flatnonzero((cand >= 0) & (fl > 0) & (fl <= width) & (fs + width <= len(u8)))
            if len(sel):
                ids, lengths = cand[sel], fl[sel]
                w = np.arange(int(lengths.max()))
                rows = u8[fs[sel][:, None] + w]  # each topic's bytes and the next ones, to the longest
                same = (rows == self._rows[ids, :len(w)]) | (w >= lengths[:, None])
                hit = same.all(axis=1)
                out[sel[hit]] = ids[hit]
        rest = np.flatnonzero(out < 0)
        if len(rest):
            mv = memoryview(u8)
            rest = rest[np.argsort(key[rest], kind="stable")]
            for g, s, ln, k in zip(rest.tolist(), fs[rest].tolist(), fl[rest].tolist(), key[rest].tolist()):
                out[g] = self._id(bytes(mv[s:s + ln]), k)
            if len(self.ids) - self._indexed > self._indexed // 4:
                self._index()  # grown by a quarter: rebuilds cost a few passes over all topics in all
        return out

    def known(self) -> list[bytes]:
        """The topics' bytes, in id order."""
        return list(self.ids)

    def learn(self, raws: list[bytes], upto: int) -> None:
        """Ids up to ``upto`` are ``raws``' (another walk's topics over the same records, in its id order, of which
        this one's are the first): the ones not known yet are added in that order, as this walk would add them."""
        new = raws[len(self.ids):upto]
        if not new:
            return
        buf = np.frombuffer(b"".join(new), np.uint8)
        ends = np.cumsum([len(r) for r in new], dtype=np.int64)
        hashes = propscan.java_hash_spans(buf, ends - [len(r) for r in new], ends)  # keyed as group_ids keys them
        for raw, h in zip(new, hashes.tolist()):
            self._id(raw, (int(h) << 16) ^ len(raw))
        if len(self.ids) - self._indexed > self._indexed // 4:
            self._index()

    def _id(self, raw: bytes, key: int) -> int:
        i = self.ids.get(raw)
        if i is None:
            i = self.ids[raw] = len(self.ids)
            t = decode_utf8(raw)
            self._names.append(t)
            self.prefix.append(java_hash(t + "#") & 0xFFFFFFFF)
            self.schedule.append(t == SCHEDULE_TOPIC)
            self._key_of.append(key)
        return i

    def _index(self) -> None:
        """The sorted key table and the known topics' bytes as rows, made again once the topics found since the
        last time are a quarter of those in it: a log whose topics keep coming (tens of thousands, a few new in
        each chunk) does not make the table again for every chunk."""
        raws = list(self.ids)  # in id order
        self._indexed = len(raws)
        width = max(1, min(_ROW_BYTES, max(map(len, raws))))
        rows = np.zeros((len(raws), width), np.uint8)  # a longer topic is only found through the dict
        for i, raw in enumerate(raws):
            rows[i, :min(len(raw), width)] = np.frombuffer(raw[:width], np.uint8)
        self._rows = rows
        keys = np.asarray(self._key_of, np.int64)
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        first = np.ones(len(keys), bool)  # two known topics with one key: the first is the candidate; the bytes
        first[1:] = keys[1:] != keys[:-1]  # tell the other apart and the dict finds it
        self._keys, self._key_ids = keys[first], order[first].astype(np.int64)

    def topics(self) -> list[str]:
        return self._names[:]


def topic_ids(buf, h, registry: dict[str, int], u8: np.ndarray | None = None) -> np.ndarray:
    """Topic of every record as an id in ``registry`` (new topics are added); one compiled grouping per chunk."""
    if len(h) == 0:
        return np.zeros(0, np.int64)
    if u8 is None:
        u8 = np.frombuffer(buf, dtype=np.uint8)
    tl = np.maximum(h.topicLength, 0)
    group, firsts = propscan.group_spans(u8, h.topicStart, tl)
    raws = [bytes(u8[s:s + n]) for s, n in zip(h.topicStart[firsts].tolist(), tl[firsts].tolist())]
    width = max(map(len, raws))
    local = np.empty(len(raws), dtype=np.int64)
    # new names get their ids in byte order (as the grouping by sorted rows gave them)
    for g in sorted(range(len(raws)), key=lambda g: (raws[g].ljust(width, b"\0"), len(raws[g]))):
        local[g] = registry.setdefault(raws[g].decode("utf-8", "replace"), len(registry))
    return local[group]


class VerifyTopicIds:
    """Records' topics as ids of a registry {name: id}, read off verify's walk where it gives them
    (verify.commitlog.ChunkTopics: the segment's :class:`TopicInterner` ids) instead of grouping the topics again.

    Verify's ids are mapped only once every topic its interner holds is in the registry, so no new registry id is
    made here: new topics get theirs from :func:`topic_ids`, in its order, exactly as without verify's ids."""

    def __init__(self):
        self._interner = None
        self._remap = np.zeros(0, np.int64)

    def __call__(self, buf, h, registry: dict, topics=None, keep: np.ndarray | None = None) -> np.ndarray:
        """``h``: the records (verify's chunk, or its rows ``keep``, a bool mask, when given)."""
        if topics is not None:
            interner = topics.interner
            if self._interner is not interner:
                self._interner, self._remap = interner, np.zeros(0, np.int64)
            if len(self._remap) < len(interner.ids):
                names = interner.topics()
                if all(n in registry for n in names):
                    self._remap = np.asarray([registry[n] for n in names], np.int64)
            if len(self._remap) == len(interner.ids):
                return self._remap[topics.tids if keep is None else topics.tids[keep]]
        return topic_ids(buf, h, registry)


_DELAYS: dict = {}  # id of a delay table -> (the table, its kernel form)


def _delays(delay_table: dict) -> np.ndarray:
    """:func:`formats.propscan.delay_millis` of the store's delay table, made once per table (read-only, see
    formats.tags.parse_delay_levels)."""
    got = _DELAYS.get(id(delay_table))
    if got is None or got[0] is not delay_table:
        got = _DELAYS[id(delay_table)] = (delay_table, propscan.delay_millis(delay_table))
    return got[1]


def dispatch_chunk(u8: np.ndarray, h, interner: TopicInterner, delay_table: dict):
    """(topic ids, tagsCode, tagsBad, keyCount, keyHashes, multi) of a chunk's records: :meth:`TopicInterner.intern_chunk`
    and :func:`dispatch_columns` in one compiled pass over each record's topic and properties
    (:func:`formats.propscan.dispatch_hashes`), the same columns; ``multi``: the records carrying both multi-dispatch
    properties (only those can have LMQ units, :func:`.lmq.chunk_targets`)."""
    n = len(h)
    if not n:
        return (np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(0, np.int16),
                np.zeros(0, np.int32), np.zeros(0, bool))
    d = propscan.dispatch_hashes(u8, h.propsStart, h.propsLength, h.topicStart, h.topicLength, h.storeTimestamp,
                                 _delays(delay_table))
    fs = h.topicStart[d.firsts]
    tids = interner.group_ids(u8, fs, np.maximum(h.topicLength[d.firsts], 0), d.group_hash)[d.group]
    tags_bad = np.zeros(n, dtype=bool)
    codes, counts, kh = _one_at_a_time(u8, h, tids, interner, delay_table, d.slow, d.codes, tags_bad, d.counts,
                                       d.key_hashes, {})
    return tids, codes, tags_bad, counts, kh, d.multi


def dispatch_columns(u8: np.ndarray, h, tids: np.ndarray, interner: TopicInterner, delay_table: dict, details: bool = False,
                     extra_names: tuple = ()):
    """(tagsCode int64, tagsBad bool, keyCount int16, keyHashes int32) for the chunk's records.

    ``tagsBad``: the DELAY property is not a number (tags_code fails; CL_DELAY_PROPERTY).
    ``keyHashes`` holds each record's index key hashes (UNIQ_KEY first, then KEYS tokens, duplicates
    kept), ``keyCount`` how many belong to each record, in record order. With ``details``, also the
    property spans (:class:`formats.propscan.PropValues`) and the decoded properties of the records
    that took the one-at-a-time rules ({record: properties}); ``extra_names`` are located in the same pass
    (e.g. the multi-dispatch properties, so that lmq.chunk_targets need not scan again). Without ``details``,
    :func:`dispatch_chunk` gives the same columns (and the topic ids) in one pass.
    """
    if not details:
        _, codes, tags_bad, counts, kh, _ = dispatch_chunk(u8, h, interner, delay_table)
        return codes, tags_bad, counts, kh
    n = len(h)
    tags_bad = np.zeros(n, dtype=bool)
    pv = propscan.scan(u8, h.propsStart, h.propsLength, names=propscan.WANTED + tuple(extra_names))
    sched = np.asarray(interner.schedule, dtype=bool)[tids] if n else np.zeros(0, bool)
    codes = np.zeros(n, dtype=np.int64)
    slow = np.zeros(n, dtype=bool)
    wide = np.flatnonzero(~pv.ascii)  # non-ASCII: hashed over UTF-16 code units when well-formed UTF-8
    if len(wide):
        slow[wide[~propscan.utf8_tags(u8, wide, h.propsStart, h.propsLength, pv, codes)]] = True
    ts, te = pv.start["TAGS"], pv.end["TAGS"]
    has_tags = (ts >= 0) & ~slow & pv.ascii
    if has_tags.any():
        codes[has_tags] = propscan.java_hash_spans(u8, ts[has_tags], te[has_tags]).view(np.int32)
    delayed = np.flatnonzero(sched & ~slow)  # delay-level records: tagsCode = delivery time for a plain DELAY
    if len(delayed):
        slow[delayed[~propscan.delay_codes(u8, delayed, pv, h.storeTimestamp, _delays(delay_table), codes)]] = True
    codes[slow] = 0  # the one-at-a-time rules set these
    # Keys: UNIQ_KEY, then every non-empty space-separated token of KEYS (compiled kernel).
    prefix = np.asarray(interner.prefix, dtype=np.uint32)[tids] if n else np.zeros(0, np.uint32)
    counts, kh = propscan.key_hashes(u8, ~slow, prefix, pv)
    slow_props: dict = {}
    codes, counts, kh = _one_at_a_time(u8, h, tids, interner, delay_table, slow, codes, tags_bad, counts, kh, slow_props)
    return codes, tags_bad, counts, kh, pv, slow_props


def _one_at_a_time(u8: np.ndarray, h, tids: np.ndarray, interner: TopicInterner, delay_table: dict, slow: np.ndarray,
                   codes: np.ndarray, tags_bad: np.ndarray, counts: np.ndarray, kh: np.ndarray, slow_props: dict):
    """The ``slow`` records' tagsCode, tagsBad and key hashes by the one-at-a-time rules, into the compiled pass's
    columns (``slow_props`` gets their decoded properties): (codes, counts, key hashes)."""
    slow_idx = np.flatnonzero(slow)
    if not len(slow_idx):
        return codes, counts, kh
    topics = list(interner.ids)
    starts = np.cumsum(counts.astype(np.int64)) - counts  # where each record's hashes start in kh
    at, extra = [], []
    for i in slow_idx.tolist():
        ps, pl = int(h.propsStart[i]), int(h.propsLength[i])
        props = slow_props[i] = parse_properties(decode_utf8(bytes(u8[ps:ps + pl]))) if pl > 0 else {}
        topic = decode_utf8(topics[int(tids[i])])
        try:
            codes[i] = tags_code(topic, props, int(h.storeTimestamp[i]), delay_table)
        except TagsCodeError:
            tags_bad[i] = True
        keys = ([props["UNIQ_KEY"]] if props.get("UNIQ_KEY") else []) + [k for k in props.get("KEYS", "").split(" ") if k]
        at += [int(starts[i])] * len(keys)
        extra += [index_key_hash(index_key(topic, k)) for k in keys]
        counts[i] = len(keys)
    if extra:  # the slow records have no hashes in kh yet: insert theirs at their place (equal positions keep order)
        kh = np.insert(kh, np.asarray(at, np.int64), np.asarray(extra, np.int64).astype(np.int32))
    return codes, counts, kh
