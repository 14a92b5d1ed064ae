"""Compiled parse of ``dump commitlog --json`` lines and encoding of their records (numba, nopython):
the batch route of ``append --from`` (a replay), many lines per call instead of one Python object each.

:func:`parse_lines` recognises the shape ``dump commitlog --json`` writes (``--body base64``, ``hex``
or ``text``): one object of known fields in any order, integers, ``{"ip", "ipHex", "port"}`` hosts,
a printable-ASCII topic without escapes, ``propertiesRaw`` (JSON escapes decoded, ``\\uXXXX``
pairs included) whose entries equal the ``properties`` object (``parse_properties(raw) ==
properties``, the plain route's check, told here when neither side repeats a name), one body.
Anything else, or a value the plain route would refuse or treat specially (a null, a lone
surrogate escape, an out-of-range or 19-digit number, a ``__CRC32#`` or ``INNER_MULTI_*``
property, a missing store time, a body not in strict base64 or hex digit pairs), is marked
``SLOW``: the caller sends that line through :meth:`engine.log.messages.MessageBuilder.from_json`,
which gives the value or the error. The kernel never decides an error itself, so the errors stay
those of one implementation.

:mod:`formats.replayencode` writes the records from the columns; the JSON scanning pieces are in
:mod:`formats.jsonscan`, the comparison of the properties object with the raw string in
:mod:`formats.replayprops` (numba caches a kernel by its own file: after editing one of those, clear
``formats/__pycache__/*.nbi``). ``tests/test_append_batch.py`` checks the lines this parser takes
give the files the plain route gives.
"""

from __future__ import annotations

import numpy as np


from .jsonscan import _HEX, _inline, _int_end, _int_read, _read_string, _string_end, _unescape, _ws
from .kernel import _jit_no_refcounts
from .replayprops import _props_match
from .wordops import _bytes_equal_mask, _low_byte_index, _same_bytes, _word
from .wordstore import _base64_decode32, _bswap, _store_word

OK, BLANK, SLOW = 0, 1, 2
MAGIC_V2 = -626843477  # formats.records.MAGIC_V2 (a literal: numba freezes globals)

# Field ids: the order of FIELDS; 0..12, 21 and 22 carry values, 13..20 are computed by the store and skipped.
FIELDS = (b"topic", b"queueId", b"flag", b"sysFlag", b"bornTimestamp", b"bornHost", b"storeTimestamp", b"storeHost",
          b"reconsumeTimes", b"preparedTransactionOffset", b"properties", b"propertiesRaw", b"bodyBase64",
          b"queueOffset", b"commitLogOffset", b"storeSize", b"bodyCRC", b"bodyLen", b"msgId", b"magicVersion",
          b"offset", b"bodyHex", b"bodyText")
_DUMP_ORDER = (0, 1, 2, 13, 14, 15, 16, 3, 4, 5, 6, 7, 8, 9, 17, 10, 11, 12)  # dump --json's field order
_NEXT = np.full(len(FIELDS) + 1, -1, np.int64)  # field id -> the next one in dump order; [-1]: the first
_NEXT[-1] = _DUMP_ORDER[0]
for _a, _b in zip(_DUMP_ORDER, _DUMP_ORDER[1:]):
    _NEXT[_a] = _b
_FIELD_BYTES = np.frombuffer(b"".join(FIELDS), np.uint8).copy()
_FIELD_ENDS = np.cumsum([len(f) for f in FIELDS]).astype(np.int64)
_UNDERSCORES, _CAPITAL_IS = 0x5F5F5F5F5F5F5F5F, 0x4949494949494949  # the first bytes of the two keys, in every byte
_CRC_KEY = np.frombuffer(b"__CRC32#", np.uint8).copy()
_MULTI_KEY = np.frombuffer(b"INNER_MULTI_", np.uint8).copy()
_B64 = np.full(256, -1, np.int64)
# The same values pre-shifted to their place in a quad's 24 bits; 0xFF000000 (never set by a digit): not one.
_B64_0, _B64_1, _B64_2, _B64_3 = (np.full(256, 0xFF000000, np.uint32) for _ in range(4))
for _i, _c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):
    _B64[_c] = _i
    _B64_0[_c], _B64_1[_c], _B64_2[_c], _B64_3[_c] = _i << 18, _i << 12, _i << 6, _i
