"""diff -j N: workers find each log's end (segment walks), compare the logs' bytes range by range and hash the index
files; this process takes the first difference in log order. The output (JSON and table) and the exit code must be
those of -j 1 on pairs of broker-written stores and on seeded damage (a changed byte, a torn record, garbage, a
log cut short, a missing file). Tiny windows and ranges make the samples' logs many ranges."""

from __future__ import annotations

import os
import random

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.query import diffjobs
from tests.conftest import STORES, copy_store, tree_digest
from tests.test_salvage_jobs import shared_roots
from tests.test_verify_memory import _damage_log
from tests.test_verify_subwindows import _damage_near_boundary

SEED = int(os.environ.get("RMQSTORE_DIFF_JOBS_SEED", random.randrange(1 << 30)))
runner = CliRunner()


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch):
    monkeypatch.setattr(diffjobs, "WINDOW", 3001)
    monkeypatch.setattr(diffjobs, "TASK", 7 * 1024 + 5)


def _diff(a, b, jobs: int, *extra) -> tuple:
    r = runner.invoke(app, ["diff", str(a), str(b), "-j", str(jobs), *extra])
    return r.exit_code, r.stdout


def _same(a, b, jobs=(2,), tables: bool = False) -> tuple:
    one = _diff(a, b, 1, "--json")
    for j in jobs:
        assert _diff(a, b, j, "--json") == one, j
    if tables:
        assert _diff(a, b, 2) == _diff(a, b, 1)
    return one


PAIRS = [("4.9.3-clean/store", "4.9.3-crash/store"), ("4.9.3-clean/store", "5.3.3-clean/store"),
         ("4.9.3-clean/store", "4.9.3-ext/store"), ("dledger-4.9.3-group/store-n0", "dledger-4.9.3-group/store-n1"),
         ("dledger-4.9.3-clean/store", "dledger-4.9.3-torn/store-corrupt")]


@pytest.mark.parametrize("rel", shared_roots())
def test_jobs_equal_one_process_on_a_store_and_itself(rel):
    root = STORES / rel
    before = tree_digest(root)
    code, out = _same(root, root)
    assert code in (0, 3), out  # 3: a layout diff refuses, refused the same way with -j
    assert tree_digest(root) == before


@pytest.mark.parametrize("a,b", PAIRS)
def test_jobs_equal_one_process_on_pairs(a, b):
    code, out = _same(STORES / a, STORES / b, jobs=(2, 3), tables=True)
    assert code in (0, 1), out


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_jobs_equal_one_process_on_seeded_damage(tmp_path, name):
    print(f"seed {SEED} (RMQSTORE_DIFF_JOBS_SEED)")
    rng = random.Random(f"{SEED}-{name}")
    src = STORES / name / "store"
    for case in range(5):
        root = copy_store(name, tmp_path / f"{name}-{case}")
        how = rng.choice(["boundary", "bytes", "cut", "missing"])
        segs = sorted((root / "commitlog").iterdir())
        if how == "boundary":
            _damage_near_boundary(root, rng, 7 * 1024 + 5)
        elif how == "bytes":
            _damage_log(root, rng)
        elif how == "cut":  # the log ends early: a prefix of the other
            p = segs[rng.randrange(len(segs))]
            keep = rng.randrange(os.path.getsize(p))
            os.chmod(p, 0o644)
            with open(p, "r+b") as fh:
                fh.seek(keep)
                fh.write(bytes(os.path.getsize(p) - keep))
        else:  # a file of the middle missing on one side
            os.remove(segs[rng.randrange(1, len(segs) - 1)])
        code, out = _same(src, root, tables=case == 0)
        assert code in (0, 1), (how, out)
        assert _same(root, src)[0] == code, how
