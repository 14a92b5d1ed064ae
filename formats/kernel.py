"""Compiled commitlog kernels (numba, nopython): record walk, fixed-header gather, body and
property CRC — the broker's ``checkMessageAndReturnSize`` loop (FORMAT.md §2, §4, §13.3) at
machine speed, one record per loop step instead of one numpy pass per field.

Callers reach these kernels through :mod:`formats.fast`, which imports this module lazily (importing
numba costs ~0.4 s, which a command that never reads records must not pay); the other kernel modules
take its :func:`_jit` helper, and :mod:`formats.warmup` compiles them all. This module imports none of
them. Kernels are compiled once per environment and
cached (``cache=True``): in ``__pycache__`` beside this file when it is writable (a checkout or an
editable install), else in the user cache directory (numba's ``UserWideCacheLocator``:
``$XDG_CACHE_HOME/numba`` or ``~/.cache/numba``), or ``NUMBA_CACHE_DIR`` when that is set; when
none of these is writable they go to a private directory under the system temp dir.

CRC32 is ISA-L's ``crc32_gzip_refl`` (the IEEE CRC of java.util.zip.CRC32; ``isal_zlib.crc32``
calls the same function), exported by the ``isal`` wheel's extension module. The kernels call it
by a symbol name registered with LLVM (:data:`CRC_SYMBOL`) rather than through a ctypes pointer:
a ctypes pointer is a "dynamic global" and makes numba refuse to cache the kernel.

Layout constants are literals here, not imports: numba freezes globals into the cached machine
code and only re-compiles when *this* file changes. ``tests/test_kernel.py`` asserts each one
equals what :mod:`formats.records` declares.
"""

from __future__ import annotations

import ctypes
import os
import tempfile

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import types

from . import numbastart  # noqa: F401  (numba's start trimmed to what cached loads need: see there)

# --- layout (FORMAT.md §2.1; equal to formats.records, asserted in tests/test_kernel.py) ---------
OFF_TOTALSIZE = 0
OFF_MAGIC = 4
OFF_BODYCRC = 8
OFF_QUEUEID = 12
OFF_FLAG = 16
OFF_QUEUEOFFSET = 20
OFF_PHYSICALOFFSET = 28
OFF_SYSFLAG = 36
OFF_BORNTIMESTAMP = 40
OFF_BORNHOST = 48  # end of the fixed prefix; everything after moves with the host widths
# After the born host: storeTimestamp (8), then the store host at MID_STOREHOST; after the store
# host: reconsumeTimes, preparedTransactionOffset at TAIL_PREPARED, bodyLength at TAIL_BODYLENGTH,
# the body at TAIL_BODY.
MID_STOREHOST = 8
TAIL_PREPARED = 4
TAIL_BODYLENGTH = 12
TAIL_BODY = 16
HOST_V4_WIDTH = 8
HOST_V6_WIDTH = 20
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
MAGIC_V2 = -626843477
MAGIC_BLANK = -875286124
MIN_MESSAGE_SIZE = 91
SIZE_BASE = 74  # TOTALSIZE = 74 + born host + store host + topic-length width + body + topic + properties
CRC32_RESERVED_LEN = 20
CRC_PROP_PREFIX = b"__CRC32#\x01"

# --- stop kinds and reasons (mapped to formats.fast's names there) -------------------------------
K_BLANK, K_ZERO, K_EOF, K_BAD_MAGIC, K_BAD_SIZE, K_TORN, K_CHUNK, K_INVALID = range(8)
R_OK, R_BODY_CRC, R_TOPIC_LENGTH, R_LENGTHS, R_TOTALSIZE, R_PROP_CRC = 0, 1, 2, 3, 4, 5

# Property-CRC policy of CommitLog.validate: none (4.x), when the record carries ``__CRC32#``, or
# required (5.x with forceVerifyPropCRC and CRC checking on).
PROP_NONE, PROP_IF_PRESENT, PROP_REQUIRED = 0, 1, 2

# Header columns the kernels fill (formats.fast.Headers attribute names), by dtype.
I32_COLUMNS = ("totalSize", "magicCode", "bodyCRC", "queueId", "flag", "sysFlag", "reconsumeTimes")
I64_COLUMNS = ("offsets", "queueOffset", "physicalOffset", "bornTimestamp", "bornHostStart", "bornHostLen",
               "storeTimestamp", "storeHostStart", "storeHostLen", "preparedTransactionOffset", "bodyStart",
               "bodyLength", "topicStart", "topicLength", "propsStart", "propsLength", "computedSize")

