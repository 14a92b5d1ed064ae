"""recover's re-dispatch read from the dispatch columns the plan's walk kept (repair/dispatchspill.py) leaves the
same files, output and exit code as the re-dispatch that walks the log itself: in one process and with ``-j 2``,
on broker-written stores turned into crash copies (abort present, checkpoint zeroed: the whole log is
re-dispatched), with consume queues cut short (units written again), with queue bytes flipped, and with seeded
damage of the log (a bad body CRC, a torn record: the walk along may not answer, then the columns are not
used). The seed is printed; RMQSTORE_SPILL_SEED repeats it."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.repair import dispatchspill

from .conftest import STORES, json_lines
from .fuzzlib import tree_bytes
from .test_recover_queues_complete import crash_copy
from .test_recover_walk_along import _damage

SEED = int(os.environ.get("RMQSTORE_SPILL_SEED", random.randrange(1 << 30)))
STORE_NAMES = ["4.9.3-crash", "4.9.3-clean", "5.3.3-clean", "5.3.3-v2topic", "lmq-5.3.3", "4.9.3-ext"]
runner = CliRunner()


def _recover(root, backup, monkeypatch, spill: bool, jobs: int, taken: Path | None = None):
    """``taken``: a file verify after the apply adds a line to for each chunk it took from the kept columns
    ("take OFFSET") and each segment it did not read again ("replay START"), from -j's workers too."""
    used = []
    real_batches = dispatchspill.DispatchSpill.batches
    real_take = dispatchspill.SpilledColumns.take
    real_replay = dispatchspill.SpilledColumns.replay

    def batches(self, seg_start):
        used.append(seg_start)
        return real_batches(self, seg_start)

    def note(line: str) -> None:
        if taken is not None:
            with open(taken, "a") as f:
                f.write(line + "\n")

    def take(self, phy, size):
        got = real_take(self, phy, size)
        if got is not None:
            note(f"take {int(phy[0])}")
        return got

    def replay(self, commitlog, seg, *a):
        got = real_replay(self, commitlog, seg, *a)
        if got is not None:
            note(f"replay {seg.start}")
        return got

    with monkeypatch.context() as m:
        if spill:
            m.setattr(dispatchspill.DispatchSpill, "batches", batches)
            m.setattr(dispatchspill.SpilledColumns, "take", take)
            m.setattr(dispatchspill.SpilledColumns, "replay", replay)
        else:
            m.setattr(dispatchspill.DispatchSpill, "create", classmethod(lambda cls, *a: None))
        r = runner.invoke(app, ["recover", str(root), "--json", "--backup-dir", str(backup), "-j", str(jobs)])
    lines = [{k: v for k, v in o.items() if k != "backup"} for o in json_lines(r.stdout)]
    return r.exit_code, lines, tree_bytes(Path(root)), used


def _case(name, root, variant: str, rng: random.Random) -> str:
    if variant in ("crash", "cut", "damage"):
        crash_copy(name, root, variant, rng)
        return variant
    crash_copy(name, root, "crash", rng)
    return _damage(rng, root, variant)


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("variant", ["crash", "cut", "damage", "crc", "torn"])
@pytest.mark.parametrize("name", STORE_NAMES)
def test_dispatch_from_the_walks_columns_changes_nothing(name, variant, jobs, tmp_path, monkeypatch):
    if not (STORES / name / "store").is_dir():
        pytest.fail(f"broker-written store {name} missing under {STORES}")
    print(f"seed {SEED} (RMQSTORE_SPILL_SEED)")
    root = tmp_path / "store"  # both runs on a copy at the same path: the plan and steps print it
    what = _case(name, root, variant, random.Random(SEED))
    before = tree_bytes(Path(root))
    taken = tmp_path / "taken"  # chunks verify after the apply took from the kept columns
    code_s, out_s, files_s, used = _recover(root, tmp_path / "bak", monkeypatch, True, jobs, taken)
    root.rename(tmp_path / "spilled")
    if (tmp_path / "bak").exists():  # not when the plan was not applied (a torn record: data loss)
        (tmp_path / "bak").rename(tmp_path / "bak-spilled")
    _case(name, root, variant, random.Random(SEED))
    assert tree_bytes(Path(root)) == before
    code_w, out_w, files_w, _ = _recover(root, tmp_path / "bak", monkeypatch, False, jobs)
    where = f"seed {SEED}: {name}, {what}, -j {jobs}"
    assert code_s == code_w, where
    assert out_s == out_w, where
    assert files_s == files_w, where
    if variant in ("crash", "cut") and name in ("4.9.3-clean", "5.3.3-clean", "4.9.3-crash"):
        assert used, f"{where}: the re-dispatch walked the log although the plan's walk kept its columns"
        # the apply wrote no commitlog file: verify after it reads none again
        replayed = sorted(int(line.split()[1]) for line in taken.read_text().split("\n") if line.startswith("replay "))
        log = sorted(int(p.name) for p in (tmp_path / "spilled" / "commitlog").iterdir())
        assert replayed == log, f"{where}: verify after the apply read unchanged segments again"
    if name == "4.9.3-ext":
        assert not used, where  # ext units: the dispatcher's own walk


