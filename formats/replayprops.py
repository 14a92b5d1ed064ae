"""The ``properties`` object of a ``dump commitlog --json`` line compared with its ``propertiesRaw`` string
(numba, nopython), the check :mod:`formats.replaykernel` makes before it takes a line: the plain route's
``parse_properties(raw) == properties``, told without a name repeated on either side. A separate file from the
parser only to keep each under 500 lines (numba caches a kernel by its own file: after editing this one, clear
``formats/__pycache__/replaykernel*``).
"""

from __future__ import annotations

import numpy as np

from .jsonscan import _inline, _string_end, _unescape, _ws
from .kernel import _jit_no_refcounts
from .wordops import _bytes_equal_mask, _low_byte_index, _same_bytes, _word


_ONES, _TWOS = 0x0101010101010101, 0x0202020202020202  # the property separators, in every byte


@_inline
def _next_byte(raw, i, end, rep, byte):
    """Index of the first ``byte`` in ``raw[i:end]`` (``rep``: it in every byte of a word), ``end`` if none; eight
    bytes a step."""
    while i + 8 <= end:
        m = _bytes_equal_mask(_word(raw, i), np.uint64(rep))
        if m:
            return i + _low_byte_index(m)
        i += 8
    while i < end and raw[i] != byte:
        i += 1
    return i


@_inline
def _plain_copy(u8, q, e, raw, s, n):
    """``u8[q:q + n]`` equals ``raw[s:s + n]`` and each of those bytes stands for itself in a JSON string (no
    quote, backslash or control character): returns q + n, else -1."""
    if q + n > e:
        return -1
    for k in range(n):
        c = raw[s + k]
        if u8[q + k] != c or c < 32 or c == 34 or c == 92:
            return -1
    return q + n


@_inline
def _props_in_order(u8, p, e, raw, ents, m):
    """The usual case, told in one pass: the ``properties`` object at ``p`` is ``{"k":"v",...}`` with the ``m``
    entries of the raw string (``ents``: no name twice) in their order, without spaces or escapes. Returns its
    end, or -1 (then the general comparison decides)."""
    if p >= e or u8[p] != 123:
        return -1
    q = p + 1
    for k in range(m):
        if k:
            if q >= e or u8[q] != 44:
                return -1
            q += 1
        if q >= e or u8[q] != 34:
            return -1
        q = _plain_copy(u8, q + 1, e, raw, ents[k, 0], ents[k, 1])
        if q < 0 or q + 3 > e or u8[q] != 34 or u8[q + 1] != 58 or u8[q + 2] != 34:
            return -1
        q = _plain_copy(u8, q + 3, e, raw, ents[k, 2], ents[k, 3])
        if q < 0 or q >= e or u8[q] != 34:
            return -1
        q += 1
    if q >= e or u8[q] != 125:
        return -1
    return q + 1


@_jit_no_refcounts
def _props_match(u8, p, e, raw, rn, tmp, ents):
    """The ``properties`` object at ``p`` equals ``parse_properties`` of the decoded raw string ``raw[:rn]``
    (the plain route's check), told without duplicate names on either side. Returns its end or -1."""
    m = 0
    start = 0
    while start < rn:  # MessageDecoder.string2messageProperties
        end = _next_byte(raw, start, rn, _TWOS, 2)
        if end - start >= 3:
            sep = _next_byte(raw, start, end, _ONES, 1)
            if start < sep < end - 1:
                if m == len(ents):
                    return -1
                ents[m, 0], ents[m, 1], ents[m, 2], ents[m, 3] = start, sep - start, sep + 1, end - sep - 1
                for k in range(m):
                    if ents[k, 1] == ents[m, 1] and _same_bytes(raw, ents[k, 0], raw, start, ents[m, 1]):
                        return -1
                m += 1
        start = end + 1
    if m:
        q = _props_in_order(u8, p, e, raw, ents, m)
        if q >= 0:
            return q
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
            if ents[k, 1] == kn and _same_bytes(raw, ents[k, 0], tmp, 0, kn):
                found = k
                break
        if found < 0 or ents[found, 4] or ents[found, 3] != vn or not _same_bytes(raw, ents[found, 2], tmp, kn, vn):
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