# --- CRC32 symbol -------------------------------------------------------------------------------
CRC_SYMBOL = "rmqstore_crc32_ieee"


def _table_crc32_cfunc():
    """A compiled table CRC32 (same values, ~10x slower than ISA-L) for an ``isal`` build that does
    not export ``crc32_gzip_refl``. Returns the numba cfunc."""
    table = np.zeros(256, dtype=np.uint32)
    for n in range(256):
        c = n
        for _ in range(8):
            c = (0xEDB88320 ^ (c >> 1)) if c & 1 else (c >> 1)
        table[n] = c

    @numba.cfunc(types.uint32(types.uint32, types.uintp, types.uint64))
    def crc32_table(init, address, length):
        data = numba.carray(_as_u8_ptr(address), (length,))
        c = ~np.uint32(init)
        for i in range(length):
            c = table[(c ^ data[i]) & 0xFF] ^ (c >> np.uint32(8))
        return ~c

    return crc32_table


@numba.extending.intrinsic
def _as_u8_ptr(typingctx, address):
    """uint8* from an integer address (for :func:`numba.carray` in the fallback CRC)."""
    sig = types.CPointer(types.uint8)(address)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.uint8)))

    return sig, codegen


def _crc_address() -> tuple[int, str]:
    try:
        import isal.isal_zlib

        fn = ctypes.CDLL(isal.isal_zlib.__file__).crc32_gzip_refl
        return ctypes.cast(fn, ctypes.c_void_p).value, "isal crc32_gzip_refl"
    except (ImportError, OSError, AttributeError):
        global _FALLBACK
        _FALLBACK = _table_crc32_cfunc()
        return _FALLBACK.address, "compiled table (isal's crc32_gzip_refl not found)"


_FALLBACK = None
CRC_ADDRESS, CRC_IMPLEMENTATION = _crc_address()
llvm.add_symbol(CRC_SYMBOL, CRC_ADDRESS)
# uint32 crc32_gzip_refl(uint32 init, const uint8_t *buf, uint64 len): the pointer is passed as an
# address-sized integer (same register in every 64-bit C calling convention numba targets).
_crc32 = types.ExternalFunction(CRC_SYMBOL, types.uint32(types.uint32, types.uintp, types.uint64))


# --- loading cached kernels ---------------------------------------------------------------------

def _lean_cached_loads() -> bool:
    """Load cached kernels without numba's full target refresh. Before loading a cached overload numba
    refreshes the CPU target: it imports and installs every typing and lowering registry (~40 modules:
    linalg, random, typed containers, jitclass...), which only compiling needs — ~0.1 s of every
    record-reading command's start. Loading needs the runtime (NRT) whose symbols the cached code links
    against; on a cache miss numba compiles, and compiling refreshes the target itself. Only on the numba
    line this was measured and tested on (0.68); elsewhere numba's own load is left as it is."""
    from numba.core import caching
    from numba.core.runtime import rtsys

    cache = getattr(caching, "Cache", None)
    if not numba.__version__.startswith("0.68.") or cache is None or not all(
            hasattr(cache, a) for a in ("load_overload", "_load_overload", "_guard_against_spurious_io_errors")):
        return False

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    cache.load_overload = load_overload
    return True


LEAN_CACHED_LOADS = _lean_cached_loads()


# --- compilation and cache location --------------------------------------------------------------

def _private_cache_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"rmqstore-numba-cache-{os.getuid() if hasattr(os, 'getuid') else 0}")


def _jit(fn, refcounts: bool = True):
    """``njit(cache=True, nogil=True)``; when numba finds no writable cache location (read-only
    package directory and home), cache into a private temp directory instead of failing.

    ``refcounts=False``: compiled without numba's runtime (NRT) reference counting, for a kernel that makes no
    array (it could not: compiling one fails). Helpers inlined into a kernel's loop otherwise take and drop a
    reference to each array they are handed, an atomic add each, every iteration. The ahead-of-time build reads
    the same mark (:data:`NO_REFCOUNTS`, set on ``fn``) and compiles that export the same way."""
    options = {"cache": True, "nogil": True}
    if not refcounts:
        options["_nrt"] = False
        setattr(fn, NO_REFCOUNTS, True)
    try:
        return numba.njit(**options)(fn)
    except RuntimeError:
        saved = numba.config.CACHE_DIR, numba.config.CACHE_LOCATOR_CLASSES
        numba.config.CACHE_DIR, numba.config.CACHE_LOCATOR_CLASSES = _private_cache_dir(), "UserProvidedCacheLocator"
        try:
            return numba.njit(**options)(fn)
        except RuntimeError:
            return numba.njit(**{**options, "cache": False})(fn)
        finally:
            numba.config.CACHE_DIR, numba.config.CACHE_LOCATOR_CLASSES = saved


