"""verify -j N: worker processes walk whole segments and run every per-window cross-check on them, this process
only merges their per-segment results. The findings (text and JSON), their order and counts, the summary and the
exit code must be those of -j 1, on every broker-written store and on seeded damage; the stores are not changed."""

from __future__ import annotations

import os
import re
import random
import struct
import subprocess
import sys

import numpy as np
import pytest

from rmqstore_cli.formats import fast

from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify import commitlog as verify_commitlog
from rmqstore_cli.engine.verify import filechecks, windowchecks
from rmqstore_cli.engine.verify.pipeline import parallel_checks, verify_store_jobs
from tests.conftest import REPO, STORES, copy_store, tree_digest
from tests.test_verify_memory import _damage_index, _damage_log, _damage_queues, _undispatch
from tests.test_verify_subwindows import _damage_near_boundary, _records

SEED = int(os.environ.get("RMQSTORE_VJOBS_SEED", random.randrange(1 << 30)))
ALL_STORES = sorted(p.name for p in STORES.iterdir() if (p / "store").is_dir()) if STORES.is_dir() else []


def _run(root, jobs: int):
    with Store.open(str(root)) as st:
        res = verify_store_jobs(st, jobs)
    return [f.as_json() for f in res.findings], res.summary, res.exit_code


def _back_in_time(root, rng: random.Random) -> None:
    """Records stored earlier than their predecessor (CL_STORE_TIME): a segment's first record (the order across
    two workers' segments) and one inside a segment."""
    recs = _records(root)
    firsts = [r for k, r in enumerate(recs) if k and r[1] != recs[k - 1][1]]
    for path, seg_start, phy, size in [rng.choice(firsts or recs[1:]), rng.choice(recs[1:])]:
        pos = phy - seg_start
        data = bytearray(open(path, "rb").read())
        ts = int(fast.decode_headers(bytes(data), np.asarray([pos], np.int64)).storeTimestamp[0])
        at = bytes(data[pos:pos + size]).index(struct.pack(">q", ts))
        struct.pack_into(">q", data, pos + at, ts - rng.randrange(1, 10**6))
        os.chmod(path, 0o644)
        with open(path, "wb") as fh:
            fh.write(bytes(data))


def _same_for_every_jobs(root, jobs=(2, 3)):
    one = _run(root, 1)
    for j in jobs:
        assert _run(root, j) == one, j
    return one


def test_every_shared_store_is_a_case():
    assert {"4.9.3-clean", "4.9.3-crash", "5.3.3-clean", "lmq-5.3.3", "batchcq-5.3.3"} <= set(ALL_STORES)


@pytest.mark.parametrize("name", ALL_STORES)
def test_jobs_equal_one_process_on_every_shared_store(monkeypatch, name):
    """Small windows (several per segment, boundaries inside records), read in place: nothing written. The
    queues' and index files' own checks are built by the workers too (not in this process as a fallback)."""
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 7000)
    monkeypatch.setattr(filechecks, "MIN_PARALLEL_BYTES", 0)
    built = []
    real = filechecks.FileChecksPlan.load

    def load(self, parts):  # here: the workers' shares of the file checks arrived (in a worker: its own list)
        got = real(self, parts)
        built.append(got is not None)
        return got

    monkeypatch.setattr(filechecks.FileChecksPlan, "load", load)
    root = STORES / name / "store"
    before = tree_digest(root)
    _same_for_every_jobs(root)
    assert tree_digest(root) == before
    with Store.open(str(root)) as st:
        if parallel_checks(st, 2) and len(st.queues()) + len(st.index.files) > 1:
            assert built == [True, True]


