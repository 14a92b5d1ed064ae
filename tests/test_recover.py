"""recover: the plan against the broker's own crash recovery (broker-recover.json) and its
read-back after recovery (broker-read.jsonl.gz); apply, idempotence, restore, lock."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.store import Store

from .conftest import STORES, broker_read, json_lines, tree_digest

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def summary_of(out: str) -> dict:
    return next(o for o in json_lines(out) if o.get("type") == "recover")


def digest_bytes(root) -> dict:
    return {k: v[0] for k, v in tree_digest(root).items()}


@pytest.mark.parametrize("version", [4, 5])
def test_crash_dry_run_predicts_broker_recover(store_copy, version):
    root = store_copy("4.9.3-crash")
    before = tree_digest(root)
    r = run("recover", root, "--dry-run", "--json", "--broker-version", version)
    assert r.exit_code == 1, r.output  # repairs planned: abnormal recovery
    s = summary_of(r.stdout)
    b = json.loads((STORES / "4.9.3-crash" / "broker-recover.json").read_text())
    assert s["lastExitOK"] is b["lastExitOK"] is False
    assert s["maxPhyOffset"] == b["maxPhyOffset"]
    assert s["minPhyOffset"] == b["minPhyOffset"]
    ours = {(q["topic"], q["queueId"]): q for q in s["queues"]}
    for q in b["queues"]:
        o = ours.get((q["topic"], q["queueId"]))
        if o is None:  # the broker lists empty schedule queues it created in memory
            assert q["maxOffset"] == 0 and q["maxPhysicOffset"] == -1
            continue
        assert (o["minOffset"], o["maxOffset"], o["maxPhysicOffset"]) == (q["minOffset"], q["maxOffset"], q["maxPhysicOffset"]), q
    assert set(ours) <= {(q["topic"], q["queueId"]) for q in b["queues"]}
    plan = next(o for o in json_lines(r.stdout) if o.get("type") == "recover-plan")
    # §10.6: the index file whose end time is after the checkpoint's indexMsgTimestamp goes
    broker_names = {f["name"] for f in broker_read("4.9.3-crash")["index"][0]["files"]}
    on_disk = set(os.listdir(root / "index"))
    assert set(plan["indexDeleted"]) == on_disk - broker_names
    assert tree_digest(root) == before  # dry-run changes nothing


def test_crash_apply_equals_broker_read_back(store_copy):
    root = store_copy("4.9.3-crash")
    original = digest_bytes(root)
    r = run("recover", root)
    assert r.exit_code == 0, r.output  # applied and verify is clean
    br = broker_read("4.9.3-crash")
    with Store.open(str(root)) as st:
        recs = list(st.commitlog.records(with_body=False))
        assert [m["offset"] for m in recs] == [m["offset"] for m in br["clmsg"]]
        units = {}
        for t, q in st.queues():
            u = st.queue(t, q).units()
            for qo, phy, size in zip(u.queue_offsets.tolist(), u.phy.tolist(), u.size.tolist()):
                units[(t, q, qo)] = (phy, size)
        assert units == {(e["topic"], e["queueId"], e["queueOffset"]): (e["phyOffset"], e["size"]) for e in br["cqe"]}
        hdrs = [f.header().as_json() for f in st.index.files]
        expected = [{k: f[k] for k in hdrs[0]} for f in br["index"][0]["files"]]
        assert hdrs == expected
        for qline in br["query"][:300]:
            assert st.index.query(qline["topic"], qline["key"], qline["maxNum"], qline["begin"], qline["end"]) == qline["offsets"]
        cp = st.checkpoint()
        after = br["checkpoint-after-shutdown"][0]["checkpoint"]
        assert (cp.physicMsgTimestamp, cp.logicsMsgTimestamp, cp.indexMsgTimestamp) == (
            after["physicMsgTimestamp"], after["logicsMsgTimestamp"], after["indexMsgTimestamp"])
        assert not st.abort_exists
    # a second run is a no-op
    r2 = run("recover", root, "--dry-run")
    assert r2.exit_code == 0, r2.output
    snap = digest_bytes(root)
    assert run("recover", root).exit_code == 0
    assert digest_bytes(root) == snap
    # the backup restores the original bytes exactly
    parent = root.parent / (root.name + ".rmqstore-backup")
    backups = sorted(os.listdir(parent))
    assert len(backups) == 1
    assert run("restore", parent / backups[0]).exit_code == 0
    assert digest_bytes(root) == original


@pytest.mark.parametrize("name", ["4.9.3-clean", "4.9.3-ext", "5.3.3-clean", "5.3.3-v2topic"])
def test_clean_stores_need_nothing(name, store_copy):
    """A clean 4.9.3 store: empty plan, exit 0. A clean 5.3.3 store: its next start writes confirmPhyOffset
    (the broker's checkpoint after that start says so), the plan's only action, housekeeping the broker does at
    every start: nothing to repair, exit 0, and applying it writes the field."""
    root = store_copy(name)
    v = 4 if name.startswith("4") else 5
    r = run("recover", root, "--dry-run", "--json", "--broker-version", v)
    plan = next(o for o in json_lines(r.stdout) if o.get("type") == "recover-plan")
    assert plan["keptFindings"] == plan["leftFindings"] == [] and plan["expectedApplyExitCode"] == 0
    after = broker_read(name)["checkpoint-after-shutdown"][0]["checkpoint"]
    if after["confirmPhyOffset"] == broker_read(name)["store"][0]["checkpointBeforeOpen"]["confirmPhyOffset"]:
        assert r.exit_code == 0 and plan["empty"] and plan["actions"] == [], r.output
    else:
        assert r.exit_code == 0 and plan["empty"], r.output
        (a,) = plan["actions"]
        assert a["action"] == "checkpoint" and a["fields"]["confirmPhyOffset"] == after["confirmPhyOffset"]
        assert a["housekeeping"] is True
        assert all(a["fields"][k] == after[k] for k in ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp"))
        assert run("recover", root, "--broker-version", v).exit_code == 0
        assert run("recover", root, "--dry-run", "--broker-version", v).exit_code == 0
    s = summary_of(r.stdout)
    st = broker_read(name)["store"][0]
    assert (s["maxPhyOffset"], s["minPhyOffset"], s["lastExitOK"]) == (st["maxPhyOffset"], st["minPhyOffset"], True)
    cq = {(c["topic"], c["queueId"]): c for c in broker_read(name)["cq"]}
    for q in s["queues"]:
        c = cq[(q["topic"], q["queueId"])]
        assert (q["minOffset"], q["maxOffset"], q["maxPhysicOffset"]) == (c["minOffset"], c["maxOffset"], c["maxPhysicOffset"])


def test_v2_store_opened_as_49_is_data_loss(store_copy):
    """§2.9/§13.3: 4.9 knows only magic v1, so its recovery cuts the log at the first v2 record."""
    root = store_copy("5.3.3-v2topic")
    r = run("recover", root, "--dry-run", "--json", "--broker-version", 4)
    assert r.exit_code == 2
    plan = next(o for o in json_lines(r.stdout) if o.get("type") == "recover-plan")
    first_v2 = next(m["offset"] for m in broker_read("5.3.3-v2topic")["clmsg"] if len(m["msg"]["topic"]) > 127)
    assert plan["commitlog"]["recoveredEnd"] == first_v2
    assert any("v2" in n for n in plan["notes"])


HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    print("locked", flush=True)
    time.sleep(60)
""")


