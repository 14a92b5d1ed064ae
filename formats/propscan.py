"""The few properties dispatch reads (TAGS, KEYS, UNIQ_KEY, DELAY), found for many records at once.

``MessageDecoder.string2messageProperties`` (FORMAT.md §3.2) splits at ``\\x02``, skips entries
shorter than 3 characters, splits each at its first ``\\x01`` (non-empty name and value), and a
later entry overwrites an earlier one. For a name like ``TAGS`` that means: the value of the last
entry that starts with ``TAGS\\x01`` and has a non-empty value. Splitting the bytes before decoding
gives the same pieces as decoding first (a malformed UTF-8 sequence never swallows an ASCII
separator); records whose properties hold any non-ASCII byte are flagged so callers decode those
with :func:`formats.properties.parse_properties` (hashes are over UTF-16 units there).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .tags import DEFAULT_DELAY_TABLE, SCHEDULE_TOPIC

WANTED = ("TAGS", "KEYS", "UNIQ_KEY", "DELAY")
# the multi-dispatch (LMQ) properties: a record carrying both gets units in the queues they name (engine/derived/lmq.py)
MULTI_DISPATCH_PROPS = ("INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET")
ONE_PASS = WANTED + MULTI_DISPATCH_PROPS  # the names dispatch_hashes locates (formats.propkernel's ROW_*)


@dataclass
class PropValues:
    """Per record: where the value of each wanted name is (absolute buffer positions), -1 if absent."""

    start: dict  # name -> int64 array
    end: dict  # name -> int64 array
    ascii: np.ndarray  # bool: every property byte < 0x80


def _kernels():
    from . import fast  # noqa: F401 (fast first: it owns the lazy kernel import order)
    from .aot import kernels

    return kernels("propkernel")


def scan(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray, names=WANTED) -> PropValues:
    """Locate the wanted properties of the records whose property strings are ``u8[starts:starts+lengths]``
    (compiled kernel, one pass over each property string)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    n = len(starts)
    names = tuple(dict.fromkeys(names))  # each name once (the kernel gives an entry to one name)
    pats, off, words, masks, first, chain = _patterns(names)
    out_s = np.full((len(names), n), -1, dtype=np.int64)  # one contiguous row per name
    out_e = np.full((len(names), n), -1, dtype=np.int64)
    ascii_ok = np.ones(n, dtype=bool)
    if n:
        _kernels().find_props(_view(u8), starts, lengths, words, masks, pats, off, first, chain, out_s, out_e, ascii_ok)
    return PropValues(dict(zip(names, out_s)), dict(zip(names, out_e)), ascii_ok)


@lru_cache(maxsize=16)
def _patterns(names: tuple) -> tuple:
    """The kernel's form of the wanted names (:func:`formats.propkernel.find_props`): the ``NAME\\x01``
    patterns back to back and where each starts; each one's first (up to) 8 bytes as a little-endian word
    and the mask of those bytes; the names by pattern length (9: longer than 8) and first byte, listed in
    ``first`` and chained in ``chain``."""
    raw = [k.encode("ascii") + b"\x01" for k in names]
    pats = np.frombuffer(b"".join(raw), np.uint8)
    off = np.cumsum([0] + [len(p) for p in raw]).astype(np.int64)
    words = np.array([int.from_bytes(p[:8], "little") for p in raw], dtype=np.uint64)
    masks = np.array([(1 << (8 * min(len(p), 8))) - 1 for p in raw], dtype=np.uint64)
    first = np.full(10 * 256, -1, np.int64)
    chain = np.full(len(raw), -1, np.int64)
    for k in reversed(range(len(raw))):
        slot = min(len(raw[k]), 9) * 256 + raw[k][0]
        chain[k], first[slot] = first[slot], k
    return pats, off, words, masks, first, chain


def _view(u8) -> np.ndarray:
    from . import fast

    return fast.kernel_view(u8)


