"""Compiled JSON Lines writer for commitlog records (numba, nopython): ``dump commitlog --json``.

One loop step per record writes the record's whole line into a preallocated byte buffer, from the
header columns the walk kernels already produce (:class:`formats.fast.Headers`) and the record
bytes. The text is exactly what ``json_line(render_body(decode_message(...), body))`` (with the
``offset`` field) gives: Python's ``json.dumps(ensure_ascii=False, separators=(",", ":"))``
escaping (``\\"``, ``\\\\``, ``\\n``, ``\\r``, ``\\t``, ``\\b``, ``\\f``, other controls as lowercase
``\\u00xx``; DEL and non-ASCII kept), strings decoded like :func:`formats.message.decode_utf8`
(``errors="replace"``: one U+FFFD per maximal invalid subpart, CPython's rule), the
``properties`` object as :func:`formats.properties.parse_properties` builds it (an entry is
split at its first ``\\x01``; a repeated key keeps its first place and takes the last value).

The property string of almost every record (printable ASCII but ``"`` and ``\\``, one ``\x01`` per
entry, distinct keys) takes a one-pass path writing the object and the raw string together
(:func:`_props_fast`); any other string the general one. The helpers (here and in
:mod:`formats.jsontext`) are inlined into the kernel (a call per field cost more than writing the field).

A record the kernel does not render itself is flagged and rendered by the reference decoder
(:func:`formats.jsonl.reference_line`): a property string with malformed UTF-8 and more than one
entry (two different malformed keys can decode to the same text) or with more than
:data:`MAX_ENTRIES` entries. ``tests/test_jsonkernel.py`` compares the two on every record of the
broker-written stores and on fuzzed records.

Imported lazily (numba's import is slow) by :mod:`formats.jsonl`; compiled once and cached.
"""

from __future__ import annotations

import numpy as np

import numba

from .jsontext import _HEXL, _HEXU, _esc, _hex, _host, _int, _lit
from .wordops import _json_special32, _low_bit_index, _same_bytes
from .wordstore import _copy_words
from .kernel import _jit

MAGIC_V2 = -626843477  # formats.records.MAGIC_V2 (a literal: numba freezes globals)
MAX_ENTRIES = 512  # property entries per record rendered here (duplicate keys are found in O(k^2))
BODY_NONE, BODY_HEX, BODY_BASE64, BODY_TEXT = 0, 1, 2, 3
FIXED_BOUND = 1024  # bytes of a line besides its strings and body (worst case ~810: IPv6 hosts, 20-digit numbers)

_B64 = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8).copy()


# literal texts (module arrays: numba freezes them into the compiled code)
_L3 = np.frombuffer(b'{"topic":"', np.uint8).copy()
_L4 = np.frombuffer(b'","queueId":', np.uint8).copy()
_L5 = np.frombuffer(b',"flag":', np.uint8).copy()
_L6 = np.frombuffer(b',"queueOffset":', np.uint8).copy()
_L7 = np.frombuffer(b',"commitLogOffset":', np.uint8).copy()
_L8 = np.frombuffer(b',"storeSize":', np.uint8).copy()
_L9 = np.frombuffer(b',"bodyCRC":', np.uint8).copy()
_L10 = np.frombuffer(b',"sysFlag":', np.uint8).copy()
_L11 = np.frombuffer(b',"bornTimestamp":', np.uint8).copy()
_L12 = np.frombuffer(b',"bornHost":', np.uint8).copy()
_L13 = np.frombuffer(b',"storeTimestamp":', np.uint8).copy()
_L14 = np.frombuffer(b',"storeHost":', np.uint8).copy()
_L15 = np.frombuffer(b',"reconsumeTimes":', np.uint8).copy()
_L16 = np.frombuffer(b',"preparedTransactionOffset":', np.uint8).copy()
_L17 = np.frombuffer(b',"bodyLen":', np.uint8).copy()
_L18 = np.frombuffer(b',"properties":', np.uint8).copy()
_L19 = np.frombuffer(b',"propertiesRaw":"', np.uint8).copy()
_L20 = np.frombuffer(b'","msgId":"', np.uint8).copy()
_L21 = np.frombuffer(b'","magicVersion":', np.uint8).copy()
_L22 = np.frombuffer(b',"offset":', np.uint8).copy()
_L23 = np.frombuffer(b',"bodyHex":"', np.uint8).copy()
_L24 = np.frombuffer(b',"bodyBase64":"', np.uint8).copy()
_L25 = np.frombuffer(b',"bodyText":"', np.uint8).copy()
_U0001 = np.frombuffer(b"\\u0001", np.uint8).copy()
_U0002 = np.frombuffer(b"\\u0002", np.uint8).copy()
_PLAIN = np.array([0x20 <= c < 0x80 and c not in (0x22, 0x5C) for c in range(256)], np.bool_)