def test_spill_folder_is_removed(tmp_path, monkeypatch):
    """The columns' folder is gone once recover returns, whether the apply read it or not."""
    made = []
    real_create = dispatchspill.DispatchSpill.create.__func__

    def create(cls, near, log_bytes):
        s = real_create(cls, near, log_bytes)
        if s is not None:
            made.append(s.dir)
        return s

    monkeypatch.setattr(dispatchspill.DispatchSpill, "create", classmethod(create))
    for k, variant in enumerate(("crash", "torn")):
        root = tmp_path / f"store{k}"
        _case("4.9.3-clean", root, variant, random.Random(SEED))
        r = runner.invoke(app, ["recover", str(root), "--json", "--backup-dir", str(tmp_path / f"bak{k}")])
        assert r.exit_code in (0, 1, 2), r.stdout  # 2: a torn record, the plan loses data and is not applied
    assert made, "no spill was made for a crash copy"
    assert not [d for d in made if os.path.exists(d)], made


def test_a_killed_recovers_folder_is_removed_by_the_next(tmp_path, monkeypatch):
    """SIGKILL runs no exit handler: the columns' folder of a killed recover stays until the next recover's
    DispatchSpill.create removes it (its process is gone); a folder of a live process is left alone."""
    import subprocess
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{dispatchspill.PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{dispatchspill.PREFIX}{os.getppid()}-def"  # pytest's parent: alive
    other = tmp_path / ".rmqstore-spill-xyz"  # not a columns folder
    for d in (dead, live, other):
        d.mkdir()
        (d / "00000000000000000000").write_bytes(b"x")
    s = dispatchspill.DispatchSpill.create(str(tmp_path / "store"), 1 << 20)
    try:
        assert s is not None and os.path.basename(s.dir).startswith(f"{dispatchspill.PREFIX}{os.getpid()}-")
        assert not dead.exists()
        assert live.exists() and other.exists()
    finally:
        s.remove()


def test_a_chunks_columns_read_back_as_written(tmp_path):
    """The column files' framing (dispatchspill.write_chunk / read_chunk): every column comes back with its values and
    the type the re-dispatch takes, chunk after chunk (one with no key hashes, one with none of either); a file cut
    inside a chunk is an error, not a shorter log."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    print("seed", SEED)
    chunks = []
    for n, m in ((5, 9), (3, 0), (0, 0), (700, 1400)):
        cols = tuple(rng.integers(-(1 << 31), 1 << 31, n).astype(dtype) for _, dtype in dispatchspill._COLUMNS)
        chunks.append((cols, rng.integers(-(1 << 31), 1 << 31, m).astype(np.int32)))
    path = tmp_path / "columns"
    with open(path, "wb") as f:
        for cols, hashes in chunks:
            dispatchspill.write_chunk(f, cols, hashes)
    with open(path, "rb") as f:
        for cols, hashes in chunks:
            got_cols, got_hashes = dispatchspill.read_chunk(f)
            for (name, dtype), want, got in zip(dispatchspill._COLUMNS, cols, got_cols):
                assert got.dtype == dtype and np.array_equal(got, want), name
            assert got_hashes.dtype == np.int32 and np.array_equal(got_hashes, hashes)
        assert dispatchspill.read_chunk(f) is None
    whole = path.read_bytes()
    for cut in (3, 16 + 8 * 5 - 1, len(whole) - 1):
        path.write_bytes(whole[:cut])
        with open(path, "rb") as f, pytest.raises(EOFError):
            while dispatchspill.read_chunk(f) is not None:
                pass


def _verify_fed_and_alone(root, spill, where: str):
    """verify of the store at ``root`` fed what the plan's walk kept (``spill``) asserted equal to verify alone; returns
    what it took from the kept walk: (each chunk's first record's offset, the start of each segment not read again)."""
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store

    taken, replayed = [], []
    real_take, real_replay = dispatchspill.SpilledColumns.take, dispatchspill.SpilledColumns.replay

    def take(self, phy, size):
        got = real_take(self, phy, size)
        if got is not None:
            taken.append(int(phy[0]))
        return got

    def replay(self, commitlog, seg, *a):
        got = real_replay(self, commitlog, seg, *a)
        if got is not None:
            replayed.append(seg.start)
        return got

    with Store.open(str(root)) as st:
        alone = verify_store(st)
        dispatchspill.SpilledColumns.take, dispatchspill.SpilledColumns.replay = take, replay
        try:
            fed = verify_store(st, columns=dispatchspill.SpilledColumns(spill, st.config.delay_table))
        finally:
            dispatchspill.SpilledColumns.take, dispatchspill.SpilledColumns.replay = real_take, real_replay
    key = lambda r: ([f.as_json() for f in r.findings], r.summary)  # noqa: E731
    assert key(fed) == key(alone), where
    return taken, replayed


@pytest.mark.parametrize("name", STORE_NAMES)
def test_verify_fed_the_kept_columns_finds_what_it_finds_alone(name, tmp_path):
    """verify's walk fed the columns a plan's one-process walk kept (dispatchspill.SpilledColumns) gives the same
    result as its own property pass: on the crash copy the plan walked, with the columns of every chunk taken; on a
    copy whose log was cut short at a seeded place (the records after it are not the plan's: from there on it
    computes them)."""
    from rmqstore_cli.engine.repair.recovery import plan_recovery
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store

    rng = random.Random(SEED)
    print(f"seed {SEED} (RMQSTORE_SPILL_SEED)")

    def planned(root):
        st = Store.open(str(root))
        plan = plan_recovery(st, st.config.version, with_verify=True, jobs=1, spill_dispatch=True)
        st.close()
        return plan.dispatch_spill

    def both(root, spill):
        return _verify_fed_and_alone(root, spill, f"seed {SEED}: {name}")

    root = tmp_path / "store"
    crash_copy(name, root, "crash", rng)
    spill = planned(root)
    try:
        assert spill is not None and spill.usable, name
        with Store.open(str(root)) as st:
            records = verify_store(st).summary["commitlog"]["records"]
        taken, replayed = both(root, spill)
        kept = any(part[0] for part in spill.parts.values())  # not a segment with multi-dispatch records (LMQ)
        assert bool(taken or replayed) == (kept and records > 0), f"{name}: chunks taken {len(taken)}, kept: {kept}"
        log = sorted((root / "commitlog").iterdir())
        if name == "4.9.3-clean":  # the demo's broker-written twin: every segment's columns kept, none read again
            assert replayed == [int(p.name) for p in log], name
        k = rng.randrange(len(log))
        seg, seg_start = log[k], int(log[k].name)
        data = bytearray(seg.read_bytes())
        at = rng.randrange(len(data) // 2 + 1)
        data[at:] = bytes(len(data) - at)  # the log ends there: its later records are gone
        seg.write_bytes(bytes(data))
        for later in log[log.index(seg) + 1:]:
            later.unlink()
        after_cut, replayed_after = both(root, spill)
        assert all(p < seg_start + at for p in after_cut), f"seed {SEED}: {name}: columns taken past the cut"
        # the segment cut was written after the plan's walk: read again, not made from what that walk kept
        assert seg_start not in replayed_after, f"seed {SEED}: {name}: the cut segment was not read again"
        assert set(replayed_after) <= set(replayed), name
    finally:
        spill.remove()


def test_verify_reads_a_segment_again_when_its_kept_columns_are_gone(tmp_path):
    """A scratch file of the plan's walk removed before verify after the apply (a temporary-folder cleaner): that
    segment is read again, the others are taken from what the walk kept, and the result is verify's alone."""
    from rmqstore_cli.engine.repair.recovery import plan_recovery
    from rmqstore_cli.engine.store import Store

    print(f"seed {SEED} (RMQSTORE_SPILL_SEED)")
    root = tmp_path / "store"
    crash_copy("4.9.3-clean", root, "crash", random.Random(SEED))
    with Store.open(str(root)) as st:
        spill = plan_recovery(st, st.config.version, with_verify=True, jobs=1, spill_dispatch=True).dispatch_spill
    try:
        assert spill is not None and spill.usable
        log = sorted(int(p.name) for p in (root / "commitlog").iterdir())
        gone = random.Random(SEED).choice([s for s in log if os.path.exists(spill.path(s))])
        os.unlink(spill.path(gone))
        _, replayed = _verify_fed_and_alone(root, spill, f"seed {SEED}")
        assert gone not in replayed and replayed, (gone, replayed)
    finally:
        spill.remove()


@pytest.mark.parametrize("jobs", [1, 2])
def test_recover_with_a_scratch_file_gone_before_the_apply(jobs, tmp_path, monkeypatch):
    """A scratch file of the plan's walk removed between the plan and the apply: the re-dispatch walks the log
    itself and verify after the apply reads that segment again; files, output and exit code are those of a recover
    that kept no columns."""
    from rmqstore_cli.engine.repair import apply as apply_mod

    print(f"seed {SEED} (RMQSTORE_SPILL_SEED)")
    real_apply = apply_mod.apply_plan

    def apply_plan(plan, *a, **k):
        spill = plan.dispatch_spill
        files = sorted(os.listdir(spill.dir))
        os.unlink(os.path.join(spill.dir, random.Random(SEED).choice(files)))
        return real_apply(plan, *a, **k)

    root = tmp_path / "store"
    _case("4.9.3-clean", root, "crash", random.Random(SEED))
    with monkeypatch.context() as m:
        m.setattr(apply_mod, "apply_plan", apply_plan)
        code_s, out_s, files_s, used = _recover(root, tmp_path / "bak", monkeypatch, True, jobs)
    assert not used  # not every segment's columns: the re-dispatch walked
    root.rename(tmp_path / "spilled")
    _case("4.9.3-clean", root, "crash", random.Random(SEED))
    code_w, out_w, files_w, _ = _recover(root, tmp_path / "bak2", monkeypatch, False, jobs)
    assert (code_s, out_s, files_s) == (code_w, out_w, files_w), f"seed {SEED}, -j {jobs}"
