"""Columnar JSON Lines encoder for commitlog records (``dump commitlog --json``).

Produces, for a block of records given as :class:`formats.fast.Headers` columns, exactly the
bytes that ``json_line(render_body(decode_message(buf, pos), body))`` (plus the ``offset``
field) would give, UTF-8 encoded, one line per record. :func:`formats.message.decode_message`
stays the reference; tests/test_jsonl_fast.py compares the two on every broker-written record.

How: each record becomes one row of a ``(records, width)`` byte matrix built column by column
(field texts right- or left-aligned in a slot, unused slot bytes set to 0); the rows are
then joined and the zeros deleted with one ``bytes.translate``. JSON text never holds a raw
NUL (json escapes it as ``\\u0000``), so the zeros can only be padding. Numbers are rendered
with numpy two digits at a time; values that repeat (topics, hosts, constant columns) are
rendered once; strings are JSON-escaped once per block on a joined string, properties too:
the ``properties`` object is derived from the escaped raw string when the record has the
plain ``key\\x01value\\x02`` shape with distinct keys, else from the reference parser.
"""

from __future__ import annotations

import binascii
import json
import mmap
from itertools import chain, repeat
from json.encoder import encode_basestring  # the escaper json.dumps(ensure_ascii=False) uses

import numpy as np

from .fast import Headers
from .message import decode_utf8, host_json
from .properties import parse_properties
from .records import MAGIC_V2

__all__ = ["encode_records", "topic_mask", "BLOCK_RECORDS"]

BLOCK_RECORDS = 8192  # records per block (the scan's chunk size)
_SEP = 0x7F  # joins the strings of a block; json leaves DEL unescaped, so it survives escaping
_SEP_B = b"\x7f"
_SEP_S = "\x7f"
_MAX_GROUPED = 256  # topics up to this many bytes are grouped by value in a byte matrix

_PAIRS = np.frombuffer(b"".join(b"%02d" % i for i in range(100)), np.uint8).reshape(100, 2)
_POW10 = np.array([10**k for k in range(1, 20)], dtype=np.uint64)
_HEX_LOWER = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), np.uint8).reshape(256, 2)
_HEX_UPPER = np.frombuffer(b"".join(b"%02X" % i for i in range(256)), np.uint8).reshape(256, 2)
_U64_100 = np.uint64(100)


def _dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# ---------------------------------------------------------------------------------------------
# Field renderers: each returns bytes (the same text for every row) or an (n, w) uint8 matrix.


def _ints(values: np.ndarray):
    """Decimal text of an integer column, right-aligned, leading slot bytes 0."""
    v = np.asarray(values, dtype=np.int64)
    lo, hi = int(v.min()), int(v.max())
    if lo == hi:
        return str(lo).encode()
    if lo > 0:
        # Values close together (timestamps, offsets) share their leading digits: render
        # those once and only the last k digits per row.
        k = len(str(hi - lo))
        p = 10**k
        while lo // p != hi // p:
            k += 1
            p *= 10
        head = lo // p
        if head:
            tail = _digits((v - head * p).view(np.uint64), k)
            return [str(head).encode(), tail]
    neg = v < 0
    # |v| as uint64 (also right for INT64_MIN)
    mag = np.where(neg, (~v).view(np.uint64) + np.uint64(1), v.view(np.uint64))
    ndig = np.searchsorted(_POW10, mag, side="right") + 1
    width = ndig + neg
    w = int(width.max())
    out = _digits(mag, w)
    if int(width.min()) != w:
        out[np.arange(w)[None, :] < (w - ndig)[:, None]] = 0
    if lo < 0:
        rows = np.flatnonzero(neg)
        out[rows, (w - ndig - 1)[rows]] = ord("-")
    return out


def _digits(mag: np.ndarray, w: int) -> np.ndarray:
    """The last ``w`` decimal digits of each value, zero-padded on the left."""
    n = len(mag)
    even = w + (w & 1)  # two digits per step
    out = np.empty((n, even), np.uint8)
    m = mag
    for j in range(even, 0, -2):
        m, r = np.divmod(m, _U64_100)
        out[:, j - 2 : j] = _PAIRS[r]
    return out[:, even - w :]