# int columns of the parse (I_*), one row per line
I_QUEUE, I_FLAG, I_SYSFLAG, I_BORN_TS, I_STORE_TS, I_RECONSUME, I_PREPARED = 0, 1, 2, 3, 4, 5, 6
I_BORN_PORT, I_STORE_PORT, I_BORN_HEX, I_BORN_HEXLEN, I_STORE_HEX, I_STORE_HEXLEN = 7, 8, 9, 10, 11, 12
I_TOPIC, I_TOPICLEN, I_RAW, I_RAWLEN, I_BODY, I_BODYLEN = 13, 14, 15, 16, 17, 18
N_COLUMNS = 19
INT32_MAX = 2147483647
MAX_ENTRIES = 256  # property entries of a line compared here (O(k^2)); more: the plain route


@_inline
def _field_is(u8, s, e, table, ends, f):
    start = ends[f - 1] if f else 0
    n = e - s
    return ends[f] - start == n and _same_bytes(u8, s, table, start, n)


@_inline
def _field_id(u8, s, e, table, ends):
    n = e - s
    start = 0
    for f in range(len(ends)):
        if ends[f] - start == n:
            same = True
            for k in range(n):
                if u8[s + k] != table[start + k]:
                    same = False
                    break
            if same:
                return f
        start = ends[f]
    return -1


@_inline
def _at(buf, i, n, needle):
    if i + len(needle) > n:
        return False
    for k in range(1, len(needle)):
        if buf[i + k] != needle[k]:
            return False
    return True


@_inline
def _special_at(raw, i, rn, v5):
    c = raw[i]
    if c == 95 and v5 and _at(raw, i, rn, _CRC_KEY):
        return True
    return c == 73 and _at(raw, i, rn, _MULTI_KEY)


@_inline
def _special(raw, rn, v5):
    """Does the property string hold ``__CRC32#`` (5.x: its value is recomputed) or ``INNER_MULTI_``
    (LMQ dispatch) anywhere? One pass, 8 bytes a step: only a word holding a ``_`` or an ``I`` is looked at."""
    i = 0
    while i + 8 <= rn:
        w = _word(raw, i)
        if _bytes_equal_mask(w, np.uint64(_UNDERSCORES)) | _bytes_equal_mask(w, np.uint64(_CAPITAL_IS)):
            for j in range(i, i + 8):
                if _special_at(raw, j, rn, v5):
                    return True
        i += 8
    for j in range(i, rn):
        if _special_at(raw, j, rn, v5):
            return True
    return False


@_jit_no_refcounts
def _host(u8, p, e, port_col, hex_col, cols, at):
    """An ``{"ip": str, "ipHex": hex of 4 or 16 bytes, "port": 0..2^31-1}`` object at ``p``; returns its end or -1."""
    if p >= e or u8[p] != 123:
        return -1
    p += 1
    seen = 0
    while True:
        p = _ws(u8, p, e)
        q = _string_end(u8, p, e)
        if q < 0:
            return -1
        n = q - p - 1
        k = -1
        if n == 2 and u8[p + 1] == 105 and u8[p + 2] == 112:
            k = 0
        elif n == 5 and u8[p + 1] == 105 and u8[p + 2] == 112 and u8[p + 3] == 72 and u8[p + 4] == 101 and u8[p + 5] == 120:
            k = 1
        elif n == 4 and u8[p + 1] == 112 and u8[p + 2] == 111 and u8[p + 3] == 114 and u8[p + 4] == 116:
            k = 2
        if k < 0 or seen & (1 << k):
            return -1
        seen |= 1 << k
        p = _ws(u8, q + 1, e)
        if p >= e or u8[p] != 58:
            return -1
        p = _ws(u8, p + 1, e)
        if k == 0:
            q = _string_end(u8, p, e)
            if q < 0:
                return -1
            p = q + 1
        elif k == 1:
            q = _string_end(u8, p, e)
            if q < 0:
                return -1
            n = q - p - 1
            if n != 8 and n != 32:
                return -1
            for j in range(p + 1, q):
                if _HEX[u8[j]] < 0:
                    return -1
            cols[at, hex_col] = p + 1
            cols[at, hex_col + 1] = n
            p = q + 1
        else:
            q, v = _int_read(u8, p, e)
            if q < 0:
                return -1
            if v < 0 or v > INT32_MAX:
                return -1
            cols[at, port_col] = v
            p = q
        p = _ws(u8, p, e)
        if p < e and u8[p] == 44:
            p += 1
            continue
        if p < e and u8[p] == 125 and seen == 7:
            return p + 1
        return -1


