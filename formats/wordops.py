"""Word-at-a-time helpers for the compiled kernels (the property, hash, index-chain and JSON passes test,
fetch or compare 8 bytes per step): one unaligned little-endian 64-bit load, the lowest flagged byte of a
mask and a cache prefetch hint (LLVM intrinsics, one instruction each), a byte-equality mask, a buffer's
last few bytes as one word, and the comparison of two byte spans. One implementation each, shared by
:mod:`formats.propkernel`, :mod:`formats.entrykernel`, :mod:`formats.jsonkernel` and :mod:`formats.replayprops`."""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types

from . import kernel  # noqa: F401  (numba's start trimmed first: formats.numbastart)


@numba.extending.intrinsic
def _word(typingctx, arr, idx):
    """The 8 bytes at ``u8[i]`` as one little-endian uint64 (byte ``u8[i]`` lowest), one unaligned
    load; the caller makes sure ``i + 8 <= len(u8)``."""
    sig = types.uint64(arr, types.intp)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(64).as_pointer())
        v = builder.load(ptr, align=1)
        if not np.little_endian:
            v = builder.call(builder.module.declare_intrinsic("llvm.bswap", [ir.IntType(64)]), [v])
        return v

    return sig, codegen


@numba.extending.intrinsic
def _low_byte_index(typingctx, mask):
    """Index (0-7) of the lowest byte of the uint64 ``mask`` with its top bit set (count of trailing
    zero bits / 8); ``mask`` is not 0."""
    sig = types.int64(types.uint64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        cttz = builder.module.declare_intrinsic("llvm.cttz.i64", fnty=ir.FunctionType(i64, [i64, ir.IntType(1)]))
        tz = builder.call(cttz, [args[0], ir.Constant(ir.IntType(1), 1)])
        return builder.lshr(tz, ir.Constant(ir.IntType(64), 3))

    return sig, codegen


@numba.extending.intrinsic
def _low_bit_index(typingctx, mask):
    """Index (0-63) of the lowest set bit of the uint64 ``mask`` (count of trailing zero bits); ``mask`` is not 0."""
    sig = types.int64(types.uint64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        cttz = builder.module.declare_intrinsic("llvm.cttz.i64", fnty=ir.FunctionType(i64, [i64, ir.IntType(1)]))
        return builder.call(cttz, [args[0], ir.Constant(ir.IntType(1), 1)])

    return sig, codegen


def _byte_masks32(byte: int):
    """Intrinsic ``masks(u8, i)``: the 32 bytes at ``u8[i]`` tested at once (one vector load and two compares,
    e.g. AVX2's ``vpcmpeqb``/``vpmovmskb``): bit ``t`` of the result is set when byte ``t`` equals ``byte``, bit
    ``32 + t`` when byte ``t`` is >= 0x80. The caller makes sure ``i + 32 <= len(u8)``."""

    @numba.extending.intrinsic
    def masks(typingctx, arr, idx):
        sig = types.uint64(arr, types.intp)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            vec = ir.VectorType(ir.IntType(8), 32)
            v = builder.load(builder.bitcast(builder.gep(ary.data, [args[1]]), vec.as_pointer()), align=1)
            equal = builder.icmp_unsigned("==", v, ir.Constant(vec, [byte] * 32))
            high = builder.icmp_signed("<", v, ir.Constant(vec, [0] * 32))
            i32, i64 = ir.IntType(32), ir.IntType(64)
            low_half = builder.zext(builder.bitcast(equal, i32), i64)
            high_half = builder.shl(builder.zext(builder.bitcast(high, i32), i64), ir.Constant(i64, 32))
            return builder.or_(low_half, high_half)

        return sig, codegen

    return masks


@numba.extending.intrinsic
def _json_special32(typingctx, arr, idx):
    """The 32 bytes at ``u8[i]`` tested at once for what JSON text cannot copy as it is: bit ``t`` of the result
    is set when byte ``t`` is a control (< 0x20: the property separators among them), ``"``, ``\\`` or not ASCII
    (>= 0x80). The caller makes sure ``i + 32 <= len(u8)``."""
    sig = types.uint64(arr, types.intp)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        vec = ir.VectorType(ir.IntType(8), 32)
        v = builder.load(builder.bitcast(builder.gep(ary.data, [args[1]]), vec.as_pointer()), align=1)
        special = builder.icmp_unsigned("<", v, ir.Constant(vec, [0x20] * 32))
        special = builder.or_(special, builder.icmp_unsigned(">=", v, ir.Constant(vec, [0x80] * 32)))
        special = builder.or_(special, builder.icmp_unsigned("==", v, ir.Constant(vec, [0x22] * 32)))
        special = builder.or_(special, builder.icmp_unsigned("==", v, ir.Constant(vec, [0x5C] * 32)))
        return builder.zext(builder.bitcast(special, ir.IntType(32)), ir.IntType(64))

    return sig, codegen


@numba.extending.intrinsic
def _prefetch(typingctx, arr, idx):
    """Hint the CPU to start loading the cache line of ``u8[i]`` (never faults, whatever ``i``)."""
    sig = types.void(arr, types.intp)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch.p0", fnty=ir.FunctionType(
            ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]))
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


ONES = 0x0101010101010101
HIGHS = 0x8080808080808080


@numba.njit(inline="always")
def _bytes_equal_mask(w, rep):
    """High bit set in the lowest byte of ``w`` equal to the byte repeated in ``rep`` (bytes above
    a match may be flagged too: only the lowest flagged byte is exact)."""
    x = w ^ rep
    return (x - np.uint64(ONES)) & ~x & np.uint64(HIGHS)


@numba.njit(inline="always")
def _low_bytes(w, r):
    """The ``r`` (1..8) lowest bytes of ``w`` moved to its top, zeros below (``_poly`` of the result is
    the hash step over those ``r`` bytes)."""
    return w << np.uint64(8 * (8 - r))


@numba.njit(inline="always")
def _load(u8, j, r):
    """The word at ``u8[j]`` of which only the ``r`` (1..8) lowest bytes matter: one load when 8 bytes
    are left in the buffer, else the ``r`` bytes one by one (the buffer's last few bytes only)."""
    if j + 8 <= u8.shape[0]:
        return _word(u8, j)
    w = np.uint64(0)
    for t in range(r):
        w |= np.uint64(u8[j + t]) << np.uint64(8 * t)
    return w


@numba.njit(inline="always")
def _same_bytes(a, ai, b, bi, n):
    """``a[ai:ai+n] == b[bi:bi+n]`` (eight bytes per step; both spans lie inside their arrays)."""
    t = 0
    while t + 8 <= n:
        if _word(a, ai + t) != _word(b, bi + t):
            return False
        t += 8
    if t < n:
        r = n - t
        return _low_bytes(_load(a, ai + t, r), r) == _low_bytes(_load(b, bi + t, r), r)
    return True
