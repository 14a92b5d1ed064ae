"""recover's plan with the broker's recovery walk read off verify's walk of the log (repair/walkalong.py) is the
plan of the separate walks (``plan_recovery(..., walk_along=False)``: the broker's CRC walk on its own, then
verify with the derived-file check), and verify's findings are the same: on every broker-written store (copied),
after a crash (abort, checkpoint kept or zeroed) or not, under both brokers' rules (5.x's magic v2 records under
4.9's), and on seeded damage of the log: a body CRC mid-log, a torn tail, zeros, a BLANK marker, a bad magic,
a huge TOTALSIZE (the seed is printed; RMQSTORE_WALK_ALONG_SEED repeats it)."""

from __future__ import annotations

import os
import random
import struct

import pytest

from rmqstore_cli.engine.repair import recovery, walkalong, walkalongjobs
from rmqstore_cli.engine.repair.recovery import plan_recovery
from rmqstore_cli.engine.store import Store
from rmqstore_cli.formats.records import MAGIC_BLANK
from tests.conftest import STORE_NAMES, STORES

# a fixed default; RMQSTORE_WALK_ALONG_SEED=<n> for another (the fixed cases cover both paths whatever the seed)
SEED = int(os.environ.get("RMQSTORE_WALK_ALONG_SEED", "20261128"))
# every broker-written store whose recovery the Planner makes (not DLedger, not RocksDB queues)
PLANNED = [n for n in STORE_NAMES + ["batchcq-5.3.3", "lmq-5.3.3", "timer-5.3.3", "timer-5.3.3-crash"]
           if (STORES / n / "store" / "commitlog").is_dir()]


def _plans(root, version: int, answered: list | None = None, jobs: int = 1) -> tuple:
    """(plan and verify findings walked along, the same with the separate walks); ``jobs`` > 1: both with ``-j``
    (walkalongjobs.py against recoveryjobs.py's walk and verify -j feeding the derived check)."""
    cls = walkalongjobs.WalkAlongJobs if jobs > 1 else walkalong.WalkAlong
    real = cls.run

    def run(self):
        stop = real(self)
        if answered is not None:
            answered.append(stop is not None)
        return stop

    out = []
    with Store.open(str(root), overrides={"version": version}) as st:
        for along in (True, False):
            cls.run = run
            try:
                plan = plan_recovery(st, version, with_verify=True, walk_along=along, jobs=jobs)
            finally:
                cls.run = real
            out.append((plan.as_json(), [f.as_json() for f in plan.verify_findings]))
    return out[0], out[1]