@_jit_no_refcounts
def _parse_line(u8, s, e, cols, at, side, cursor, scratch, ents, table, ends, v5):
    p = _ws(u8, s, e)
    if p == e:
        return BLANK
    if u8[p] != 123:
        return SLOW
    p += 1
    seen = 0
    prev = len(_NEXT) - 1
    props_at = -1
    while True:
        p = _ws(u8, p, e)
        q = _string_end(u8, p, e)
        if q < 0:
            return SLOW
        f = _NEXT[prev]  # the field dump writes after the previous one, tried first
        if f < 0 or not _field_is(u8, p + 1, q, table, ends, f):
            f = _field_id(u8, p + 1, q, table, ends)
        if f < 0 or seen & (1 << f):
            return SLOW
        seen |= 1 << f
        prev = f
        p = _ws(u8, q + 1, e)
        if p >= e or u8[p] != 58:
            return SLOW
        p = _ws(u8, p + 1, e)
        if f == 11:  # propertiesRaw, decoded into the side buffer
            o = cursor[0]
            q, end = _read_string(u8, p, e, side, o)
            if q < 0:
                return SLOW
            cols[at, I_RAW] = o
            cols[at, I_RAWLEN] = end - o
            cursor[0] = end
            p = q + 1
        elif f == 0:  # topic: printable ASCII, no escapes
            if p >= e or u8[p] != 34:
                return SLOW
            q = p + 1
            while q < e and 32 <= u8[q] <= 126 and u8[q] != 34 and u8[q] != 92:
                q += 1
            if q >= e or u8[q] != 34:
                return SLOW
            cols[at, I_TOPIC] = p + 1
            cols[at, I_TOPICLEN] = q - p - 1
            p = q + 1
        elif f == 12:  # bodyBase64, decoded (and so checked) into the side buffer
            if p >= e or u8[p] != 34:
                return SLOW
            o = cursor[0]
            o0 = o
            q = p + 1
            while q + 32 <= e and _base64_decode32(side, o, u8, q):  # eight quads per step (o <= q: room in side)
                o += 24
                q += 32
            while q + 8 <= e:  # two quads per step: one 8-byte load, one 8-byte store (6 bytes kept)
                x = _word(u8, q)
                v = (_B64_0[x & 0xFF] | _B64_1[(x >> 8) & 0xFF] | _B64_2[(x >> 16) & 0xFF]
                     | _B64_3[(x >> 24) & 0xFF])
                w = (_B64_0[(x >> 32) & 0xFF] | _B64_1[(x >> 40) & 0xFF] | _B64_2[(x >> 48) & 0xFF]
                     | _B64_3[x >> 56])
                if (v | w) >> 24:
                    break  # a character that is not a digit (the closing quote, padding): the steps below
                # o + 8 <= q + 8 <= len(side): what is decoded is shorter than the text read so far
                _store_word(side, o, _bswap((np.uint64(v) << np.uint64(40)) | (np.uint64(w) << np.uint64(16))))
                o += 6
                q += 8
            while q + 4 <= e:
                a, b, c, d = _B64[u8[q]], _B64[u8[q + 1]], _B64[u8[q + 2]], _B64[u8[q + 3]]
                if (a | b | c | d) < 0:
                    break
                v = (a << 18) | (b << 12) | (c << 6) | d
                side[o] = v >> 16
                side[o + 1] = (v >> 8) & 0xFF
                side[o + 2] = v & 0xFF
                o += 3
                q += 4
            if q < e and u8[q] == 34:
                pass
            elif q + 4 < e and u8[q + 4] == 34 and _B64[u8[q]] >= 0 and _B64[u8[q + 1]] >= 0 and u8[q + 3] == 61:
                a, b = _B64[u8[q]], _B64[u8[q + 1]]
                side[o] = (a << 2) | (b >> 4)
                o += 1
                if u8[q + 2] != 61:
                    c = _B64[u8[q + 2]]
                    if c < 0:
                        return SLOW
                    side[o] = ((b & 15) << 4) | (c >> 2)
                    o += 1
                q += 4
            else:
                return SLOW
            cols[at, I_BODY] = o0
            cols[at, I_BODYLEN] = o - o0
            cursor[0] = o
            p = q + 1
        elif f == 21:  # bodyHex: pairs of hex digits
            q = _string_end(u8, p, e)
            if q < 0 or (q - p - 1) % 2:
                return SLOW
            o = cursor[0]
            for j in range(p + 1, q, 2):
                hi, lo = _HEX[u8[j]], _HEX[u8[j + 1]]
                if (hi | lo) < 0:
                    return SLOW
                side[o + (j - p - 1) // 2] = (hi << 4) | lo
            cols[at, I_BODY] = o
            cols[at, I_BODYLEN] = (q - p - 1) // 2
            cursor[0] = o + (q - p - 1) // 2
            p = q + 1
        elif f == 22:  # bodyText: its UTF-8 bytes
            q = _string_end(u8, p, e)
            if q < 0:
                return SLOW
            o = cursor[0]
            end = _unescape(u8, p + 1, q, side, o)
            if end < 0:
                return SLOW
            cols[at, I_BODY] = o
            cols[at, I_BODYLEN] = end - o
            cursor[0] = end
            p = q + 1
        elif f == 5 or f == 7:
            if f == 5:
                p = _host(u8, p, e, I_BORN_PORT, I_BORN_HEX, cols, at)
            else:
                p = _host(u8, p, e, I_STORE_PORT, I_STORE_HEX, cols, at)
            if p < 0:
                return SLOW
        elif f == 10:
            props_at = p
            q = p + 1
            depth = 1  # skipped now, compared with the raw string once both are known
            while q < e and depth:
                c = u8[q]
                if c == 34:
                    q = _string_end(u8, q, e)
                    if q < 0:
                        return SLOW
                elif c == 123 or c == 91:
                    return SLOW
                elif c == 125:
                    depth -= 1
                q += 1
            if depth:
                return SLOW
            p = q
        elif f <= 9 or f == 13 or f == 14 or f == 15 or f == 16 or f == 17 or f == 20:  # integers
            q, v = _int_read(u8, p, e)
            if q < 0:
                return SLOW
            if f <= 9:
                col = I_PREPARED
                if f == 1:
                    col = I_QUEUE
                elif f == 2:
                    col = I_FLAG
                elif f == 3:
                    col = I_SYSFLAG
                elif f == 4:
                    col = I_BORN_TS
                elif f == 6:
                    col = I_STORE_TS
                elif f == 8:
                    col = I_RECONSUME
                if (f == 1 or f == 2 or f == 3 or f == 8) and (v < -INT32_MAX - 1 or v > INT32_MAX):
                    return SLOW
                cols[at, col] = v
            p = q
        else:  # msgId, magicVersion: a string or an integer, ignored
            q = _string_end(u8, p, e)
            if q >= 0:
                p = q + 1
            else:
                q = _int_end(u8, p, e)
                if q < 0:
                    return SLOW
                p = q
        p = _ws(u8, p, e)
        if p < e and u8[p] == 44:
            p += 1
            continue
        if p < e and u8[p] == 125:
            p += 1
            break
        return SLOW
    if _ws(u8, p, e) != e:
        return SLOW
    # topic, both times, both hosts, propertiesRaw and one body field are needed
    need = (1 << 0) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 11)
    if seen & need != need:
        return SLOW
    bodies = (seen >> 12) & 1
    bodies += (seen >> 21) & 1
    bodies += (seen >> 22) & 1
    if bodies != 1:
        return SLOW
    if cols[at, I_QUEUE] < 0:
        return SLOW
    if cols[at, I_SYSFLAG] & 0xC0:
        return SLOW
    o = cols[at, I_RAW]
    rn = cols[at, I_RAWLEN]
    raw = side[o:o + rn]
    if _special(raw, rn, v5):
        return SLOW
    if props_at >= 0 and _props_match(u8, props_at, e, raw, rn, scratch, ents) < 0:
        return SLOW
    sf = cols[at, I_SYSFLAG] & ~0x30
    if cols[at, I_BORN_HEXLEN] == 32:
        sf |= 0x10
    if cols[at, I_STORE_HEXLEN] == 32:
        sf |= 0x20
    cols[at, I_SYSFLAG] = sf
    return OK


