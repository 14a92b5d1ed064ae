"""Commitlog codec for the hot paths: record boundaries, header columns and validity as numpy
columns, without building a Python object per field.

The per-record work (walk, header gather, body and property CRC) runs in the compiled kernels
of :mod:`formats.kernel`, imported on first use; this module is their Python face (buffers in,
:class:`Headers` columns and stop reasons out). Layouts come from :mod:`formats.records`
(``MESSAGE_PREFIX_FIELDS``); :func:`decode_headers_reference` is a numpy gather derived from that
declaration, kept as the tests' independent reference. Works on any buffer (bytes, mmap,
memoryview): no files are opened here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .records import (struct_format, 
    MAGIC_V1,
    MAGIC_V2,
    MESSAGE_PREFIX_FIELDS,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
)


def _np_type(ctype) -> str:
    return {1: "i1", 2: ">i2", 4: ">i4", 8: ">i8"}[ctype.sizeof()]


PREFIX_DTYPE = np.dtype([(name, _np_type(ctype)) for name, ctype in MESSAGE_PREFIX_FIELDS])
PREFIX_SIZE = PREFIX_DTYPE.itemsize  # 48: born host starts here
PREFIX_STRUCT = struct.Struct(struct_format(MESSAGE_PREFIX_FIELDS))

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


_KERNEL = None


def _kernel():
    """The compiled kernels (:mod:`formats.kernel`), imported on first use: numba's import (~0.4 s)
    is too slow for commands that never walk records."""
    global _KERNEL
    if _KERNEL is None:
        from .aot import kernels

        _KERNEL = kernels("kernel")
    return _KERNEL


# Kernel stop codes, in formats.kernel's K_* order.
_KINDS = (STOP_BLANK, STOP_ZERO, STOP_EOF, STOP_BAD_MAGIC, STOP_BAD_SIZE, STOP_TORN, STOP_CHUNK, STOP_INVALID)
WALK_PIECE = 1 << 18  # offsets gathered per kernel call: bounded temporaries, few calls


def kernel_view(buf) -> np.ndarray:
    """Read-only uint8 view of any buffer: one kernel specialisation for mmaps, bytes and bytearrays."""
    u8 = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if u8.flags.writeable:
        u8 = u8.view()
        u8.flags.writeable = False
    return u8


def _magic_pair(magics) -> tuple[int, int]:
    magics = tuple(magics)
    return int(magics[0]), int(magics[1] if len(magics) > 1 else magics[0])


def walk(buf, pos: int = 0, end: int | None = None, magics=(MAGIC_V1, MAGIC_V2), max_records: int = 1 << 62) -> Walk:
    """Follow the TOTALSIZE chain from ``pos``; stop at a BLANK, zeros, or anything not a record.

    Only the 8-byte size/magic pair of each record is read (compiled kernel,
    :func:`formats.kernel.walk_offsets`).
    """
    if end is None:
        end = len(buf)
    k = _kernel()
    u8 = kernel_view(buf)
    v1, v2 = _magic_pair(magics)
    parts = []
    n = 0
    while True:
        want = min(max_records - n, WALK_PIECE)
        out = np.empty(max(want, 0), dtype=np.int64)
        got, pos, kind, size, magic = k.walk_offsets(u8, int(pos), int(end), v1, v2, want, out)
        parts.append(out[:got])
        n += got
        if kind != k.K_CHUNK or n >= max_records:
            break
    offsets = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return Walk(offsets, int(pos), _KINDS[kind], int(size), int(magic))


@dataclass
class Neighbours:
    """The record starts on either side of a position in one segment (see :func:`neighbours`)."""

    before: int | None  # last record start <= the position
    after: int | None  # first record start > the position
    walk: Walk | None  # the walk's last piece, when it ended before passing the position (stop, kind)


def neighbours(buf, target: int, end: int | None = None, magics=(MAGIC_V1, MAGIC_V2),
               piece: int | None = None) -> Neighbours:
    """The record starts around ``target``, following the TOTALSIZE chain from 0 in pieces of
    ``piece`` records and stopping at the first start past ``target``: a broker's 1 GiB segment of
    small messages holds millions of records, so their offsets are never gathered all at once."""
    piece = piece or WALK_PIECE
    pos, before = 0, None
    while True:
        w = walk(buf, pos, end, magics, max_records=piece)
        offs = w.offsets
        k = int(np.searchsorted(offs, target, side="right"))
        if k:
            before = int(offs[k - 1])
        if k < len(offs):
            return Neighbours(before, int(offs[k]), None)
        if w.kind != STOP_CHUNK or not len(offs):
            return Neighbours(before, None, w)
        pos = w.stop


# Reasons a record fails validation, in the order the broker would notice them.
R_OK = 0
R_BODY_CRC = 1
R_TOPIC_LENGTH = 2  # negative (signed) topic length
R_LENGTHS = 3  # lengths run past TOTALSIZE / the buffer
R_TOTALSIZE = 4  # TOTALSIZE differs from the size computed from the lengths
R_PROP_CRC = 5  # __CRC32# property wrong or missing (only when required)
R_MAGIC_VERSION = 6  # v2 magic where the broker version only knows v1
R_NOT_A_MESSAGE = 7  # a DLedger entry whose body does not start with a message (magic, size)
R_ENTRY_SIZE = 8  # a DLedger entry whose body length is not its message's TOTALSIZE
REASON_TEXT = {
    R_OK: "ok",
    R_BODY_CRC: "body CRC mismatch",
    R_TOPIC_LENGTH: "negative topic length",
    R_LENGTHS: "field lengths run past the record",
    R_TOTALSIZE: "TOTALSIZE differs from the size computed from the field lengths",
    R_PROP_CRC: "__CRC32# property missing or wrong",
    R_MAGIC_VERSION: "magic v2 record in a store read as 4.x",
    R_NOT_A_MESSAGE: "the DLedger entry's body is not a message",
    R_ENTRY_SIZE: "the DLedger entry's body length differs from its message's TOTALSIZE",
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
        if n == len(self.offsets):  # a full chunk (the common case): the same views
            return self
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


def new_headers(n: int):
    """Empty Headers with room for ``n`` records, and the column tuples the kernels fill."""
    k = _kernel()
    h = Headers()
    c32 = tuple(np.empty(n, dtype=np.int32) for _ in k.I32_COLUMNS)
    c64 = tuple(np.empty(n, dtype=np.int64) for _ in k.I64_COLUMNS)
    for name, col in zip(k.I32_COLUMNS, c32):
        setattr(h, name, col)
    for name, col in zip(k.I64_COLUMNS, c64):
        setattr(h, name, col)
    h.reason = np.zeros(n, dtype=np.int8)
    return h, c32, c64


def _columns(h: Headers):
    k = _kernel()
    return (tuple(getattr(h, name) for name in k.I32_COLUMNS), tuple(getattr(h, name) for name in k.I64_COLUMNS))


def decode_headers(buf, offsets: np.ndarray, u8: np.ndarray | None = None) -> Headers:
    """Gather every fixed and length field of the records at ``offsets`` (compiled kernel).

    Structural checks (lengths, TOTALSIZE formula, topic length sign) are filled into
    ``reason``; CRC checks are separate (:func:`check_body_crc`). Bytes past the buffer read as
    its last byte (as :func:`decode_headers_reference` does), so any offset is safe.
    """
    u8 = kernel_view(buf if u8 is None else u8)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    h, c32, c64 = new_headers(len(offsets))
    if len(offsets):
        _kernel().decode_at(u8, offsets, c32, c64, h.reason)
    return h


# Property-CRC policies of :func:`scan_records` / :func:`validate` (formats.kernel PROP_*).
PROP_NONE, PROP_IF_PRESENT, PROP_REQUIRED = 0, 1, 2


@dataclass
class ScanStep:
    """What :func:`scan_records` found: the valid records and why it stopped."""

    headers: Headers  # valid records only
    stop: int  # position of the first byte not taken (the failing record for STOP_INVALID)
    kind: str  # STOP_*, incl. STOP_INVALID and STOP_CHUNK
    size: int  # TOTALSIZE at the stop
    magic: int
    reason: int  # R_* of the failing record for STOP_INVALID, else R_OK


def scan_records(buf, pos: int, end: int, magics=(MAGIC_V1, MAGIC_V2), max_records: int = 8192,
                 check_crc: bool = True, prop_crc: int = PROP_NONE, u8: np.ndarray | None = None) -> ScanStep:
    """Walk, decode and validate up to ``max_records`` records from ``pos`` in one compiled pass
    (the broker's recovery loop, §13.3): stops at a BLANK, zeros, anything not a record, or the
    first record that fails a structural check, its body CRC (``check_crc``) or its property CRC
    (``prop_crc``, see :func:`validate`)."""
    k = _kernel()
    u8 = kernel_view(buf if u8 is None else u8)
    v1, v2 = _magic_pair(magics)
    h, c32, c64 = new_headers(max(int(max_records), 0))
    n, stop, kind, size, magic, reason = k.scan_records(u8, int(pos), int(end), v1, v2, int(max_records),
                                                        bool(check_crc), int(prop_crc), c32, c64, h.reason)
    return ScanStep(h.take(n), int(stop), _KINDS[kind], int(size), int(magic), int(reason))


def validate(buf, h: Headers, check_crc: bool, prop_crc: int, u8: np.ndarray | None = None) -> None:
    """CommitLog.validate's content checks on decoded records, into ``h.reason``: a body CRC
    mismatch (``check_crc``) replaces any structural reason; then records still valid fail with
    R_PROP_CRC when their ``__CRC32#`` property is wrong, or missing under PROP_REQUIRED."""
    if not len(h):
        return
    c32, c64 = _columns(h)
    c32 = tuple(np.ascontiguousarray(c, dtype=np.int32) for c in c32)
    c64 = tuple(np.ascontiguousarray(c, dtype=np.int64) for c in c64)
    reason = np.ascontiguousarray(h.reason, dtype=np.int8)
    _kernel().validate(kernel_view(buf if u8 is None else u8), bool(check_crc), int(prop_crc), c32, c64, reason)
    h.reason[:] = reason


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
    """Boolean array: body CRC matches (records with an empty body always match, as in Java;
    a body running past the buffer never does). Records outside ``mask`` count as matching."""
    n = len(h)
    ok = np.ones(n, dtype=bool)
    if n == 0:
        return ok
    todo = np.ones(n, dtype=bool) if mask is None else np.ascontiguousarray(mask, dtype=bool)
    _kernel().body_crc_mask(kernel_view(buf), np.ascontiguousarray(h.bodyStart, dtype=np.int64),
                            np.ascontiguousarray(h.bodyLength, dtype=np.int64),
                            np.ascontiguousarray(h.bodyCRC, dtype=np.int32), todo, ok)
    return ok


CRC_PROP_PREFIX = b"__CRC32#\x01"


def check_property_crc(buf, offset: int, total_size: int) -> bool:
    """Whole-record CRC of §4.2: CRC31 of all but the last 20 bytes equals the stored digits."""
    return bool(_kernel().property_crc_of(kernel_view(buf), int(offset), int(total_size)))


def first_invalid(h: Headers, crc_ok: np.ndarray | None = None) -> int:
    """Index of the first record that fails (structure or CRC), or len(h)."""
    bad = h.reason != R_OK
    if crc_ok is not None:
        bad = bad | ~crc_ok
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else len(h)
