"""Vectorised commitlog codec: record boundaries, header columns and validity, without
building a Python object per field.

Layouts come from :mod:`formats.records` (``MESSAGE_PREFIX_FIELDS``); the numpy dtype
below is derived from that declaration. Works on any buffer (bytes, mmap, memoryview):
no files are opened here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from . import lanes as lanes_mod
from .hashing import crc31, crc32, parse_crc_property_digits
from .records import (
    CRC32_RESERVED_LEN,
    MAGIC_BLANK,
    MAGIC_V1,
    MAGIC_V2,
    MESSAGE_PREFIX_FIELDS,
    MIN_MESSAGE_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
)


def _np_type(ctype) -> str:
    return {1: "i1", 2: ">i2", 4: ">i4", 8: ">i8"}[ctype.sizeof()]


PREFIX_DTYPE = np.dtype([(name, _np_type(ctype)) for name, ctype in MESSAGE_PREFIX_FIELDS])
PREFIX_SIZE = PREFIX_DTYPE.itemsize  # 48: born host starts here
PREFIX_STRUCT = struct.Struct(">" + "".join({4: "i", 8: "q"}[c.sizeof()] for _, c in MESSAGE_PREFIX_FIELDS))
_SIZE_MAGIC = struct.Struct(">ii")

# Why a walk stopped (Appendix B / §13.3). "blank" is the normal end of a segment.
STOP_BLANK = "blank"  # BLANK marker: continue in the next segment
STOP_ZERO = "zero"  # zero-filled space: end of data
STOP_EOF = "eof"  # fewer than 8 bytes left
STOP_BAD_MAGIC = "bad_magic"
STOP_BAD_SIZE = "bad_size"  # TOTALSIZE < minimum record size
STOP_TORN = "torn"  # TOTALSIZE runs past the end of the segment
STOP_CHUNK = "chunk"  # max_records reached: more records may follow at ``stop``
STOP_INVALID = "invalid"  # the record at the stop position failed validation (see reason)


@dataclass
class Walk:
    """Record starts found by following TOTALSIZE from a position in one segment."""

    offsets: np.ndarray  # int64 positions (relative to the buffer) of candidate records
    stop: int  # position where the walk stopped
    kind: str  # STOP_*
    size: int  # TOTALSIZE read at the stop position (BLANK length, bad size, ...)
    magic: int


def _walk_seq(buf, pos: int, end: int, magics, max_records: int) -> Walk:
    """The plain walk: one ``struct`` read per record. Reference semantics for :func:`walk`."""
    unpack = _SIZE_MAGIC.unpack_from
    out = []
    append = out.append
    v1, v2 = (tuple(magics) + (None,))[:2]
    min_size = MIN_MESSAGE_SIZE
    size = magic = 0
    kind = STOP_EOF
    while pos + 8 <= end:
        if len(out) >= max_records:
            kind = STOP_CHUNK
            size = magic = 0
            break
        size, magic = unpack(buf, pos)
        if magic == v1 or magic == v2:
            if size < min_size:
                kind = STOP_BAD_SIZE
                break
            if pos + size > end:
                kind = STOP_TORN
                break
            append(pos)
            pos += size
            continue
        if magic == MAGIC_BLANK:
            kind = STOP_BLANK
        elif magic == 0 and size == 0:
            kind = STOP_ZERO
        else:
            kind = STOP_BAD_MAGIC
        break
    else:
        size = magic = 0
        kind = STOP_EOF
    return Walk(np.asarray(out, dtype=np.int64), pos, kind, size, magic)


# The lane walk pays off from ~1 MiB of data; per record it costs ~100 ns whatever the size,
# the plain walk ~250 ns, so records averaging more than LANE_MAX_AVG are walked plainly.
LANE_MIN_BYTES = 1 << 20
LANE_MIN_RECORDS = 4096
LANE_MAX_AVG = 16384
LANE_RECORDS = 24  # records per lane aimed at
MAX_LANES = 8192
_PROBE = 64


def walk(buf, pos: int = 0, end: int | None = None, magics=(MAGIC_V1, MAGIC_V2), max_records: int = 1 << 62) -> Walk:
    """Follow the TOTALSIZE chain from ``pos``; stop at a BLANK, zeros, or anything not a record.

    Only the 8-byte size/magic pair of each record is read. Large ranges are walked with the
    speculative lane walk of :mod:`formats.lanes` (same result as the plain walk, which is
    used for small ranges and buffers without ``find``).
    """
    if end is None:
        end = len(buf)
    if max_records < LANE_MIN_RECORDS or end - pos < LANE_MIN_BYTES or not hasattr(buf, "find"):
        return _walk_seq(buf, pos, end, magics, max_records)
    probe = _walk_seq(buf, pos, end, magics, _PROBE)
    if probe.kind != STOP_CHUNK:
        return probe
    parts = [probe.offsets]
    n = len(probe.offsets)
    p = probe.stop
    avg = max((p - pos) / n, MIN_MESSAGE_SIZE)
    u8 = as_u8(buf)
    magics = tuple(magics)

    def seq_rest(q: int):
        w = _walk_seq(buf, q, end, magics, 1 << 62)
        return w.offsets, w.stop

    while n < max_records and p + 8 <= end:
        want = int((max_records - n) * avg * 1.02) + 4096
        wend = end if want >= end - p else p + want
        lanes = min(MAX_LANES, int((wend - p) // (avg * LANE_RECORDS)))
        if avg > LANE_MAX_AVG or lanes < 16:
            w = _walk_seq(buf, p, end, magics, max_records - n)
            parts.append(w.offsets)
            return Walk(np.concatenate(parts), w.stop, w.kind, w.size, w.magic)
        offs, p, stopped = lanes_mod.lane_walk(buf, u8, p, wend, end, magics, MIN_MESSAGE_SIZE, lanes, seq_rest)
        parts.append(offs)
        n += len(offs)
        if stopped:
            break
    offsets = np.concatenate(parts)
    if len(offsets) >= max_records:
        q = int(offsets[max_records]) if len(offsets) > max_records else p
        if q + 8 <= end:
            return Walk(offsets[:max_records], q, STOP_CHUNK, 0, 0)
    kind, size, magic = _classify(buf, p, end, magics)
    return Walk(offsets, p, kind, size, magic)


def _classify(buf, pos: int, end: int, magics) -> tuple[str, int, int]:
    """Why the plain walk would stop at ``pos`` (which is known not to hold a valid record)."""
    if pos + 8 > end:
        return STOP_EOF, 0, 0
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic in magics:
        return (STOP_BAD_SIZE if size < MIN_MESSAGE_SIZE else STOP_TORN), size, magic
    if magic == MAGIC_BLANK:
        return STOP_BLANK, size, magic
    if magic == 0 and size == 0:
        return STOP_ZERO, size, magic
    return STOP_BAD_MAGIC, size, magic


# Reasons a record fails validation, in the order the broker would notice them.
R_OK = 0
R_BODY_CRC = 1
R_TOPIC_LENGTH = 2  # negative (signed) topic length
R_LENGTHS = 3  # lengths run past TOTALSIZE / the buffer
R_TOTALSIZE = 4  # TOTALSIZE differs from the size computed from the lengths
R_PROP_CRC = 5  # __CRC32# property wrong or missing (only when required)
R_MAGIC_VERSION = 6  # v2 magic where the broker version only knows v1
REASON_TEXT = {
    R_OK: "ok",
    R_BODY_CRC: "body CRC mismatch",
    R_TOPIC_LENGTH: "negative topic length",
    R_LENGTHS: "field lengths run past the record",
    R_TOTALSIZE: "TOTALSIZE differs from the size computed from the field lengths",
    R_PROP_CRC: "__CRC32# property missing or wrong",
    R_MAGIC_VERSION: "magic v2 record in a store read as 4.x",
}


class Headers:
    """Column view of the records at ``offsets`` in ``buf`` (numpy arrays, one entry per record)."""

    __slots__ = (
        "offsets", "totalSize", "magicCode", "bodyCRC", "queueId", "flag", "queueOffset",
        "physicalOffset", "sysFlag", "bornTimestamp", "bornHostStart", "bornHostLen",
        "storeTimestamp", "storeHostStart", "storeHostLen", "reconsumeTimes",
        "preparedTransactionOffset", "bodyStart", "bodyLength", "topicStart", "topicLength",
        "propsStart", "propsLength", "computedSize", "reason",
    )

    def __len__(self) -> int:
        return len(self.offsets)

    def take(self, n: int) -> "Headers":
        h = Headers()
        for name in self.__slots__:
            setattr(h, name, getattr(self, name)[:n])
        return h

    def select(self, mask: np.ndarray) -> "Headers":
        """The records where ``mask`` is true (a boolean array or an index array)."""
        h = Headers()
        for name in self.__slots__:
            setattr(h, name, getattr(self, name)[mask])
        return h


def _gather(u8: np.ndarray, starts: np.ndarray, width: int, dtype: str) -> np.ndarray:
    if len(starts) == 0:
        return np.zeros(0, dtype=dtype).astype(dtype.replace(">", "<"))
    idx = starts[:, None] + np.arange(width, dtype=np.int64)
    np.clip(idx, 0, len(u8) - 1, out=idx)
    return u8[idx].view(dtype).reshape(-1).astype(dtype.replace(">", "<"))


def as_u8(buf) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8)


# The whole fixed header up to BODYLENGTH when both hosts are IPv4 (nearly every record):
# one row gather per record instead of one gather per field (NOTES-performance).
FIXED_V4_DTYPE = np.dtype(PREFIX_DTYPE.descr + [
    ("bornHost", "V8"), ("storeTimestamp", ">i8"), ("storeHost", "V8"), ("reconsumeTimes", ">i4"),
    ("preparedTransactionOffset", ">i8"), ("bodyLength", ">i4"),
])
FIXED_V4_SIZE = FIXED_V4_DTYPE.itemsize  # 88
_HOSTS_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6


def _rows(u8: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray | None:
    """(n, width) bytes at ``starts`` through a strided view, or None if any row leaves ``u8``."""
    if len(starts) and (int(starts.min()) < 0 or int(starts.max()) > len(u8) - width):
        return None
    view = np.lib.stride_tricks.as_strided(u8, shape=(max(len(u8) - width + 1, 0), width), strides=(1, 1),
                                           writeable=False)
    return view[starts]


def _gather_fast(u8: np.ndarray, starts: np.ndarray, width: int, dtype: str) -> np.ndarray:
    rows = _rows(u8, starts, width) if len(starts) else None
    if rows is None:
        return _gather(u8, starts, width, dtype)
    return rows.view(dtype).reshape(-1).astype(dtype.replace(">", "<"))


def decode_headers(buf, offsets: np.ndarray, u8: np.ndarray | None = None) -> Headers:
    """Gather every fixed and length field of the records at ``offsets`` in one pass.

    Structural checks (lengths, TOTALSIZE formula, topic length sign) are filled into
    ``reason``; CRC checks are separate (:func:`check_body_crc`).
    """
    if u8 is None:
        u8 = as_u8(buf)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets)
    rows = _rows(u8, offsets, FIXED_V4_SIZE) if n else None
    if rows is None:
        return decode_headers_reference(buf, offsets, u8)
    fixed = rows.view(FIXED_V4_DTYPE).reshape(-1)
    h = Headers()
    h.offsets = offsets
    for name, _ in MESSAGE_PREFIX_FIELDS:
        setattr(h, name, fixed[name].astype(PREFIX_DTYPE[name].newbyteorder("=")))
    sysflag = h.sysFlag
    v6 = (sysflag & _HOSTS_V6) != 0
    any_v6 = bool(v6.any())
    if any_v6:
        bh = np.where(sysflag & SYSFLAG_BORNHOST_V6, 20, 8).astype(np.int64)
        sh = np.where(sysflag & SYSFLAG_STOREHOST_V6, 20, 8).astype(np.int64)
    else:
        bh = np.full(n, 8, dtype=np.int64)
        sh = np.full(n, 8, dtype=np.int64)
    h.bornHostStart = offsets + PREFIX_SIZE
    h.bornHostLen = bh
    h.storeHostLen = sh
    if any_v6:
        # Fields after a 20-byte host move: gather them where they really are.
        st = h.bornHostStart + bh
        h.storeTimestamp = _gather_fast(u8, st, 8, ">i8")
        h.storeHostStart = st + 8
        rc = h.storeHostStart + sh
        h.reconsumeTimes = _gather_fast(u8, rc, 4, ">i4")
        h.preparedTransactionOffset = _gather_fast(u8, rc + 4, 8, ">i8")
        h.bodyLength = _gather_fast(u8, rc + 12, 4, ">i4").astype(np.int64)
        h.bodyStart = rc + 16
    else:
        h.storeTimestamp = fixed["storeTimestamp"].astype(np.int64)
        h.storeHostStart = offsets + (PREFIX_SIZE + 16)
        h.reconsumeTimes = fixed["reconsumeTimes"].astype(np.int32)
        h.preparedTransactionOffset = fixed["preparedTransactionOffset"].astype(np.int64)
        h.bodyLength = fixed["bodyLength"].astype(np.int64)
        h.bodyStart = offsets + FIXED_V4_SIZE
    body = np.maximum(h.bodyLength, 0)
    tl_pos = h.bodyStart + body
    is_v2 = h.magicCode == MAGIC_V2
    tl = _rows(u8, tl_pos, 2)
    if tl is None:
        tl8 = _gather(u8, tl_pos, 1, "i1").astype(np.int64)
        tl16 = _gather(u8, tl_pos, 2, ">i2").astype(np.int64)
    else:
        tl8 = tl[:, 0].view(np.int8).astype(np.int64)
        tl16 = tl.view(">i2").reshape(-1).astype(np.int64)
    any_v2 = bool(is_v2.any())
    h.topicLength = np.where(is_v2, tl16, tl8) if any_v2 else tl8
    tw = np.where(is_v2, 2, 1) if any_v2 else np.ones(n, dtype=np.int64)
    h.topicStart = tl_pos + tw
    topic = np.maximum(h.topicLength, 0)
    pl_pos = h.topicStart + topic
    h.propsLength = _gather_fast(u8, pl_pos, 2, ">i2").astype(np.int64)
    h.propsStart = pl_pos + 2
    props = np.maximum(h.propsLength, 0)
    h.computedSize = 74 + bh + sh + tw + body + topic + props
    h.reason = _reasons(h, offsets, body, props)
    return h


def _reasons(h: Headers, offsets: np.ndarray, body: np.ndarray, props: np.ndarray) -> np.ndarray:
    rec_end = offsets + h.totalSize.astype(np.int64)
    reason = np.zeros(len(offsets), dtype=np.int8)
    # Checked from the last to the first so the earliest reason the broker would hit wins.
    reason[h.computedSize != h.totalSize] = R_TOTALSIZE
    over = (h.propsStart + props > rec_end) | (h.bodyLength < 0) | (h.bodyStart + body > rec_end)
    reason[over] = R_LENGTHS
    reason[h.topicLength < 0] = R_TOPIC_LENGTH
    return reason


def decode_headers_reference(buf, offsets: np.ndarray, u8: np.ndarray | None = None) -> Headers:
    """Field-by-field gather with clipped indexes: the reference for :func:`decode_headers`, and
    its path for offsets whose fixed header would run past the buffer."""
    if u8 is None:
        u8 = as_u8(buf)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets)
    h = Headers()
    h.offsets = offsets
    if n:
        idx = offsets[:, None] + np.arange(PREFIX_SIZE, dtype=np.int64)
        np.clip(idx, 0, len(u8) - 1, out=idx)
        prefix = np.ascontiguousarray(u8[idx]).view(PREFIX_DTYPE).reshape(-1)
    else:
        prefix = np.zeros(0, dtype=PREFIX_DTYPE)
    for name, _ in MESSAGE_PREFIX_FIELDS:
        setattr(h, name, prefix[name].astype(prefix.dtype[name].newbyteorder("=")))
    sysflag = h.sysFlag
    bh = np.where(sysflag & SYSFLAG_BORNHOST_V6, 20, 8).astype(np.int64)
    sh = np.where(sysflag & SYSFLAG_STOREHOST_V6, 20, 8).astype(np.int64)
    h.bornHostStart = offsets + PREFIX_SIZE
    h.bornHostLen = bh
    st = h.bornHostStart + bh
    h.storeTimestamp = _gather(u8, st, 8, ">i8")
    h.storeHostStart = st + 8
    h.storeHostLen = sh
    rc = h.storeHostStart + sh
    h.reconsumeTimes = _gather(u8, rc, 4, ">i4")
    h.preparedTransactionOffset = _gather(u8, rc + 4, 8, ">i8")
    h.bodyLength = _gather(u8, rc + 12, 4, ">i4").astype(np.int64)
    h.bodyStart = rc + 16
    body = np.maximum(h.bodyLength, 0)
    tl_pos = h.bodyStart + body
    is_v2 = h.magicCode == MAGIC_V2
    tl8 = _gather(u8, tl_pos, 1, "i1").astype(np.int64)
    tl16 = _gather(u8, tl_pos, 2, ">i2").astype(np.int64)
    h.topicLength = np.where(is_v2, tl16, tl8)
    tw = np.where(is_v2, 2, 1)
    h.topicStart = tl_pos + tw
    topic = np.maximum(h.topicLength, 0)
    pl_pos = h.topicStart + topic
    h.propsLength = _gather(u8, pl_pos, 2, ">i2").astype(np.int64)
    h.propsStart = pl_pos + 2
    props = np.maximum(h.propsLength, 0)
    h.computedSize = 74 + bh + sh + tw + body + topic + props
    rec_end = offsets + h.totalSize.astype(np.int64)
    reason = np.zeros(n, dtype=np.int8)
    # Checked from the last to the first so the earliest reason the broker would hit wins.
    reason[h.computedSize != h.totalSize] = R_TOTALSIZE
    over = (h.propsStart + props > rec_end) | (h.bodyLength < 0) | (h.bodyStart + body > rec_end)
    reason[over] = R_LENGTHS
    reason[h.topicLength < 0] = R_TOPIC_LENGTH
    h.reason = reason
    return h


def check_body_crc(buf, h: Headers, mask: np.ndarray | None = None) -> np.ndarray:
    """Boolean array: body CRC matches (records with an empty body always match, as in Java)."""
    mv = memoryview(buf)
    n = len(h)
    ok = np.ones(n, dtype=bool)
    if n == 0:
        return ok
    lens = h.bodyLength
    starts = h.bodyStart
    ends = starts + lens
    todo = lens > 0
    if mask is not None:
        todo &= mask
    outside = todo & (ends > len(mv))
    if outside.any():
        ok[outside] = False
        todo &= ~outside
    if todo.all():
        idx = None
        s, e, expected = starts.tolist(), ends.tolist(), h.bodyCRC
    else:
        idx = np.flatnonzero(todo)
        s, e, expected = starts[idx].tolist(), ends[idx].tolist(), h.bodyCRC[idx]
    if not s:
        return ok
    # One C call per body on a zero-copy slice; ~170 ns per record is the floor in Python.
    crcs = np.array([crc32(mv[a:b]) for a, b in zip(s, e)], dtype=np.int64)
    good = (crcs & 0x7FFFFFFF) == expected
    if idx is None:
        ok[:] = good
    else:
        ok[idx] = good
    return ok


CRC_PROP_PREFIX = b"__CRC32#\x01"


def has_crc_property(u8: np.ndarray, h: Headers) -> np.ndarray:
    """Records whose properties end with the 20-byte ``__CRC32#`` entry (5.2+)."""
    n = len(h)
    if n == 0:
        return np.zeros(0, dtype=bool)
    start = h.propsStart + np.maximum(h.propsLength, 0) - CRC32_RESERVED_LEN
    candidates = (h.propsLength >= CRC32_RESERVED_LEN) & (h.reason == R_OK)
    idx = start[:, None] + np.arange(len(CRC_PROP_PREFIX), dtype=np.int64)
    np.clip(idx, 0, len(u8) - 1, out=idx)
    pattern = np.frombuffer(CRC_PROP_PREFIX, dtype=np.uint8)
    return candidates & np.all(u8[idx] == pattern, axis=1)


def check_property_crc(buf, offset: int, total_size: int) -> bool:
    """Whole-record CRC of §4.2: CRC31 of all but the last 20 bytes equals the stored digits."""
    mv = memoryview(buf)
    tail = bytes(mv[offset + total_size - CRC32_RESERVED_LEN : offset + total_size])
    if not tail.startswith(CRC_PROP_PREFIX) or tail[-1:] != b"\x02":
        return False
    try:
        digits = tail[len(CRC_PROP_PREFIX) : -1].decode("ascii")
    except UnicodeDecodeError:
        return False
    expected = parse_crc_property_digits(digits)
    return expected >= 0 and crc31(mv[offset : offset + total_size - CRC32_RESERVED_LEN]) == expected


def first_invalid(h: Headers, crc_ok: np.ndarray | None = None) -> int:
    """Index of the first record that fails (structure or CRC), or len(h)."""
    bad = h.reason != R_OK
    if crc_ok is not None:
        bad = bad | ~crc_ok
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else len(h)