_LOW7 = 0x7F7F7F7F7F7F7F7F
_NEWLINES = 0x0A0A0A0A0A0A0A0A
_RETURNS = 0x0D0D0D0D0D0D0D0D
_HIGHS = 0x8080808080808080


@_inline
def _zero_bytes(x):
    """High bit set in exactly the bytes of ``x`` that are 0 (no carries between bytes)."""
    low7 = np.uint64(_LOW7)
    return ~(((x & low7) + low7) | x | low7)


@_jit_no_refcounts
def line_ends(u8, ends):
    """Every ``\\n`` of ``u8``, 8 bytes a step: its positions into ``ends`` and (count, any ``\\r``, any byte
    >= 0x80). A count of -1: more lines than ``ends`` holds (the caller looks again another way)."""
    n = len(u8)
    count = 0
    returns = np.uint64(0)
    high = np.uint64(0)
    i = 0
    while i + 8 <= n:
        w = _word(u8, i)
        high |= w
        returns |= _zero_bytes(w ^ np.uint64(_RETURNS))
        nl = _zero_bytes(w ^ np.uint64(_NEWLINES))
        while nl:
            if count == len(ends):
                return -1, False, False
            ends[count] = i + _low_byte_index(nl)
            count += 1
            nl &= nl - np.uint64(1)
        i += 8
    cr = (returns & np.uint64(_HIGHS)) != 0
    wide = (high & np.uint64(_HIGHS)) != 0
    while i < n:
        c = u8[i]
        if c == 10:
            if count == len(ends):
                return -1, False, False
            ends[count] = i
            count += 1
        elif c == 13:
            cr = True
        elif c >= 128:
            wide = True
        i += 1
    return count, cr, wide


