"""Build the ahead-of-time kernel extension (:mod:`formats.aot`): ``python -m rmqstore_cli.formats.aotbuild``
(``scripts/setup.sh`` runs it after the kernel warm-up).

Nothing here is listed by hand. The warm-up (:func:`formats.warmup.warm_up`) runs every routed kernel through
numba's JIT with the argument types its callers pass; then every kernel compiled by then in a module routed
through :mod:`formats.aot` is exported once per signature numba compiled for it, by ``numba.pycc`` from the
same Python function (its inline helpers and intrinsics compile into it, as in the JIT). A kernel added later is
picked up by the next build; until then its calls take the numba route. ISA-L's CRC, which the JIT resolves
through a symbol registered with LLVM at run time (``formats.kernel.CRC_SYMBOL``), is a small C function of the
extension that calls through a pointer :mod:`formats.aot` sets when it loads the extension.

pycc compiles one export after another (~2.5 min in one process on a slow 2-core host), so the kernels are dealt
into parts (:func:`part_count`, :func:`deal`), each compiled by its own process into its own extension at the same
time, by the compile times the set-up's warm-up measured: one kernel, the JSON writer, is about half of the whole.

Each routed module's face is recorded too: its simple constants, the names it imported from outside numba, and
its plain Python functions (their code objects, marshalled) whose globals need nothing else — what callers use
besides the kernels. The manifest (key, exports, faces) is written last, so an interrupted build leaves no
extension that would be used.
"""

from __future__ import annotations

import gc
import hashlib
import marshal
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import types

from . import aot

CRC_TARGET = "rmqstore_crc32_target"
SIMPLE = (int, float, bool, str, bytes, type(None))
NUMBA_ROOTS = ("numba", "llvmlite")


def _simple(value) -> bool:
    if isinstance(value, tuple):
        return all(_simple(v) for v in value)
    return isinstance(value, SIMPLE) and not isinstance(value, type)


def _numba_free(mod_name: str) -> bool:
    return mod_name.split(".")[0] not in NUMBA_ROOTS


def face_of(module, kernels: dict) -> dict:
    """What callers may use of ``module`` without importing it: constants, outside imports, plain functions."""
    from numba.core.dispatcher import Dispatcher

    constants, imports, functions = {}, {}, {}
    for name, value in vars(module).items():
        if name.startswith("__"):
            continue
        if _simple(value):
            constants[name] = value
        elif isinstance(value, types.ModuleType) and _numba_free(value.__name__) and name not in kernels:
            imports[name] = (value.__name__, None)
        elif isinstance(value, (type, types.FunctionType)) and not isinstance(value, Dispatcher):
            owner = getattr(value, "__module__", None) or ""
            if owner != module.__name__ and _numba_free(owner) and getattr(sys.modules.get(owner), name, None) is value:
                imports[name] = (owner, name)
    import builtins

    available = set(constants) | set(imports) | set(kernels) | set(dir(builtins))
    for name, value in vars(module).items():
        if (isinstance(value, types.FunctionType) and value.__module__ == module.__name__ and value.__closure__ is None
                and name not in kernels):
            if _simple(value.__defaults__) and _simple(tuple((value.__kwdefaults__ or {}).values())):
                functions[name] = value
    # plain functions whose globals are all available (calling another one kept is fine)
    changed = True
    while changed:
        changed = False
        for name, f in list(functions.items()):
            if not _globals_used(f.__code__) <= available | set(functions):
                del functions[name]
                changed = True
    # callers in other modules use the public ones: those, and the plain functions they call
    keep = {n for n in functions if not n.startswith("_")}
    todo = list(keep)
    while todo:
        for n in _globals_used(functions[todo.pop()].__code__) & set(functions) - keep:
            keep.add(n)
            todo.append(n)
    functions = {n: f for n, f in functions.items() if n in keep}
    used = set().union(*(_globals_used(f.__code__) for f in functions.values()))
    imports = {name: ref for name, ref in imports.items() if name in used}  # only what the functions kept use
    return {"constants": constants, "imports": imports, "kernels": kernels,
            "functions": {n: (marshal.dumps(f.__code__), f.__defaults__, f.__kwdefaults__, f.__doc__)
                          for n, f in functions.items()}}