def key_hashes(u8: np.ndarray, use: np.ndarray, prefix: np.ndarray, pv: PropValues) -> tuple[np.ndarray, np.ndarray]:
    """(keyCount int16 per record, keyHash int32 of every key in record order) for the records with
    ``use``: UNIQ_KEY first, then each non-empty space-separated KEYS token, hashed as ``topic#key``
    (``prefix``: uint32 Java hash of ``topic#`` per record) and turned into index key hashes. A record whose
    properties hold a non-ASCII byte is hashed over UTF-16 code units: ``use`` it only when they are well-formed
    UTF-8 (:func:`utf8_tags`)."""
    n = len(use)
    us, ue, ks, ke = pv.start["UNIQ_KEY"], pv.end["UNIQ_KEY"], pv.start["KEYS"], pv.end["KEYS"]
    use = np.ascontiguousarray(use, dtype=bool)
    prefix = np.ascontiguousarray(prefix, dtype=np.uint32)
    out = np.empty(3 * n + 16, dtype=np.int32)  # room for most chunks (a UNIQ_KEY and two KEYS tokens a record)
    counts = np.zeros(n, dtype=np.int16)
    if not n:
        return counts, out[:0]
    ascii_ok = np.ascontiguousarray(pv.ascii, dtype=bool)
    got = _kernels().key_hashes(_view(u8), use, ascii_ok, prefix, us, ue, ks, ke, counts, out)
    if got < 0:  # more keys than that: room for every one
        out = np.empty(int(np.count_nonzero(use & (us >= 0))) + int(((ke - ks + 1) // 2)[use & (ks >= 0)].sum()), np.int32)
        got = _kernels().key_hashes(_view(u8), use, ascii_ok, prefix, us, ue, ks, ke, counts, out)
    return counts, out[:got]


def utf8_tags(u8: np.ndarray, rows: np.ndarray, starts: np.ndarray, lengths: np.ndarray, pv: PropValues,
              codes: np.ndarray) -> np.ndarray:
    """For the records ``rows`` (property strings with a non-ASCII byte): whether each one's property string is
    well-formed UTF-8 (bool per row), and for those the tagsCode of their TAGS value (the Java hash over its UTF-16
    code units) written into ``codes`` (int64 per record; left as is without TAGS)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    ok = np.zeros(len(rows), dtype=bool)
    if len(rows):
        _kernels().utf8_tags(_view(u8), rows, np.ascontiguousarray(starts, dtype=np.int64),
                             np.ascontiguousarray(lengths, dtype=np.int64), pv.start["TAGS"], pv.end["TAGS"], ok, codes)
    return ok


SCHEDULE_BYTES = np.frombuffer(SCHEDULE_TOPIC.encode(), np.uint8)  # the delay-level topic: tagsCode = delivery time


@dataclass
class Dispatched:
    """:func:`dispatch_hashes`' result: the records' topics grouped, and what dispatch computes from the properties."""

    group: np.ndarray  # int32 per record: its topic's group, numbered in first-occurrence order
    firsts: np.ndarray  # int64 per group: its first record
    group_hash: np.ndarray  # uint32 per group: the Java hash of its topic's bytes
    codes: np.ndarray  # int64 per record: tagsCode (0 for slow records)
    slow: np.ndarray  # bool per record: left to the one-at-a-time rules
    counts: np.ndarray  # int16 per record: its index key hashes
    key_hashes: np.ndarray  # int32: every key hash, in record order
    multi: np.ndarray  # bool per record: it carries both MULTI_DISPATCH_PROPS (slow or not)


def _scratch_slots(n: int) -> np.ndarray:
    size = 16
    while size < 2 * n:
        size *= 2
    return np.full(size, -1, np.int64)  # the grouping's hash table (made here: see propkernel._group_spans)


def delay_millis(delay_table: dict) -> np.ndarray:
    """The delay table ({level: ms}, levels 1..N) as the kernels take it: int64, index = level, entry 0 unused."""
    out = np.zeros(len(delay_table) + 1, np.int64)
    for level, ms in delay_table.items():
        out[level] = ms
    return out


_DEFAULT_DELAYS = delay_millis(DEFAULT_DELAY_TABLE)


def dispatch_hashes(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray, topic_starts: np.ndarray,
                    topic_lengths: np.ndarray, store_ts: np.ndarray | None = None,
                    delays: np.ndarray = _DEFAULT_DELAYS) -> Dispatched:
    """:func:`group_spans` of the topics, :func:`scan`, the TAGS hash and :func:`key_hashes` in one compiled pass over
    each record's topic and property string (non-ASCII property strings hashed over their UTF-16 code units when they
    are well-formed UTF-8). A record whose properties are not well-formed UTF-8, or whose topic holds a non-ASCII byte
    (its ``topic#`` hash over bytes would not be Java's), or is a SCHEDULE_TOPIC_XXXX record whose DELAY is not a plain
    int, is left to the one-at-a-time rules (``slow``; tagsCode and keyCount 0, no hashes). A SCHEDULE_TOPIC_XXXX
    record with a plain DELAY gets its delivery time (``store_ts``: the records' store times, zeros when None;
    ``delays``: :func:`delay_millis` of the store's delay table)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    n = len(starts)
    codes = np.zeros(n, dtype=np.int64)
    slow = np.zeros(n, dtype=bool)
    counts = np.zeros(n, dtype=np.int16)
    group = np.empty(n, dtype=np.int32)
    firsts = np.empty(n, dtype=np.int64)
    group_hash = np.empty(n, dtype=np.uint32)
    out = np.empty(3 * n + 16, dtype=np.int32)  # room for most chunks (a UNIQ_KEY and two KEYS tokens a record)
    if not n:
        return Dispatched(group, firsts, group_hash, codes, slow, counts, out[:0], slow.copy())
    pats, off, words, masks, first, chain = _patterns(ONE_PASS)
    vs = np.empty((len(ONE_PASS), 1), np.int64)
    ve = np.empty((len(ONE_PASS), 1), np.int64)
    multi = np.zeros(n, dtype=bool)
    group_prefix = np.empty(n, dtype=np.uint32)
    group_slow = np.empty(n, dtype=bool)
    group_sched = np.empty(n, dtype=bool)
    store_ts = np.zeros(n, np.int64) if store_ts is None else np.ascontiguousarray(store_ts, dtype=np.int64)
    args = (_view(u8), starts, lengths, np.ascontiguousarray(topic_starts, dtype=np.int64),
            np.ascontiguousarray(topic_lengths, dtype=np.int64), SCHEDULE_BYTES, words, masks, pats, off, first, chain, vs, ve,
            group, firsts)
    rest = (group_hash, group_prefix, group_slow, group_sched, store_ts, np.ascontiguousarray(delays, dtype=np.int64),
            codes, slow, multi, counts)
    got, groups = _kernels().dispatch_props(*args, _scratch_slots(n), *rest, out)
    if got < 0:  # more keys than that: room for every one (a key is at least a byte, and a space or its entry's name)
        out = np.empty(n + (int(np.maximum(lengths, 0).sum()) + n) // 2 + 16, np.int32)
        slow[:] = False
        codes[:] = 0
        got, groups = _kernels().dispatch_props(*args, _scratch_slots(n), *rest, out)
    return Dispatched(group, firsts[:groups], group_hash[:groups], codes, slow, counts, out[:got], multi)


def delay_codes(u8: np.ndarray, rows: np.ndarray, pv: PropValues, store_ts: np.ndarray, delays: np.ndarray,
                codes: np.ndarray) -> np.ndarray:
    """For the SCHEDULE_TOPIC_XXXX records ``rows``: whether each one's DELAY is absent or a plain int (bool per row;
    the others are left to the one-at-a-time rules), and for those with one, their delivery time written into
    ``codes`` over the TAGS hash there (FORMAT.md §5.2; ``delays``: :func:`delay_millis`)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    ok = np.zeros(len(rows), dtype=bool)
    if len(rows):
        _kernels().delay_codes(_view(u8), rows, pv.start["DELAY"], pv.end["DELAY"],
                               np.ascontiguousarray(store_ts, dtype=np.int64), np.ascontiguousarray(delays, dtype=np.int64),
                               codes, ok)
    return ok


def java_hash_spans(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Java ``String.hashCode`` (uint32) of the ASCII byte spans ``u8[start:end]`` (compiled kernel)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    out = np.zeros(len(starts), dtype=np.uint32)
    if len(starts):
        _kernels().java_hash_spans(_view(u8), starts, np.ascontiguousarray(ends, dtype=np.int64), out)
    return out


def group_spans(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Equal byte spans grouped (compiled kernel): (group int32 per span, numbered in first-occurrence
    order; index of each group's first span). Spans are compared byte for byte, never by hash alone."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)  # clipped to the buffer by the kernel
    n = len(starts)
    group = np.empty(n, dtype=np.int32)
    firsts = np.empty(n, dtype=np.int64)
    count = _kernels().group_spans(_view(u8), starts, lengths, group, firsts, _scratch_slots(n)) if n else 0
    return group, firsts[:count]


PICKED = ("TAGS", "UNIQ_KEY", "KEYS")  # the names whose last entry is picked per record (formats.propentries' PICK_*)
_PICKED_BYTES = np.frombuffer("".join(PICKED).encode("ascii"), np.uint8)
_PICKED_OFF = np.cumsum([0] + [len(p) for p in PICKED]).astype(np.int64)


@dataclass
class PropertyEntries:
    """Every entry of some records' property strings, as absolute byte spans (:func:`property_entries`)."""

    name_s: np.ndarray  # in record order (``counts`` per record)
    name_e: np.ndarray
    value_s: np.ndarray
    value_e: np.ndarray
    counts: np.ndarray  # entries per record
    picks: np.ndarray  # (3, records): the entry of the last TAGS, UNIQ_KEY, KEYS; -1 if none
    tok_s: np.ndarray  # the non-empty space-separated tokens of each record's KEYS value
    tok_e: np.ndarray
    tok_counts: np.ndarray  # tokens per record
    duplicate: bool  # a record names a key twice: the spans do not say which value Java's map keeps


def property_entries(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> PropertyEntries:
    """The entries of the property strings ``u8[starts:starts+lengths]`` (well-formed UTF-8), by the broker parser's
    rules (compiled: :func:`formats.propentries.property_entries`, a pass to count and a pass to fill)."""
    from .aot import kernels

    k = kernels("propentries")
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    n = len(starts)
    u8 = _view(u8)
    none = np.zeros(0, np.int64)
    entries, tokens, _ = k.property_entries(u8, starts, lengths, False, _PICKED_BYTES, _PICKED_OFF, none, none, none,
                                            none, none, np.zeros((len(PICKED), 0), np.int64), none, none, none)
    e = [np.empty(entries, np.int64) for _ in range(4)]
    counts, tok_counts = np.zeros(n, np.int64), np.zeros(n, np.int64)
    picks = np.full((len(PICKED), n), -1, np.int64)
    tok_s, tok_e = np.empty(tokens, np.int64), np.empty(tokens, np.int64)
    _, _, dup = k.property_entries(u8, starts, lengths, True, _PICKED_BYTES, _PICKED_OFF, *e, counts, picks, tok_s,
                                   tok_e, tok_counts)
    return PropertyEntries(*e, counts, picks, tok_s, tok_e, tok_counts, bool(dup))


def span_bytes(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the bytes ``u8[starts[i]:ends[i]]`` back to back, int32 offsets of where each begins and the last ends):
    an Arrow string or binary array's buffers (compiled: :func:`formats.propentries.copy_spans`)."""
    from .aot import kernels

    starts = np.ascontiguousarray(starts, dtype=np.int64)
    ends = np.ascontiguousarray(ends, dtype=np.int64)
    out = np.empty(int((ends - starts).sum()), np.uint8)
    offsets = np.empty(len(starts) + 1, np.int32)
    kernels("propentries").copy_spans(_view(u8), starts, ends, out, offsets)
    return out, offsets