@pytest.fixture
def held_lock():
    procs = []

    def hold(root):
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(root / "lock")], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "locked"
        procs.append(p)

    yield hold
    for p in procs:
        p.kill()
        p.wait()


def test_every_writing_command_refuses_a_locked_store(store_copy, held_lock, tmp_path):
    root = store_copy("4.9.3-crash")
    held_lock(root)
    before = tree_digest(root)
    for args in (["recover", root], ["recover", root, "--dry-run"], ["truncate", root, "--offset", 0],
                 ["rebuild", "all", root]):
        r = run(*args)
        assert r.exit_code == 4, (args, r.output)
        assert "in use" in r.output and "lock" in r.output
    assert tree_digest(root) == before
    assert not (root.parent / (root.name + ".rmqstore-backup")).exists()


# --- the printed plan is the applied plan (plan reuse under the lock) -------------------------------------


def _broker_start_between_plan_and_lock(monkeypatch, tmp_path):
    """take_lock first lets 'a broker' start and stop on the store (a full recover applied at engine
    level, its backup elsewhere): the store changes after recover printed its plan."""
    import rmqstore_cli.engine.repair.apply as repair
    from rmqstore_cli.engine.repair.backup import Backup
    from rmqstore_cli.engine.repair.recovery import plan_recovery

    real = repair.take_lock
    calls = []

    def take_lock(root, force):
        if not calls:
            with Store.open(root) as st:
                plan = plan_recovery(st)
                config = st.config
            assert plan.actions
            backup = Backup.create(root, str(tmp_path / "broker-ran"), "recover", {})
            repair.apply_plan(plan, root, config, backup)
            backup.mark("complete")
        calls.append(root)
        return real(root, force)

    monkeypatch.setattr(repair, "take_lock", take_lock)
    return calls


