"""JSON text scanning for the compiled parsers (numba, nopython): whitespace, strings (escapes checked,
decoded to UTF-8), integers of at most 18 digits. Each function works on a ``uint8`` view of the text and
positions in it; anything outside what they handle is reported (-1), never guessed.
"""

from __future__ import annotations

import numba
import numpy as np

from .kernel import _jit_no_refcounts
from .wordops import _json_special32, _low_bit_index
from .wordstore import _copy

_inline = numba.njit(inline="always")
_HEX = np.full(256, -1, np.int64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


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
        if p + 32 <= e:  # 32 bytes tested at once: most strings end within them, or have no byte to look at
            m = _json_special32(u8, p)
            if m == 0:
                p += 32
                continue
            p += _low_bit_index(m)
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


@_jit_no_refcounts
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


@_jit_no_refcounts
def _read_string(u8, p, e, out, o):
    """The JSON string at ``u8[p]`` (its opening quote) decoded to UTF-8 at ``out[o]``, in one pass:
    (index of its closing quote, end in ``out``), or (-1, -1) if it is not a string or holds a lone surrogate.
    The caller makes sure ``o <= p`` and ``len(out) >= len(u8)`` (what is decoded is never longer than its text:
    the 32-byte copies stay inside ``out``)."""
    if p >= e or u8[p] != 34:
        return -1, -1
    p += 1
    while p < e:
        if p + 32 <= e:  # 32 bytes tested and copied at once (o <= p: the copy stays inside ``out``), up to the first
            # byte to look at; what is copied past it is written over next
            m = _json_special32(u8, p)
            _copy(out, o, u8, p, 32)
            if m == 0:
                o += 32
                p += 32
                continue
            k = _low_bit_index(m)
            o += k
            p += k
        c = u8[p]
        if c == 34:
            return p, o
        if c < 32:
            return -1, -1
        if c != 92:
            out[o] = c
            o += 1
            p += 1
            continue
        if (p + 5 < e and u8[p + 1] == 117 and u8[p + 2] == 48 and u8[p + 3] == 48 and 0 <= _HEX[u8[p + 4]] < 8
                and _HEX[u8[p + 5]] >= 0):  # \u00XX below 0x80 (the property separators): one byte
            out[o] = (_HEX[u8[p + 4]] << 4) | _HEX[u8[p + 5]]
            o += 1
            p += 6
            continue
        q = _string_end_escape(u8, p, e)
        if q < 0:
            return -1, -1
        o = _unescape(u8, p, q, out, o)
        if o < 0:
            return -1, -1
        p = q
    return -1, -1


@_inline
def _string_end_escape(u8, p, e):
    """End of the escape sequence at ``u8[p]`` (a backslash), a ``\\uXXXX\\uXXXX`` pair taken whole; -1 if invalid."""
    if p + 1 >= e:
        return -1
    d = u8[p + 1]
    if d != 117:
        if d == 34 or d == 92 or d == 47 or d == 98 or d == 102 or d == 110 or d == 114 or d == 116:
            return p + 2
        return -1
    if p + 5 >= e:
        return -1
    for k in range(2, 6):
        if _HEX[u8[p + k]] < 0:
            return -1
    cp = _hex4(u8, p + 2)
    if 0xD800 <= cp <= 0xDBFF and p + 11 < e and u8[p + 6] == 92 and u8[p + 7] == 117:
        for k in range(8, 12):
            if _HEX[u8[p + k]] < 0:
                return -1
        return p + 12
    return p + 6


@_inline
def _int_read(u8, p, e):
    """(end, value) of a JSON integer of at most 18 digits at ``p`` (no fraction/exponent, no leading zero) in one
    pass, else (-1, 0)."""
    q = p
    neg = q < e and u8[q] == 45
    if neg:
        q += 1
    d = q
    v = np.int64(0)
    while q < e:
        c = u8[q]
        if c < 48 or c > 57:
            break
        v = v * 10 + (c - 48)
        q += 1
    n = q - d
    if n == 0 or n > 18 or (n > 1 and u8[d] == 48):
        return -1, np.int64(0)
    if q < e and (u8[q] == 46 or u8[q] == 101 or u8[q] == 69):
        return -1, np.int64(0)
    return q, -v if neg else v


@_inline
def _int_end(u8, p, e):
    """End of a JSON integer of at most 18 digits at ``p`` (:func:`_int_read`'s rule), else -1."""
    return _int_read(u8, p, e)[0]
