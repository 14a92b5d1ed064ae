"""formats/aot.py: the ahead-of-time kernels (formats/aotbuild.py) give what numba's give.

- an argument's type key at run time is the key of the type numba gives it (what pins an export's dtypes,
  dimensions, layout and read-only-ness: pycc's own unboxing checks only the item size);
- the commitlog, property and JSON kernels run through both routes on every broker-written store's commitlog
  give the same records, reasons, CRC results, property spans and JSON bytes (and the extension's kernels were
  the ones called: no call fell back to numba);
- the DLedger entry walk does the same on every data file of every broker-written DLedger store (and on copies with
  seeded header damage), and DLedger verify prints the same through both routes;
- whole commands (verify --json, dump --json, recover --dry-run --json) print the same through both routes on the
  broker-written stores and on a copy with seeded damage (seed printed).

The last two need the extension (scripts/setup.sh builds it); without it they are skipped, saying so.
"""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from rmqstore_cli.formats import aot, fast, jsonl, propscan

from .conftest import REPO, STORE_NAMES, copy_store, shared_store

needs_extension = pytest.mark.skipif(not aot.loaded(), reason="the AOT kernel extension is not built or not "
                                     "current (python -m rmqstore_cli.formats.aotbuild)")


def _values(rnd: random.Random) -> list:
    out = [0, 1, -1, 1 << 40, (1 << 63) - 1, -(1 << 63), 1 << 63, True, False, 1.5, np.int32(7), np.int64(-3),
           np.uint8(200), np.uint64(5), np.bool_(True), np.float32(2.0), np.int16(4)]
    for dt in ("u1", "i1", "<i2", "i4", "<i8", "u4", "<u8", "f8", "?", ">i4"):
        base = np.zeros((4, 6), dtype=dt)
        for a in (base, base[0], base[:, 1], base[::2, ::3], np.asfortranarray(base), base.reshape(-1), base[0, 0:0]):
            out.append(a)
            ro = a.view()
            ro.setflags(write=False)
            out.append(ro)
    out.append(np.frombuffer(bytes(range(32)), np.uint8))  # read-only, as the kernels get mapped files
    out.append(np.frombuffer(bytearray(33), np.uint8)[1:].view(np.int32))  # unaligned
    out += [tuple(np.zeros(3, np.int32) for _ in range(7)), (np.zeros(2, np.int64), 5), (1, 2.0, True)]
    rnd.shuffle(out)
    return out


def test_an_arguments_key_is_the_key_of_numbas_type_for_it():
    import numba

    from rmqstore_cli.formats.aotbuild import signature_key

    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    for v in _values(random.Random(seed)):
        try:
            ty = numba.typeof(v)
        except Exception:  # noqa: BLE001 - numba refuses it: no export can take it
            assert aot.type_key(v) is None, (seed, v)
            continue
        want = signature_key(ty)
        if isinstance(v, np.ndarray) and not v.flags.aligned:
            want = None  # numba types it as an unaligned array, which no export is compiled for
        assert aot.type_key(v) == want, (seed, v, ty)


def _route(monkeypatch, use_extension: bool) -> dict:
    """Make fast, propscan and jsonl (formats.aot.kernels) and checkkernel/entrykernel (formats.aot.first) take
    the extension's kernels or numba's. Returns the faces handed out."""
    faces: dict = {}

    def kernels(module):
        if not use_extension:
            return importlib.import_module(f"{aot.PACKAGE}.{module}")
        if module not in faces:
            faces[module] = aot.face(module)
        return faces[module]

    monkeypatch.setattr(aot, "kernels", kernels)
    monkeypatch.setattr(fast, "_KERNEL", None)
    monkeypatch.setattr(aot, "aot_first", lambda: use_extension)
    monkeypatch.setattr(aot, "FIRST", {})
    return faces


def _commitlog_files():
    for name in STORE_NAMES:
        folder = shared_store(name) / "commitlog"
        for f in sorted(folder.iterdir()):
            yield name, f


def _all_columns(h) -> dict:
    return {k: np.array(getattr(h, k)) for k in type(h).__slots__}