def test_recover_plans_again_when_the_store_changed_after_its_plan(store_copy, monkeypatch, tmp_path):
    """The plan printed was made on the crashed store; by the time the lock is held the store was recovered
    by someone else. The old plan (re-dispatch every record, rewrite the checkpoint) must not be applied:
    recover plans again under the lock and finds nothing to do."""
    root = store_copy("4.9.3-crash")
    calls = _broker_start_between_plan_and_lock(monkeypatch, tmp_path)
    r = run("recover", root, "--backup-dir", tmp_path / "bk")
    assert calls, r.output
    assert "changed after its plan was made; planned again under the lock" in r.output, r.output[-3000:]
    assert "(planned again)" in r.output and "nothing to apply" in r.output, r.output[-3000:]
    assert "dispatched" not in r.output, r.output[-3000:]
    assert r.exit_code == 0, r.output[-3000:]
    monkeypatch.undo()
    assert run("verify", root).exit_code == 0


def test_recover_applies_the_plan_it_printed_when_nothing_changed(store_copy, monkeypatch, tmp_path):
    """No change between plan and lock: the printed plan is applied as is, and it equals a plan made afresh
    under the lock (what reusing it saves is exactly that second plan)."""
    import rmqstore_cli.engine.repair.apply as repair
    from rmqstore_cli.engine.repair.outcome import assess_plan
    from rmqstore_cli.engine.repair.plan import store_fingerprint
    from rmqstore_cli.engine.repair.recovery import plan_recovery

    root = store_copy("4.9.3-crash")
    real = repair.apply_plan
    seen = []

    def apply_plan(plan, store_root, config, backup, **kw):
        assert store_fingerprint(store_root) == plan.fingerprint
        with Store.open(store_root) as st:
            fresh = plan_recovery(st)
            assess_plan(st, fresh)
        seen.append((plan.as_json(), fresh.as_json()))
        return real(plan, store_root, config, backup, **kw)

    monkeypatch.setattr(repair, "apply_plan", apply_plan)
    r = run("recover", root, "--backup-dir", tmp_path / "bk")
    assert r.exit_code == 0, r.output[-3000:]
    assert "planned again" not in r.output
    (applied, fresh), = seen
    assert applied["actions"] and applied == fresh


