"""recover's re-dispatch when the plan proves no consume-queue unit is missing (apply.run_dispatch's
``queues_complete``: the queues are not opened and their units are counted as skipped) leaves every file, the
printed plan and steps, the JSON ``applied`` line (cqSkipped included) and the exit code exactly as the full
re-dispatch (every queue read and every unit put and skipped) does, in one process and with ``-j 2`` (whose
workers then make no queue plan): on broker-written stores turned into crash
copies (abort present, checkpoint zeroed), with some queues' last files cut short (units ARE missing: the full
path must run) and with seeded damage in the queues (the seed is printed)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.derived import cqwriter
from rmqstore_cli.engine.repair import apply as apply_mod

from .conftest import STORES, copy_store, json_lines, seed_params
from .fuzzlib import tree_bytes

SEED = int(os.environ.get("RMQSTORE_QUEUES_COMPLETE_SEED", random.randrange(1 << 30)))
STORE_NAMES = ["4.9.3-crash", "4.9.3-clean", "5.3.3-clean", "5.3.3-v2topic", "4.9.3-ext", "lmq-5.3.3"]
runner = CliRunner()


def crash_copy(name: str, dest, variant: str, rng: random.Random):
    root = copy_store(name, dest)
    (root / "abort").write_bytes(b"")
    cp = root / "checkpoint"
    if cp.exists():
        cp.write_bytes(bytes(cp.stat().st_size))
    lasts = []
    cq = root / "consumequeue"
    if cq.is_dir():
        for topic in sorted(os.listdir(cq)):
            for qid in sorted(os.listdir(cq / topic)):
                names = sorted(n for n in os.listdir(cq / topic / qid) if n.isdigit())
                if names:
                    lasts.append(cq / topic / qid / names[-1])
    if variant == "cut":  # every other queue's last file loses its last few units: the re-dispatch must add them
        for p in lasts[::2]:
            data = bytearray(p.read_bytes())
            used = len(data.rstrip(b"\0")) // 20 * 20
            keep = max(0, used - 20 * rng.randrange(1, 4))
            data[keep:] = bytes(len(data) - keep)
            p.write_bytes(bytes(data))
    elif variant == "damage":  # a few bytes of some queues' last files flipped
        for p in rng.sample(lasts, min(3, len(lasts))):
            data = bytearray(p.read_bytes())
            used = len(data.rstrip(b"\0"))
            for _ in range(2):
                if used:
                    data[rng.randrange(used)] ^= 1 << rng.randrange(8)
            p.write_bytes(bytes(data))
    return root


def recover(root, backup, monkeypatch, force_full: bool, jobs: int = 1):
    seen = {"complete": [], "writers": 0}
    real_run, real_init = apply_mod.run_dispatch, cqwriter.ConsumeQueueWriter.__init__

    def run_dispatch(*a, **kw):
        if force_full:
            kw["queues_complete"] = False
        seen["complete"].append(kw.get("queues_complete"))
        return real_run(*a, **kw)

    def init(self, *a, **kw):
        seen["writers"] += 1
        real_init(self, *a, **kw)

    with monkeypatch.context() as m:
        m.setattr(apply_mod, "run_dispatch", run_dispatch)
        m.setattr(cqwriter.ConsumeQueueWriter, "__init__", init)
        r = runner.invoke(app, ["recover", str(root), "--json", "--backup-dir", str(backup), "-j", str(jobs)])
    lines = [{k: v for k, v in o.items() if k != "backup"} for o in json_lines(r.stdout)]
    return r.exit_code, lines, tree_bytes(Path(root)), seen


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("variant", ["crash", "cut", "damage"])
@pytest.mark.parametrize("name", STORE_NAMES)
def test_skipping_complete_queues_changes_nothing(name, variant, jobs, tmp_path, monkeypatch):
    if not (STORES / name / "store").is_dir():
        pytest.fail(f"broker-written store {name} missing under {STORES}")
    print(f"seed {SEED} (RMQSTORE_QUEUES_COMPLETE_SEED)")
    # both runs on a copy at the same path (the plan and steps print it), one after the other
    root = tmp_path / "store"
    crash_copy(name, root, variant, random.Random(SEED))
    before = tree_bytes(Path(root))
    code_f, out_f, files_f, seen_f = recover(root, tmp_path / "bak", monkeypatch, force_full=False, jobs=jobs)
    root.rename(tmp_path / "fast")
    (tmp_path / "bak").rename(tmp_path / "bak-fast")
    crash_copy(name, root, variant, random.Random(SEED))
    assert tree_bytes(Path(root)) == before
    code_r, out_r, files_r, seen_r = recover(root, tmp_path / "bak", monkeypatch, force_full=True, jobs=jobs)
    assert code_f == code_r
    assert out_f == out_r
    assert files_f == files_r
    plan = next((o for o in out_r if o.get("type") == "recover-plan"), {})
    applied = next((o for o in out_r if o.get("type") == "applied"), None)
    new_units = (plan.get("dispatch") or {}).get("newConsumeQueueUnits")
    if seen_f["complete"] and seen_f["complete"][0]:
        # the fast path ran: the plan proved every unit present and no queue writer opened a file
        assert new_units == 0 and applied["dispatch"]["cqUnits"] == 0
        if name != "4.9.3-ext":  # with ext units the Dispatcher keeps the full path (its ext writers)
            assert seen_f["writers"] < seen_r["writers"] or seen_r["writers"] == 0
    if variant == "crash" and name in ("4.9.3-crash", "4.9.3-clean", "5.3.3-clean"):
        assert seen_f["complete"] == [True]  # the case this path is for is taken
        assert applied["dispatch"]["cqSkipped"] > 0
    if variant == "cut" and seen_f["complete"]:
        assert seen_f["complete"] == [False]  # units missing: the full dispatch


@pytest.mark.parametrize("seed", seed_params(2, 11, draw=[SEED, SEED + 1]))
def test_dispatcher_counts_complete_queues_as_the_puts_skip_them(tmp_path, seed):
    """Dispatching again records every queue already holds: the Dispatcher with ``queues_complete`` leaves the same
    files (checkpoint included) and counts, skipped units and DISPATCH_UNSAFE_TOPIC findings as the full one does
    (random records over several queues with damaged offsets, transaction types left out and a topic that
    cannot be a directory: tests/test_cqplan.py's generator)."""
    import shutil

    from rmqstore_cli.engine.config.storeconfig import StoreConfig
    from rmqstore_cli.engine.derived.dispatch import DispatchBatch, Dispatcher
    from tests.conftest import files_of
    from tests.test_cqplan import _records

    print("seed", seed)
    rng = random.Random(seed)
    cfg = StoreConfig(version=5).with_(mappedFileSizeConsumeQueue=20 * rng.choice([3, 40, 400]), messageIndexEnable=False)
    recs = _records(rng, 400)
    cuts = sorted(rng.sample(range(1, len(recs)), 3))
    parts = list(zip([0] + cuts, cuts + [len(recs)]))

    def dispatch(root, complete: bool) -> Dispatcher:
        d = Dispatcher(str(root), cfg, batch_topics=set(), repair=True)
        d.queues_complete = complete
        for a, b in parts:
            d.dispatch_many(DispatchBatch.from_requests(recs[a:b]))
        d.close()
        return d

    first = dispatch(tmp_path / "full", False)
    assert first.stats.cq_units > 0
    shutil.copytree(tmp_path / "full", tmp_path / "fast")
    again = dispatch(tmp_path / "full", False)
    assert again.stats.cq_units == 0  # every unit is present: what the plan proves before taking this path
    fast = dispatch(tmp_path / "fast", True)
    assert files_of(tmp_path / "fast", "") == files_of(tmp_path / "full", "")
    assert vars(fast.stats) == vars(again.stats)
    assert fast.stats.cq_skipped > 0 and fast.stats.unsafe_topics > 0
    assert [f.as_json() for f in fast.problems] == [f.as_json() for f in again.problems]
