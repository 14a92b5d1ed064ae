"""recover -j N and truncate -j N: forked workers walk whole commitlog segments (the broker's CRC walk, the
derived-file check, verify before and after, the re-dispatch's parsing); this process merges in log order and
writes. The output (plan text and JSON lines), the exit code and every file of the store afterwards must be
those of -j 1: on every broker-written store and on seeded damage (torn record, bad CRC mid-segment, cut consume
queue, missing index file; the seed is printed). Each pair of runs uses the same paths, so outputs compare whole."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from rmqstore_cli.engine.repair import derived_windows, recoveryjobs
from rmqstore_cli.engine.store import Store
from tests.conftest import STORES, copy_store
from tests.fuzzlib import _make_runner, add_crash, content_digest

SEED = int(os.environ.get("RMQSTORE_RJOBS_SEED", random.randrange(1 << 30)))
ALL_STORES = sorted(p.name for p in STORES.iterdir() if (p / "store").is_dir()) if STORES.is_dir() else []
_runner = None


def _cli(args: list[str]) -> tuple[int, str, str]:
    global _runner
    if _runner is None:
        _runner = _make_runner()
    res = _runner.invoke(None, args, env={"RMQSTORE_DEBUG": "1", "COLUMNS": "200"})
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture
def used(monkeypatch):
    """Counts of the -j paths taken in this process (so a test knows the workers really ran). The clock is fixed:
    an index file the re-dispatch creates is named after the time it is made (the broker's rule)."""
    from rmqstore_cli.engine.derived import indexwriter

    class Clock:
        @staticmethod
        def time() -> float:
            return 1764150000.0

    monkeypatch.setattr(indexwriter, "time", Clock)
    # small chunks and hand-overs: a worker pauses its walk and resumes it many times in each segment
    monkeypatch.setattr(recoveryjobs, "CHUNK", 7)
    monkeypatch.setattr(recoveryjobs, "HAND_OVER", 10)
    seen = {"walk": 0, "derived": 0, "dispatch": 0, "fed": 0, "pruned": 0, "along": 0, "spilled": 0}

    real_walk = recoveryjobs.broker_walk_jobs
    real_check = derived_windows.WindowedCheck.run_parallel

    def walk(*a, **k):
        seen["walk"] += 1
        return real_walk(*a, **k)

    def check(self, jobs):
        seen["derived"] += 1
        return real_check(self, jobs)

    monkeypatch.setattr(recoveryjobs, "broker_walk_jobs", walk)
    monkeypatch.setattr(derived_windows.WindowedCheck, "run_parallel", check)
    real_fed = derived_windows.FedByVerify.verdicts

    def fed(self):
        got = real_fed(self)
        if got is not None:  # the derived check answered from verify's workers' walk
            seen["fed"] += 1
            seen["derived"] += 1
        return got

    monkeypatch.setattr(derived_windows.FedByVerify, "verdicts", fed)
    from rmqstore_cli.engine.repair import walkalongjobs

    real_along, real_holds = walkalongjobs.WalkAlongJobs.run, walkalongjobs.WalkAlongJobs.check_holds

    def along(self):
        stop = real_along(self)
        if stop is not None:  # the broker's walk read off verify's workers' walk (walkalongjobs.py)
            seen["walk"] += 1
            seen["along"] += 1
        return stop

    def holds(self):
        got = real_holds(self)
        if got:  # the derived check answered from the same walk
            seen["fed"] += 1
            seen["derived"] += 1
        return got

    from rmqstore_cli.engine.repair import dispatchspill

    real_batches = dispatchspill.DispatchSpill.batches

    def batches(self, seg_start):
        seen["dispatch"] += 1  # the re-dispatch read the columns verify's workers kept (no walk of its own)
        seen["spilled"] += 1
        return real_batches(self, seg_start)

    monkeypatch.setattr(dispatchspill.DispatchSpill, "batches", batches)
    monkeypatch.setattr(walkalongjobs.WalkAlongJobs, "run", along)
    monkeypatch.setattr(walkalongjobs.WalkAlongJobs, "check_holds", holds)
    from rmqstore_cli.engine.repair import dispatchjobs

    real_skipped = dispatchjobs.skipped_units

    def skipped(batch):
        n = real_skipped(batch)
        seen["pruned"] += n  # units a re-dispatch worker left out of its batch (the queue held them)
        return n

    monkeypatch.setattr(dispatchjobs, "skipped_units", skipped)
    from rmqstore_cli.engine.repair import rebuild

    real_req = rebuild.parallel_requests

    def requests(*a, **k):
        seen["dispatch"] += 1
        return real_req(*a, **k)

    monkeypatch.setattr(rebuild, "parallel_requests", requests)
    return seen


def _same_with_jobs(src, work, command: list[str], jobs=(2,)) -> tuple:
    """``rmqstore COMMAND STORE --backup-dir B [-j N]`` on fresh copies of ``src`` at the same path: output, exit
    code and the store's files with -j 1, then the same with each N (asserted equal). Returns -j 1's."""
    results = []
    for j in (1,) + tuple(jobs):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work / "store")
        root, bak = str(work / "store"), str(work / "bak")
        code, out, err = _cli(command[:1] + [root] + command[1:] + ["--backup-dir", bak, "-j", str(j)])
        results.append((code, out, err, content_digest(work / "store")))
    one = results[0]
    for j, got in zip(jobs, results[1:]):
        assert got[0] == one[0], f"-j {j}: exit {got[0]} != {one[0]}\n{got[2]}"
        assert got[1] == one[1], f"-j {j}: stdout differs"
        assert got[2] == one[2], f"-j {j}: stderr differs"
        assert got[3] == one[3], f"-j {j}: files differ: {sorted(k for k in set(got[3]) | set(one[3]) if got[3].get(k) != one[3].get(k))}"
    return one