def _crash(root, how: str) -> None:
    """``how``: none, abort, zeroed (abort and the checkpoint's times at 0), short (zeroed, and every consume
    queue's last file lost its second half: the re-dispatch writes units again)."""
    if how == "none":
        return
    (root / "abort").write_bytes(b"")
    if how in ("zeroed", "short"):
        with open(root / "checkpoint", "r+b") as f:
            f.write(b"\0" * 24)
    if how == "short":
        for q in (root / "consumequeue").glob("*/*"):
            files = sorted(q.iterdir())
            if files:
                size = files[-1].stat().st_size
                with open(files[-1], "r+b") as f:
                    f.seek(size // 40 * 20)
                    f.write(bytes(size - size // 40 * 20))


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("name", PLANNED)
def test_walk_along_plans_like_separate_walks_on_broker_stores(store_copy, name, jobs):
    answered = []
    for crash in ("none", "abort", "zeroed", "short"):
        root = store_copy(name, f"{name}-{crash}")
        _crash(root, crash)
        for version in (4, 5):
            along, separate = _plans(root, version, answered, jobs)
            assert along[0] == separate[0], f"{name} ({crash}, broker {version}): plans differ"
            assert along[1] == separate[1], f"{name} ({crash}, broker {version}): findings differ"
    # the walk along stands for the broker's walk somewhere on every store but a batch one (its dispatch prediction
    # needs the records' bytes per batch: the separate walk); never on 5.x stores whose magic v2 records end 4.9's walk
    if jobs > 1 and len(os.listdir(STORES / name / "store" / "commitlog")) < 2:
        assert not any(answered), (name, answered)  # -j walks whole segments: one segment, one process
        return
    assert any(answered) != name.startswith("batchcq"), (name, answered)


@pytest.mark.parametrize("jobs", [1, 2])
def test_walk_along_reads_the_crash_copy_once(store_copy, monkeypatch, jobs):
    """A crash (abort, zeroed checkpoint) of an undamaged store: the broker's walk is read off verify's walk (no
    walk of the log of its own: neither ``recovery.broker_walk`` nor, with ``-j 2``, recoveryjobs.py's walk is
    called) and the derived check answers in it; with ``-j 2`` the plan is the one-process plan."""
    from rmqstore_cli.engine.repair import derived_plan, recoveryjobs

    separate, again = [], []
    real_walk, real_jobs, real_again = recovery.broker_walk, recoveryjobs.broker_walk_jobs, derived_plan.windowed_verdicts
    monkeypatch.setattr(recovery, "broker_walk", lambda *a, **k: separate.append(a[3]) or real_walk(*a, **k))
    monkeypatch.setattr(recoveryjobs, "broker_walk_jobs", lambda *a, **k: separate.append(a[3]) or real_jobs(*a, **k))
    monkeypatch.setattr(derived_plan, "windowed_verdicts", lambda p: again.append(1) or real_again(p))
    for name in ("4.9.3-clean", "5.3.3-clean"):
        root = store_copy(name)
        _crash(root, "zeroed")
        version = 4 if name.startswith("4") else 5
        with Store.open(str(root)) as st:
            plan = plan_recovery(st, version, with_verify=True, jobs=jobs)
            assert not separate and not again, (name, separate, again)
            if jobs > 1:
                one = plan_recovery(st, version, with_verify=True)
                assert plan.as_json() == one.as_json()
                assert [f.as_json() for f in plan.verify_findings] == [f.as_json() for f in one.verify_findings]
        assert plan.commitlog["stopKind"] in ("zero", "blank"), plan.commitlog
        assert plan.commitlog["walkedRecords"] > 0


def _records(root) -> list:
    """(file path, position, TOTALSIZE, body start, body length) of every record, in log order."""
    with Store.open(str(root)) as st:
        return [(c.segment.path, int(o), int(s), int(b), int(n)) for c in st.commitlog.scan(check_crc=False)
                for o, s, b, n in zip(c.headers.offsets, c.headers.totalSize, c.headers.bodyStart,
                                      c.headers.bodyLength)]


def _damage(rng: random.Random, root, kind: str) -> str:
    recs = _records(root)
    if not recs:  # an earlier damage of the case left no record to walk to
        return f"{kind}: no record left"
    path, pos, size, body, n = recs[rng.randrange(len(recs))]
    with open(path, "r+b") as f:
        end = f.seek(0, 2)
        if kind == "crc" and n > 0:
            f.seek(body + rng.randrange(n))
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
        elif kind == "torn":  # the record's second half and the rest of its file never reached the disk
            cut = pos + rng.randrange(8, max(9, size))
            f.seek(cut)
            f.write(bytes(end - cut))
        elif kind == "zeros":
            f.seek(pos)
            f.write(bytes(end - pos))
        elif kind == "blank":
            f.seek(pos)
            f.write(struct.pack(">ii", end - pos, MAGIC_BLANK))
        elif kind == "magic":
            f.seek(pos + 4)
            f.write(struct.pack(">i", rng.randrange(-(1 << 31), 1 << 31)))
        elif kind == "size":
            f.seek(pos)
            f.write(struct.pack(">i", rng.choice([1 << 30, (1 << 31) - 1, 12, end - pos + 1])))
    return f"{kind} at {os.path.basename(path)}+{pos}"


KINDS = ("crc", "torn", "zeros", "blank", "magic", "size")


@pytest.mark.parametrize("jobs,group", [(1, None), (2, None), (1, 3 * 65536)])
def test_walk_along_plans_like_separate_walks_on_seeded_damage(store_copy, monkeypatch, jobs, group):
    """Two fixed cases first, so both paths are compared whatever the seed: an undamaged crash copy, whose walk
    verify's reports prove, and 5.3.3's magic v2 records under 4.9's rules, which they cannot (4.9's walk stops at
    the first one); then 18 cases of seeded damage. In one process the walk along checks windows of several
    segments (all of a small store's, or three 64 KiB segments each with ``group``), the separate walk a window per
    segment."""
    from rmqstore_cli.engine.verify import commitlog as verify_commitlog

    if group is not None:
        monkeypatch.setattr(verify_commitlog, "GROUP_BYTES", group)
    print("seed", SEED)
    fixed = []
    for name in ("4.9.3-clean", "5.3.3-v2topic"):
        root = store_copy(name, f"fixed-{name}")
        _crash(root, "zeroed")
        answered = []
        for version in (4, 5):
            along, separate = _plans(root, version, answered, jobs)
            assert along == separate, f"{name}, crash zeroed, broker {version}"
        fixed.append(answered)
    assert fixed == [[True, True], [False, True]], fixed  # (broker 4, broker 5) for each store
    rng = random.Random(SEED)
    answered = []
    for i in range(18):
        name = rng.choice(["4.9.3-clean", "4.9.3-crash", "5.3.3-clean", "5.3.3-v2topic"])
        root = store_copy(name, f"case{i}")
        what = [_damage(rng, root, KINDS[(i + k) % len(KINDS)]) for k in range(1 + (i % 4 == 3))]
        crash = rng.choice(["none", "abort", "zeroed", "short"])
        _crash(root, crash)
        for version in (4, 5):
            along, separate = _plans(root, version, answered, jobs)
            where = f"seed {SEED} case {i}: {name}, {'; '.join(what)}, crash {crash}, broker {version}"
            assert along[0] == separate[0], f"{where}: plans differ"
            assert along[1] == separate[1], f"{where}: findings differ"
    print("seeded cases whose walk verify's reports proved:", sum(answered), "of", len(answered))


@pytest.mark.parametrize("gap", ["to the end of its file", "one record"])
def test_look_past_skips_a_zero_tail(store_copy, monkeypatch, gap):
    """The broker's walk ends in zeros: when the rest of the file is zeros no record can start there and it is
    not searched (a crash's last 1 GiB file may be mostly zeros); the plan is the one a search gives (forced
    here); zeros over one record in the middle of a file: searched, and the records after it are found."""
    name = "4.9.3-clean"
    root = store_copy(name)
    recs = _records(root)
    path, pos, size, _, _ = recs[len(recs) // 2]
    with open(path, "r+b") as f:
        end = f.seek(0, 2)
        f.seek(pos)
        f.write(bytes(end - pos if gap.startswith("to") else size))
    _crash(root, "zeroed")
    searched = []
    real_resync, real_look = recovery.resync, recovery.Planner._look_past
    monkeypatch.setattr(recovery, "resync", lambda *a: searched.append(a[1]) or real_resync(*a))
    plans = []
    for forced in (False, True):
        if forced:
            monkeypatch.setattr(recovery.Planner, "_look_past", lambda self, stop, tail=True: real_look(self, stop))
        with Store.open(str(root)) as st:
            plans.append(plan_recovery(st, 4, with_verify=True).as_json())
        if not forced:
            assert bool(searched) == (gap == "one record"), searched
    assert plans[0]["commitlog"]["stopKind"] == "zero"
    assert plans[0] == plans[1]
    assert ("salvage" in str(plans[0])) or gap.startswith("to")


@pytest.mark.parametrize("group", [None, 3 * 65536])
@pytest.mark.parametrize("name", ["4.9.3-clean", "4.9.3-crash", "5.3.3-clean"])
def test_walk_along_check_answers_from_whole_windows(store_copy, monkeypatch, name, group):
    """On a broker-written store the derived check fed by verify's walk answers by itself, every record of the log
    checked once in windows of several segments (all of the store's in one, or three 64 KiB segments each with
    ``group``): a window checked without some of its segments' records would find units pointing at nothing, and
    the plan would come from a second, separate walk instead."""
    from rmqstore_cli.engine.repair import derived_windows
    from rmqstore_cli.engine.verify import commitlog as verify_commitlog
    from rmqstore_cli.engine.verify.pipeline import verify_store

    if group is not None:
        monkeypatch.setattr(verify_commitlog, "GROUP_BYTES", group)
    root = store_copy(name)
    finished = []
    finish = derived_windows.WindowedCheck.finish

    def spy(self):
        finished.append((self.group is not None, self.lied, self.invalid_seen, self.count, len(self.wbounds)))
        return finish(self)

    monkeypatch.setattr(derived_windows.WindowedCheck, "finish", spy)
    with Store.open(str(root)) as st:
        records = verify_store(st).summary["commitlog"]["records"]
        segments = len(st.commitlog.segments.segments)
    with Store.open(str(root)) as st:
        plan_recovery(st, with_verify=True)  # as `recover` plans: verify in the plan's walk
    assert len(finished) == 1, finished
    grouped, lied, invalid, count, windows = finished[0]
    assert (grouped, lied, invalid, count) == (True, False, False, records)
    assert windows == (1 if group is None else -(-segments // 3))
