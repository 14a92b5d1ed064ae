"""Compiled encoding of replayed messages into commitlog records (numba, nopython), FORMAT.md §2.1: the batch
route of ``append --from`` writes the columns :mod:`formats.replaykernel` parsed, many records per call.

:func:`encode_records` writes each record's fields big-endian, its body and property string from the side
buffer the parser decoded them into, and the body CRC (CRC32 & 0x7FFFFFFF, 0 for an empty body);
:func:`layout` places records one put each, a BLANK where a segment cannot take the next one (§2.4).
``tests/test_append_batch.py`` checks both against the plain route (``encode_message`` + ``Appender.put``).
"""

from __future__ import annotations

import numpy as np

from .jsonscan import _HEX, _inline
from .kernel import _crc, _jit_no_refcounts
from .wordstore import _copy
from .replaykernel import (I_BODY, I_BODYLEN, I_BORN_HEX, I_BORN_HEXLEN, I_BORN_PORT, I_BORN_TS, I_FLAG, I_PREPARED,
                           I_QUEUE, I_RAW, I_RAWLEN, I_RECONSUME, I_STORE_HEX, I_STORE_HEXLEN, I_STORE_PORT, I_STORE_TS,
                           I_SYSFLAG, I_TOPIC, I_TOPICLEN, MAGIC_V2)


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


@_jit_no_refcounts
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
        _copy(out, q, side, s, blen)
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
        _copy(out, q + 2, side, s, rn)


@_jit_no_refcounts
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