def _through(data: bytes, base: int) -> dict:
    u8 = np.frombuffer(data, np.uint8)
    out = {}
    w = fast.walk(data)
    out["walk"] = (w.offsets.copy(), w.stop, w.kind, w.size, w.magic)
    step = fast.scan_records(data, 0, len(data), max_records=1 << 20, prop_crc=1)
    out["scan"] = (_all_columns(step.headers), step.stop, step.kind, step.size, step.magic, step.reason)
    h = fast.decode_headers(data, w.offsets)
    fast.validate(data, h, True, 1)
    out["decode"] = _all_columns(h)
    out["crc"] = fast.check_body_crc(data, h)
    if len(h):
        pv = propscan.scan(u8, h.propsStart, h.propsLength)
        out["props"] = ({k: v.copy() for k, v in pv.start.items()}, {k: v.copy() for k, v in pv.end.items()},
                        pv.ascii.copy())
        buf, size, ends, fallback = jsonl.kernel_lines(data, h, base, "base64")
        out["json"] = (bytes(buf[:size]), ends.copy(), fallback.copy())
    return out


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@needs_extension
def test_the_kernels_give_the_same_through_both_routes_on_broker_written_stores(monkeypatch):
    files = list(_commitlog_files())
    assert files
    for name, f in files:
        data = f.read_bytes()
        base = int(f.name)
        faces = _route(monkeypatch, True)
        ours = _through(data, base)
        _route(monkeypatch, False)
        numbas = _through(data, base)
        assert _same(ours, numbas), (name, f.name)
        kernels = [v for face in faces.values() for v in vars(face).values() if isinstance(v, aot.AotKernel)]
        assert sum(k.calls for k in kernels) > 0 and sum(k.missed for k in kernels) == 0, (name, f.name)
        monkeypatch.undo()


def _cli(args, aot_on: bool) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), RMQSTORE_AOT="1" if aot_on else "0")
    p = subprocess.run([sys.executable, "-m", "rmqstore_cli", *args], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=300)
    return p.returncode, p.stdout + p.stderr


@needs_extension
def test_commands_print_the_same_through_both_routes(tmp_path):
    seed = random.randrange(1 << 30)
    print(f"damage seed {seed}")
    damaged = copy_store("4.9.3-clean", tmp_path / "damaged")
    rnd = random.Random(seed)
    for sub in ("commitlog", "consumequeue", "index"):
        files = sorted(p for p in (damaged / sub).rglob("*") if p.is_file() and p.stat().st_size)
        for p in rnd.sample(files, min(2, len(files))):
            b = bytearray(p.read_bytes())
            for _ in range(3):
                b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
            p.write_bytes(bytes(b))
    cases = [["verify", str(shared_store(n)), "--json"] for n in STORE_NAMES]
    cases += [["dump", "commitlog", str(shared_store(n)), "--json"] for n in ("4.9.3-crash", "5.3.3-v2topic")]
    cases += [["recover", str(shared_store("4.9.3-crash")), "--dry-run", "--json"],
              ["verify", str(damaged), "--json"], ["recover", str(damaged), "--dry-run", "--json"],
              ["dump", "commitlog", str(damaged), "--json"]]
    for args in cases:
        assert _cli(args, True) == _cli(args, False), (seed, args)


@needs_extension
def test_a_call_with_types_the_extension_lacks_goes_to_numba():
    """An export is called only with the exact types it was compiled for: the commitlog walk given a writable
    buffer (the callers pass read-only ones) or an int32 output column is numba's call, same result."""
    face = aot.face("kernel")
    data = (shared_store("4.9.3-clean") / "commitlog").iterdir().__next__().read_bytes()
    walk = face.walk_offsets
    assert isinstance(walk, aot.AotKernel)
    results, misses = [], 0
    for u8, dtype in ((np.frombuffer(data, np.uint8), np.int64), (np.frombuffer(bytearray(data), np.uint8), np.int64),
                      (np.frombuffer(data, np.uint8), np.int32)):
        out = np.zeros(4096, dtype)
        args = (u8, 0, len(data), fast.MAGIC_V1, fast.MAGIC_V2, 4096, out)
        misses += tuple(aot.type_key(a) for a in args) not in walk.exports
        results.append((walk(*args), out.astype(np.int64)))
    assert misses >= 1 and walk.calls == 3 and walk.missed == misses
    assert _same(results[0], results[1]) and _same(results[0], results[2]) and results[0][0][0] > 0