def _props(u8, s, e, out, p, hexl, ent):
    """The ``properties`` object; returns (end, ok). ok False: the record takes the reference path
    (written bytes are discarded by the caller)."""
    # entries: key start, key end, value start, value end, value owner (-1: skipped duplicate)
    k = 0
    a = s
    while a < e:
        b = a
        while b < e and u8[b] != 2:
            b += 1
        sep = a
        while sep < b and u8[sep] != 1:
            sep += 1
        if a < sep and sep < b - 1:
            if k == ent.shape[0]:
                return p, False
            ent[k, 0] = a
            ent[k, 1] = sep
            ent[k, 2] = sep + 1
            ent[k, 3] = b
            ent[k, 4] = k
            for j in range(k):
                if ent[j, 4] == j and ent[j, 1] - ent[j, 0] == sep - a and _same_bytes(u8, ent[j, 0], u8, a, sep - a):
                    ent[j, 2] = sep + 1  # the later value wins, the first place stays
                    ent[j, 3] = b
                    ent[k, 4] = -1
                    break
            k += 1
        a = b + 1
    out[p] = 0x7B
    p += 1
    first = True
    bad = False
    for j in range(k):
        if ent[j, 4] < 0:
            continue
        if not first:
            out[p] = 0x2C
            p += 1
        first = False
        out[p] = 0x22
        p, b1 = _esc(u8, ent[j, 0], ent[j, 1], out, p + 1, hexl)
        out[p] = 0x22
        out[p + 1] = 0x3A
        out[p + 2] = 0x22
        p, b2 = _esc(u8, ent[j, 2], ent[j, 3], out, p + 3, hexl)
        out[p] = 0x22
        p += 1
        bad = bad or b1 or b2
    out[p] = 0x7D
    # malformed UTF-8 in a key: two different byte strings may decode to one key
    return p + 1, not (bad and k > 1)


def _entry_fast(u8, ent, k, a, sep, b):
    """Entry ``u8[a:b]`` (its ``\x01`` at ``sep``, -1: none seen) as the ``k``-th of :func:`_props_fast`: the
    entries so far plus this one, or -1 when it is not the common case (no separator, an empty key or value, a
    repeated key, too many entries)."""
    if sep <= a or sep >= b - 1 or k == ent.shape[0]:
        return -1
    for j in range(k):
        if ent[j, 1] - ent[j, 0] == sep - a and _same_bytes(u8, ent[j, 0], u8, a, sep - a):
            return -1
    ent[k, 0] = a
    ent[k, 1] = sep
    ent[k, 3] = b
    return k + 1


