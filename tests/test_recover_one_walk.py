"""recover's plan and its verify of the store in one walk of the log (``plan_recovery(with_verify=True)``:
verify's window reports also feed the windowed derived-file check). The plan and the findings must be
exactly those of the two separate walks (the plan, then ``verify``), on seeded damage of the broker-written
stores; where the reports cannot stand for the check's own walk (a record invalid before the recovered end:
verify checks CRCs, the check reads without) the check walks again, with the same answer."""

from __future__ import annotations

import os
import random

import pytest

from rmqstore_cli.engine.repair.recovery import plan_recovery
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify import commitlog as verify_commitlog
from rmqstore_cli.engine.verify.pipeline import verify_store

SEED = int(os.environ.get("RMQSTORE_ONEWALK_SEED", random.randrange(1 << 30)))


def _both(root: str, version: int, monkeypatch, passes: list | None = None) -> tuple:
    """(plan and findings of the one walk, of the separate walks, how the one walk answered); ``passes`` gets how
    many times the one-walk plan read the whole log: verify's walk, the broker's walk unless verify's walk stood
    for it (repair/walkalong.py), the derived check's own walk if it walked again."""
    from rmqstore_cli.engine.repair import derived_plan, walkalong

    walked_again, answered = [], []
    real, real_run = derived_plan.windowed_verdicts, walkalong.WalkAlong.run

    def counting(planner):
        walked_again.append(True)
        return real(planner)

    def along(self):
        stop = real_run(self)
        answered.append(stop is not None)
        return stop

    with Store.open(root, overrides={"version": version}) as st:
        monkeypatch.setattr(derived_plan, "windowed_verdicts", counting)
        monkeypatch.setattr(walkalong.WalkAlong, "run", along)
        one = plan_recovery(st, version, with_verify=True)
        how = "walked again" if walked_again else "one walk"
        if passes is not None:
            passes.append(1 + (not any(answered)) + bool(walked_again))
        monkeypatch.setattr(derived_plan, "windowed_verdicts", real)
        monkeypatch.setattr(walkalong.WalkAlong, "run", real_run)
        two = plan_recovery(st, version)
        found = verify_store(st).findings
    assert two.verify_findings is None
    return ((one.as_json(), [f.as_json() for f in one.verify_findings]),
            (two.as_json(), [f.as_json() for f in found]), how)


def test_one_walk_plans_and_verifies_like_two(tmp_path, monkeypatch):
    """Seeded damage (derived-file lies, commitlog/queue/index damage) and crashes, whole-segment and tiny
    windows: the same plan and the same verify findings; some cases answered by the one walk alone."""
    from tests import fuzzlib

    print("seed", SEED)
    rng = random.Random(SEED)
    hows = []
    for i in range(12):
        monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", (verify_commitlog.WINDOW_BYTES, 4096, 3000)[i % 3])
        name, case = fuzzlib.seeded_case(rng, i, tmp_path, kind="commitlog")
        if rng.random() < 0.6:
            fuzzlib.add_crash(case, zero_checkpoint=rng.random() < 0.5)
        for version in (4, 5):
            one, two, how = _both(str(case), version, monkeypatch)
            assert one[0] == two[0], f"case {i} ({name}, broker {version}): plans differ"
            assert one[1] == two[1], f"case {i} ({name}, broker {version}): findings differ"
            hows.append(how)
    assert "one walk" in hows, hows


