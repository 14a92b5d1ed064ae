"""Java's reading of property text, as compiled helpers (numba, inlined into :mod:`formats.propkernel`'s kernels).

A record's property string is UTF-8 that Java decodes into a ``String`` of UTF-16 code units before it hashes a
tag or a key (``String.hashCode``), and a delay-level record's ``DELAY`` is read with ``Integer.parseInt``
(FORMAT.md §5). The helpers here take the common forms straight from the bytes: well-formed UTF-8 (what
Java's decoder would replace with U+FFFD is refused, and the caller leaves that record to the one-at-a-time rules
of :mod:`formats.properties`), and a plain decimal ``DELAY``.
"""

from __future__ import annotations

import numba
import numpy as np

NOT_PLAIN = -(1 << 40)  # _delay_level: not a plain decimal int (the one-at-a-time rules decide)


@numba.njit(inline="never")
def _utf8_units(u8, j, e):
    """The code point of the well-formed UTF-8 sequence at ``u8[j:e]`` (its lead byte >= 0x80) and its length; a
    length of 0 when it is not one (truncated, a bad continuation byte, an overlong form, a surrogate, past
    U+10FFFF): Java's decoder would put U+FFFD there, which only the one-at-a-time rules reproduce."""
    b0 = np.int64(u8[j])
    if b0 < 0xC2 or b0 > 0xF4:
        return np.int64(0), 0
    n = 2 if b0 < 0xE0 else 3 if b0 < 0xF0 else 4
    if j + n > e:
        return np.int64(0), 0
    b1 = np.int64(u8[j + 1])
    lo, hi = 0x80, 0xBF
    if b0 == 0xE0:
        lo = 0xA0  # overlong
    elif b0 == 0xED:
        hi = 0x9F  # UTF-16 surrogates
    elif b0 == 0xF0:
        lo = 0x90  # overlong
    elif b0 == 0xF4:
        hi = 0x8F  # past U+10FFFF
    if b1 < lo or b1 > hi:
        return np.int64(0), 0
    if n == 2:
        return ((b0 & 0x1F) << 6) | (b1 & 0x3F), 2
    b2 = np.int64(u8[j + 2])
    if b2 < 0x80 or b2 > 0xBF:
        return np.int64(0), 0
    if n == 3:
        return ((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b2 & 0x3F), 3
    b3 = np.int64(u8[j + 3])
    if b3 < 0x80 or b3 > 0xBF:
        return np.int64(0), 0
    return ((b0 & 0x07) << 18) | ((b1 & 0x3F) << 12) | ((b2 & 0x3F) << 6) | (b3 & 0x3F), 4


@numba.njit(inline="never")
def _valid_utf8(u8, s, e):
    """Every byte of ``u8[s:e]`` belongs to a well-formed UTF-8 sequence (:func:`_utf8_units`)."""
    j = s
    while j < e:
        if u8[j] < 0x80:
            j += 1
            continue
        _, n = _utf8_units(u8, j, e)
        if n == 0:
            return False
        j += n
    return True


@numba.njit(inline="never")
def _java_hash_utf8(h, u8, s, e, stop):
    """Java ``String.hashCode`` continued from ``h`` over the UTF-16 code units of the well-formed UTF-8 bytes
    ``u8[s:e]`` (:func:`_valid_utf8`), up to the first byte ``stop`` (-1: none; a byte < 0x80 is never inside a
    sequence), and where it stopped. A code point past U+FFFF is two units (its surrogate pair), as in Java."""
    x = np.uint64(h)
    j = s
    while j < e:
        b = np.int64(u8[j])
        if b < 0x80:
            if b == stop:
                break
            x = x * np.uint64(31) + np.uint64(b)
            j += 1
            continue
        cp, n = _utf8_units(u8, j, e)
        if cp >= 0x10000:
            c = cp - 0x10000
            x = x * np.uint64(31) + np.uint64(0xD800 + (c >> 10))
            x = x * np.uint64(31) + np.uint64(0xDC00 + (c & 0x3FF))
        else:
            x = x * np.uint64(31) + np.uint64(cp)
        j += max(n, 1)
    return np.uint32(x & np.uint64(0xFFFFFFFF)), j


@numba.njit(inline="always")
def _delay_level(u8, s, e):
    """The DELAY value ``u8[s:e]`` as Integer.parseInt reads it when it is a plain one (an optional sign, then 1-10
    ASCII digits, inside int's range); NOT_PLAIN for anything else (no digits, other characters, Unicode digits,
    overflow), which the one-at-a-time rules then parse or reject."""
    j = s
    neg = False
    if j < e and (u8[j] == 0x2D or u8[j] == 0x2B):  # '-', '+'
        neg = u8[j] == 0x2D
        j += 1
    if j >= e or e - j > 10:
        return np.int64(NOT_PLAIN)
    v = np.int64(0)
    while j < e:
        d = np.int64(u8[j]) - 0x30
        if d < 0 or d > 9:
            return np.int64(NOT_PLAIN)
        v = v * 10 + d
        j += 1
    if neg:
        v = -v
    if v < -(1 << 31) or v > (1 << 31) - 1:
        return np.int64(NOT_PLAIN)
    return v


@numba.njit(inline="always")
def _delay_code(code, level, store_ts, delay_ms):
    """tagsCode of a SCHEDULE_TOPIC_XXXX record with DELAY ``level`` (FORMAT.md §5.2): capped at the table's last
    level (``delay_ms[1:]``, levels from 1), the delivery time when > 0, else ``code`` (its TAGS hash)."""
    top = delay_ms.shape[0] - 1
    if level > top:
        level = top
    if level > 0:
        return store_ts + delay_ms[level]
    return code