def _props_fast(u8, s, e, out, p, ent, plain):
    """The ``properties`` object and, after the ``propertiesRaw`` key, the raw string, in one pass,
    when every byte is plain (printable ASCII but ``"`` and ``\\``) besides the separators, every entry
    has one ``\x01``, a key and a value, and no key repeats: the common case. Returns the end of the
    raw string's text, or -1 (nothing usable written: the general path renders the record).
    The bytes are tested 32 at a time (:func:`_json_special32`); only the few that are not plain are looked at."""
    n = u8.shape[0]
    k = 0
    a = s  # the current entry's start
    sep = -1  # its \x01
    i = s
    while i < e:
        if i + 32 <= n:
            m = _json_special32(u8, i)
        else:  # the buffer's last bytes
            m = np.uint64(0)
            for t in range(min(32, e - i)):
                if not plain[u8[i + t]]:
                    m |= np.uint64(1) << np.uint64(t)
        if e - i < 32:
            m &= (np.uint64(1) << np.uint64(e - i)) - np.uint64(1)
        while m:
            j = i + _low_bit_index(m)
            m &= m - np.uint64(1)
            c = u8[j]
            if c == 1 and sep < 0:
                sep = j
            elif c == 2:
                k = _entry_fast(u8, ent, k, a, sep, j)
                if k < 0:
                    return -1
                a = j + 1
                sep = -1
            else:
                return -1
        i += 32
    if a < e:
        k = _entry_fast(u8, ent, k, a, sep, e)
        if k < 0:
            return -1
    objlen = 2 + (k - 1 if k > 1 else 0)
    for j in range(k):
        objlen += ent[j, 3] - ent[j, 0] + 4  # "key":"value"
    q = p + objlen + _L19.shape[0]  # the raw string's text
    out[p] = 0x7B
    p += 1
    for j in range(k):
        if j:
            out[p] = 0x2C
            p += 1
        out[p] = 0x22
        p += 1
        a = ent[j, 0]
        sep = ent[j, 1]
        b = ent[j, 3]
        _copy_words(out, p, u8, a, sep - a)
        _copy_words(out, q, u8, a, sep - a)
        p += sep - a
        q += sep - a
        out[p] = 0x22
        out[p + 1] = 0x3A
        out[p + 2] = 0x22
        p += 3
        q = _lit(out, q, _U0001)
        _copy_words(out, p, u8, sep + 1, b - sep - 1)
        _copy_words(out, q, u8, sep + 1, b - sep - 1)
        p += b - sep - 1
        q += b - sep - 1
        out[p] = 0x22
        p += 1
        if b < e:
            q = _lit(out, q, _U0002)
    out[p] = 0x7D
    p += 1
    _lit(out, p, _L19)
    return q