@_jit_no_refcounts
def parse_lines(u8, starts, ends, cols, status, side, cursor, scratch, ents, table, ends_table, v5):
    """Parse each line ``u8[starts[i]:ends[i]]`` into ``cols[i]``; ``status[i]`` OK, BLANK or SLOW. Bodies
    and decoded property strings go to ``side`` (at ``cols[i, I_BODY]``, ``cols[i, I_RAW]``) from ``cursor[0]``
    (0 at the call: the kernel makes no array, so it runs without reference counting, kernel._jit)."""
    for i in range(len(starts)):
        for c in range(N_COLUMNS):
            cols[i, c] = 0
        status[i] = _parse_line(u8, starts[i], ends[i], cols, i, side, cursor, scratch, ents, table, ends_table, v5)


def parse(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray, v5: bool):
    """(columns, status, side buffer) of the lines ``u8[starts[i]:ends[i]]``."""
    n = len(starts)
    cols = np.empty((n, N_COLUMNS), np.int64)
    status = np.empty(n, np.int8)
    longest = int((ends - starts).max()) if n else 0
    scratch = np.empty(longest + 16, np.uint8)
    side = np.empty(len(u8) + 16, np.uint8)  # a decoded body or string is never longer than its JSON text
    ents = np.empty((MAX_ENTRIES, 5), np.int64)
    parse_lines(u8, starts, ends, cols, status, side, np.zeros(1, np.int64), scratch, ents, _FIELD_BYTES, _FIELD_ENDS, v5)
    return cols, status, side
