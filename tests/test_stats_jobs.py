"""stats -j N: workers walk whole commitlog segments into their own accumulators, this process merges them in log
order up to where the log ends. The result must be that of -j 1 on every broker-written store and on seeded damage
(a log that ends early, a BLANK in the middle, garbage), with the timeline's time keys coarsened the same way."""

from __future__ import annotations

import os
import re
import random
import subprocess
import sys

import numpy as np
import pytest

from rmqstore_cli.engine.query import stats as stats_mod
from rmqstore_cli.engine.query import statsjobs
from rmqstore_cli.engine.query.stats import StatsAccumulator, compute_stats
from rmqstore_cli.engine.store import Store
from tests.conftest import REPO, STORES, copy_store, tree_digest
from tests.test_verify_memory import _damage_log
from tests.test_verify_subwindows import _damage_near_boundary

SEED = int(os.environ.get("RMQSTORE_SJOBS_SEED", random.randrange(1 << 30)))
ALL_STORES = sorted(p.name for p in STORES.iterdir() if (p / "store").is_dir()) if STORES.is_dir() else []


def _stats(root, jobs: int) -> dict:
    with Store.open(str(root)) as st:
        return compute_stats(st, jobs=jobs)


@pytest.mark.parametrize("name", ALL_STORES)
def test_jobs_equal_one_process_on_every_shared_store(name):
    root = STORES / name / "store"
    before = tree_digest(root)
    one = _stats(root, 1)
    assert _stats(root, 2) == one
    assert _stats(root, 3) == one
    assert tree_digest(root) == before


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean", "batchcq-5.3.3"])
def test_jobs_equal_one_process_on_seeded_damage(tmp_path, monkeypatch, name):
    """Damage that ends the log inside a segment (torn record, garbage, a BLANK marker in the middle of a file):
    the segments after it are walked by the workers but not counted, as one walk never reaches them. A tiny
    time-key limit makes segments coarsen their timelines at different points."""
    print(f"seed {SEED} (RMQSTORE_SJOBS_SEED)")
    rng = random.Random(f"{SEED}-{name}")
    for case in range(3):
        monkeypatch.setattr(stats_mod, "SECOND_KEYS_LIMIT", rng.choice([5, 40, 100_000]))
        root = copy_store(name, tmp_path / f"{name}-{case}")
        _damage_near_boundary(root, rng, 4096)
        if case:
            _damage_log(root, rng)
        one = _stats(root, 1)
        assert _stats(root, 2) == one
        assert _stats(root, 3) == one


def test_the_workers_walk_the_log(tmp_path, monkeypatch):
    log = tmp_path / "pids"
    real = statsjobs._segment_stats

    def walk(i, *args):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        yield from real(i, *args)

    monkeypatch.setattr(statsjobs, "_segment_stats", walk)
    root = STORES / "4.9.3-clean" / "store"
    _stats(root, 2)
    pids = log.read_text().split()
    with Store.open(str(root)) as st:
        assert len(pids) == len(st.commitlog.segments.segments)
    assert str(os.getpid()) not in pids and len(set(pids)) == 2


def _finest_unit(ts: np.ndarray, limit: int) -> int:
    """The timeline unit one walk ends with, computed directly: the finest of ms, s, min, ... at which the
    records' store times fall into at most ``limit`` distinct keys."""
    unit = 1
    while len(np.unique(ts // unit)) > limit:
        unit *= 1000 if unit == 1 else 60
    return unit


def test_partial_timelines_merge_to_the_one_walk_unit(monkeypatch):
    print(f"seed {SEED} (RMQSTORE_SJOBS_SEED)")
    rng = np.random.default_rng(SEED)
    monkeypatch.setattr(stats_mod, "SECOND_KEYS_LIMIT", 50)
    for _ in range(20):
        n = int(rng.integers(10, 3000))
        ts = 1_700_000_000_000 + np.cumsum(rng.integers(-5, 40_000, n))
        cuts = sorted(rng.choice(np.arange(1, n), size=int(rng.integers(1, 6)), replace=False).tolist())
        parts = []
        for a, b in zip([0, *cuts], [*cuts, n]):
            acc = StatsAccumulator()
            acc.topics["T"] = 0
            m = b - a
            acc.add_columns(np.zeros(m, np.int64), np.zeros(m), np.arange(a, b), np.full(m, 100), ts[a:b], np.zeros(m),
                            np.zeros(m))
            parts.append(acc)
        merged = StatsAccumulator()
        for p in parts:
            merged.merge(p)
        want = _finest_unit(ts, 50)
        assert merged.time_unit_ms == want
        keys, counts = np.unique(ts // want, return_counts=True)
        assert merged.seconds == dict(zip(keys.tolist(), counts.tolist()))


def _cli(*args):
    env = {"COLUMNS": "120", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "rmqstore_cli", *args], capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_cli_output_equals_one_process():
    root = str(STORES / "4.9.3-crash" / "store")
    for extra in ([], ["--json"]):
        one = _cli("stats", root, *extra)
        assert one[0] == 0 and one[1]
        for j in ("2", "0"):
            assert _cli("stats", "-j", j, root, *extra) == one, (j, extra)
    code, out, _ = _cli("stats", "--help")
    assert code == 0 and "0: one per core" in re.sub(r"[\s│]+", " ", out)
