"""The one place code reaches the compiled kernels through: the ahead-of-time (AOT) extension when it is built
and matches the sources, else the numba modules as before (JIT, numba's cache).

``scripts/setup.sh`` builds ``_aotkernels`` (C extensions, :mod:`formats.aotbuild`, numba's ``pycc``: one per part
of the kernels, the parts compiled by processes side by side, ``_aotkernels``, ``_aotkernels1``...) beside this file
after the kernel warm-up: every kernel of the modules routed through here, with every argument-type
combination the warm-up compiled, from the same kernel source. A start that finds it loads no numba at all
(~0.15 s of CPU: numba's import and the cached kernels' loading, docs/start.md). It is used only when its
manifest's key equals the current one: the hash of the formats sources the build read, numba's and llvmlite's
version files, the Python version and the CPU (model and feature flags, as the code is compiled for the host
CPU). Anything else (no extension, a stale one, ``RMQSTORE_AOT=0``, isal missing) takes the numba route.

Routed: :func:`kernels` gives a module's face — the kernels exported (:class:`AotKernel`), the module's simple
constants and its plain Python functions, recorded by the build from the module itself — or the module;
:func:`first` wraps a module's own "compile the kernel ``name``" function (``checkkernel._compiled``). An
exported kernel is called only with exactly the argument types it was compiled for (dtype, dimensions, layout,
read-only or writable, as numba types them: pycc's own unboxing checks only the item size); any other call,
and any name the extension does not hold (a kernel added since the build), goes to the numba module.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pickle
import sys
import types

import numpy as np

EXTENSION = "_aotkernels"
MANIFEST = EXTENSION + ".manifest"
COMPILE_TIMES = EXTENSION + ".compile-times.{part}.json"  # what the warm-up measured (formats/warmup.py)
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = __name__.rpartition(".")[0]

ROUTED: set = set()  # short names of the modules routed here (the build exports their kernels)
_STATE: list = []  # [manifest or None, extension or None], once per process
_FACES: dict = {}


# --- the key -----------------------------------------------------------------------------------------

def _cpu() -> str:
    """The host CPU's model and feature flags (the extension is compiled for the host CPU)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            seen = {}
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "flags", "Features", "CPU part") and name not in seen:
                    seen[name] = value.strip()
                if not line.strip() and seen:
                    break
        return repr(sorted(seen.items()))
    except OSError:
        import platform

        return platform.machine() + " " + platform.processor()


def _version_file(package: str) -> bytes:
    """The bytes of ``package``'s version file (found, not imported: importing numba is what is avoided)."""
    from importlib.util import find_spec

    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return b"absent"
    folder = list(spec.submodule_search_locations)[0]
    for name in ("_version.py", "__init__.py"):
        try:
            with open(os.path.join(folder, name), "rb") as f:
                return f.read()
        except OSError:
            continue
    return b"absent"


