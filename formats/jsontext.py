"""Text pieces of the compiled JSON Lines writer (:mod:`formats.jsonkernel`), numba helpers inlined into it:
literal copies, decimal integers, JSON string escaping of bytes decoded as UTF-8 with ``errors="replace"``
(CPython's rule: one U+FFFD per maximal invalid subpart), the ``{"ip",...}`` object of a host field.

A call per field cost more than writing the field: every helper here is inlined into the kernel that calls it.
"""

from __future__ import annotations

import numba
import numpy as np

from .wordstore import _copy

_HEXL = np.frombuffer(b"0123456789abcdef", np.uint8).copy()
_HEXU = np.frombuffer(b"0123456789ABCDEF", np.uint8).copy()
_POW10 = np.array([10**k for k in range(20)], dtype=np.uint64)
_PAIRS = np.frombuffer(b"".join(b"%02d" % i for i in range(100)), np.uint8).copy()

# a host's literal texts (module arrays: numba freezes them into the compiled code)
_L0 = np.frombuffer(b'{"ip":"', np.uint8).copy()
_L1 = np.frombuffer(b'","ipHex":"', np.uint8).copy()
_L2 = np.frombuffer(b'","port":', np.uint8).copy()


def _lit(out, p, s):
    _copy(out, p, s, 0, s.shape[0])
    return p + s.shape[0]


def _ndigits(m):
    """Decimal digits of an unsigned 64-bit value (binary search over the powers of ten)."""
    pw = _POW10
    if m < pw[8]:
        if m < pw[4]:
            if m < pw[2]:
                return 1 if m < pw[1] else 2
            return 3 if m < pw[3] else 4
        if m < pw[6]:
            return 5 if m < pw[5] else 6
        return 7 if m < pw[7] else 8
    if m < pw[16]:
        if m < pw[12]:
            if m < pw[10]:
                return 9 if m < pw[9] else 10
            return 11 if m < pw[11] else 12
        if m < pw[14]:
            return 13 if m < pw[13] else 14
        return 15 if m < pw[15] else 16
    if m < pw[18]:
        return 17 if m < pw[17] else 18
    return 19 if m < pw[19] else 20


def _int(out, p, v):
    """Decimal text of a signed 64-bit value (INT64_MIN included), two digits per division."""
    if 0 <= v < 10:  # most header fields: flags, queue ids, counters
        out[p] = 48 + v
        return p + 1
    if v < 0:
        out[p] = 45
        p += 1
        m = np.uint64(-(v + 1)) + np.uint64(1)
    else:
        m = np.uint64(v)
    n = _ndigits(m)
    pairs = _PAIRS
    q = p + n
    while m >= np.uint64(100):
        r = np.int64(m % np.uint64(100))
        m //= np.uint64(100)
        q -= 2
        out[q] = pairs[2 * r]
        out[q + 1] = pairs[2 * r + 1]
    r = np.int64(m)
    if r >= 10:
        out[q - 2] = pairs[2 * r]
        out[q - 1] = pairs[2 * r + 1]
    else:
        out[q - 1] = 48 + r
    return p + n


def _seq_len(u8, i, e):
    """(bytes, valid) of the UTF-8 sequence at u8[i] (a byte >= 0x80): valid -> its length; invalid
    -> the length of the maximal subpart CPython replaces by one U+FFFD."""
    c = u8[i]
    lo = 0x80
    hi = 0xBF
    if 0xC2 <= c <= 0xDF:
        n = 1
    elif c == 0xE0:
        n = 2
        lo = 0xA0
    elif c == 0xED:
        n = 2
        hi = 0x9F
    elif 0xE1 <= c <= 0xEF:
        n = 2
    elif c == 0xF0:
        n = 3
        lo = 0x90
    elif c == 0xF4:
        n = 3
        hi = 0x8F
    elif 0xF1 <= c <= 0xF3:
        n = 3
    else:
        return 1, False
    j = i + 1
    for k in range(n):
        if j >= e:
            return j - i, False
        b = u8[j]
        if k == 0:
            if b < lo or b > hi:
                return j - i, False
        elif b < 0x80 or b > 0xBF:
            return j - i, False
        j += 1
    return j - i, True


def _esc(u8, s, e, out, p, hexl):
    """JSON string content (no quotes) of the bytes u8[s:e] decoded with errors="replace".
    Returns (end position, whether a replacement happened)."""
    bad = False
    i = s
    while i < e:
        c = u8[i]
        if c < 0x80:
            if c >= 0x20:
                if c == 0x22 or c == 0x5C:
                    out[p] = 0x5C
                    p += 1
                out[p] = c
                p += 1
            else:
                out[p] = 0x5C
                if c == 10:
                    out[p + 1] = 110
                    p += 2
                elif c == 13:
                    out[p + 1] = 114
                    p += 2
                elif c == 9:
                    out[p + 1] = 116
                    p += 2
                elif c == 8:
                    out[p + 1] = 98
                    p += 2
                elif c == 12:
                    out[p + 1] = 102
                    p += 2
                else:
                    out[p + 1] = 117
                    out[p + 2] = 48
                    out[p + 3] = 48
                    out[p + 4] = hexl[c >> 4]
                    out[p + 5] = hexl[c & 15]
                    p += 6
            i += 1
            continue
        n, ok = _seq_len(u8, i, e)
        if ok:
            for k in range(n):
                out[p + k] = u8[i + k]
            p += n
        else:
            out[p] = 0xEF
            out[p + 1] = 0xBF
            out[p + 2] = 0xBD
            p += 3
            bad = True
        i += n
    return p, bad


def _hex(u8, s, n, out, p, digits):
    """The ``n`` bytes at ``s`` as hex text (two of ``digits`` per byte: lower or upper case), written at ``p``."""
    for k in range(n):
        b = u8[s + k]
        out[p] = digits[b >> 4]
        out[p + 1] = digits[b & 15]
        p += 2
    return p


def _host(u8, s, w, out, p, hexl):
    """{"ip":...,"ipHex":...,"port":N} of a host field (ip bytes then a big-endian int32 port)."""
    ipn = w - 4
    p = _lit(out, p, _L0)
    if ipn == 4:
        for k in range(4):
            if k:
                out[p] = 46
                p += 1
            p = _int(out, p, np.int64(u8[s + k]))
    else:  # Java's getHostAddress: 8 groups, lowercase hex, no leading zeros, no "::"
        for g in range(ipn // 2):
            if g:
                out[p] = 58
                p += 1
            v = (np.int64(u8[s + 2 * g]) << 8) | np.int64(u8[s + 2 * g + 1])
            started = False
            for sh in (12, 8, 4, 0):
                d = (v >> sh) & 15
                if d or started or sh == 0:
                    out[p] = hexl[d]
                    p += 1
                    started = True
    p = _lit(out, p, _L1)
    p = _hex(u8, s, ipn, out, p, hexl)
    p = _lit(out, p, _L2)
    port = np.int32((np.uint32(u8[s + ipn]) << np.uint32(24)) | (np.uint32(u8[s + ipn + 1]) << np.uint32(16))
                    | (np.uint32(u8[s + ipn + 2]) << np.uint32(8)) | np.uint32(u8[s + ipn + 3]))
    p = _int(out, p, np.int64(port))
    out[p] = 0x7D
    return p + 1


_inline = numba.njit(inline="always")
_lit = _inline(_lit)
_ndigits = _inline(_ndigits)
_int = _inline(_int)
_seq_len = _inline(_seq_len)
_esc = _inline(_esc)
_hex = _inline(_hex)
_host = _inline(_host)
