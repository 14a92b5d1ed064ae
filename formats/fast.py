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

from .hashing import crc31, parse_crc_property_digits
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


def walk(buf, pos: int = 0, end: int | None = None, magics=(MAGIC_V1, MAGIC_V2), max_records: int = 1 << 62) -> Walk:
    """Follow the TOTALSIZE chain from ``pos``; stop at a BLANK, zeros, or anything not a record.

    Only the 8-byte size/magic pair is read per record (~250 ns); validation of the rest
    is vectorised in :func:`decode_headers`.
    """
    if end is None:
        end = len(buf)
    unpack = _SIZE_MAGIC.unpack_from
    out = []
    append = out.append
    v1, v2 = (magics + (None,))[:2]
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


def _gather(u8: np.ndarray, starts: np.ndarray, width: int, dtype: str) -> np.ndarray:
    if len(starts) == 0:
        return np.zeros(0, dtype=dtype).astype(dtype.replace(">", "<"))
    idx = starts[:, None] + np.arange(width, dtype=np.int64)
    np.clip(idx, 0, len(u8) - 1, out=idx)
    return u8[idx].view(dtype).reshape(-1).astype(dtype.replace(">", "<"))


def as_u8(buf) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8)


def decode_headers(buf, offsets: np.ndarray, u8: np.ndarray | None = None) -> Headers:
    """Gather every fixed and length field of the records at ``offsets`` in one pass.

    Structural checks (lengths, TOTALSIZE formula, topic length sign) are filled into
    ``reason``; CRC checks are separate (:func:`check_body_crc`).
    """
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
    starts = h.bodyStart.tolist()
    lens = h.bodyLength.tolist()
    expected = h.bodyCRC.tolist()
    todo = range(n) if mask is None else np.flatnonzero(mask).tolist()
    limit = len(mv)
    for i in todo:
        b = lens[i]
        if b > 0:
            s = starts[i]
            if s + b > limit or crc31(mv[s : s + b]) != expected[i]:
                ok[i] = False
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
