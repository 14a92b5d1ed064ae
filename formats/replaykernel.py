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

:func:`encode_records` writes the records (FORMAT.md §2.1) from the parsed columns straight from
the input bytes (base64 decoded and escapes undone in place), with the body CRC.
``tests/test_append_batch.py`` checks the records equal those the plain route writes.
"""

from __future__ import annotations

import numpy as np

import numba

from .kernel import _crc, _jit

_inline = numba.njit(inline="always")

OK, BLANK, SLOW = 0, 1, 2
MAGIC_V2 = -626843477  # formats.records.MAGIC_V2 (a literal: numba freezes globals)

# Field ids: the order of FIELDS; 0..12, 21 and 22 carry values, 13..20 are computed by the store and skipped.
FIELDS = (b"topic", b"queueId", b"flag", b"sysFlag", b"bornTimestamp", b"bornHost", b"storeTimestamp", b"storeHost",
          b"reconsumeTimes", b"preparedTransactionOffset", b"properties", b"propertiesRaw", b"bodyBase64",
          b"queueOffset", b"commitLogOffset", b"storeSize", b"bodyCRC", b"bodyLen", b"msgId", b"magicVersion",
          b"offset", b"bodyHex", b"bodyText")
_FIELD_BYTES = np.frombuffer(b"".join(FIELDS), np.uint8).copy()
_FIELD_ENDS = np.cumsum([len(f) for f in FIELDS]).astype(np.int64)
_HOST_FIELDS = np.frombuffer(b"ipipHexport", np.uint8).copy()
_CRC_KEY = np.frombuffer(b"__CRC32#", np.uint8).copy()
_MULTI_KEY = np.frombuffer(b"INNER_MULTI_", np.uint8).copy()
_B64 = np.full(256, -1, np.int64)
for _i, _c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):
    _B64[_c] = _i
_HEX = np.full(256, -1, np.int64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i

# int columns of the parse (I_*), one row per line
I_QUEUE, I_FLAG, I_SYSFLAG, I_BORN_TS, I_STORE_TS, I_RECONSUME, I_PREPARED = 0, 1, 2, 3, 4, 5, 6
I_BORN_PORT, I_STORE_PORT, I_BORN_HEX, I_BORN_HEXLEN, I_STORE_HEX, I_STORE_HEXLEN = 7, 8, 9, 10, 11, 12
I_TOPIC, I_TOPICLEN, I_RAW, I_RAWEND, I_RAWLEN, I_BODY, I_BODYLEN = 13, 14, 15, 16, 17, 18, 19
N_COLUMNS = 20
INT32_MAX = 2147483647
MAX_ENTRIES = 256  # property entries of a line compared here (O(k^2)); more: the plain route


@_inline
def _ws(u8, p, e):
    while p < e and (u8[p] == 32 or u8[p] == 9 or u8[p] == 10 or u8[p] == 13):
        p += 1
    return p


@_inline
def _string_end(u8, p, e):
    """``u8[p]`` is an opening quote: index of the closing quote (escapes checked), -1 if not a string."""
    if p >= e or u8[p] != 34:
        return -1
    p += 1
    while p < e:
        c = u8[p]
        if c == 34:
            return p
        if c < 32:
            return -1
        if c == 92:
            if p + 1 >= e:
                return -1
            d = u8[p + 1]
            if d == 117:
                if p + 5 >= e:
                    return -1
                for k in range(2, 6):
                    if _HEX[u8[p + k]] < 0:
                        return -1
                p += 6
                continue
            if not (d == 34 or d == 92 or d == 47 or d == 98 or d == 102 or d == 110 or d == 114 or d == 116):
                return -1
            p += 2
            continue
        p += 1
    return -1


@_inline
def _hex4(u8, p):
    return (_HEX[u8[p]] << 12) | (_HEX[u8[p + 1]] << 8) | (_HEX[u8[p + 2]] << 4) | _HEX[u8[p + 3]]


@_jit
def _unescape(u8, s, e, out, o):
    """The UTF-8 bytes of the JSON string content ``u8[s:e]`` (escapes valid) written at ``out[o]``;
    returns the end, or -1 for a lone surrogate (its value is the plain route's business)."""
    p = s
    while p < e:
        c = u8[p]
        if c != 92:
            out[o] = c
            o += 1
            p += 1
            continue
        d = u8[p + 1]
        if d != 117:
            v = d
            if d == 98:
                v = 8
            elif d == 102:
                v = 12
            elif d == 110:
                v = 10
            elif d == 114:
                v = 13
            elif d == 116:
                v = 9
            out[o] = v
            o += 1
            p += 2
            continue
        cp = _hex4(u8, p + 2)
        p += 6
        if 0xD800 <= cp <= 0xDBFF:
            if p + 5 < e and u8[p] == 92 and u8[p + 1] == 117:
                lo = _hex4(u8, p + 2)
                if 0xDC00 <= lo <= 0xDFFF:
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    p += 6
                else:
                    return -1
            else:
                return -1
        elif 0xDC00 <= cp <= 0xDFFF:
            return -1
        if cp < 0x80:
            out[o] = cp
            o += 1
        elif cp < 0x800:
            out[o] = 0xC0 | (cp >> 6)
            out[o + 1] = 0x80 | (cp & 0x3F)
            o += 2
        elif cp < 0x10000:
            out[o] = 0xE0 | (cp >> 12)
            out[o + 1] = 0x80 | ((cp >> 6) & 0x3F)
            out[o + 2] = 0x80 | (cp & 0x3F)
            o += 3
        else:
            out[o] = 0xF0 | (cp >> 18)
            out[o + 1] = 0x80 | ((cp >> 12) & 0x3F)
            out[o + 2] = 0x80 | ((cp >> 6) & 0x3F)
            out[o + 3] = 0x80 | (cp & 0x3F)
            o += 4
    return o


@_inline
def _int_end(u8, p, e):
    """End of a JSON integer of at most 18 digits at ``p`` (no fraction/exponent), else -1."""
    q = p
    if q < e and u8[q] == 45:
        q += 1
    d = q
    while q < e and 48 <= u8[q] <= 57:
        q += 1
    n = q - d
    if n == 0 or n > 18 or (n > 1 and u8[d] == 48):
        return -1
    if q < e and (u8[q] == 46 or u8[q] == 101 or u8[q] == 69):
        return -1
    return q


@_inline
def _int_value(u8, p, q):
    neg = u8[p] == 45
    if neg:
        p += 1
    v = np.int64(0)
    while p < q:
        v = v * 10 + (u8[p] - 48)
        p += 1
    return -v if neg else v


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
def _find(buf, n, needle):
    m = len(needle)
    for i in range(n - m + 1):
        if buf[i] == needle[0]:
            same = True
            for k in range(1, m):
                if buf[i + k] != needle[k]:
                    same = False
                    break
            if same:
                return True
    return False


@_jit
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
            q = _int_end(u8, p, e)
            if q < 0:
                return -1
            v = _int_value(u8, p, q)
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


@_inline
def _same(x, xs, y, ys, n):
    for k in range(n):
        if x[xs + k] != y[ys + k]:
            return False
    return True


@_jit
def _props_match(u8, p, e, raw, rn, tmp, ents):
    """The ``properties`` object at ``p`` equals ``parse_properties`` of the decoded raw string ``raw[:rn]``
    (the plain route's check), told without duplicate names on either side. Returns its end or -1."""
    m = 0
    start = 0
    while start < rn:  # MessageDecoder.string2messageProperties
        end = start
        while end < rn and raw[end] != 2:
            end += 1
        if end - start >= 3:
            sep = start
            while sep < end and raw[sep] != 1:
                sep += 1
            if start < sep < end - 1:
                if m == len(ents):
                    return -1
                ents[m, 0], ents[m, 1], ents[m, 2], ents[m, 3] = start, sep - start, sep + 1, end - sep - 1
                for k in range(m):
                    if ents[k, 1] == ents[m, 1] and _same(raw, ents[k, 0], raw, start, ents[m, 1]):
                        return -1
                m += 1
        start = end + 1
    for k in range(m):
        ents[k, 4] = 0
    if p >= e or u8[p] != 123:
        return -1
    p = _ws(u8, p + 1, e)
    if p < e and u8[p] == 125:
        return p + 1 if m == 0 else -1
    count = 0
    while True:
        q = _string_end(u8, p, e)
        if q < 0:
            return -1
        kn = _unescape(u8, p + 1, q, tmp, 0)
        if kn <= 0:
            return -1
        p = _ws(u8, q + 1, e)
        if p >= e or u8[p] != 58:
            return -1
        p = _ws(u8, p + 1, e)
        q = _string_end(u8, p, e)
        if q < 0:
            return -1
        vn = _unescape(u8, p + 1, q, tmp, kn)
        if vn <= kn:
            return -1
        vn -= kn
        for k in range(kn + vn):
            if tmp[k] == 1 or tmp[k] == 2:
                return -1
        found = -1
        for k in range(m):
            if ents[k, 1] == kn and _same(raw, ents[k, 0], tmp, 0, kn):
                found = k
                break
        if found < 0 or ents[found, 4] or ents[found, 3] != vn or not _same(raw, ents[found, 2], tmp, kn, vn):
            return -1
        ents[found, 4] = 1
        count += 1
        p = _ws(u8, q + 1, e)
        if p < e and u8[p] == 44:
            p = _ws(u8, p + 1, e)
            continue
        if p < e and u8[p] == 125 and count == m:
            return p + 1
        return -1


@_jit
def _parse_line(u8, s, e, cols, at, side, cursor, scratch, ents, table, ends, v5):
    p = _ws(u8, s, e)
    if p == e:
        return BLANK
    if u8[p] != 123:
        return SLOW
    p += 1
    seen = 0
    props_at = -1
    while True:
        p = _ws(u8, p, e)
        q = _string_end(u8, p, e)
        if q < 0:
            return SLOW
        f = _field_id(u8, p + 1, q, table, ends)
        if f < 0 or seen & (1 << f):
            return SLOW
        seen |= 1 << f
        p = _ws(u8, q + 1, e)
        if p >= e or u8[p] != 58:
            return SLOW
        p = _ws(u8, p + 1, e)
        if f == 0 or f == 11:  # topic, propertiesRaw: strings
            q = _string_end(u8, p, e)
            if q < 0:
                return SLOW
            if f == 0:
                for j in range(p + 1, q):
                    if u8[j] < 32 or u8[j] > 126 or u8[j] == 92:
                        return SLOW
                cols[at, I_TOPIC] = p + 1
                cols[at, I_TOPICLEN] = q - p - 1
            elif f == 11:
                cols[at, I_RAW] = p + 1
                cols[at, I_RAWEND] = q
            p = q + 1
        elif f == 12:  # bodyBase64, decoded (and so checked) into the side buffer
            if p >= e or u8[p] != 34:
                return SLOW
            o = cursor[0]
            o0 = o
            q = p + 1
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
            q = _int_end(u8, p, e)
            if q < 0:
                return SLOW
            if f <= 9:
                v = _int_value(u8, p, q)
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
    o = cursor[0]
    rn = _unescape(u8, cols[at, I_RAW], cols[at, I_RAWEND], side, o)
    if rn < 0:
        return SLOW
    rn -= o
    raw = side[o:o + rn]
    if (v5 and _find(raw, rn, _CRC_KEY)) or _find(raw, rn, _MULTI_KEY):
        return SLOW
    if props_at >= 0 and _props_match(u8, props_at, e, raw, rn, scratch, ents) < 0:
        return SLOW
    cols[at, I_RAW] = o
    cols[at, I_RAWLEN] = rn
    cursor[0] = o + rn
    sf = cols[at, I_SYSFLAG] & ~0x30
    if cols[at, I_BORN_HEXLEN] == 32:
        sf |= 0x10
    if cols[at, I_STORE_HEXLEN] == 32:
        sf |= 0x20
    cols[at, I_SYSFLAG] = sf
    return OK


@_jit
def parse_lines(u8, starts, ends, cols, status, side, scratch, ents, table, ends_table, v5):
    """Parse each line ``u8[starts[i]:ends[i]]`` into ``cols[i]``; ``status[i]`` OK, BLANK or SLOW. Bodies
    and decoded property strings go to ``side`` (at ``cols[i, I_BODY]``, ``cols[i, I_RAW]``)."""
    cursor = np.zeros(1, np.int64)
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
    parse_lines(u8, starts, ends, cols, status, side, scratch, ents, _FIELD_BYTES, _FIELD_ENDS, v5)
    return cols, status, side


@_inline
def _put_be(out, p, v, width):
    for k in range(width):
        out[p + width - 1 - k] = (v >> (8 * k)) & 0xFF


@_inline
def _put_host(u8, out, p, hexpos, hexlen, port):
    for k in range(hexlen // 2):
        out[p + k] = (_HEX[u8[hexpos + 2 * k]] << 4) | _HEX[u8[hexpos + 2 * k + 1]]
    p += hexlen // 2
    _put_be(out, p, port, 4)
    return p + 4


@_jit
def encode_records(u8, side, cols, rows, magic, total, queue_offset, phy, out, at):
    """Write the record of line ``rows[j]`` at ``out[at[j]]`` (TOTALSIZE ``total[j]``, ``magic[j]``)."""
    for j in range(len(rows)):
        i = rows[j]
        p = at[j]
        _put_be(out, p, total[j], 4)
        _put_be(out, p + 4, magic[j], 4)
        _put_be(out, p + 12, cols[i, I_QUEUE], 4)
        _put_be(out, p + 16, cols[i, I_FLAG], 4)
        _put_be(out, p + 20, queue_offset[j], 8)
        _put_be(out, p + 28, phy[j], 8)
        _put_be(out, p + 36, cols[i, I_SYSFLAG], 4)
        _put_be(out, p + 40, cols[i, I_BORN_TS], 8)
        q = _put_host(u8, out, p + 48, cols[i, I_BORN_HEX], cols[i, I_BORN_HEXLEN], cols[i, I_BORN_PORT])
        _put_be(out, q, cols[i, I_STORE_TS], 8)
        q = _put_host(u8, out, q + 8, cols[i, I_STORE_HEX], cols[i, I_STORE_HEXLEN], cols[i, I_STORE_PORT])
        _put_be(out, q, cols[i, I_RECONSUME], 4)
        _put_be(out, q + 4, cols[i, I_PREPARED], 8)
        blen = cols[i, I_BODYLEN]
        _put_be(out, q + 12, blen, 4)
        q += 16
        body = q
        s = cols[i, I_BODY]
        out[q:q + blen] = side[s:s + blen]
        q += blen
        crc = np.int64(_crc(out, body, blen) & np.uint32(0x7FFFFFFF)) if blen else 0
        _put_be(out, p + 8, crc, 4)
        tl = cols[i, I_TOPICLEN]
        if magic[j] == MAGIC_V2:
            _put_be(out, q, tl, 2)
            q += 2
        else:
            out[q] = tl
            q += 1
        ts = cols[i, I_TOPIC]
        for k in range(tl):
            out[q + k] = u8[ts + k]
        q += tl
        rn = cols[i, I_RAWLEN]
        _put_be(out, q, rn, 2)
        s = cols[i, I_RAW]
        out[q + 2:q + 2 + rn] = side[s:s + rn]


@_jit
def layout(total, offset, file_size, phy, blank_after):
    """Place records one put each (FORMAT.md §2.4): a record whose TOTALSIZE + 8 does not fit in what
    remains of its segment goes to the next one after a BLANK. ``phy[j]``: its offset;
    ``blank_after[j]``: the BLANK's offset written before record ``j`` (-1: none). Returns the end."""
    for j in range(len(total)):
        pos = offset % file_size
        blank_after[j] = -1
        if total[j] + 8 > file_size - pos:
            blank_after[j] = offset
            offset += file_size - pos
        phy[j] = offset
        offset += total[j]
    return offset