def test_the_workers_run_the_window_checks(tmp_path, monkeypatch):
    """With -j 2 every window is checked in a worker, never in this process, and so are the queues' and index
    files' own checks."""
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 4096)
    log = tmp_path / "pids"
    real = windowchecks.WindowChecks.window

    def window(self, rep):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return real(self, rep)

    monkeypatch.setattr(windowchecks.WindowChecks, "window", window)
    monkeypatch.setattr(filechecks, "MIN_PARALLEL_BYTES", 0)
    real_part = filechecks.FileChecksPlan.part

    def part(self, k, workers):
        with open(log.with_suffix(".files"), "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return real_part(self, k, workers)

    monkeypatch.setattr(filechecks.FileChecksPlan, "part", part)
    root = STORES / "4.9.3-clean" / "store"
    with Store.open(str(root)) as st:
        assert parallel_checks(st, 2)
        n_windows = verify_commitlog.first_windows(st.commitlog)[-1]
        verify_store_jobs(st, 2)
    pids = log.read_text().split()
    assert len(pids) == n_windows
    assert str(os.getpid()) not in pids and len(set(pids)) == 2
    builders = log.with_suffix(".files").read_text().split()
    assert str(os.getpid()) not in builders and len(set(builders)) == 2


def test_workers_walk_ahead_while_the_file_checks_travel(tmp_path, monkeypatch):
    """A worker slow to build its share of the per-file checks: the others walk windows before they have the
    checks, keep them and check them in order once the checks arrive. Same output as -j 1, with damage in the
    log, the queues and the index."""
    print(f"seed {SEED} (RMQSTORE_VJOBS_SEED)")
    rng = random.Random(f"{SEED}-ahead")
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 3000)
    monkeypatch.setattr(filechecks, "MIN_PARALLEL_BYTES", 0)
    real = filechecks.FileChecksPlan.part

    def part(self, k, workers):
        if k == 0:
            import time

            time.sleep(1.0)  # the other worker meanwhile walks up to windowchecks._WALK_AHEAD windows ahead
        return real(self, k, workers)

    monkeypatch.setattr(filechecks.FileChecksPlan, "part", part)
    root = copy_store("4.9.3-clean", tmp_path / "store")
    _damage_near_boundary(root, rng, 3000)
    for damage in (_damage_index, _damage_queues, _damage_log):
        damage(root, rng)
    _same_for_every_jobs(root, jobs=(2,))


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean", "4.9.3-ext", "lmq-5.3.3", "batchcq-5.3.3"])
def test_jobs_equal_one_process_on_seeded_damage(tmp_path, monkeypatch, name):
    """Flipped body bytes, torn tails, BLANK markers and garbage at window boundaries; lies in consume-queue units
    (wrong offsets, sizes, tags) and index entries (offsets, hashes, links); random log bytes; store times going back."""
    print(f"seed {SEED} (RMQSTORE_VJOBS_SEED)")
    rng = random.Random(f"{SEED}-{name}")
    for case in range(2):
        window = (7000, 3000)[case % 2]
        monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", window)
        monkeypatch.setattr(filechecks, "MIN_PARALLEL_BYTES", (0, 1 << 62)[case % 2])  # file checks in workers, or here
        root = copy_store(name, tmp_path / f"{name}-{case}")
        _damage_near_boundary(root, rng, window)
        for damage in rng.sample([_damage_index, _damage_queues, _damage_log, _back_in_time], rng.randint(1, 4)):
            if damage is _damage_index and not (root / "index").is_dir():
                continue
            damage(root, rng)
        before = tree_digest(root)
        findings, _, code = _same_for_every_jobs(root, jobs=(2,) if case else (2, 3))
        assert findings and code == 1
        assert tree_digest(root) == before


@pytest.mark.parametrize("how", ["none", "one", "tails", "shifted"])
def test_jobs_equal_one_process_on_undispatched_records(tmp_path, monkeypatch, how):
    """CQ_NOT_DISPATCHED / CQ_DISPATCH_LAG from per-window summaries merged in order, wherever the mark falls."""
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 7000)
    root = copy_store("5.3.3-clean", tmp_path / "s")
    _undispatch(root, how)
    findings, _, _ = _same_for_every_jobs(root, jobs=(2,))
    assert {f["code"] for f in findings} & {"CQ_NOT_DISPATCHED", "CQ_DISPATCH_LAG"}


def _cli(*args):
    env = {"COLUMNS": "120", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "rmqstore_cli", *args], capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_cli_output_and_exit_code_equal_one_process(tmp_path):
    """The command: text and --json, stdout, stderr summary and exit code; -j 0 (every core) included."""
    print(f"seed {SEED} (RMQSTORE_VJOBS_SEED)")
    root = copy_store("4.9.3-crash", tmp_path / "s")
    _damage_queues(root, random.Random(SEED))
    for extra in ([], ["--json"]):
        one = _cli("verify", str(root), *extra)
        assert one[0] == 1 and one[1]
        for j in ("2", "0"):
            assert _cli("verify", "-j", j, str(root), *extra) == one, (j, extra)


def test_help_says_what_jobs_does():
    code, out, _ = _cli("verify", "--help")
    assert code == 0
    assert "0: one per core" in re.sub(r"[\s│]+", " ", out) and "cross-check" in out


def test_summaries_that_cannot_decide_fall_back_to_one_process(monkeypatch):
    """When the dispatch summaries cannot place the high-water mark (records that overlap), the workers' result is
    dropped and the store verified in this process: still the one-process findings."""
    from rmqstore_cli.engine.verify import dispatch

    root = STORES / "4.9.3-crash" / "store"
    want = _run(root, 1)
    real = dispatch.DispatchWindows.finish
    calls = []

    def finish(self, cl, findings):
        calls.append(self.detail is not None and self.detail.cols is None)
        if calls[-1]:
            raise dispatch.NotMergeable("test")
        return real(self, cl, findings)

    monkeypatch.setattr(dispatch.DispatchWindows, "finish", finish)
    assert _run(root, 2) == want
    assert calls == [True, False]
