"""What numba does at a record-reading command's start, trimmed to what loading cached kernels needs.

Imported by :mod:`formats.kernel` right after numba (every kernel module goes through it). Loading a
kernel from numba's cache is cheap; around it numba 0.68 does work only compiling needs:

- the NRT (numba's runtime) is compiled from LLVM IR in every process before the first kernel loads
  (~15 ms): here its machine code is cached once per environment, beside the kernels, keyed as numba
  keys them (the source that makes the IR, numba's codegen identity: LLVM triple, CPU name and
  features, the versions), so a change in what would be compiled misses and compiles as before;
- typing an ndarray argument reads ``numpy.ma.MaskedArray``, which imports ``numpy.ma`` (~7 ms)
  just to learn that a plain array is not a masked one: while ``numpy.ma`` is not imported no masked
  array can exist, so the check is skipped then (the type is the one numba's own rule gives);
- the first call of each kernel runs the third-party extension entry points (``numba_extensions``):
  a scan of every installed distribution's metadata (and ``importlib.metadata``'s import, ~12 ms in
  all) for extensions that only compiling can use. Compiling still runs them (numba's CPU target
  refresh does, ahead of any compile), so only a cached load goes without.

Only on the numba line this was measured and tested on (0.68, as formats.kernel's lean loads);
elsewhere numba is left as it is. ``tests/test_cli_start.py`` checks what a command start imports.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile

import numba
import numpy as np

NRT_CACHE_PREFIX = "rmqstore-nrt-"


def applies() -> bool:
    return numba.__version__.startswith("0.68.")


# --- the NRT's machine code, cached --------------------------------------------------------------

def _cache_dir() -> str | None:
    """Where numba caches this package's kernels (the locator numba picks for a function of this file,
    honouring NUMBA_CACHE_DIR), or None when it finds none."""
    from numba.core.caching import CompileResultCacheImpl

    try:
        locator = CompileResultCacheImpl(_cache_dir)._locator
        locator.ensure_cache_path()
        return locator.get_cache_path()
    except (RuntimeError, OSError):
        return None


def nrt_cache_key(ctx) -> str:
    """What the NRT's machine code depends on, as numba keys its own cache: the source that makes the IR
    (numba's nrtdynmod.py, its bytes: a patched numba of the same version differs), numba's codegen
    identity (LLVM triple, CPU name and features), the calling convention and the versions."""
    import llvmlite
    from numba.core import config
    from numba.core.runtime import nrtdynmod

    with open(nrtdynmod.__file__, "rb") as f:
        source = hashlib.sha256(f.read()).hexdigest()
    ident = (source, ctx.codegen().magic_tuple(), type(ctx.call_conv).__qualname__, config.OPT, numba.__version__,
             llvmlite.__version__, sys.version_info[:2])
    return hashlib.sha256(repr(ident).encode()).hexdigest()[:32]


def _compile_nrt_functions(ctx):
    """numba's ``nrtdynmod.compile_nrt_functions``, its result loaded from the cache when there."""
    from numba.core.runtime import nrtdynmod

    folder = _cache_dir()
    path = os.path.join(folder, NRT_CACHE_PREFIX + nrt_cache_key(ctx) + ".nbc") if folder else None
    if path is not None:
        try:
            with open(path, "rb") as f:
                state = pickle.load(f)
            return ctx.codegen().unserialize_library(state)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError):
            pass  # absent or unreadable: compiled below (and written again)
    ir_mod, library = nrtdynmod.create_nrt_module(ctx)
    if path is not None:
        library.enable_object_caching()  # keeps the machine code to serialize
    library.add_ir_module(ir_mod)
    library.finalize()
    if path is not None:
        _write_atomically(path, pickle.dumps(library.serialize_using_object_code(), protocol=pickle.HIGHEST_PROTOCOL))
    return library


def _write_atomically(path: str, data: bytes) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".nrt-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


# --- ndarray typing without numpy.ma --------------------------------------------------------------

def _lean_typeof_ndarray():
    from numba.core import errors, types
    from numba.core.typing.typeof import typeof_impl
    from numba.np import numpy_support

    numba_rule = typeof_impl.dispatch(np.ndarray)

    def typeof_ndarray(val, c):
        if "numpy.ma" in sys.modules:  # a masked array may exist: numba's own rule (which refuses it)
            return numba_rule(val, c)
        try:
            dtype = numpy_support.from_dtype(val.dtype)
        except errors.NumbaNotImplementedError:
            raise errors.NumbaValueError(f"Unsupported array dtype: {val.dtype}")
        return types.Array(dtype, val.ndim, numpy_support.map_layout(val), readonly=not val.flags.writeable)

    typeof_ndarray.numba_rule = numba_rule
    typeof_impl.register(np.ndarray)(typeof_ndarray)
    return typeof_ndarray


def _skip_entry_points_before_loads() -> None:
    from numba.core.dispatcher import _DispatcherBase

    def _compilation_chain_init_hook(self):
        """numba runs the extension entry points here, ahead of a cached load or a compile; the CPU target's
        refresh (which every compile runs first) runs them too, so a compile still has them."""

    _DispatcherBase._compilation_chain_init_hook = _compilation_chain_init_hook


def _apply() -> bool:
    if not applies():
        return False
    from numba.core.dispatcher import _DispatcherBase
    from numba.core.runtime import nrtdynmod

    if not (hasattr(nrtdynmod, "compile_nrt_functions") and hasattr(nrtdynmod, "create_nrt_module")
            and hasattr(_DispatcherBase, "_compilation_chain_init_hook")):
        return False
    nrtdynmod.compile_nrt_functions = _compile_nrt_functions
    _lean_typeof_ndarray()
    _skip_entry_points_before_loads()
    return True


APPLIED = _apply()
