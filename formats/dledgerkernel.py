"""Compiled DLedger entry walk (numba, nopython): the header checks of DLedger's recovery loop
(``DLedgerMmapFileStore.recover``, FORMAT.md appendix D) one entry per loop step.

The walk reads only the 48-byte entry headers; the RocketMQ message inside each entry is decoded and
validated by the classic kernels (:func:`formats.fast.decode_headers`, :func:`formats.fast.validate`)
at entry pos + 48. Imported lazily by :mod:`formats.fast` users (numba's import is slow); compiled once
and cached like :mod:`formats.kernel`. Layout constants come from :mod:`formats.dledger` (numba
compiles module globals in as constants; ``tests/test_dledger_formats.py`` checks the columns against
a construct parse of every entry).
"""

from __future__ import annotations

import numpy as np

from .dledger import (BLANK_MAGIC, E_BODYLEN, E_INDEX, E_OK, E_POS, E_SIZE, E_TERM, E_TEXT, ENTRY_FIXED_SIZE,  # noqa: F401
                      ENTRY_HEADER_SIZE, ENTRY_MAGIC, ENTRY_OFFSETS)
from .kernel import _content_reason, _decode, _jit

O_MAGIC, O_SIZE, O_INDEX, O_TERM = (ENTRY_OFFSETS[k] for k in ("magic", "size", "index", "term"))
O_POS, O_CHANNEL, O_CHAIN, O_BODYCRC, O_BODYLEN = (ENTRY_OFFSETS[k] for k in
                                                   ("pos", "channel", "chainCrc", "bodyCrc", "bodyLength"))
HEADER = ENTRY_HEADER_SIZE
FIXED = ENTRY_FIXED_SIZE
MAGIC, BLANK = ENTRY_MAGIC, BLANK_MAGIC

# Why the walk stopped (formats.fast's STOP_* names, plus an entry that breaks a header rule).
K_BLANK, K_ZERO, K_EOF, K_BAD_MAGIC, K_BAD_SIZE, K_TORN, K_CHUNK, K_INVALID = range(8)
K_TAKEN = -1  # _take_entry's answer for an entry that passed the rules (the walk goes on)
# Entry columns the walk fills, in order (all int64).
COLUMNS = ("at", "size", "index", "term", "pos", "channel", "chainCrc", "bodyCrc", "bodyLength", "magic")


def _be(u8, i, n):
    v = np.int64(0)
    for k in range(n):
        v = (v << 8) | np.int64(u8[i + k])
    s = 64 - 8 * n
    return (v << s) >> s


def _take_entry(u8, pos, end, file_start, last_index, last_term, cols, n):
    """The header rules for the entry at ``pos``; an entry that passes them has its header fields stored in row ``n``
    of ``cols``. Returns (K_TAKEN or the K_* kind that stops the walk, size, magic, E_* rule, index, term)."""
    if pos + 8 > end:
        return K_EOF, 0, 0, E_OK, 0, 0
    magic = _be(u8, pos + O_MAGIC, 4)
    size = _be(u8, pos + O_SIZE, 4)
    if magic == BLANK:
        return K_BLANK, size, magic, E_OK, 0, 0
    if magic == 0 and size == 0:
        return K_ZERO, size, magic, E_OK, 0, 0
    if magic != MAGIC:
        return K_BAD_MAGIC, size, magic, E_OK, 0, 0
    if pos + HEADER > end:
        return K_EOF, size, magic, E_OK, 0, 0
    index = _be(u8, pos + O_INDEX, 8)
    term = _be(u8, pos + O_TERM, 8)
    at = _be(u8, pos + O_POS, 8)
    body_len = _be(u8, pos + O_BODYLEN, 4)
    rule = E_OK
    if at != file_start + pos:
        rule = E_POS
    elif body_len + HEADER != size:
        rule = E_BODYLEN
    elif size <= FIXED:
        rule = E_SIZE
    elif last_index != -1 and index != last_index + 1:
        rule = E_INDEX
    elif term < last_term:
        rule = E_TERM
    if rule != E_OK:
        return K_INVALID, size, magic, rule, index, term
    if pos + size > end:
        return K_TORN, size, magic, E_OK, index, term
    c_at, c_size, c_index, c_term, c_pos, c_channel, c_chain, c_bodycrc, c_bodylen, c_magic = cols
    c_at[n] = pos
    c_size[n] = size
    c_index[n] = index
    c_term[n] = term
    c_pos[n] = at
    c_channel[n] = _be(u8, pos + O_CHANNEL, 4)
    c_chain[n] = _be(u8, pos + O_CHAIN, 4)
    c_bodycrc[n] = _be(u8, pos + O_BODYCRC, 4)
    c_bodylen[n] = body_len
    c_magic[n] = magic
    return K_TAKEN, size, magic, E_OK, index, term


def _walk_entries(u8, pos, end, file_start, last_index, last_term, max_entries, cols):
    """Entries from ``pos`` (relative to the file) to ``end``: their header fields into ``cols``
    (COLUMNS order, capacity >= ``max_entries``). ``last_index``/``last_term`` are the entry before
    (-1: none). Returns (count, stop position, K_* kind, size and magic at the stop, E_* rule)."""
    n = 0
    while True:
        if n >= max_entries:
            return n, pos, K_CHUNK, 0, 0, E_OK
        kind, size, magic, rule, last_index, last_term = _take_entry(u8, pos, end, file_start, last_index, last_term,
                                                                     cols, n)
        if kind != K_TAKEN:
            return n, pos, kind, size, magic, rule
        n += 1
        pos += size


def _walk_messages(u8, pos, end, file_start, last_index, last_term, max_entries, cols, check_crc, prop_mode, c32, c64,
                   reason):
    """:func:`_walk_entries` that also decodes and validates the message inside each entry it accepts (at the entry's
    pos + 48), as ``formats.kernel._decode_at`` then ``_validate`` do, into ``c32``/``c64``/``reason`` (row per entry):
    one pass over the log instead of a header walk followed by two passes over the messages, so the message's
    header lines are read while the entry's are in the cache. Returns what :func:`_walk_entries` returns."""
    t0, t1, t2, t3, t4, t5, t6 = c32
    o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15, o16 = c64
    n = 0
    while True:
        if n >= max_entries:
            return n, pos, K_CHUNK, 0, 0, E_OK
        kind, size, magic, rule, last_index, last_term = _take_entry(u8, pos, end, file_start, last_index, last_term,
                                                                     cols, n)
        if kind != K_TAKEN:
            return n, pos, kind, size, magic, rule
        v32, v64, r = _decode(u8, pos + HEADER)
        r = _content_reason(u8, r, check_crc, prop_mode, v32, v64)
        t0[n], t1[n], t2[n], t3[n], t4[n], t5[n], t6[n] = v32
        (o0[n], o1[n], o2[n], o3[n], o4[n], o5[n], o6[n], o7[n], o8[n], o9[n], o10[n], o11[n], o12[n], o13[n],
         o14[n], o15[n], o16[n]) = v64
        reason[n] = r
        n += 1
        pos += size


# none makes an array: compiled without reference counting (kernel._jit)
_be = _jit(_be, refcounts=False)
_take_entry = _jit(_take_entry, refcounts=False)
walk_entries = _jit(_walk_entries, refcounts=False)
walk_messages = _jit(_walk_messages, refcounts=False)