def _globals_used(code) -> set:
    """The global names ``code`` (and the code nested in it) loads."""
    import dis

    used = set()
    stack = [code]
    while stack:
        c = stack.pop()
        used.update(ins.argval for ins in dis.get_instructions(c) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"))
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return used


def signature_key(ty):
    """The :func:`formats.aot.type_key` of values numba types as ``ty``; None when no plain value is."""
    from numba.core import types as nt
    from numba.np.numpy_support import as_dtype

    if isinstance(ty, nt.Array):
        if not ty.aligned or ty.layout not in "CFA":
            return None
        return ("array", as_dtype(ty.dtype), ty.ndim, ty.layout, not ty.mutable)
    if isinstance(ty, (nt.Boolean, nt.Integer, nt.Float)):
        return as_dtype(ty).str
    if isinstance(ty, nt.BaseTuple):
        keys = tuple(signature_key(t) for t in ty.types)
        return None if None in keys else ("tuple",) + keys
    return None


def _sources() -> list[str]:
    """The formats sources loaded by now (the kernels' and everything they read), and this one, by file name."""
    names = {os.path.basename(__file__)}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if name.startswith(aot.PACKAGE + ".") and f and os.path.dirname(os.path.abspath(f)) == aot.HERE \
                and f.endswith(".py"):
            names.add(os.path.basename(f))
    return sorted(names)


def _fresh_flags_per_export() -> None:
    """pycc compiles every export with one Flags object; inlining an ``inline="always"`` helper sets that object's
    ``enable_ssa`` to False (numba's InlineWorker), so the next export that inlines it is typed without SSA and fails
    (a variable given two global constants). The JIT compiles each function with its own flags: so does this, and a
    kernel the JIT compiles without reference counting (``formats.kernel._jit(..., refcounts=False)``) is exported so."""
    import numba.pycc.compiler as pycc_compiler

    compile_extra = pycc_compiler.compile_extra
    if getattr(compile_extra, "fresh_flags", False):
        return

    from .kernel import NO_REFCOUNTS

    def compile_with_own_flags(typingctx, targetctx, func, args, return_type, flags, *rest, **kw):
        own = flags.copy()
        if getattr(func, NO_REFCOUNTS, False):  # as the JIT compiles it (formats.kernel._jit)
            own.nrt = False
        return compile_extra(typingctx, targetctx, func, args, return_type, own, *rest, **kw)

    compile_with_own_flags.fresh_flags = True
    pycc_compiler.compile_extra = compile_with_own_flags


def current() -> bool:
    """The extension built here is there and its key is the current one (nothing to build)."""
    try:
        with open(os.path.join(aot.HERE, aot.MANIFEST), "rb") as f:
            manifest = pickle.load(f)
        names = os.listdir(aot.HERE)
        return os.path.basename(__file__) in manifest["sources"] and manifest["key"] == aot.current_key(
            manifest["sources"]) and all(any(n.startswith(ext + ".") and not n.endswith(".manifest") for n in names)
                                         for ext in manifest["extensions"])
    except Exception:
        return False


def part_count() -> int:
    """How many processes compile the extension's parts side by side: one per core, at most 4 (each part is one more
    extension a start imports, ~0.4 ms)."""
    return max(1, min(4, os.cpu_count() or 1))


def deal(weights: dict, parts: int) -> dict:
    """(module, func) -> part: the kernels dealt largest first, each to the part with the least weight so far
    (weight: a rough measure of a kernel's compile time; its inline helpers compile into it, so it is only rough)."""
    loads = [0] * parts
    out = {}
    for kernel, weight in sorted(weights.items(), key=lambda kw: (-kw[1], kw[0])):
        k = loads.index(min(loads))
        out[kernel] = k
        loads[k] += weight
    return out


def compile_weights(dispatchers: dict) -> dict:
    """(module, func) -> weight to deal by: the seconds numba took to compile each kernel when the set-up's warm-up
    compiled them all (recorded by :func:`formats.warmup.record_compile_times`), else :func:`compile_weight` times
    its signatures. One kernel can take half of the whole (``jsonkernel._write_lines``, ~100 s of ~190 s in the JIT
    on a slow host), which the bytecode measure does not see."""
    import glob
    import json

    recorded: dict = {}
    for path in sorted(glob.glob(os.path.join(aot.HERE, aot.COMPILE_TIMES.format(part="*")))):
        try:
            with open(path) as f:
                recorded.update(json.load(f))
        except (OSError, ValueError):
            continue
    if all(f"{m}.{f}" in recorded for m, f in dispatchers):
        return {(m, f): recorded[f"{m}.{f}"] for m, f in dispatchers}
    return {k: len(d.nopython_signatures) * compile_weight(d.py_func) for k, d in dispatchers.items()}


def compile_weight(func) -> int:
    """A rough measure of a kernel's compile time: the bytecode of its function and of every function of ours it
    reaches, by a global name or a module's attribute (its jitted and inline helpers compile into it)."""
    import dis

    seen, todo, size = set(), [func], 0
    while todo:
        f = todo.pop()
        f = getattr(f, "py_func", f)  # a numba dispatcher: its Python function
        code = getattr(f, "__code__", None)
        if code is None or id(code) in seen or not str(getattr(f, "__module__", "")).startswith(aot.PACKAGE):
            continue
        seen.add(id(code))
        codes, names, attrs = [code], set(), set()
        while codes:
            c = codes.pop()
            size += len(c.co_code)
            for ins in dis.get_instructions(c):
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                    names.add(ins.argval)
                elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                    attrs.add(ins.argval)
            codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        for name in names:
            value = f.__globals__.get(name)
            if isinstance(value, types.ModuleType) and value.__name__.startswith(aot.PACKAGE):
                todo.extend(getattr(value, a) for a in attrs if callable(getattr(value, a, None)))
            elif callable(value):
                todo.append(value)
    return size


def _extension_name(part: int) -> str:
    return aot.EXTENSION if part == 0 else f"{aot.EXTENSION}{part}"


def _compile_part(part: int, parts: int, verbose: bool) -> tuple[dict, dict]:
    """Warm up through numba's route, then compile this part's kernels into its extension. Returns (this part's
    exports: (module, func) -> [(key, symbol, part)], the routed modules: full name -> short name)."""
    from numba.core.dispatcher import Dispatcher
    from numba.pycc import CC
    import llvmlite.binding as llvm

    from . import warmup

    warmup.warm_up(full=True)  # through numba's route, recording the modules routed through formats.aot
    for module in sorted(aot.ROUTED):
        aot._real(module)
    routed = {aot.PACKAGE + "." + m: m for m in aot.ROUTED}
    dispatchers = {}
    for d in gc.get_objects():
        if isinstance(d, Dispatcher) and d.overloads and d.py_func.__module__ in routed:
            dispatchers.setdefault((routed[d.py_func.__module__], d.py_func.__name__), d)
    mine = deal(compile_weights(dispatchers), parts)

    shim = os.path.join(tempfile.mkdtemp(prefix="rmqstore-aot-"), "crcshim.c")
    from . import kernel

    with open(shim, "w") as f:
        f.write("#include <stdint.h>\n"
                "typedef uint32_t (*crc_fn)(uint32_t, uintptr_t, uint64_t);\n"
                f"crc_fn {CRC_TARGET} = 0;\n"
                f"uint32_t {kernel.CRC_SYMBOL}(uint32_t init, uintptr_t address, uint64_t length)"
                f" {{ return {CRC_TARGET}(init, address, length); }}\n")

    class KernelCC(CC):
        def _get_mixin_sources(self):
            return super()._get_mixin_sources() + [shim]

    from numba.core.registry import cpu_target

    # the warm-up may have only loaded cached kernels, which skips the target's refresh (formats.kernel's lean
    # loads): compiling needs every typing and lowering registry installed, as numba's own compile does first
    cpu_target.typing_context.refresh()
    cpu_target.target_context.refresh()
    _fresh_flags_per_export()
    cc = KernelCC(_extension_name(part))
    cc.output_dir = aot.HERE
    cc.target_cpu = llvm.get_host_cpu_name()
    exports: dict = {}
    for (module, func), d in sorted(dispatchers.items()):
        if mine[module, func] != part:
            continue
        for i, sig in enumerate(d.nopython_signatures):
            key = tuple(signature_key(t) for t in sig.args)
            if None in key:
                continue
            symbol = f"{module}__{func.lstrip('_')}__{i}"
            cc.export(symbol, sig)(d.py_func)
            exports.setdefault((module, func), []).append((key, symbol, part))
            if verbose:
                print(f"  part {part}: {module}.{func}{sig.args}", file=sys.stderr)
    try:
        cc.compile()
    finally:
        shutil.rmtree(os.path.dirname(shim), ignore_errors=True)
    return exports, routed


def build(verbose: bool = False, parts: int | None = None) -> dict:
    """Build the extension: part 0 in this process, the others (:func:`part_count`) in child processes at the same
    time (pycc compiles one export after another, ~2.5 min in one process on a slow 2-core host); then the
    manifest, last, naming every part."""
    from numba.core.dispatcher import Dispatcher

    t0 = time.time()
    parts = parts or part_count()
    manifest_path = os.path.join(aot.HERE, aot.MANIFEST)
    try:
        os.unlink(manifest_path)  # no manifest while the extension is replaced
    except FileNotFoundError:
        pass
    out_dir = tempfile.mkdtemp(prefix="rmqstore-aot-parts-")
    children = []
    try:
        for k in range(1, parts):
            out = os.path.join(out_dir, f"part{k}.pickle")
            argv = [sys.executable, "-m", __spec__.name if __spec__ else aot.PACKAGE + ".aotbuild",
                    "--part", str(k), "--parts", str(parts), "--exports-out", out] + (["-v"] if verbose else [])
            children.append((k, out, subprocess.Popen(argv)))
        exports, routed = _compile_part(0, parts, verbose)
        for k, out, child in children:
            if child.wait() != 0:
                raise RuntimeError(f"part {k} of the ahead-of-time build failed (exit {child.returncode})")
            with open(out, "rb") as f:
                for kernel, entries in pickle.load(f).items():
                    exports.setdefault(kernel, []).extend(entries)
    finally:
        for _k, _out, child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        shutil.rmtree(out_dir, ignore_errors=True)
    faces = {}
    for full, module in routed.items():
        mod = sys.modules[full]
        kernels = {name: v.py_func.__name__ for name, v in vars(mod).items()
                   if isinstance(v, Dispatcher) and (module, v.py_func.__name__) in exports}
        faces[module] = face_of(mod, kernels)
    sources = _sources()
    manifest = {"key": aot.current_key(sources), "sources": sources, "kernels": exports, "faces": faces,
                "crc_target": CRC_TARGET, "extensions": [_extension_name(k) for k in range(parts)]}
    fd, tmp = tempfile.mkstemp(dir=aot.HERE, prefix=".aot-")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(manifest, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.chmod(tmp, 0o644)
    os.replace(tmp, manifest_path)
    n = sum(len(v) for v in exports.values())
    print(f"rmqstore AOT kernels: {n} exports of {len(exports)} kernels in {time.time() - t0:.0f} s, {parts} part(s) "
          f"compiled side by side ({hashlib.sha256(manifest['key'].encode()).hexdigest()[:12]})")
    return manifest


def _child(argv: list) -> None:
    """One part compiled by a child process of :func:`build`; its exports are handed back in a pickle file."""
    part, parts, out = int(argv[argv.index("--part") + 1]), int(argv[argv.index("--parts") + 1]), \
        argv[argv.index("--exports-out") + 1]
    exports, _routed = _compile_part(part, parts, verbose="-v" in argv)
    with open(out, "wb") as f:
        pickle.dump(exports, f, protocol=pickle.HIGHEST_PROTOCOL)


if __name__ == "__main__":
    if "--part" in sys.argv:
        _child(sys.argv)
    elif "--force" not in sys.argv and current():
        print("rmqstore AOT kernels: up to date")
    else:
        build(verbose="-v" in sys.argv)