def _root_of(name: str):
    return STORES / name / "store"


@pytest.mark.parametrize("name", ALL_STORES)
def test_recover_jobs_equals_one_on_every_shared_store(tmp_path, name, used):
    """Every broker-written store as it is (recover refuses some layouts: the same refusal either way), and the
    classic and LMQ stores after a crash with a zeroed checkpoint (the whole log walked and re-dispatched)."""
    src = _root_of(name)
    jobs = (2, 0) if name == "4.9.3-crash" else (2,)  # -j 0: one process per core
    code, *_ = _same_with_jobs(src, tmp_path / "w", ["recover", "--json"], jobs)
    assert code in (0, 1, 2, 3)
    if code == 3 or name.startswith(("dledger", "rocksdb", "timer")):
        return
    crashed = copy_store(name, tmp_path / "crashed")
    add_crash(crashed, zero_checkpoint=True)
    code, out, err, _ = _same_with_jobs(crashed, tmp_path / "w", ["recover", "--json"])
    assert code in (0, 1), err
    if not name.startswith("batchcq"):  # batch queues: the broker's walk stays in one process
        assert used["walk"] and used["dispatch"], used  # the workers did the walks
    if not name.endswith("-ext"):  # ext queues: the whole-table check, in one process
        assert used["derived"], used


def _records(root) -> list[tuple[str, int, int, int, int]]:
    """(segment path, position, size, body start, body length) of every record."""
    out = []
    with Store.open(str(root)) as st:
        for c in st.commitlog.scan(check_crc=False):
            h = c.headers
            for p, n, b, bl in zip(h.offsets.tolist(), h.totalSize.tolist(), h.bodyStart.tolist(), h.bodyLength.tolist()):
                out.append((c.segment.path, int(p), int(n), int(b), int(bl)))
    return out


