"""Recovery keeps no per-record Python objects (constant memory).

The planner's walk feeds running values (logwalk.LogTally); the re-dispatch prediction re-walks the
records it needs and runs the consume-queue put rules per queue on numpy batches
(dispatchpredict.DispatchPrediction). These tests hold the prediction to the record-by-record rules
it replaced and check that nothing reachable from a finished planner grows with the record count.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from rmqstore_cli.engine.derived import dispatchpredict
from rmqstore_cli.engine.log.segments import SharedQueueFiles
from rmqstore_cli.engine.log.walk import LogTally
from rmqstore_cli.engine.repair.recovery import Planner
from rmqstore_cli.engine.store import Store
from tests.conftest import STORE_NAMES

SEED = int(os.environ.get("RMQSTORE_TEST_SEED", "1124"))


def reference_puts(records, state: dict) -> dict:
    """The §7.5 put rules one record at a time (the planner's former loop): a unit only at its record's
    QUEUEOFFSET, records already covered by maxPhysicOffset skipped, an empty queue opened at its first
    record's offset."""
    new_units: dict = {}
    for phy, size, topic, qid, qo in records:
        key = (topic, qid)
        st = state.get(key)
        if st is None:
            st = state[key] = [qo, -1, qo, False]
        if phy + size <= st[1]:
            continue
        if st[3]:
            st[0] = st[2] = qo
            st[3] = False
        if qo != st[0]:
            continue
        st[0] += 1
        st[1] = phy + size
        new_units[key] = new_units.get(key, 0) + 1
    return new_units


def _random_log(rng: random.Random, n: int) -> list:
    """Records in log order over a few queues, QUEUEOFFSETs mostly consecutive, with damage: gaps,
    repeats, jumps back, and some records before the queues' maxPhysicOffset."""
    topics = ["TopicA", "TopicB", "%RETRY%g1"]
    nxt: dict = {}
    out, phy = [], rng.randrange(0, 5000)
    for _ in range(n):
        key = (rng.choice(topics), rng.randrange(3))
        qo = nxt.get(key, rng.randrange(0, 50))
        r = rng.random()
        if r < 0.03:
            qo += rng.randint(1, 5)  # gap
        elif r < 0.06:
            qo -= rng.randint(1, 5)  # repeat / back
        elif r < 0.08:
            qo = rng.randrange(0, 200)  # anywhere
        nxt[key] = qo + 1
        size = rng.randint(91, 400)
        out.append((phy, size, key[0], key[1], qo))
        phy += size
    return out


@pytest.mark.parametrize("case", range(40))
def test_prediction_matches_the_record_by_record_rules(case, monkeypatch):
    seed = SEED * 1000 + case
    print("seed", seed)
    rng = random.Random(seed)
    monkeypatch.setattr(dispatchpredict, "BATCH", rng.choice([1, 7, 64, 1 << 18]))
    log = _random_log(rng, rng.randint(1, 3000))
    state = {}
    for key in {(t, q) for _, _, t, q, _ in log}:
        r = rng.random()
        if r < 0.3:
            continue  # a queue the store has no directory for
        if r < 0.45:
            state[key] = [0, -1, None, True]  # a directory without files
        else:
            mine = [rec for rec in log if (rec[2], rec[3]) == key]
            k = rng.randrange(len(mine) + 1)
            max_phys = mine[k - 1][0] + mine[k - 1][1] if k else -1
            state[key] = [mine[k][4] if k < len(mine) else mine[-1][4] + 1, max_phys, None, False]
    expected_state = {k: list(v) for k, v in state.items()}
    expected = reference_puts(log, expected_state)

    pred = dispatchpredict.DispatchPrediction(state)
    names = pred.topics  # the registry the prediction turns ids back into topics with
    chunk = rng.choice([1, 5, 100, 5000])
    for i in range(0, len(log), chunk):
        part = log[i:i + chunk]
        tid = [names.setdefault(t, len(names)) for _, _, t, _, _ in part]
        pred.add(np.asarray([r[0] for r in part]), np.asarray([r[1] for r in part]), np.asarray(tid),
                 np.asarray([r[3] for r in part]), np.asarray([r[4] for r in part]))
    pred.flush()
    assert pred.new_units == expected
    assert state == expected_state


def test_planner_keeps_nothing_per_record(store_copy):
    """Nothing reachable from a finished Planner (outside the store it reads and the derived-file
    record table) is a Python container with an entry per record."""
    root = store_copy("5.3.3-v2topic")
    (root / "abort").write_bytes(b"")  # abnormal recovery: the walk and the re-dispatch cover every record
    st = Store.open(str(root))
    with st:
        planner = Planner(st, 5)
        plan = planner.run()
        records = plan.dispatch["records"]
        assert records > 50 and plan.commitlog["walkedRecords"] == records
        assert isinstance(planner.tally, LogTally) and len(planner.tally) == records
        seen, stack = set(), [(k, v) for k, v in vars(planner).items() if k not in ("store", "cfg", "record_table")]
        while stack:
            path, obj = stack.pop()
            if id(obj) in seen or isinstance(obj, (str, bytes, int, float, np.ndarray)) or obj is None:
                continue
            if isinstance(obj, SharedQueueFiles):
                continue  # the process's queue files mapped, per file and at most half its descriptors: not the planner's
            seen.add(id(obj))
            if isinstance(obj, (list, tuple, set, dict)):
                assert len(obj) < records, f"planner.{path} holds {len(obj)} entries (one per record?)"
                items = obj.items() if isinstance(obj, dict) else enumerate(obj)
                stack += [(f"{path}[{k!r}]", v) for k, v in items]
            elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("rmqstore_cli.engine"):
                stack += [(f"{path}.{k}", v) for k, v in vars(obj).items()]


def test_every_store_plan_counts_match_the_tally(store_copy):
    """The re-walk finds exactly the records the first walk counted (abnormal recovery dispatches all)."""
    for name in STORE_NAMES:
        root = store_copy(name)
        (root / "abort").write_bytes(b"")
        with open(root / "checkpoint", "r+b") as f:
            f.write(b"\0" * 24)  # times at 0: the walk starts at the first file
        st = Store.open(str(root))
        with st:
            planner = Planner(st, st.config.version)
            plan = planner.run()
            assert plan.commitlog["startOffset"] == 0
            assert plan.dispatch["from"] == 0 and plan.dispatch["records"] == len(planner.tally), name


# --- the derived-file check one segment at a time (derived_windows) ----------------------------------


def _plan_json(root: str, version: int, whole: bool, monkeypatch) -> tuple[dict, str]:
    """The plan, and which record table the planner ended with."""
    from rmqstore_cli.engine.repair import derived_plan
    from rmqstore_cli.engine.repair.derived_windows import LazyRecordTable, windowed_verdicts

    monkeypatch.setattr(derived_plan, "windowed_verdicts", (lambda planner: None) if whole else windowed_verdicts)
    st = Store.open(root, overrides={"version": version})
    with st:
        planner = Planner(st, version)
        plan = planner.run().as_json()
    t = getattr(planner, "record_table", None)
    kind = ("windowed" if t._full is None else "windowed+whole") if isinstance(t, LazyRecordTable) else "whole"
    return plan, kind


# Sub-segment windows (4 KiB / 3000 B) give the broker-written stores many windows per segment; that run
# takes a fresh seed each time (printed; RMQSTORE_VMEM_SEED repeats it).
SMALL_WINDOW_SEED = int(os.environ.get("RMQSTORE_VMEM_SEED", random.randrange(1 << 30)))


@pytest.mark.parametrize("windows, cases, seed", [(None, 36, SEED), ((4096, 3000), 16, SMALL_WINDOW_SEED)],
                         ids=["segment-windows", "small-windows"])
def test_windowed_check_plans_like_the_whole_table(tmp_path, monkeypatch, windows, cases, seed):
    """Seeded damage (derived-file lies, commitlog/queue/index damage, crashes) on copies of the
    broker-written stores: the plan is the same whether the derived-file check runs one window at a
    time or on the whole record table, and the windowed path answers some cases alone."""
    from rmqstore_cli.engine.verify import commitlog as verify_commitlog
    from tests import fuzzlib

    print("seed", seed)
    rng = random.Random(seed)
    kinds = []
    for i in range(cases):
        if windows:
            monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", windows[i % len(windows)])
        name, case = fuzzlib.seeded_case(rng, i, tmp_path)
        if rng.random() < 0.5:
            fuzzlib.add_crash(case, zero_checkpoint=rng.random() < 0.5)
        for version in (4, 5):
            whole, k_whole = _plan_json(str(case), version, True, monkeypatch)
            windowed, k = _plan_json(str(case), version, False, monkeypatch)
            assert k_whole == "whole"
            assert windowed == whole, f"case {i} ({name}, broker {version})"
            kinds.append(k)
    assert "windowed" in kinds, kinds  # some plans never needed the whole table


def test_crash_plan_builds_no_whole_record_table(store_copy):
    """A crash with intact queues (index files deleted at an abnormal start): the plan needs no table of
    every record; its re-dispatch prediction and checkpoint times match the whole-table answers."""
    from rmqstore_cli.engine.repair.derived_windows import LazyRecordTable

    for name in ("4.9.3-clean", "5.3.3-clean"):
        root = store_copy(name)
        (root / "abort").write_bytes(b"")
        with open(root / "checkpoint", "r+b") as f:
            f.write(b"\0" * 24)
        st = Store.open(str(root))
        with st:
            planner = Planner(st, st.config.version)
            plan = planner.run()
            t = planner.record_table
            assert isinstance(t, LazyRecordTable) and t._full is None, name
            assert plan.dispatch["records"] == len(planner.tally) > 0
            from rmqstore_cli.engine.repair.derived import record_table

            assert t.times() == record_table(st, planner.end).times()


@pytest.mark.parametrize("unit", [0, 1, "last"])
def test_a_unit_with_a_negative_phy_offset_plans_like_the_whole_table(tmp_path, monkeypatch, unit):
    """A queue unit whose phyOffset is negative (garbage, as seed 405940158 of the test above wrote) is no record the
    cleaner deleted: the windowed check leaves the decision to the whole table (CQ_NO_RECORD), and the plan is the
    same either way, under both brokers' rules."""
    import struct

    from tests.conftest import copy_store

    root = copy_store("5.3.3-clean", tmp_path / "store")
    queue = sorted((root / "consumequeue").rglob("*"), key=lambda p: (-p.stat().st_size if p.is_file() else 0, str(p)))
    path = next(p for p in queue if p.is_file() and p.name.isdigit())
    data = bytearray(path.read_bytes())
    used = [i for i in range(len(data) // 20) if struct.unpack_from(">qi", data, i * 20)[1] > 0]
    i = used[-1] if unit == "last" else used[unit]
    struct.pack_into(">qiq", data, i * 20, -5743336843260484454, 526398404, 4728716397051162048)
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    for version in (4, 5):
        whole, _ = _plan_json(str(root), version, True, monkeypatch)
        windowed, _ = _plan_json(str(root), version, False, monkeypatch)
        assert windowed == whole, (path.name, i, version)