NO_REFCOUNTS = "_rmqstore_no_refcounts"  # attribute of a kernel's Python function: compile it without NRT


def _jit_no_refcounts(fn):
    """``_jit(fn, refcounts=False)`` as a decorator: a kernel or helper that makes no array. Each call of a compiled
    helper otherwise takes and drops a reference to every array it is handed (two atomic operations each)."""
    return _jit(fn, refcounts=False)


# --- big-endian reads ---------------------------------------------------------------------------

def _load_be(bits):
    """Intrinsic: signed big-endian ``bits``-bit value at ``u8[i]`` as int64, one unaligned load
    and a byte swap (the byte-by-byte shift loop cost ~10x more per field)."""

    @numba.extending.intrinsic
    def load(typingctx, arr, idx):
        sig = types.int64(arr, types.intp)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(bits).as_pointer())
            v = builder.load(ptr, align=1)
            if bits > 8:
                v = builder.call(builder.module.declare_intrinsic("llvm.bswap", [ir.IntType(bits)]), [v])
            return builder.sext(v, ir.IntType(64)) if bits < 64 else v

        return sig, codegen

    return load


_ld8, _ld16, _ld32, _ld64 = (_load_be(b) for b in (8, 16, 32, 64))


@numba.njit(inline="always")
def _clipped(u8, i, n):
    """Bytes outside the buffer read as its nearest end byte, like the clipped numpy gather of
    formats.fast.decode_headers_reference, so damaged records decode the same."""
    size = u8.shape[0]
    v = np.int64(0)
    if size > 0:
        for k in range(n):
            j = min(max(i + k, 0), size - 1)
            v = (v << 8) | np.int64(u8[j])
    s = 64 - 8 * n
    return (v << s) >> s


@numba.njit(inline="always")
def _i8(u8, i):
    return _ld8(u8, i) if 0 <= i < u8.shape[0] else _clipped(u8, i, 1)


@numba.njit(inline="always")
def _i16(u8, i):
    return _ld16(u8, i) if 0 <= i and i + 2 <= u8.shape[0] else _clipped(u8, i, 2)


@numba.njit(inline="always")
def _i32(u8, i):
    return _ld32(u8, i) if 0 <= i and i + 4 <= u8.shape[0] else _clipped(u8, i, 4)


@numba.njit(inline="always")
def _i64(u8, i):
    return _ld64(u8, i) if 0 <= i and i + 8 <= u8.shape[0] else _clipped(u8, i, 8)


@numba.njit(inline="always")
def _decode(u8, p):
    """The record at ``p``: (its I32_COLUMNS values, its I64_COLUMNS values, structural reason);
    the reason follows §13.3's order (the earliest rule the broker would notice wins)."""
    total = _i32(u8, p + OFF_TOTALSIZE)
    magic = _i32(u8, p + OFF_MAGIC)
    sysflag = _i32(u8, p + OFF_SYSFLAG)
    bh = HOST_V6_WIDTH if sysflag & SYSFLAG_BORNHOST_V6 else HOST_V4_WIDTH
    sh = HOST_V6_WIDTH if sysflag & SYSFLAG_STOREHOST_V6 else HOST_V4_WIDTH
    st = p + OFF_BORNHOST + bh
    rc = st + MID_STOREHOST + sh
    body_len = _i32(u8, rc + TAIL_BODYLENGTH)
    body_start = rc + TAIL_BODY
    body = max(body_len, 0)
    tl_pos = body_start + body
    if magic == MAGIC_V2:
        topic_len = _i16(u8, tl_pos)
        tw = 2
    else:
        topic_len = _i8(u8, tl_pos)
        tw = 1
    topic_start = tl_pos + tw
    pl_pos = topic_start + max(topic_len, 0)
    props_len = _i16(u8, pl_pos)
    props_start = pl_pos + 2
    props = max(props_len, 0)
    computed = SIZE_BASE + bh + sh + tw + body + max(topic_len, 0) + props
    rec_end = p + total
    if topic_len < 0:
        reason = R_TOPIC_LENGTH
    elif props_start + props > rec_end or body_len < 0 or body_start + body > rec_end:
        reason = R_LENGTHS
    elif computed != total:
        reason = R_TOTALSIZE
    else:
        reason = R_OK
    v32 = (total, magic, _i32(u8, p + OFF_BODYCRC), _i32(u8, p + OFF_QUEUEID), _i32(u8, p + OFF_FLAG), sysflag,
           _i32(u8, rc))
    v64 = (p, _i64(u8, p + OFF_QUEUEOFFSET), _i64(u8, p + OFF_PHYSICALOFFSET), _i64(u8, p + OFF_BORNTIMESTAMP),
           p + OFF_BORNHOST, np.int64(bh), _i64(u8, st), st + MID_STOREHOST, np.int64(sh), _i64(u8, rc + TAIL_PREPARED),
           body_start,
           body_len, topic_start, topic_len, props_start, props_len, computed)
    return v32, v64, reason