def current_key(sources) -> str:
    """The key an extension built from ``sources`` (file names in this folder) must carry to be used."""
    h = hashlib.sha256()
    for name in sources:
        with open(os.path.join(HERE, name), "rb") as f:
            h.update(name.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    for package in ("numba", "llvmlite"):
        h.update(hashlib.sha256(_version_file(package)).digest())
    h.update(repr(sys.version_info[:2]).encode() + _cpu().encode())
    return h.hexdigest()


# --- loading -----------------------------------------------------------------------------------------

def _crc_address() -> int:
    """ISA-L's crc32_gzip_refl (formats.kernel's CRC): the extension calls it through a pointer set here."""
    import ctypes

    import isal.isal_zlib

    fn = ctypes.CDLL(isal.isal_zlib.__file__).crc32_gzip_refl
    return ctypes.cast(fn, ctypes.c_void_p).value


def _load():
    if os.environ.get("RMQSTORE_AOT", "1") == "0":
        return None, None
    try:
        with open(os.path.join(HERE, MANIFEST), "rb") as f:
            manifest = pickle.load(f)
        if manifest.get("key") != current_key(manifest["sources"]):
            return None, None
        import ctypes

        crc = _crc_address()
        parts = []
        for name in manifest["extensions"]:  # the build's parts, compiled side by side (aotbuild.build)
            ext = importlib.import_module(PACKAGE + "." + name)
            ctypes.c_void_p.in_dll(ctypes.CDLL(ext.__file__), manifest["crc_target"]).value = crc
            parts.append(ext)
        return manifest, parts
    except Exception:  # absent, unreadable or not loadable here: the numba route, as without it
        return None, None


def use_numba() -> None:
    """From now on this process takes numba's route (the set-up's warm-up and the extension's build)."""
    _STATE[:] = [None, None]
    _FACES.clear()
    FIRST.clear()


def loaded() -> bool:
    """The extension is in use in this process."""
    if not _STATE:
        _STATE.extend(_load())
    return _STATE[1] is not None


# --- argument types, as numba types them ---------------------------------------------------------------

# numba's layout of an array from numpy's C_CONTIGUOUS (1) and F_CONTIGUOUS (2) flag bits: "C" when C-contiguous
# (a contiguous 1-d array is both), else "F" when Fortran-contiguous, else "A"
_LAYOUT = ("A", "C", "F", "C")
_ALIGNED, _WRITEABLE = 0x100, 0x400  # numpy's NPY_ARRAY_ALIGNED, NPY_ARRAY_WRITEABLE


def _array_key(dtype, ndim: int, flags: int):
    if not flags & _ALIGNED or not dtype.isnative:
        return None
    return ("array", dtype, ndim, _LAYOUT[flags & 3], not flags & _WRITEABLE)


_ARRAY_KEYS: dict = {}  # (dtype, ndim, flags) -> _array_key of them: a handful of combinations per process


def type_key(value):
    """numba's type of ``value`` in the form the build records for each exported signature; None for what an
    exported kernel never takes (the numba route handles it). Called for every argument of every kernel call
    (a tuple of 24 column arrays for the commitlog walk): an array's key is looked up by its dtype object,
    dimensions and flags (as one int) rather than built each time."""
    t = type(value)
    if t is np.ndarray:
        k = (value.dtype, value.ndim, value.flags.num)
        try:
            return _ARRAY_KEYS[k]
        except KeyError:
            key = _ARRAY_KEYS[k] = _array_key(*k)
            return key
    if t is bool or t is np.bool_:
        return "|b1"
    if t is int:
        return "<i8" if -(1 << 63) <= value < (1 << 63) else "<u8" if 0 <= value < (1 << 64) else None
    if t is float:
        return "<f8"
    if isinstance(value, np.ndarray):  # a subclass: numba refuses some, types others its own way
        return None
    if isinstance(value, np.generic):
        return value.dtype.str if value.dtype.isnative and value.dtype.kind in "biuf" else None
    if t is tuple:
        keys = tuple(map(type_key, value))
        return None if None in keys else ("tuple",) + keys
    return None


class AotKernel:
    """One kernel of the extension: calls the export compiled for the arguments' types, else ``fallback()``'s
    kernel (numba's)."""

    __slots__ = ("name", "exports", "_fallback", "_jit", "calls", "missed")

    def __init__(self, name: str, exports: dict, fallback):
        self.name, self.exports, self._fallback, self._jit = name, exports, fallback, None
        self.calls = self.missed = 0  # calls, and those that took numba's kernel

    def __call__(self, *args):
        self.calls += 1
        fn = self.exports.get(tuple(map(type_key, args)))
        if fn is None:
            self.missed += 1
            if self._jit is None:
                self._jit = self._fallback()
            return self._jit(*args)
        return fn(*args)

    def __repr__(self):
        return f"<AotKernel {self.name}: {len(self.exports)} signature(s)>"


def _kernel(module: str, func: str, fallback):
    manifest, parts = _STATE
    exports = manifest["kernels"].get((module, func))
    if not exports:
        return None
    return AotKernel(f"{module}.{func}", {key: getattr(parts[part], symbol) for key, symbol, part in exports}, fallback)


def _real(module: str):
    return importlib.import_module(PACKAGE + "." + module)


class Face(types.ModuleType):
    """A kernel module as the extension's build recorded it: its kernels (exported), simple constants and plain
    functions; any other name imports the module itself (numba's route) and takes it from there."""

    def __getattr__(self, name):
        real = _real(self.__name__.rpartition(".")[2])
        return getattr(real, name)


def _face(module: str, record: dict):
    face = Face(PACKAGE + "." + module)
    ns = face.__dict__
    ns["__builtins__"] = __builtins__  # what the plain functions' code reads builtins from
    ns.update(record["constants"])
    for name, (mod, attr) in record["imports"].items():
        target = importlib.import_module(mod)
        ns[name] = getattr(target, attr) if attr else target
    for name, func in record["kernels"].items():
        k = _kernel(module, func, lambda n=name: getattr(_real(module), n))
        if k is not None:
            ns[name] = k
    import marshal

    for name, (code, defaults, kwdefaults, doc) in record["functions"].items():
        f = types.FunctionType(marshal.loads(code), ns, name, defaults)
        f.__kwdefaults__, f.__doc__ = kwdefaults, doc
        ns[name] = f
    return face


def face(module: str):
    """The extension's face of ``module`` (for tests: whether or not the module itself is imported); None when the
    extension is not in use or does not hold it."""
    if not loaded() or module not in _STATE[0]["faces"]:
        return None
    return _face(module, _STATE[0]["faces"][module])


def kernels(module: str):
    """The kernel module ``module`` (short name: "kernel", "propkernel"...): the extension's face of it when the
    extension is in use and holds it, else the module itself (imported)."""
    ROUTED.add(module)
    face = _FACES.get(module)
    if face is not None:
        return face
    if loaded() and module in _STATE[0]["faces"] and PACKAGE + "." + module not in sys.modules:
        try:
            face = _FACES[module] = _face(module, _STATE[0]["faces"][module])
            return face
        except Exception:  # a recorded name no longer importable: the module itself
            pass
    return _real(module)


FIRST: dict = {}  # (module, name) -> AotKernel handed out by first()


def aot_first() -> bool:
    """first() hands out the extension's kernels: it is in use and numba is not imported. Once numba is in (a kernel
    the extension lacks, or a -j warm-up), first() gives numba's: a module's compile function may compile its
    helpers as a side effect another module's relies on (entrykernel on checkkernel's)."""
    return "numba" not in sys.modules and loaded()


def first(module_name: str):
    """Decorator for a module's ``compile(name)`` function (as ``checkkernel._compiled``): the extension's
    kernel ``name`` when it holds it, else what the function makes (numba's)."""
    module = module_name.rpartition(".")[2]
    ROUTED.add(module)

    def wrap(compile_kernel):
        def compiled(name: str):
            if not aot_first():
                return compile_kernel(name)
            fn = FIRST.get((module, name))
            if fn is None:
                fn = _kernel(module, name, lambda: compile_kernel(name))
                if fn is None:  # not in the extension (added since it was built)
                    return compile_kernel(name)
                FIRST[module, name] = fn
            return fn

        compiled.__wrapped__ = compile_kernel
        compiled.__doc__ = compile_kernel.__doc__
        return compiled

    return wrap