def _gather_var(u8: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Bytes ``u8[start:start+len]`` of each row, left-aligned, slot padded with 0."""
    w = int(lens.max()) if len(lens) else 0
    if w == 0:
        return np.zeros((len(starts), 0), np.uint8)
    col = np.arange(w, dtype=np.int64)
    idx = starts[:, None] + col[None, :]
    np.minimum(idx, len(u8) - 1, out=idx)
    out = u8[idx]
    out[col[None, :] >= lens[:, None]] = 0
    return out


def _table_field(pieces: list[bytes], inverse: np.ndarray):
    """Rows take the text ``pieces[inverse[i]]``."""
    if len(pieces) == 1:
        return pieces[0]
    lens = np.array([len(p) for p in pieces], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    u8 = np.frombuffer(b"".join(pieces) or b"\0", np.uint8)
    return _gather_var(u8, starts[inverse], lens[inverse])


def _group_rows(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a byte matrix and each row's index among them.

    Values repeat (a few topics, one or two hosts): rows are compared as 64-bit words against
    one representative at a time; many distinct values fall back to a sort.
    """
    n, w = mat.shape
    inverse = np.zeros(n, dtype=np.int64)
    if n == 0:
        return mat[:0], inverse
    pad = (-w) % 8
    words = np.concatenate([mat, np.zeros((n, pad), np.uint8)], axis=1) if pad else np.ascontiguousarray(mat)
    words = words.view(np.uint64)
    reps: list[np.ndarray] = []
    todo = None  # all rows
    while True:
        cand = words if todo is None else words[todo]
        if len(reps) == _MAX_PASSES:
            uniq, inv = np.unique(mat[todo], axis=0, return_inverse=True)
            inverse[todo] = inv.reshape(-1) + len(reps)
            reps.extend(uniq)
            break
        first = 0 if todo is None else int(todo[0])
        eq = (cand == words[first]).all(axis=1)
        reps.append(mat[first])
        if eq.all():
            if todo is not None:
                inverse[todo] = len(reps) - 1
            break
        if todo is None:
            todo = np.flatnonzero(~eq)
        else:
            inverse[todo[eq]] = len(reps) - 1
            todo = todo[~eq]
    return np.array(reps), inverse


_MAX_PASSES = 16


def _escaped_texts(raws: list[bytes], joined: bytes | None = None) -> tuple[bytes | None, list[str] | None]:
    """JSON-escaped (no quotes) UTF-8 text of each raw string, decoded like Java (U+FFFD).

    Returns (DEL-joined escaped bytes, None) or, when a text itself holds DEL, (None, texts).
    ``joined``: the raw strings already joined with DEL.
    """
    n = len(raws)
    if joined is None:
        joined = _SEP_B.join(raws)
    if joined.isascii():
        if joined.count(_SEP_B) == n - 1:
            return encode_basestring(joined.decode("ascii"))[1:-1].encode("ascii"), None
        texts = [r.decode("ascii") for r in raws]
    else:
        texts = [decode_utf8(r) for r in raws]
        s = _SEP_S.join(texts)
        if s.count(_SEP_S) == n - 1:
            return encode_basestring(s)[1:-1].encode("utf-8"), None
    return None, texts


def _string_pieces(raws: list[bytes]) -> list[bytes]:
    """JSON-escaped text (no quotes) of each raw string."""
    esc, texts = _escaped_texts(raws)
    if esc is not None:
        return esc.split(_SEP_B)
    return [encode_basestring(t)[1:-1].encode("utf-8") for t in texts]


def _grouped_string(u8, starts, lens, maxlen=_MAX_GROUPED):
    """A string column whose values repeat (topics): group by bytes, escape each value once.

    Returns (field, decoded values, inverse) or None when the strings are too long to group.
    """
    w = int(lens.max()) if len(lens) else 0
    if w > maxlen:
        return None
    mat = _gather_var(u8, starts, lens)
    key = np.concatenate([mat, lens.astype(">u2").view(np.uint8).reshape(-1, 2)], axis=1)
    uniq, inverse = _group_rows(key)
    texts = [decode_utf8(bytes(r[: int.from_bytes(bytes(r[-2:]), "big")])) for r in uniq]
    pieces = [encode_basestring(t).encode("utf-8") for t in texts]
    return _table_field(pieces, inverse), texts, inverse


def _hosts(u8, starts, lens, with_msgid_prefix: bool):
    """bornHost/storeHost objects (and the msgId prefix: host bytes in upper hex)."""
    mat = _gather_var(u8, starts, lens)
    key = np.concatenate([mat, lens.astype(np.uint8)[:, None]], axis=1)
    uniq, inverse = _group_rows(key)
    objs, prefixes = [], []
    for r in uniq:
        width = int(r[-1])
        raw = bytes(r[:width])
        objs.append(_dumps(host_json(raw[:-4], int.from_bytes(raw[-4:], "big", signed=True))))
        prefixes.append(raw.hex().upper().encode())
    return _table_field(objs, inverse), (_table_field(prefixes, inverse) if with_msgid_prefix else None)


def _hex_u64(values: np.ndarray, table=_HEX_UPPER):
    """16 upper-case hex digits of each value as an unsigned 64-bit big-endian number."""
    b = np.ascontiguousarray(values.astype(">i8")).view(np.uint8).reshape(-1, 8)
    return table[b].reshape(-1, 16)


# ---------------------------------------------------------------------------------------------
# Properties


# bytes that matter to the shape of a property string -> 1..4 (for bytes.translate)
_CLASS = bytes(1 if b == 1 else 2 if b == 2 else 3 if b == _SEP else 4 if b == 0x5C else 0 for b in range(256))


def _plain_props(joined: bytes, n: int) -> np.ndarray:
    """Which of the n DEL-joined property strings are ``k\x01v(\x02k\x01v)*[\x02]`` with
    non-empty keys and values, no backslash, and distinct keys: their JSON object is the
    escaped raw text with the separators replaced (the others take the reference parser)."""
    ok = np.ones(n, dtype=bool)
    u8j = np.frombuffer(joined, np.uint8)
    cls = np.frombuffer(joined.translate(_CLASS), np.uint8)
    pos = np.flatnonzero(cls)
    typ = cls[pos]
    # a backslash would leave "\\u0001"-like runs in the escaped text that are not separators
    slash = typ == 4
    if slash.any():
        ok[np.cumsum(typ == 3)[slash]] = False
        pos, typ = pos[~slash], typ[~slash]
    # separators in order, with a record boundary (3) before the first and after the last
    pos = np.concatenate(([-1], pos, [len(u8j)]))
    typ = np.concatenate(([3], typ, [3]))
    rec = np.cumsum(typ == 3)[:-1] - 1  # record of each (separator, next separator) pair
    a, b = typ[:-1], typ[1:]
    nonempty = np.diff(pos) > 1
    # 3->1, 1->2, 2->1, 1->3 around a non-empty token; 2->3 only as the trailing separator
    valid = np.where((b == 3) & (a == 2), ~nonempty, nonempty & (a != b) & ((a == 1) | (b == 1)))
    bad = rec[~valid]
    if len(bad):
        ok[bad] = False
    # distinct keys: a fingerprint of each key (length, first and last 8 bytes); equal keys have
    # equal fingerprints, so a duplicate is always caught (a collision only costs the slow path)
    is_key = valid & (b == 1)
    ks = pos[:-1][is_key] + 1
    ke = pos[1:][is_key]
    krec = rec[is_key]
    if len(ks) > 1:
        klen = ke - ks
        # unaligned 8-byte words (little-endian) through a strided view; the joined text is
        # padded so that every word lies inside it
        pad = np.frombuffer(joined + bytes(8), np.uint8)
        words = np.lib.stride_tricks.as_strided(pad, shape=(len(pad) - 7, 8), strides=(1, 1))
        first = words[ks].view("<u8").reshape(-1)
        last = words[np.maximum(ke - 8, 0)].view("<u8").reshape(-1)
        short = klen < 8
        if short.any():  # the first word covers the whole key: keep its bytes only
            bits = (np.minimum(klen, 8) * 8).astype(np.uint64)
            first = np.where(short, first & ((np.uint64(1) << (bits & np.uint64(63))) - np.uint64(1)), first)
            last = np.where(short, np.uint64(0), last)
        fp = (first * np.uint64(0x9E3779B97F4A7C15)) ^ (last * np.uint64(0xC2B2AE3D27D4EB4F)) ^ klen.astype(np.uint64)
        # keys of a record are consecutive: compare each with the few before it
        most = int(np.bincount(krec).max())
        if most <= 16:
            for j in range(1, most):
                dup = (krec[j:] == krec[:-j]) & (fp[j:] == fp[:-j])
                if dup.any():
                    ok[krec[j:][dup]] = False
        else:
            order = np.lexsort((fp, krec))
            r2, f2 = krec[order], fp[order]
            dup = (r2[1:] == r2[:-1]) & (f2[1:] == f2[:-1])
            ok[r2[1:][dup]] = False
    return ok


def _slices(buf, starts: list[int], ends: list[int]) -> list[bytes]:
    """``bytes`` of each range (an mmap or bytes slice is already bytes: one copy, not two)."""
    obj = buf
    if isinstance(buf, memoryview) and isinstance(buf.obj, (bytes, mmap.mmap)) and buf.nbytes == len(buf.obj):
        obj = buf.obj
    if isinstance(obj, (bytes, mmap.mmap)):
        return [obj[a:b] for a, b in zip(starts, ends)]
    return [bytes(buf[a:b]) for a, b in zip(starts, ends)]


_RAW_KEY = b',"propertiesRaw":"'


def _object_text(esc: bytes, trailing: bool) -> bytes:
    """The escaped raw strings with each ``\\u0001`` made ``":"`` and each ``\\u0002`` made
    ``","`` (a last ``\\u0002`` before DEL or the end dropped when ``trailing``): the inside of
    each plain string's ``properties`` object. Done in place on a copy (the 3 spare bytes
    become NUL and are deleted) because ``bytes.replace`` is slow with this many matches."""
    e = np.frombuffer(esc, np.uint8)
    n = len(e)
    if n < 6:
        return esc.replace(b"\\u0002", b'","').replace(b"\\u0001", b'":"') if not trailing else \
            _object_text_slow(esc)
    bs = np.flatnonzero(e[: n - 5] == 0x5C)
    m = (e[bs + 1] == 0x75) & (e[bs + 2] == 0x30) & (e[bs + 3] == 0x30) & (e[bs + 4] == 0x30)
    bs, last = bs[m], e[bs[m] + 5]
    one, two = bs[last == 0x31], bs[last == 0x32]
    out = e.copy()
    if trailing:
        nxt = np.append(e, np.uint8(_SEP))[two + 6]
        end = nxt == _SEP
        for k in range(6):
            out[two[end] + k] = 0
        two = two[~end]
    for at, text in ((one, b'":"'), (two, b'","')):
        for k in range(3):
            out[at + k] = text[k]
            out[at + 3 + k] = 0
    return out.tobytes().translate(None, b"\0")


def _object_text_slow(esc: bytes) -> bytes:
    s = esc.replace(b"\\u0002\x7f", b"\x7f")
    if s.endswith(b"\\u0002"):
        s = s[:-6]
    return s.replace(b"\\u0001", b'":"').replace(b"\\u0002", b'","')


_OBJ_OPEN = b'{"'
_OBJ_CLOSE = b'"},"propertiesRaw":"'
_RAW_KEY = b',"propertiesRaw":"'


def _props_pieces(buf, starts: list[int], ends: list[int], trailing: bool):
    """(plain, objs, raws): which records have a plain property string, the text of each
    ``properties`` object (for a plain one without its ``{"`` and ``"}``, which the caller
    adds), and each escaped raw string. ``trailing``: some string may end with ``\x02``."""
    n = len(starts)
    raws = _slices(buf, starts, ends)
    joined = _SEP_B.join(raws)
    esc, texts = _escaped_texts(raws, joined)
    if esc is None:  # a property string holds DEL: reference path for every record of the block
        return (np.zeros(n, dtype=bool), [_dumps(parse_properties(t)) for t in texts],
                [encode_basestring(t)[1:-1].encode("utf-8") for t in texts])
    raw_pieces = esc.split(_SEP_B)
    ok = _plain_props(joined, n)
    obj_pieces = _object_text(esc, trailing).split(_SEP_B)
    if not ok.all():
        for i in np.flatnonzero(~ok).tolist():
            obj_pieces[i] = _dumps(parse_properties(decode_utf8(raws[i])))
    return ok, obj_pieces, raw_pieces


# ---------------------------------------------------------------------------------------------


def _body_pieces(buf, h: Headers, mode: str) -> list[bytes]:
    starts = h.bodyStart.tolist()
    ends = (h.bodyStart + h.bodyLength).tolist()
    raws = _slices(buf, starts, ends)
    if mode == "hex":
        return list(map(binascii.hexlify, raws))
    if mode == "base64":
        b64 = binascii.b2a_base64
        return [b64(r, newline=False) for r in raws]
    if mode == "text":
        return _string_pieces(raws)
    raise ValueError(f"unknown body mode {mode!r}")


BODY_KEYS = {"hex": "bodyHex", "text": "bodyText", "base64": "bodyBase64"}


def _take(h: Headers, idx) -> Headers:
    t = Headers()
    for name in Headers.__slots__:
        setattr(t, name, getattr(h, name)[idx])
    return t


def encode_records(buf, h: Headers, base: int, body: str = "none", idx: np.ndarray | None = None) -> bytes:
    """JSON Lines (UTF-8) of the records ``h`` (all, or those at ``idx``) of a buffer whose
    first byte is commitlog offset ``base``; body rendered as ``--body`` does."""
    if idx is not None:
        h = _take(h, idx)
    n = len(h)
    if n <= BLOCK_RECORDS:
        return _encode_block(buf, h, base, body) if n else b""
    return b"".join(_encode_block(buf, _take(h, slice(i, i + BLOCK_RECORDS)), base, body)
                    for i in range(0, n, BLOCK_RECORDS))


class _Rows:
    """Rows of fixed-width slots: literal text shared by every row, or an (n, w) byte matrix
    whose unused bytes are 0."""

    def __init__(self, n: int):
        self.n = n
        self.parts: list = []
        self.lit: list[bytes] = []

    def add(self, f) -> None:
        if isinstance(f, list):
            for x in f:
                self.add(x)
        elif isinstance(f, bytes):
            self.lit.append(f)
        else:
            if self.lit:
                self.parts.append(b"".join(self.lit))
                self.lit = []
            self.parts.append(f)

    def columns(self, end: bytes = b"") -> list[np.ndarray]:
        """The slots as (n, w) arrays, ``end`` added to every row."""
        self.add(end)
        parts = self.parts + [b"".join(self.lit)]
        self.lit = []
        self.parts = parts
        n = self.n
        return [np.broadcast_to(np.frombuffer(p, np.uint8), (n, len(p))) if isinstance(p, bytes) else p
                for p in parts if (len(p) if isinstance(p, bytes) else p.shape[1])]


_ROW_END = b"\r"  # JSON text never holds a raw CR (nor a NUL, the padding)


def _row_texts(cols: list[np.ndarray]) -> list[bytes]:
    """One text per row of the concatenated slots, padding removed."""
    rows = len(cols[0]) if cols else 0
    end = np.broadcast_to(np.frombuffer(_ROW_END, np.uint8), (rows, 1))
    text = np.concatenate(cols + [end], axis=1).tobytes().translate(None, b"\0")
    return text.split(_ROW_END)[:-1]


def _encode_block(buf, h: Headers, base: int, body: str) -> bytes:
    mv = memoryview(buf)
    u8 = np.frombuffer(buf, np.uint8)
    n = len(h)
    head = _Rows(n)  # '{"topic":...,"properties":'
    topic = _grouped_string(u8, h.topicStart, h.topicLength)
    tops = None
    if topic is None:  # long topics: one escaped text per record, not a padded matrix
        tops = [b'{"topic":"' + t + b'"' for t in
                _string_pieces(_slices(mv, h.topicStart.tolist(), (h.topicStart + h.topicLength).tolist()))]
    else:
        head.add(b'{"topic":')
        head.add(topic[0])
    for key, col in (("queueId", h.queueId), ("flag", h.flag), ("queueOffset", h.queueOffset),
                     ("commitLogOffset", h.physicalOffset), ("storeSize", h.totalSize), ("bodyCRC", h.bodyCRC),
                     ("sysFlag", h.sysFlag), ("bornTimestamp", h.bornTimestamp)):
        head.add(b',"' + key.encode() + b'":')
        head.add(_ints(col))
    born, _ = _hosts(u8, h.bornHostStart, h.bornHostLen, False)
    head.add(b',"bornHost":')
    head.add(born)
    head.add(b',"storeTimestamp":')
    head.add(_ints(h.storeTimestamp))
    store, prefix = _hosts(u8, h.storeHostStart, h.storeHostLen, True)
    head.add(b',"storeHost":')
    head.add(store)
    for key, col in (("reconsumeTimes", h.reconsumeTimes), ("preparedTransactionOffset", h.preparedTransactionOffset),
                     ("bodyLen", h.bodyLength)):
        head.add(b',"' + key.encode() + b'":')
        head.add(_ints(col))
    pend = h.propsStart + h.propsLength
    trailing = bool((u8[np.maximum(pend - 1, 0)][h.propsLength > 0] == 2).any())
    plain, objs, raws = _props_pieces(buf, h.propsStart.tolist(), pend.tolist(), trailing)
    head.add(b',"properties":')
    if plain.all():
        head.add(_OBJ_OPEN)
        closes = repeat(_OBJ_CLOSE)
    else:
        head.add(np.where(plain[:, None], np.frombuffer(_OBJ_OPEN, np.uint8)[None, :], np.uint8(0)).astype(np.uint8))
        closes = [_OBJ_CLOSE if p else _RAW_KEY for p in plain.tolist()]
    tail = _Rows(n)  # '","msgId":...}' (then the body)
    tail.add(b'","msgId":"')
    tail.add(prefix)
    tail.add(_hex_u64(h.physicalOffset))
    tail.add(b'","magicVersion":')
    tail.add(_ints(np.where(h.magicCode == MAGIC_V2, 2, 1)))
    tail.add(b',"offset":')
    tail.add(_ints(h.offsets + base))
    bodies = None
    if body != "none":
        tail.add(b',"' + BODY_KEYS[body].encode() + b'":"')
        bodies = _body_pieces(buf, h, body)
    hc = head.columns()
    if tops is not None:  # the topic text leads each record: no merged rows
        heads = [a + b for a, b in zip(tops, _row_texts(hc))]
        if bodies is None:
            tails = _row_texts(tail.columns(b"}\n"))
            return b"".join(chain.from_iterable(zip(heads, objs, closes, raws, tails)))
        tails = _row_texts(tail.columns())
        return b"".join(chain.from_iterable(zip(heads, objs, closes, raws, tails, bodies, repeat(b'"}\n'))))
    # the end of record i and the start of record i + 1 are one row: fewer, longer pieces
    first = _row_texts([c[:1] for c in hc])
    if bodies is None:
        tc = tail.columns(b"}\n")
        mids = _row_texts([c[:-1] for c in tc] + [c[1:] for c in hc]) if n > 1 else []
        mids.extend(_row_texts([c[-1:] for c in tc]))
        return b"".join(chain(first, chain.from_iterable(zip(objs, closes, raws, mids))))
    tails = _row_texts(tail.columns())
    close = b'"}\n'
    mids = _row_texts([np.broadcast_to(np.frombuffer(close, np.uint8), (n - 1, len(close)))] +
                      [c[1:] for c in hc]) if n > 1 else []
    mids.append(close)
    return b"".join(chain(first, chain.from_iterable(zip(objs, closes, raws, tails, bodies, mids))))


def topic_mask(buf, h: Headers, topic: str) -> np.ndarray:
    """Records whose decoded topic equals ``topic`` (as the reference compares decoded text)."""
    u8 = np.frombuffer(buf, np.uint8)
    g = _grouped_string(u8, h.topicStart, h.topicLength, maxlen=1 << 16)
    _, texts, inverse = g
    hit = np.array([t == topic for t in texts], dtype=bool)
    return hit[inverse]