def test_store_fingerprint_sees_every_write_but_the_lock(store_copy):
    from rmqstore_cli.engine.repair.plan import store_fingerprint

    root = store_copy("4.9.3-clean")
    before = store_fingerprint(root)
    with open(root / "lock", "wb") as f:  # taking the lock writes it
        f.write(b"lock")
    assert store_fingerprint(root) == before
    cq = root / "consumequeue" / "OracleTopicA" / "1" / "00000000000000000000"
    st = os.stat(cq)
    with open(cq, "r+b") as f:  # same size, same bytes written back: only the mtime tells
        b = f.read(20)
        f.seek(0)
        f.write(b)
    os.utime(cq, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert store_fingerprint(root) != before
    os.utime(cq, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert store_fingerprint(root) == before
    (root / "abort").write_bytes(b"")
    assert store_fingerprint(root) != before


def test_next_start_after_recover_is_costed_on_the_broker_steps(store_copy):
    """The next start after an applied recover is costed from a plan of the broker's own steps (no check of
    every queue and index file): on the repaired store it equals the full plan's startup cost."""
    from rmqstore_cli.engine.repair.recovery import plan_recovery
    from rmqstore_cli.engine.repair.next_start import next_start_after_repair

    for name in ("4.9.3-crash", "5.3.3-v2topic"):
        root = store_copy(name)
        r = run("recover", root, "--json", "-y")
        assert r.exit_code == 0, r.output[-3000:]
        (nxt,) = [o for o in json_lines(r.stdout) if o.get("type") == "next-start"]
        with Store.open(str(root)) as st:
            full = plan_recovery(st).startup_cost
            version = st.config.version
        assert next_start_after_repair(str(root), version) == full
        assert {k: v for k, v in nxt.items() if k not in ("type", "before")} == {k: v for k, v in full.items() if k != "type"}


@pytest.mark.parametrize("where", [None, 6, 600_000, 999_999])
def test_torn_index_found_past_the_holes_of_a_sparse_file(tmp_path, where):
    """An index file past its indexCount is mostly a hole (the broker maps the whole file): recovery's torn
    check reads only the parts that hold data, and still finds an entry written anywhere past the count."""
    import struct

    from rmqstore_cli.engine.derived.index import IndexFile
    from rmqstore_cli.engine.repair.probes import index_torn

    slots, entries, count = 100, 1_000_000, 5
    path = tmp_path / "20240101000000000"
    base = 40 + slots * 4
    with open(path, "wb") as f:
        f.truncate(base + entries * 20)  # a hole, as a broker-created file is before it is written
        f.write(struct.pack(">qqqqii", 1, 2, 0, 100, 3, count))
        f.seek(base + 20)
        for n in range(1, count):
            f.write(struct.pack(">iqii", 7 + n, 100 * n, 0, n - 1))
        if where is not None:
            f.seek(base + where * 20)
            f.write(struct.pack(">iqii", 42, 4242, 0, 0))
    f = IndexFile(str(path), slots, entries)
    try:
        assert f.complete
        assert index_torn(f) == (where is not None)
    finally:
        f.close()


@pytest.mark.parametrize("how", ["mapped", "pwrite"])
@pytest.mark.parametrize("where", [None, 6, 600_000, 999_999])
def test_torn_index_found_in_a_reserved_file_written_but_not_synced(tmp_path, where, how):
    """A file whose blocks were reserved up front (posix_fallocate, as our writers do: unwritten extents that
    read as zeros and are skipped) and then written without a sync: the entry written past the count lies in
    an extent the file system still calls unwritten until write-back, yet it is found."""
    import mmap
    import os
    import struct

    from rmqstore_cli.engine.derived.index import IndexFile
    from rmqstore_cli.engine.log.segments import data_extents
    from rmqstore_cli.engine.repair.probes import index_torn

    slots, entries, count = 100, 1_000_000, 5
    path = tmp_path / "20240101000000000"
    base = 40 + slots * 4
    size = base + entries * 20
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            pass  # no reservation on this file system: the file stays sparse, the check is the same
        head = struct.pack(">qqqqii", 1, 2, 0, 100, 3, count)
        body = b"".join(struct.pack(">iqii", 7 + n, 100 * n, 0, n - 1) for n in range(1, count))
        torn = struct.pack(">iqii", 42, 4242, 0, 0)
        if how == "mapped":
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
            mm[0:40] = head
            mm[base + 20:base + 20 + len(body)] = body
            if where is not None:
                mm[base + where * 20:base + where * 20 + 20] = torn
        else:
            os.pwrite(fd, head, 0)
            os.pwrite(fd, body, base + 20)
            if where is not None:
                os.pwrite(fd, torn, base + where * 20)
        f = IndexFile(str(path), slots, entries)
        try:
            assert index_torn(f) == (where is not None)
            if where is not None:  # the extents the check reads cover the entry
                assert any(lo <= base + where * 20 < hi for lo, hi in data_extents(str(path), 0, size))
        finally:
            f.close()
        if how == "mapped":
            mm.close()
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["4.9.3-clean", "4.9.3-crash", "4.9.3-ext", "5.3.3-clean", "5.3.3-v2topic"])
@pytest.mark.parametrize("crash", [False, True])
def test_broker_only_plan_costs_the_next_start_as_the_full_plan(store_copy, name, crash):
    """The broker's own steps (``broker_only``: no derived-file checks, no reading of the records before the
    broker's walk) give the same next-start cost as the full plan, for either broker version, after a clean
    shutdown (the walk starts late: the records before it are what the full plan reads in addition) and
    after a crash."""
    from rmqstore_cli.engine.repair.recovery import plan_recovery
    from rmqstore_cli.engine.store import Store

    root = store_copy(name)
    if crash:
        (root / "abort").write_bytes(b"")
    for version in (4, 5):
        with Store.open(str(root), overrides={"version": version}) as st:
            full = plan_recovery(st, version).startup_cost
            broker = plan_recovery(st, version, broker_only=True).startup_cost
        if name.endswith("-clean") and not crash:
            assert full["startOffset"] > 0  # records before the walk exist: the case this test is for
        assert broker == full, (name, version)