# --- the DLedger entry walk (formats.dledgerkernel, routed through formats.aot.kernels) -------------------------------

def _dledger_data_files():
    from .conftest import STORES
    from .test_dledger_jobs import dledger_roots

    for rel in dledger_roots():
        for f in sorted((STORES / rel).glob("dledger-*/data/*")):
            if f.is_file():
                yield rel, f


def _entry_walk(k, u8, start: int, chunk: int, last_index: int = -1, last_term: int = -1) -> list:
    """Every step of the kernel over one data file, ``chunk`` entries at a time: (its return tuple, its columns)."""
    steps, pos = [], 0
    while True:
        cols = tuple(np.full(chunk, -7, np.int64) for _ in k.COLUMNS)
        r = k.walk_entries(u8, pos, len(u8), start, last_index, last_term, chunk, cols)
        n, pos = r[0], r[1]
        steps.append((tuple(int(v) for v in r), tuple(c[:n].copy() for c in cols)))
        if n:
            last_index, last_term = int(cols[2][n - 1]), int(cols[3][n - 1])
        if r[2] != k.K_CHUNK:
            return steps


@needs_extension
def test_the_dledger_entry_walk_gives_the_same_through_both_routes(monkeypatch):
    """On every data file of every broker-written DLedger store, whole and in chunks, from no predecessor and from
    the real one, and on copies with seeded header damage: the extension's kernel (called, never falling back to
    numba) gives the entries, stop kind, position and rule numba's does."""
    from rmqstore_cli.formats import dledgerkernel

    face = aot.face("dledgerkernel")
    assert face is not None and isinstance(face.walk_entries, aot.AotKernel), "the build exports the DLedger walk"
    assert face.COLUMNS == dledgerkernel.COLUMNS and face.K_CHUNK == dledgerkernel.K_CHUNK
    seed = random.randrange(1 << 30)
    print(f"damage seed {seed}")
    rnd = random.Random(seed)
    files = list(_dledger_data_files())
    assert files
    kinds = set()
    for rel, f in files:
        data = f.read_bytes()
        start = int(f.name)
        variants = [data]
        for _ in range(3):  # a flipped bit inside the first 48 bytes of some entry's page: header damage mostly
            b = bytearray(data)
            if b:
                at = rnd.randrange(len(b)) // 1024 * 1024
                b[min(at + rnd.randrange(48), len(b) - 1)] ^= 1 << rnd.randrange(8)
            variants.append(bytes(b))
        for v in variants:
            u8 = fast.kernel_view(v)
            for chunk in (7, 1 << 16):
                ours = _entry_walk(face, u8, start, chunk)
                numbas = _entry_walk(dledgerkernel, u8, start, chunk)
                assert _same(ours, numbas), (seed, rel, f.name, chunk)
                kinds.add(ours[-1][0][2])
                if ours[0][1][0].size:  # from the entry before the file's first, as a walk from the previous file
                    first_index = int(ours[0][1][2][0])
                    assert _same(_entry_walk(face, u8, start, chunk, first_index - 1, 0),
                                 _entry_walk(dledgerkernel, u8, start, chunk, first_index - 1, 0)), (seed, f.name)
    assert face.walk_entries.calls > 0 and face.walk_entries.missed == 0
    assert len(kinds) >= 2  # the files end in different ways (a blank, zeros, a broken header...)


@needs_extension
def test_dledger_verify_prints_the_same_through_both_routes():
    from .conftest import STORES

    for rel in ("dledger-4.9.3-clean/store", "dledger-4.9.3-crash/store", "dledger-4.9.3-torn/store-torn",
                "dledger-4.9.3-torn/store-corrupt"):
        args = ["verify", str(STORES / rel), "--json"]
        aot_run, numba_run = _cli(args, True), _cli(args, False)
        assert aot_run == numba_run and "records in" in aot_run[1], (rel, aot_run[1][-500:])