@numba.njit(inline="always")
def _crc(u8, start, length):
    return _crc32(np.uint32(0), np.uintp(u8.ctypes.data + start), np.uint64(length))


@numba.njit(inline="always")
def _body_crc_ok(u8, body_start, body_len, stored):
    """BODYCRC (CRC32 & 0x7FFFFFFF, §4.1) matches; an empty body always matches, a body that runs
    past the buffer never does."""
    if body_len <= 0:
        return True
    if body_start + body_len > u8.shape[0]:
        return False
    return np.int64(_crc(u8, body_start, body_len) & np.uint32(0x7FFFFFFF)) == stored


@numba.njit(inline="always")
def _has_crc_property(u8, props_start, props_len):
    """The properties end with the 20-byte ``__CRC32#`` entry (5.2+, §4.2): its 9-byte prefix."""
    if props_len < CRC32_RESERVED_LEN:
        return False
    q = props_start + props_len - CRC32_RESERVED_LEN
    return (_i64(u8, q) == 0x5F5F435243333223 and _i8(u8, q + 8) == 1)  # "__CRC32#" "\x01"


@numba.njit(inline="always")
def _property_crc_ok(u8, p, total):
    """Whole-record CRC of §4.2: CRC31 of all but the last 20 bytes equals the stored digits
    (least significant first, Java int wrap-around; anything but 10 ASCII digits + 0x02 fails)."""
    tail = p + total - CRC32_RESERVED_LEN
    if tail < 0 or p + total > u8.shape[0] or tail < p:
        return False
    if not (_i64(u8, tail) == 0x5F5F435243333223 and u8[tail + 8] == 1 and u8[tail + 19] == 2):
        return False
    value = np.int64(0)
    for k in range(9, -1, -1):
        d = np.int64(u8[tail + 9 + k]) - 48
        if d < 0 or d > 9:
            return False
        value = (value * 10 + d) & 0xFFFFFFFF
    if value & 0x80000000:
        return False
    return np.int64(_crc(u8, p, total - CRC32_RESERVED_LEN) & np.uint32(0x7FFFFFFF)) == value


@numba.njit(inline="always")
def _content_reason(u8, reason, check_crc, prop_mode, v32, v64):
    """CommitLog.validate's order: a body CRC mismatch replaces a structural reason; then the
    property CRC of records still valid (when present, or required)."""
    if check_crc and not _body_crc_ok(u8, v64[10], v64[11], np.int64(v32[2])):
        reason = R_BODY_CRC
    if prop_mode != PROP_NONE and reason == R_OK:
        has = _has_crc_property(u8, v64[14], v64[15])
        if has or prop_mode == PROP_REQUIRED:
            if not has or not _property_crc_ok(u8, v64[0], np.int64(v32[0])):
                reason = R_PROP_CRC
    return reason


# --- kernels ------------------------------------------------------------------------------------

def _walk_offsets(u8, pos, end, v1, v2, max_records, out):
    """Follow TOTALSIZE from ``pos`` (only the 8-byte size/magic pair of each record is read).

    Record starts go to ``out`` (capacity >= ``max_records``). Returns (count, stop position,
    K_* kind, TOTALSIZE and magic read at the stop; both 0 for K_EOF / K_CHUNK)."""
    n = 0
    while True:
        if pos + 8 > end:
            return n, pos, K_EOF, 0, 0
        if n >= max_records:
            return n, pos, K_CHUNK, 0, 0
        size = _i32(u8, pos)
        magic = _i32(u8, pos + 4)
        if magic == v1 or magic == v2:
            if size < MIN_MESSAGE_SIZE:
                return n, pos, K_BAD_SIZE, size, magic
            if pos + size > end:
                return n, pos, K_TORN, size, magic
            out[n] = pos
            n += 1
            pos += size
            continue
        if magic == MAGIC_BLANK:
            return n, pos, K_BLANK, size, magic
        if magic == 0 and size == 0:
            return n, pos, K_ZERO, size, magic
        return n, pos, K_BAD_MAGIC, size, magic


