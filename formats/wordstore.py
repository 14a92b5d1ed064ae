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