def _write_lines(u8, base, body_mode, offsets, total, magic, body_crc, queue_id, flag, queue_offset, phy, sysflag,
                 born_ts, bh_start, bh_len, store_ts, sh_start, sh_len, reconsume, prepared, body_start, body_len,
                 topic_start, topic_len, props_start, props_len, out, ends, fallback, ent):
    """Line i of the block into ``out``; ``ends[i]`` = end of line i; ``fallback[i]`` = line left out
    (reference path). Returns the bytes written. ``ent``: (MAX_ENTRIES, 5) int64 scratch for a record's
    property entries, made by the caller (an array made in a kernel makes loading it from the cache
    import numba's array module, ~30 ms of a command's start)."""
    hexl = _HEXL
    hexu = _HEXU
    b64 = _B64
    plain = _PLAIN
    p = 0
    for i in range(offsets.shape[0]):
        start = p
        p = _lit(out, p, _L3)
        p, _ = _esc(u8, topic_start[i], topic_start[i] + topic_len[i], out, p, hexl)
        p = _lit(out, p, _L4)
        p = _int(out, p, np.int64(queue_id[i]))
        p = _lit(out, p, _L5)
        p = _int(out, p, np.int64(flag[i]))
        p = _lit(out, p, _L6)
        p = _int(out, p, np.int64(queue_offset[i]))
        p = _lit(out, p, _L7)
        p = _int(out, p, np.int64(phy[i]))
        p = _lit(out, p, _L8)
        p = _int(out, p, np.int64(total[i]))
        p = _lit(out, p, _L9)
        p = _int(out, p, np.int64(body_crc[i]))
        p = _lit(out, p, _L10)
        p = _int(out, p, np.int64(sysflag[i]))
        p = _lit(out, p, _L11)
        p = _int(out, p, np.int64(born_ts[i]))
        p = _lit(out, p, _L12)
        p = _host(u8, bh_start[i], bh_len[i], out, p, hexl)
        p = _lit(out, p, _L13)
        p = _int(out, p, np.int64(store_ts[i]))
        p = _lit(out, p, _L14)
        p = _host(u8, sh_start[i], sh_len[i], out, p, hexl)
        p = _lit(out, p, _L15)
        p = _int(out, p, np.int64(reconsume[i]))
        p = _lit(out, p, _L16)
        p = _int(out, p, np.int64(prepared[i]))
        p = _lit(out, p, _L17)
        p = _int(out, p, np.int64(body_len[i]))
        p = _lit(out, p, _L18)
        ps = props_start[i]
        pe = ps + props_len[i]
        q = _props_fast(u8, ps, pe, out, p, ent, plain)
        if q >= 0:
            p = q
        else:
            p, ok = _props(u8, ps, pe, out, p, hexl, ent)
            if not ok:
                fallback[i] = True
                p = start
                ends[i] = p
                continue
            p = _lit(out, p, _L19)
            p, _ = _esc(u8, ps, pe, out, p, hexl)
        p = _lit(out, p, _L20)
        p = _hex(u8, sh_start[i], sh_len[i], out, p, hexu)
        v = np.uint64(phy[i])
        for k in range(15, -1, -1):
            out[p + k] = hexu[np.int64(v & np.uint64(15))]
            v >>= np.uint64(4)
        p += 16
        p = _lit(out, p, _L21)
        out[p] = 50 if magic[i] == MAGIC_V2 else 49
        p += 1
        p = _lit(out, p, _L22)
        p = _int(out, p, base + offsets[i])
        bs = body_start[i]
        bl = body_len[i]
        if body_mode == BODY_HEX:
            p = _lit(out, p, _L23)
            p = _hex(u8, bs, bl, out, p, hexl)
            out[p] = 0x22
            p += 1
        elif body_mode == BODY_BASE64:
            p = _lit(out, p, _L24)
            k = 0
            while k + 3 <= bl:
                x = (np.int64(u8[bs + k]) << 16) | (np.int64(u8[bs + k + 1]) << 8) | np.int64(u8[bs + k + 2])
                out[p] = b64[(x >> 18) & 63]
                out[p + 1] = b64[(x >> 12) & 63]
                out[p + 2] = b64[(x >> 6) & 63]
                out[p + 3] = b64[x & 63]
                p += 4
                k += 3
            r = bl - k
            if r:
                x = np.int64(u8[bs + k]) << 16
                if r == 2:
                    x |= np.int64(u8[bs + k + 1]) << 8
                out[p] = b64[(x >> 18) & 63]
                out[p + 1] = b64[(x >> 12) & 63]
                out[p + 2] = b64[(x >> 6) & 63] if r == 2 else 61
                out[p + 3] = 61
                p += 4
            out[p] = 0x22
            p += 1
        elif body_mode == BODY_TEXT:
            p = _lit(out, p, _L25)
            p, _ = _esc(u8, bs, bs + bl, out, p, hexl)
            out[p] = 0x22
            p += 1
        out[p] = 0x7D
        out[p + 1] = 10
        p += 2
        ends[i] = p
    return p


# helpers are inlined into the kernels (a call per field cost more than the field's text)
_inline = numba.njit(inline="always")
_props = _jit(_props, refcounts=False)  # makes no array: no reference counting (kernel._jit)
_entry_fast = _inline(_entry_fast)
_props_fast = _inline(_props_fast)
write_lines = _jit(_write_lines, refcounts=False)


def record_capacity(h, body_mode: int) -> np.ndarray:
    """An upper bound of the bytes :func:`write_lines` writes for each record of ``h`` (the kernel
    does not check its buffer's end): field names, numbers, two IPv6 hosts and the msgId need at
    most ~810 bytes (FIXED_BOUND), a string byte at most 6 (``\\u00xx``), properties twice (object
    and raw), the body as its mode renders it. tests/test_jsonkernel.py checks the worst case."""
    cap = FIXED_BOUND + 6 * (h.topicLength.astype(np.int64) + 2 * h.propsLength.astype(np.int64))
    body = h.bodyLength.astype(np.int64)
    if body_mode == BODY_HEX:
        cap += 2 * body
    elif body_mode == BODY_BASE64:
        cap += 2 * body + 4
    elif body_mode == BODY_TEXT:
        cap += 6 * body
    return cap


def capacity(h, body_mode: int) -> int:
    """:func:`record_capacity` of the whole block (its output buffer's size)."""
    return int(record_capacity(h, body_mode).sum()) + 64