@pytest.mark.parametrize("where", ["last", "first", "first-no-queues"])
def test_bad_body_crc_one_walk_plans_like_two(store_copy, monkeypatch, where):
    """A body byte changed (bad CRC, the record otherwise whole): in the last record the broker's walk
    stops there (verify's walk stands for the broker's: its stop is the bad record; the consume queues cut
    there, the derived check walks again: the log is read twice, as when the check's walk was verify's); in
    the first record of a store whose recovery walk starts later, verify's CRC-checking reports hold other
    records than the derived check reads without CRC (the check walks again: found by the unit pointing at
    the record, or, with no consume queues left, by the invalid record itself; verify's walk still stands for
    the broker's, which starts after it). Same plan and findings as two walks; the log read twice at most."""
    import shutil

    for name in ("4.9.3-clean", "5.3.3-clean"):
        root = store_copy(name)
        with Store.open(str(root)) as st:
            bodies = [(c.segment.path, int(b), int(n)) for c in st.commitlog.scan(check_crc=False)
                      for b, n in zip(c.headers.bodyStart, c.headers.bodyLength) if n > 0]
        path, body, n = bodies[-1] if where == "last" else bodies[0]
        with open(path, "r+b") as f:  # one bit of the body: only its CRC tells
            f.seek(body + n // 2)
            b = f.read(1)
            f.seek(body + n // 2)
            f.write(bytes([b[0] ^ 0x01]))
        if where == "first-no-queues":
            shutil.rmtree(root / "consumequeue")
        version = 4 if name.startswith("4") else 5
        passes = []
        one, two, how = _both(str(root), version, monkeypatch, passes)
        assert one[0] == two[0], f"{name}: plans differ"
        assert one[1] == two[1], f"{name}: findings differ"
        assert passes == [2], (name, passes)
        if where != "first-no-queues" or version == 4:  # (5.3.3 without queues walks from the first file)
            assert where == "last" or how == "walked again", (name, how)
        codes = {f["code"] for f in one[1]}
        assert codes & {"CL_BODY_CRC", "CL_PROP_CRC", "CL_TORN_TAIL", "CL_LENGTHS", "CL_TOTALSIZE"}, codes


def test_crash_prediction_in_the_walk_plans_like_a_second_walk(tmp_path, monkeypatch):
    """After a crash the consume-queue puts are predicted in the broker's walk itself (queues as loaded);
    the plan is exactly the one made with the prediction's own second walk, on seeded damage and crashes
    of the broker-written stores, both versions; some plans used the walk's prediction, and a plan whose
    queues or range changed after the walk walked again."""
    from rmqstore_cli.engine.repair import recovery
    from tests import fuzzlib

    print("seed", SEED)
    rng = random.Random(SEED + 1)
    real_recover, real_rewalk = recovery.Planner._recover_commitlog, recovery.rewalk
    rewalks = []

    def without_early(self, cp):
        real_recover(self, cp)
        self.early_prediction = None

    def counting_rewalk(*a, **k):
        rewalks.append(True)
        return real_rewalk(*a, **k)

    monkeypatch.setattr(recovery, "rewalk", counting_rewalk)
    used = []
    for i in range(14):
        name, case = fuzzlib.seeded_case(rng, i, tmp_path)
        fuzzlib.add_crash(case, zero_checkpoint=rng.random() < 0.5)
        for version in (4, 5):
            with Store.open(str(case), overrides={"version": version}) as st:
                monkeypatch.setattr(recovery.Planner, "_recover_commitlog", real_recover)
                rewalks.clear()
                early = recovery.plan_recovery(st, version).as_json()
                used.append(not rewalks)
                monkeypatch.setattr(recovery.Planner, "_recover_commitlog", without_early)
                again = recovery.plan_recovery(st, version).as_json()
            assert early == again, f"case {i} ({name}, broker {version})"
    assert any(used), used


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_crash_prediction_walks_again_from_before_the_walk(store_copy, monkeypatch, name):
    """A crash whose walk starts late (the checkpoint's times are past every record) and whose consume queues are gone: the re-dispatch
    starts at the first record, before the walk, so the walk's prediction cannot stand for it; the plan
    equals the second walk's."""
    import shutil

    from rmqstore_cli.engine.repair import recovery

    import struct

    root = store_copy(name)
    (root / "abort").write_bytes(b"")
    with open(root / "checkpoint", "r+b") as f:  # every file's first record is old enough: the walk starts late
        f.write(struct.pack(">qqq", 1 << 60, 1 << 60, 1 << 60))
    shutil.rmtree(root / "consumequeue")
    real_recover = recovery.Planner._recover_commitlog

    def without_early(self, cp):
        real_recover(self, cp)
        self.early_prediction = None

    for version in (4, 5):
        with Store.open(str(root), overrides={"version": version}) as st:
            early = recovery.plan_recovery(st, version).as_json()
            monkeypatch.setattr(recovery.Planner, "_recover_commitlog", without_early)
            again = recovery.plan_recovery(st, version).as_json()
            monkeypatch.setattr(recovery.Planner, "_recover_commitlog", real_recover)
        assert early["commitlog"]["startOffset"] > 0 and early["dispatch"]["from"] < early["commitlog"]["startOffset"]
        assert early == again, (name, version)