def test_the_kernels_are_dealt_to_the_parts_largest_first():
    """aotbuild.deal: each kernel, largest first, to the part with the least weight so far (worked by hand)."""
    from rmqstore_cli.formats.aotbuild import deal

    weights = {("m", "a"): 10, ("m", "b"): 7, ("m", "c"): 5, ("m", "d"): 3, ("n", "e"): 3}
    # a -> 0 (10, 0); b -> 1 (10, 7); c -> 1 (10, 12); d and e weigh the same: by name, d -> 0 (13, 12), e -> 1
    assert deal(weights, 2) == {("m", "a"): 0, ("m", "b"): 1, ("m", "c"): 1, ("m", "d"): 0, ("n", "e"): 1}
    assert deal(weights, 1) == {k: 0 for k in weights}
    assert sorted(deal(weights, 8).values()) == [0, 1, 2, 3, 4]  # more parts than kernels: one each


@needs_extension
def test_every_part_of_the_extension_is_loaded_and_holds_the_kernels_the_manifest_gives_it():
    manifest, parts = aot._STATE
    assert [p.__name__.rpartition(".")[2] for p in parts] == manifest["extensions"]
    assert manifest["extensions"][0] == aot.EXTENSION
    held = {}
    for (module, func), entries in manifest["kernels"].items():
        for _key, symbol, part in entries:
            assert callable(getattr(parts[part], symbol)), (module, func, part)
            held.setdefault(part, set()).add(symbol)
    assert sorted(held) == list(range(len(parts)))  # every part holds kernels
    print(f"{len(parts)} part(s): {[len(held[k]) for k in sorted(held)]} exports")


def _weighed_helper(x):
    return x + 1


def _weighed_kernel(x):
    return _weighed_helper(x) * 2


_weighed_helper.__module__ = _weighed_kernel.__module__ = aot.PACKAGE + ".kernel"  # as if ours: compile_weight follows


def test_the_build_deals_by_the_warm_ups_compile_times_when_it_has_one_for_every_kernel(tmp_path, monkeypatch):
    """aotbuild.compile_weights: the seconds the warm-up recorded (its parts' files merged); a kernel without one
    makes the build fall back to the bytecode measure for all (compile_weight times the signatures)."""
    import json
    import types

    from rmqstore_cli.formats import aotbuild

    monkeypatch.setattr(aot, "HERE", str(tmp_path))
    (tmp_path / aot.COMPILE_TIMES.format(part=0)).write_text(json.dumps({"kernel._a": 2.5, "other._z": 9.0}))
    (tmp_path / aot.COMPILE_TIMES.format(part=1)).write_text(json.dumps({"jsonkernel._b": 40.0}))

    helper, kernel_a = _weighed_helper, _weighed_kernel
    a = types.SimpleNamespace(py_func=kernel_a, nopython_signatures=[1, 2])
    b = types.SimpleNamespace(py_func=helper, nopython_signatures=[1])
    assert aotbuild.compile_weights({("kernel", "_a"): a, ("jsonkernel", "_b"): b}) == \
        {("kernel", "_a"): 2.5, ("jsonkernel", "_b"): 40.0}
    fallback = aotbuild.compile_weights({("kernel", "_a"): a, ("jsonkernel", "_c"): b})
    assert fallback == {("kernel", "_a"): 2 * aotbuild.compile_weight(kernel_a),
                        ("jsonkernel", "_c"): aotbuild.compile_weight(helper)}
    # the helper's bytecode counts in the kernel that calls it
    assert aotbuild.compile_weight(kernel_a) == len(kernel_a.__code__.co_code) + len(helper.__code__.co_code)


def test_the_warm_up_records_the_kernels_it_compiled_and_keeps_those_it_loaded(tmp_path, monkeypatch):
    """warmup.record_compile_times: a kernel numba compiled in this process gets its seconds; one recorded before
    (loaded from the cache this time: no timers) keeps its old entry."""
    import json

    import numba

    from rmqstore_cli.formats import warmup

    monkeypatch.setattr(aot, "HERE", str(tmp_path))
    path = tmp_path / aot.COMPILE_TIMES.format(part=1)
    path.write_text(json.dumps({"kernel._loaded_before": 7.5}))

    def _timed_probe(x):
        return x * 3

    _timed_probe.__module__ = aot.PACKAGE + ".kernel"  # as if one of ours
    probe = numba.njit(_timed_probe)
    assert probe(2) == 6  # compiled here
    warmup.record_compile_times(1)
    times = json.loads(path.read_text())
    assert times["kernel._loaded_before"] == 7.5
    assert times["kernel._timed_probe"] > 0