def _patch(path: str, pos: int, data: bytes) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def _damage(case, what: str, rng: random.Random) -> str:
    """One damage of ``what`` at a seeded place; says where."""
    recs = _records(case)
    segs = sorted({r[0] for r in recs})
    mid = [r for r in recs if r[0] in segs[1:-1]] or recs
    if what == "torn":
        path, pos, size, *_ = rng.choice(mid)
        cut = rng.randrange(8, size)
        _patch(path, pos + cut, b"\0" * (size - cut))
        return f"{os.path.basename(path)}@{pos}+{cut} zeroed"
    if what == "crc":
        path, pos, size, body, blen = rng.choice([r for r in mid if r[4] > 0])
        at = body + rng.randrange(blen)
        with open(path, "rb") as f:
            f.seek(at)
            b = f.read(1)[0]
        _patch(path, at, bytes([b ^ (1 << rng.randrange(8))]))
        return f"body byte {os.path.basename(path)}@{at} flipped"
    if what == "cq":
        files = sorted(str(p) for p in (case / "consumequeue").rglob("*") if p.is_file() and p.stat().st_size)
        path = rng.choice(files)
        size = os.path.getsize(path)
        keep = rng.randrange(size // 2, size) // 20 * 20 + rng.choice((0, 0, 7))
        os.chmod(path, 0o644)
        os.truncate(path, keep)
        return f"{os.path.relpath(path, case)} cut to {keep}"
    if what == "index":
        files = sorted(str(p) for p in (case / "index").iterdir())
        path = rng.choice(files)
        os.unlink(path)
        return f"{os.path.relpath(path, case)} removed"
    raise ValueError(what)


@pytest.mark.parametrize("what", ["torn", "crc", "cq", "index"])
def test_recover_jobs_equals_one_on_seeded_damage(tmp_path, what, used):
    print("seed", SEED)
    rng = random.Random(SEED * 7 + ["torn", "crc", "cq", "index"].index(what))
    names = ("4.9.3-crash", "5.3.3-clean") if what in ("torn", "crc") else (rng.choice(("4.9.3-crash", "5.3.3-clean")),)
    for name in names:
        case = copy_store(name, tmp_path / f"case-{name}")
        where = _damage(case, what, rng)
        add_crash(case, zero_checkpoint=rng.random() < 0.7)
        for extra in ([], ["--keep-valid-after"]) if what == "torn" else ([],):
            code, out, err, _ = _same_with_jobs(case, tmp_path / "w", ["recover", "--json"] + extra)
            assert code in (0, 1, 2), f"{name}, {where}: {err}"
    assert used["walk"] and used["derived"], used


def _boundaries(root) -> list[int]:
    with Store.open(str(root)) as st:
        return [int(c.segment.start + p) for c in st.commitlog.scan(check_crc=False) for p in c.headers.offsets.tolist()]


@pytest.mark.parametrize("what", [None, "cq", "index"])
def test_truncate_jobs_equals_one(tmp_path, what, used):
    print("seed", SEED)
    rng = random.Random(SEED * 11 + [None, "cq", "index"].index(what))
    for name in {None: ("4.9.3-clean", "lmq-5.3.3"), "cq": ("5.3.3-clean",), "index": ("4.9.3-clean",)}[what]:
        case = copy_store(name, tmp_path / f"case-{name}")
        where = _damage(case, what, rng) if what else "no damage"
        offsets = _boundaries(case)
        at = offsets[rng.randrange(len(offsets) // 4, len(offsets))]
        code, out, err, _ = _same_with_jobs(case, tmp_path / "w", ["truncate", "--offset", str(at), "--json"])
        assert code in (0, 1), f"{name}, {where}, --offset {at}: {err}"
    assert used["derived"], used


def test_one_file_log_is_set_up_once(monkeypatch):
    """A log of one commitlog file (the broker-written timer store) under -j 2: the derived check is set up once
    and fed by the one walk, as at -j 1. It was set up for workers that a single file does not get, then set up
    and walked again (every queue file read twice: 8192 queues, 1.4 s more). Same output as -j 1."""
    from typer.testing import CliRunner

    from rmqstore_cli.app import app

    root = str(_root_of("timer-5.3.3"))
    real = derived_windows.WindowedCheck.start.__func__
    starts = []

    def counting(cls, planner, **kwargs):
        starts.append(planner.jobs)
        return real(cls, planner, **kwargs)

    monkeypatch.setattr(derived_windows.WindowedCheck, "start", classmethod(counting))
    runs = {}
    for j in ("1", "2"):
        starts.clear()
        r = CliRunner().invoke(app, ["recover", root, "--dry-run", "--json", "-j", j])
        assert r.exit_code in (0, 1), r.output
        runs[j] = r.stdout
        assert len(starts) == 1, (j, starts)
    assert runs["1"] == runs["2"]
