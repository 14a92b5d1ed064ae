"""Word-at-a-time stores for the compiled writers (the ``append --from`` parser and encoder): one unaligned
little-endian 64-bit store and a byte swap. LLVM intrinsics, so each compiles to one instruction; the loads
are :mod:`formats.wordops`'."""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types

from . import kernel  # noqa: F401  (numba's start trimmed first: formats.numbastart)


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