def _scan_records(u8, pos, end, v1, v2, max_records, check_crc, prop_mode, c32, c64, reason):
    """The walk of :func:`_walk_offsets` that also decodes and validates each record (structure,
    body CRC, property CRC) and stops at the first one that fails.

    Returns (count, stop position, kind, size, magic, bad reason). Rows [0, count) hold valid
    records; for K_INVALID row ``count`` holds the failing record (its reason in ``reason``)."""
    # Columns unpacked once: indexing the tuples per store costs ~2x in the loop.
    t0, t1, t2, t3, t4, t5, t6 = c32
    o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15, o16 = c64
    n = 0
    while True:
        if pos + 8 > end:
            return n, pos, K_EOF, 0, 0, R_OK
        if n >= max_records:
            return n, pos, K_CHUNK, 0, 0, R_OK
        size = _i32(u8, pos)
        magic = _i32(u8, pos + 4)
        if magic == v1 or magic == v2:
            if size < MIN_MESSAGE_SIZE:
                return n, pos, K_BAD_SIZE, size, magic, R_OK
            if pos + size > end:
                return n, pos, K_TORN, size, magic, R_OK
            v32, v64, r = _decode(u8, pos)
            r = _content_reason(u8, r, check_crc, prop_mode, v32, v64)
            t0[n], t1[n], t2[n], t3[n], t4[n], t5[n], t6[n] = v32
            (o0[n], o1[n], o2[n], o3[n], o4[n], o5[n], o6[n], o7[n], o8[n], o9[n], o10[n], o11[n], o12[n], o13[n],
             o14[n], o15[n], o16[n]) = v64
            reason[n] = r
            if r != R_OK:
                return n, pos, K_INVALID, size, magic, r
            n += 1
            pos += size
            continue
        if magic == MAGIC_BLANK:
            return n, pos, K_BLANK, size, magic, R_OK
        if magic == 0 and size == 0:
            return n, pos, K_ZERO, size, magic, R_OK
        return n, pos, K_BAD_MAGIC, size, magic, R_OK


def _decode_at(u8, offsets, c32, c64, reason):
    """Decode the records at arbitrary ``offsets`` (structural reason only, no CRC)."""
    t0, t1, t2, t3, t4, t5, t6 = c32
    o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15, o16 = c64
    for n in range(offsets.shape[0]):
        v32, v64, reason[n] = _decode(u8, offsets[n])
        t0[n], t1[n], t2[n], t3[n], t4[n], t5[n], t6[n] = v32
        (o0[n], o1[n], o2[n], o3[n], o4[n], o5[n], o6[n], o7[n], o8[n], o9[n], o10[n], o11[n], o12[n], o13[n],
         o14[n], o15[n], o16[n]) = v64


def _validate(u8, check_crc, prop_mode, c32, c64, reason):
    """Content checks (body CRC, property CRC) of decoded records, into ``reason``."""
    t0, t1, t2, t3, t4, t5, t6 = c32
    o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15, o16 = c64
    for i in range(reason.shape[0]):
        v32 = (t0[i], t1[i], t2[i], t3[i], t4[i], t5[i], t6[i])
        v64 = (o0[i], o1[i], o2[i], o3[i], o4[i], o5[i], o6[i], o7[i], o8[i], o9[i], o10[i], o11[i], o12[i], o13[i],
               o14[i], o15[i], o16[i])
        reason[i] = _content_reason(u8, reason[i], check_crc, prop_mode, v32, v64)


def _body_crc_mask(u8, body_start, body_len, stored, todo, ok):
    """``ok[i]`` = body CRC of record i matches, for the records with ``todo[i]``."""
    for i in range(ok.shape[0]):
        ok[i] = _body_crc_ok(u8, body_start[i], body_len[i], np.int64(stored[i])) if todo[i] else True


def _crc32_of(u8, start, length):
    """CRC32 of ``u8[start:start+length]`` through the kernels' CRC symbol (for tests)."""
    return _crc(u8, start, length)


def _property_crc_of(u8, p, total):
    return _property_crc_ok(u8, p, total)


# none of them makes an array: compiled without reference counting (see _jit)
walk_offsets = _jit(_walk_offsets, refcounts=False)
scan_records = _jit(_scan_records, refcounts=False)
decode_at = _jit(_decode_at, refcounts=False)
validate = _jit(_validate, refcounts=False)
body_crc_mask = _jit(_body_crc_mask, refcounts=False)
crc32_of = _jit(_crc32_of, refcounts=False)
property_crc_of = _jit(_property_crc_of, refcounts=False)
