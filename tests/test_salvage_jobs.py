"""salvage -j N: workers walk, decode and render parts of the log, this process writes their lines in log order.
The file written, the report (JSON line) and the exit code must be those of -j 1 on every broker-written store and
on seeded damage (torn record, bad CRC, garbage, a BLANK in the middle; near part boundaries), classic and DLedger.
Tiny parts (a few KiB) make every segment of the samples several parts, so the part boundaries fall inside records
and next to the damage."""

from __future__ import annotations

import os
import random

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.repair import salvagejobs
from tests.conftest import STORES, copy_store, tree_digest
from tests.test_dledger_jobs import damage_dledger
from tests.test_verify_memory import _damage_log
from tests.test_verify_subwindows import _damage_near_boundary

SEED = int(os.environ.get("RMQSTORE_SALVAGE_JOBS_SEED", random.randrange(1 << 30)))
runner = CliRunner()


def shared_roots() -> list:
    """Every store root under ../shared/stores (a folder's store/, or its store-*/ replicas and damaged copies)."""
    if not STORES.is_dir():
        return []
    out = []
    for p in sorted(STORES.iterdir()):
        if (p / "store").is_dir():
            out.append(f"{p.name}/store")
        elif p.is_dir():
            out += [f"{p.name}/{q.name}" for q in sorted(p.iterdir()) if q.is_dir() and q.name.startswith("store-")]
    return out


def _salvage(root, out, jobs: int, *extra) -> tuple:
    r = runner.invoke(app, ["salvage", str(root), "--jsonl", str(out), "--json", "-j", str(jobs), *extra])
    data = out.read_bytes() if out.exists() else None
    return r.exit_code, r.stdout, data


def _same(root, tmp_path, *extra, jobs=(2, 3)) -> tuple:
    one = _salvage(root, tmp_path / "one.jsonl", 1, *extra)
    for j in jobs:
        assert _salvage(root, tmp_path / f"j{j}.jsonl", j, *extra) == one, j
    return one


@pytest.mark.parametrize("rel", shared_roots())
def test_jobs_equal_one_process_on_every_shared_store(rel, tmp_path, monkeypatch):
    monkeypatch.setattr(salvagejobs, "PART_BYTES", 4093)
    monkeypatch.setattr(salvagejobs, "BATCH_RECORDS", 97)  # DLedger: several rounds of batches, batches cut
    monkeypatch.setattr(salvagejobs, "WINDOW_BATCHES", 4)  # at data file ends
    root = STORES / rel
    before = tree_digest(root)
    code, out, data = _same(root, tmp_path)
    assert code in (0, 1, 3), out  # 3: a layout salvage refuses (the same refusal with -j); 1: a damaged copy
    assert code == 3 or data, out
    assert tree_digest(root) == before


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean", "4.9.3-ext"])
def test_jobs_equal_one_process_on_seeded_damage(tmp_path, monkeypatch, name):
    print(f"seed {SEED} (RMQSTORE_SALVAGE_JOBS_SEED)")
    rng = random.Random(f"{SEED}-{name}")
    for case in range(4):
        part = rng.choice([1500, 4093, 9000, 65536])
        monkeypatch.setattr(salvagejobs, "PART_BYTES", part)
        root = copy_store(name, tmp_path / f"{name}-{case}")
        hows = [_damage_near_boundary(root, rng, part) for _ in range(rng.randint(1, 3))]
        if case % 2:
            _damage_log(root, rng)
        (tmp_path / f"out-{case}").mkdir()
        code, out, _ = _same(root, tmp_path / f"out-{case}", jobs=(2,))
        assert code in (0, 1), (hows, out)


def test_jobs_equal_one_process_with_a_time_range(tmp_path, monkeypatch):
    """--since/--until: the walk ends at the first record past the range in whichever part it lies."""
    monkeypatch.setattr(salvagejobs, "PART_BYTES", 3000)
    root = STORES / "4.9.3-clean" / "store"
    from rmqstore_cli.engine.store import Store

    with Store.open(str(root)) as st:
        ts = sorted(m["storeTimestamp"] for m in st.commitlog.records(with_body=False))
    rng = random.Random(SEED)
    for case in range(3):
        lo, hi = sorted(rng.sample(ts, 2))
        (tmp_path / str(case)).mkdir()
        code, out, data = _same(root, tmp_path / str(case), "--since", str(lo), "--until", str(hi), jobs=(2,))
        assert code == 0 and data.count(b"\n") == sum(lo <= t <= hi for t in ts)


@pytest.mark.parametrize("name", ["dledger-4.9.3-clean", "dledger-5.3.3-clean"])
def test_dledger_jobs_equal_one_process_on_seeded_damage(tmp_path, monkeypatch, name):
    print(f"seed {SEED} (RMQSTORE_SALVAGE_JOBS_SEED)")
    monkeypatch.setattr(salvagejobs, "BATCH_RECORDS", 150)
    monkeypatch.setattr(salvagejobs, "WINDOW_BATCHES", 3)
    rng = random.Random(f"{SEED}-{name}")
    for case in range(4):
        root = copy_store(name, tmp_path / f"{name}-{case}")
        hows = damage_dledger(root, rng)
        (tmp_path / f"out-{case}").mkdir()
        code, out, _ = _same(root, tmp_path / f"out-{case}", jobs=(2,))
        assert code in (0, 1), (hows, out)


def test_the_workers_render(tmp_path, monkeypatch):
    """-j 2 on a classic log: the lines come from two worker processes, not from this one."""
    monkeypatch.setattr(salvagejobs, "PART_BYTES", 1 << 16)
    log = tmp_path / "pids"
    real = salvagejobs._part_piece

    def part(j, *args):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        yield from real(j, *args)

    monkeypatch.setattr(salvagejobs, "_part_piece", part)
    _salvage(STORES / "4.9.3-clean" / "store", tmp_path / "out.jsonl", 2)
    pids = log.read_text().split()
    assert str(os.getpid()) not in pids and len(set(pids)) == 2
