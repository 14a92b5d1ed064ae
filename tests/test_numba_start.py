"""formats/numbastart.py: what it leaves out of a cached kernel load changes nothing a kernel gets.

- an ndarray argument's numba type without numpy.ma imported is the type numba's own rule gives;
- the NRT's machine code loaded from its cache works (arrays made and freed by a cached kernel balance),
  a damaged cache entry is compiled again, and a load from the cache compiles nothing;
- importlib.metadata made to load on first use (rmqstore_cli.app.load_on_first_use) is the real module.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from .conftest import REPO


def _arrays(rnd: random.Random) -> list:
    dtypes = ["u1", "i1", "<i2", "i4", "i8", "u8", "f4", "f8", "c16", "?", "M8[ms]", "m8[s]", "S5", "U3", ">i4", "O",
              [("a", "<i4"), ("b", "<f8")], [("a", "u1", (3,)), ("b", "<i8")]]
    out = []
    for dt in dtypes:
        base = np.zeros((4, 6), dtype=dt)
        for a in (base, base[0], base[:, 1], base[::2, ::3], np.asfortranarray(base), base.reshape(-1), base[0, 0:0],
                  np.zeros((), dtype=dt), np.zeros((2, 3, 2), dtype=dt).transpose(2, 0, 1)):
            out.append(a)
            ro = a.view()
            ro.setflags(write=False)
            out.append(ro)
    out.append(np.frombuffer(bytes(range(32)), np.uint8))  # a read-only buffer, as the kernels get the files
    out.append(np.frombuffer(bytearray(32), np.int64))
    rnd.shuffle(out)
    return out


def _typed(rule, a, ctx):
    try:
        return rule(a, ctx)
    except Exception as e:  # noqa: BLE001 - the same refusal is what is compared
        return (type(e), str(e))


def test_an_array_is_typed_as_numba_types_it_without_numpy_ma(monkeypatch):
    from numba.core.typing.typeof import Purpose, _TypeofContext, typeof_impl

    from rmqstore_cli.formats import numbastart

    assert numbastart.APPLIED == numbastart.applies()
    seed = random.randrange(1 << 30)
    ours = typeof_impl.dispatch(np.ndarray)
    numbas = getattr(ours, "numba_rule", ours)
    arrays = _arrays(random.Random(seed))
    import numpy.ma  # noqa: F401  (numba's rule reads numpy.ma.MaskedArray; the lean path must not need it)

    expected = [_typed(numbas, a, _TypeofContext(Purpose.argument)) for a in arrays]
    monkeypatch.delitem(sys.modules, "numpy.ma")  # as at a command's start: no masked array can exist
    got = [_typed(ours, a, _TypeofContext(Purpose.argument)) for a in arrays]
    assert got == expected, seed
    assert any(not isinstance(t, tuple) and t.mutable is False for t in got)  # read-only arrays were seen
    monkeypatch.undo()
    import numba

    with pytest.raises(numba.core.errors.NumbaTypeError, match="MaskedArray"):
        numba.typeof(np.ma.array([1, 2], mask=[0, 1]))


PROBE_KERNEL = """
import numba
import numpy as np


@numba.njit(cache=True)
def doubled(n):
    return np.arange(n) * 2
"""

# Runs the probe kernel (made arrays need the NRT) in a fresh process with numbastart applied;
# argv: folder of the probe module, "cached" (the NRT must come from its cache) or "any".
RUN = """
import sys
sys.path.insert(0, sys.argv[1])
from rmqstore_cli.formats import numbastart
from numba.core.runtime import nrtdynmod, rtsys
assert numbastart.APPLIED
if sys.argv[2] == "cached":
    def refuse(ctx):
        raise AssertionError("the NRT was compiled although its cache entry is there")
    nrtdynmod.create_nrt_module = refuse
import numpy as np
import probe_kernel
total = 0
for n in range(1, 300):
    a = probe_kernel.doubled(n)
    assert (a == np.arange(n) * 2).all()
    total += int(a.sum())
    del a
stats = rtsys.get_allocation_stats()
print(total, stats.alloc - stats.free, stats.mi_alloc - stats.mi_free)
"""


def test_the_runtime_loaded_from_its_cache_works(tmp_path):
    (tmp_path / "probe_kernel.py").write_text(PROBE_KERNEL)
    cache = tmp_path / "cache"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), NUMBA_NRT_STATS="1", PYTHONPATH=str(REPO))
    env.pop("NUMBA_CACHE_LOCATOR_CLASSES", None)

    def run(mode):
        p = subprocess.run([sys.executable, "-c", RUN, str(tmp_path), mode], capture_output=True, text=True, env=env,
                           cwd=REPO, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return p.stdout.split()

    want = [str(sum(2 * i for n in range(1, 300) for i in range(n))), "0", "0"]
    assert run("any") == want  # compiles the kernel and the NRT, caches both
    entries = sorted(cache.rglob(numbastart_prefix() + "*"))
    assert len(entries) == 1
    assert run("cached") == want  # kernel and NRT from the caches: nothing compiled, allocations balance
    entries[0].write_bytes(b"not a pickle")
    assert run("any") == want  # a damaged entry: compiled again and rewritten
    assert entries[0].read_bytes() != b"not a pickle"
    assert run("cached") == want


def numbastart_prefix() -> str:
    from rmqstore_cli.formats import numbastart

    return numbastart.NRT_CACHE_PREFIX


LAZY = """
import sys
from rmqstore_cli.app import load_on_first_use
load_on_first_use("importlib.metadata")
assert "importlib.metadata._meta" not in sys.modules  # not loaded yet
from importlib import metadata
assert metadata is sys.modules["importlib.metadata"]
import numpy
assert metadata.version("numpy") == numpy.__version__  # loads it: the real module
assert "importlib.metadata._meta" in sys.modules
import importlib.metadata
assert importlib.metadata.version("numpy") == numpy.__version__
load_on_first_use("importlib.metadata")  # already there: left as it is
assert sys.modules["importlib.metadata"] is metadata
print("ok")
"""


def test_a_module_loaded_on_first_use_is_the_real_module():
    p = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_the_runtime_cache_key_follows_the_codegen_identity():
    """A different CPU (name or features) or LLVM triple gives another cache entry, never the same one."""
    from numba.core.registry import cpu_target

    from rmqstore_cli.formats import numbastart

    ctx = cpu_target.target_context
    real = ctx.codegen().magic_tuple()

    class Codegen:
        def __init__(self, magic):
            self._magic = magic

        def magic_tuple(self):
            return self._magic

    class Ctx:
        def __init__(self, magic):
            self._codegen = Codegen(magic)
            self.call_conv = ctx.call_conv

        def codegen(self):
            return self._codegen

    key = numbastart.nrt_cache_key(Ctx(real))
    assert key == numbastart.nrt_cache_key(ctx) and key == numbastart.nrt_cache_key(Ctx(tuple(real)))
    triple, cpu, features = real
    others = {numbastart.nrt_cache_key(Ctx(m)) for m in
              [(triple, cpu + "x", features), (triple, cpu, features + ",+avx512f"), ("aarch64-unknown-linux-gnu", cpu, features)]}
    assert key not in others and len(others) == 3
