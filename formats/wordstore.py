"""Stores for the compiled writers (the ``append --from`` parser and encoder, the ``dump --json`` writer): one
unaligned little-endian 64-bit store, a byte swap, a ``memcpy``, and short copies eight bytes a step. LLVM
intrinsics, so each compiles to one instruction (the copies to a few); the loads are :mod:`formats.wordops`'."""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types

from . import kernel  # noqa: F401  (numba's start trimmed first: formats.numbastart)
from .wordops import _word


@numba.extending.intrinsic
def _store_word(typingctx, arr, idx, val):
    """Store the uint64 ``val`` little-endian at ``u8[i:i + 8]`` (lowest byte at ``u8[i]``), one unaligned
    store; the caller makes sure ``i + 8 <= len(u8)``."""
    sig = types.void(arr, types.intp, types.uint64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(64).as_pointer())
        v = args[2]
        if not np.little_endian:
            v = builder.call(builder.module.declare_intrinsic("llvm.bswap", [ir.IntType(64)]), [v])
        builder.store(v, ptr, align=1)
        return context.get_dummy_value()

    return sig, codegen


@numba.extending.intrinsic
def _bswap(typingctx, val):
    """The uint64 ``val`` with its bytes in reverse order (big-endian <-> little-endian)."""
    sig = types.uint64(types.uint64)

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.bswap", [ir.IntType(64)])
        return builder.call(fn, [args[0]])

    return sig, codegen


@numba.extending.intrinsic
def _copy(typingctx, dst, di, src, si, n):
    """``dst[di:di+n] = src[si:si+n]`` as one ``llvm.memcpy`` (a few moves when ``n`` is a constant, such as a
    literal's length): a byte loop indexed by signed positions makes numba test each index for negative
    wraparound (a loop of literal copies measured alone ran ~6x slower). The caller makes sure both spans lie
    inside their arrays and do not overlap."""
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[2])(context, builder, args[2])
        i8p = ir.IntType(8).as_pointer()
        dp = builder.bitcast(builder.gep(d.data, [args[1]]), i8p)
        sp = builder.bitcast(builder.gep(s.data, [args[3]]), i8p)
        fn = builder.module.declare_intrinsic("llvm.memcpy", [i8p, i8p, ir.IntType(64)])
        builder.call(fn, [dp, sp, args[4], ir.Constant(ir.IntType(1), 0)])
        return context.get_dummy_value()

    return sig, codegen


def _vec(builder, ty, values):
    return ir.Constant(ir.VectorType(ty, len(values)), list(values))


@numba.extending.intrinsic
def _base64_decode32(typingctx, dst, di, src, si):
    """Decode the 32 base64 digits at ``src[si:si + 32]`` into the 24 bytes at ``dst[di:di + 24]`` at once (vector
    compares, selects and shuffles, as SIMD as the CPU has); False, with ``dst[di:di + 24]`` undefined, when one of
    the 32 is not a digit of the standard alphabet (a quote, padding). The caller makes sure both spans lie
    inside their arrays. Byte order does not matter: nothing is reinterpreted as a wider integer."""
    sig = types.boolean(dst, types.intp, src, types.intp)

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[2])(context, builder, args[2])
        i8, i1 = ir.IntType(8), ir.IntType(1)
        v32 = ir.VectorType(i8, 32)
        v = builder.load(builder.bitcast(builder.gep(s.data, [args[3]]), v32.as_pointer()), align=1)

        def within(lo, hi):
            return builder.and_(builder.icmp_unsigned(">=", v, _vec(builder, i8, [lo] * 32)),
                                builder.icmp_unsigned("<=", v, _vec(builder, i8, [hi] * 32)))

        upper, lower, digit = within(65, 90), within(97, 122), within(48, 57)
        plus = builder.icmp_unsigned("==", v, _vec(builder, i8, [43] * 32))
        slash = builder.icmp_unsigned("==", v, _vec(builder, i8, [47] * 32))
        valid = builder.or_(builder.or_(builder.or_(upper, lower), builder.or_(digit, plus)), slash)
        # each digit's value: A-Z 0-25, a-z 26-51, 0-9 52-61, + 62, / 63 (as offsets added mod 256)
        offset = builder.select(upper, _vec(builder, i8, [(-65) & 0xFF] * 32),
                                builder.select(lower, _vec(builder, i8, [(-71) & 0xFF] * 32),
                                               builder.select(digit, _vec(builder, i8, [4] * 32),
                                                              builder.select(plus, _vec(builder, i8, [19] * 32),
                                                                             _vec(builder, i8, [16] * 32)))))
        six = builder.add(v, offset)
        undef = ir.Constant(v32, ir.Undefined)

        def quad(k):  # digit k of each of the 8 quads
            return builder.shuffle_vector(six, undef, _vec(builder, ir.IntType(32), [4 * q + k for q in range(8)]))

        a, b, c, e = quad(0), quad(1), quad(2), quad(3)
        v8 = ir.VectorType(i8, 8)

        def shl(x, n):
            return builder.shl(x, _vec(builder, i8, [n] * 8))

        def shr(x, n):
            return builder.lshr(x, _vec(builder, i8, [n] * 8))

        first = builder.or_(shl(a, 2), shr(b, 4))
        second = builder.or_(shl(b, 4), shr(c, 2))
        third = builder.or_(shl(c, 6), e)
        i32 = ir.IntType(32)
        pair = builder.shuffle_vector(first, second, _vec(builder, i32, range(16)))
        third16 = builder.shuffle_vector(third, ir.Constant(v8, ir.Undefined), _vec(builder, i32, list(range(8)) * 2))
        out = builder.shuffle_vector(pair, third16, _vec(builder, i32, [x for q in range(8) for x in (q, 8 + q, 16 + q)]))
        builder.store(out, builder.bitcast(builder.gep(d.data, [args[1]]), ir.VectorType(i8, 24).as_pointer()), align=1)
        mask = builder.bitcast(valid, ir.IntType(32))
        return builder.icmp_unsigned("==", mask, ir.Constant(ir.IntType(32), 0xFFFFFFFF))

    return sig, codegen


@numba.njit(inline="always")
def _copy_words(out, p, u8, a, n):
    """``out[p:p+n] = u8[a:a+n]`` eight bytes per step, for short spans (a call to memcpy costs more than the copy).
    It may write up to 7 bytes past ``p + n``: the caller's buffer has room there and writes them again later."""
    if a + n + 8 <= u8.shape[0] and p + n + 8 <= out.shape[0]:
        t = 0
        while t < n:
            _store_word(out, p + t, _word(u8, a + t))
            t += 8
    else:
        for t in range(n):
            out[p + t] = u8[a + t]
