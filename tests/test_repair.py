"""recover / truncate on corrupted copies of the broker-written stores, for both broker versions.

Expectations come from FORMAT.md §13 and the broker read-back (record offsets, queue units),
never from the plan itself: where the broker's walk starts and stops, what it cuts, which
files would keep it from starting. After apply: verify clean, backup restores exact bytes.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.repair.outcome import assess_plan
from rmqstore_cli.engine.repair.recovery import plan_recovery
from rmqstore_cli.engine.store import Store

from .conftest import broker_read, tree_digest

runner = CliRunner()
SEG = 65536


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def plan(root, v):
    with Store.open(str(root)) as st:
        return plan_recovery(st, v)


def digest(root):
    return {k: v[0] for k, v in tree_digest(root).items()}


def apply_and_restore(root, *extra, expect=0):
    original = digest(root)
    r = run("recover", root, *extra)
    assert r.exit_code == expect, r.output
    assert "verify after apply: 0 errors, 0 warnings" in r.output
    parent = root.parent / (root.name + ".rmqstore-backup")
    (b,) = os.listdir(parent)
    assert run("restore", parent / b).exit_code == 0
    assert digest(root) == original


def clmsgs(name):
    return broker_read(name)["clmsg"]


def patch(path, pos, data):
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def seg_path(root, start):
    return root / "commitlog" / ("%020d" % start)


def flip_body(root, rec):
    start = rec["offset"] - rec["offset"] % SEG
    pos = rec["offset"] - start + rec["size"] - 30  # inside the body of these records (props are short)
    body_end = rec["offset"] - start + rec["size"]
    assert rec["msg"]["bodyHex"], "pick a record with a body"
    # the body sits before topic+props; flip a byte well inside it
    pos = rec["offset"] - start + 100 + len(rec["msg"]["bodyHex"]) // 4
    assert pos < body_end
    with open(seg_path(root, start), "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x5A]))


@pytest.mark.parametrize("v", [4, 5])
def test_torn_last_record_on_crash_store(store_copy, v):
    root = store_copy("4.9.3-crash", f"c{v}")
    last = clmsgs("4.9.3-crash")[-1]
    start = last["offset"] - last["offset"] % SEG
    patch(seg_path(root, start), last["offset"] - start + last["size"] // 2, bytes(last["size"] - last["size"] // 2))
    p = plan(root, v)
    assert p.commitlog["recoveredEnd"] == last["offset"]  # §13.5: walk stops at the torn record
    assert p.summary["maxPhyOffset"] == last["offset"]
    assert p.exit_code == 1 and not p.data_loss  # nothing valid after it
    q = next(q for q in p.summary["queues"] if q["topic"] == last["msg"]["topic"] and q["queueId"] == last["msg"]["queueId"])
    assert q["maxOffset"] == last["msg"]["queueOffset"]  # §13.7 drops its unit
    assert any(a.kind == "zero_tail" for a in p.actions)
    apply_and_restore(root, "--broker-version", v)


@pytest.mark.parametrize("v", [4, 5])
def test_crc_flip_in_middle_segment_of_crash_store(store_copy, v):
    root = store_copy("4.9.3-crash", f"c{v}")
    recs = clmsgs("4.9.3-crash")
    k = next(i for i, m in enumerate(recs) if m["offset"] > 20 * SEG and len(m["msg"]["bodyHex"]) > 400)
    flip_body(root, recs[k])
    p = plan(root, v)
    # the checkpoint puts the abnormal start at the first file (every store time is later)
    assert p.commitlog["startOffset"] == 0
    assert p.commitlog["recoveredEnd"] == recs[k]["offset"]
    assert p.salvage["validRecordsAfter"] == len(recs) - k - 1
    assert p.exit_code == 2 and p.data_loss
    assert run("recover", root, "--broker-version", v).exit_code == 2  # refuses to lose data without a choice
    apply_and_restore(root, "--broker-version", v, "--keep-valid-after")


@pytest.mark.parametrize("v", [4, 5])
def test_crc_flip_in_middle_segment_of_clean_store_is_not_seen(store_copy, v):
    """§13.4: normal recovery re-checks only the last three (4.9.3) / the CQ high-water (5.3.3) files."""
    root = store_copy("4.9.3-clean", f"c{v}")
    recs = clmsgs("4.9.3-clean")
    bad = next(m for m in recs if m["offset"] > 20 * SEG and len(m["msg"]["bodyHex"]) > 400)
    flip_body(root, bad)
    p = plan(root, v)
    assert p.commitlog["recoveredEnd"] == broker_read("4.9.3-clean")["store"][0]["maxPhyOffset"]
    assert not any(a.kind in ("zero_tail", "move_aside", "dispatch") for a in p.actions)
    # the exit-code contract: the damage is kept on purpose (named), so the plan is not empty
    with Store.open(str(root)) as st:
        assess_plan(st, p)
    assert [(k["code"], k["phyOffset"]) for k in p.kept_findings] == [("CL_BODY_CRC", bad["offset"])]
    assert p.exit_code == 1 and p.expected_exit == 0 and not p.left_findings


@pytest.mark.parametrize("v", [4, 5])
def test_huge_totalsize(store_copy, v):
    root = store_copy("4.9.3-clean", f"c{v}")
    recs = clmsgs("4.9.3-clean")
    last_seg = recs[-1]["offset"] - recs[-1]["offset"] % SEG
    k = next(i for i, m in enumerate(recs) if m["offset"] > last_seg + 1000)
    patch(seg_path(root, last_seg), recs[k]["offset"] - last_seg, struct.pack(">i", 0x7FFFFFF0))
    p = plan(root, v)
    assert p.commitlog["recoveredEnd"] == recs[k]["offset"]
    oom = [r for r in p.refusals if "OutOfMemoryError" in r]
    assert bool(oom) == (v == 4)  # 4.9.3 allocates byte[TOTALSIZE] first; 5.3.3 checks the remaining length
    assert p.salvage["validRecordsAfter"] == len(recs) - k - 1
    assert p.exit_code == 2


@pytest.mark.parametrize("v", [4, 5])
def test_zero_filled_segment_in_crash_store(store_copy, v):
    root = store_copy("4.9.3-crash", f"c{v}")
    patch(seg_path(root, 30 * SEG), 0, bytes(SEG))
    recs = clmsgs("4.9.3-crash")
    p = plan(root, v)
    assert p.commitlog["recoveredEnd"] == 30 * SEG  # previous file ends with a BLANK, then zeros
    after = [m for m in recs if m["offset"] >= 31 * SEG]
    assert p.salvage["validRecordsAfter"] == len(after)
    moved = {os.path.basename(a.path) for a in p.actions if a.kind == "move_aside" and "commitlog" in a.path}
    assert {"%020d" % (s * SEG) for s in range(31, 56)} <= moved
    assert p.exit_code == 2


@pytest.mark.parametrize("v", [4, 5])
def test_garbage_in_consume_queue(store_copy, v):
    root = store_copy("4.9.3-clean", f"c{v}")
    qdir = root / "consumequeue" / "OracleTopicA" / "1"
    (f,) = os.listdir(qdir)
    patch(qdir / f, 20 * 50, b"\xff" * 200)  # units 50..59: phy = -1, invalid (§7.4)
    p = plan(root, v)
    q = next(q for q in p.summary["queues"] if (q["topic"], q["queueId"]) == ("OracleTopicA", 1))
    c = next(c for c in broker_read("4.9.3-clean")["cq"] if (c["topic"], c["queueId"]) == ("OracleTopicA", 1))
    assert q["maxOffset"] == c["maxOffset"]  # re-dispatched (the broker alone would leave it at 50)
    assert any("OracleTopicA/1" in n for n in p.notes)
    assert p.exit_code == 1
    original = digest(root)
    assert run("recover", root, "--broker-version", v).exit_code == 0
    with open(qdir / f, "rb") as fh, open(broker_store("4.9.3-clean") / "consumequeue/OracleTopicA/1" / f, "rb") as g:
        assert fh.read() == g.read()
    parent = root.parent / (root.name + ".rmqstore-backup")
    assert run("restore", parent / os.listdir(parent)[0]).exit_code == 0
    assert digest(root) == original


def broker_store(name):
    from .conftest import shared_store

    return shared_store(name)


@pytest.mark.parametrize("v", [4, 5])
def test_missing_consume_queue_directory(store_copy, v):
    import shutil

    root = store_copy("4.9.3-clean", f"c{v}")
    shutil.rmtree(root / "consumequeue" / "OracleTopicA" / "2")
    p = plan(root, v)
    q = next(q for q in p.summary["queues"] if (q["topic"], q["queueId"]) == ("OracleTopicA", 2))
    c = next(c for c in broker_read("4.9.3-clean")["cq"] if (c["topic"], c["queueId"]) == ("OracleTopicA", 2))
    assert (q["minOffset"], q["maxOffset"], q["maxPhysicOffset"]) == (c["minOffset"], c["maxOffset"], c["maxPhysicOffset"])
    assert p.exit_code == 1
    assert run("recover", root, "--broker-version", v).exit_code == 0
    src = broker_store("4.9.3-clean") / "consumequeue/OracleTopicA/2"
    for n in os.listdir(src):
        assert (root / "consumequeue/OracleTopicA/2" / n).read_bytes() == (src / n).read_bytes()


@pytest.mark.parametrize("v", [4, 5])
def test_half_truncated_index_file(store_copy, v):
    root = store_copy("4.9.3-clean", f"c{v}")
    names = sorted(os.listdir(root / "index"))
    bad = root / "index" / names[10]
    os.truncate(bad, os.path.getsize(bad) // 2)
    p = plan(root, v)
    assert set(p.index_deleted) == set(names[10:])  # it and the files after it: the ten before are kept
    assert p.exit_code == 1
    assert run("recover", root, "--broker-version", v).exit_code == 0
    with Store.open(str(root)) as st:
        hdrs = [f.header().as_json() for f in st.index.files]
    expected = broker_read("4.9.3-clean")["index"][0]["files"]
    assert hdrs == [{k: f[k] for k in hdrs[0]} for f in expected]


@pytest.mark.parametrize("v", [4, 5])
def test_stray_tmp_and_zero_length_segment(store_copy, v):
    root = store_copy("4.9.3-clean", f"c{v}")
    (root / "commitlog" / "00000000000003670016.tmp").write_bytes(b"x" * 10)
    (root / "commitlog" / "00000000000003670016").write_bytes(b"")
    p = plan(root, v)
    refusals = " ".join(p.refusals)
    assert ".tmp" in refusals and "not a number" in refusals  # §1.3 NumberFormatException, both versions
    # §1.3: 4.9.3 refuses any wrong-size file; 5.3.3 deletes a zero-length last file itself
    assert ("zero-length" in refusals) == (v == 4)
    moved = {os.path.basename(a.path) for a in p.actions if a.kind == "move_aside"}
    assert {"00000000000003670016.tmp", "00000000000003670016"} <= moved
    assert p.exit_code == 1
    r = run("recover", root, "--broker-version", v)
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(root / "commitlog")) == sorted(os.listdir(broker_store("4.9.3-clean") / "commitlog"))
    parent = root.parent / (root.name + ".rmqstore-backup")
    moved_dir = parent / os.listdir(parent)[0] / "moved" / "commitlog"
    assert sorted(os.listdir(moved_dir)) == ["00000000000003670016", "00000000000003670016.tmp"]


def test_truncate_cascades_and_restores(store_copy):
    root = store_copy("4.9.3-clean")
    recs = clmsgs("4.9.3-clean")
    cut = recs[1000]["offset"]
    r = run("truncate", root, "--offset", cut + 1, "--dry-run")
    assert r.exit_code == 3 and str(cut) in r.output and str(recs[1001]["offset"]) in r.output
    original = digest(root)
    r = run("truncate", root, "--offset", cut)
    assert r.exit_code == 0, r.output
    kept = {(e["topic"], e["queueId"], e["queueOffset"]) for e in broker_read("4.9.3-clean")["cqe"] if e["phyOffset"] < cut}
    with Store.open(str(root)) as st:
        assert [m["offset"] for m in st.commitlog.records(with_body=False)] == [m["offset"] for m in recs[:1000]]
        got = set()
        for t, q in st.queues():
            u = st.queue(t, q).units()
            got |= {(t, q, o) for o in u.queue_offsets.tolist()}
        assert got == kept
    parent = root.parent / (root.name + ".rmqstore-backup")
    assert run("restore", parent / os.listdir(parent)[0]).exit_code == 0
    assert digest(root) == original


def test_interrupted_apply_is_finished_by_the_next_run(store_copy, monkeypatch):
    """A kill during the re-dispatch: the next recover rolls the partial dispatch back and finishes."""
    from rmqstore_cli.engine.derived import dispatch

    root = store_copy("4.9.3-crash")
    original = digest(root)
    calls = {"n": 0}
    real = dispatch.Dispatcher.dispatch_many

    def dying(self, reqs):
        calls["n"] += 1
        real(self, reqs[: len(reqs) // 2])
        self.flush()
        raise KeyboardInterrupt

    monkeypatch.setattr(dispatch.Dispatcher, "dispatch_many", dying)
    r = run("recover", root)
    assert r.exit_code != 0
    monkeypatch.setattr(dispatch.Dispatcher, "dispatch_many", real)
    r = run("recover", root)
    assert r.exit_code == 0, r.output
    assert "resuming" in r.output
    assert run("recover", root, "--dry-run").exit_code == 0
    parent = root.parent / (root.name + ".rmqstore-backup")
    assert len(os.listdir(parent)) == 1
    assert run("restore", parent / os.listdir(parent)[0]).exit_code == 0
    assert digest(root) == original


@pytest.mark.parametrize("name,v", [("4.9.3-clean", 4), ("5.3.3-clean", 5)])
def test_garbage_unit_the_broker_accepts_is_cut_and_redispatched(store_copy, name, v):
    """60 random bytes over four units, the first still 'valid' to the broker (phy >= 0, size > 0):
    the plan names the broker's result and ours; recover then verify is clean and every queue equals
    the undamaged store's byte for byte."""
    import random

    root = store_copy(name, f"c{v}")
    qdir = root / "consumequeue" / "OracleTopicA" / "1"
    (f,) = os.listdir(qdir)
    units = [e for e in broker_read(name)["cqe"] if (e["topic"], e["queueId"]) == ("OracleTopicA", 1)]
    k = len(units) // 2
    junk = bytearray(random.Random(12).randbytes(60))
    struct.pack_into(">qi", junk, 0, units[k]["phyOffset"] + 7, 58103)  # a unit the broker's test accepts
    struct.pack_into(">q", junk, 20, -1)  # ... followed by one it does not: the broker's queue ends at k + 1
    patch(qdir / f, 20 * k, bytes(junk))
    r = run("recover", root, "--broker-version", v, "--dry-run", "--json")
    plan = next(o for o in (json.loads(x) for x in r.stdout.splitlines() if x.startswith("{"))
                if o.get("type") == "recover-plan")
    (qr,) = plan["queueRepairs"]
    assert (qr["topic"], qr["queueId"], qr["firstBadOffset"], qr["code"]) == ("OracleTopicA", 1, k, "CQ_NO_RECORD")
    c = next(c for c in broker_read(name)["cq"] if (c["topic"], c["queueId"]) == ("OracleTopicA", 1))
    # the broker keeps the lying unit and its queue ends after it; ours ends where the undamaged one does
    assert qr["broker"]["maxOffset"] == k + 1 and qr["broker"]["keepsLyingUnit"] == "CQ_NO_RECORD"
    assert (qr["ours"]["minOffset"], qr["ours"]["maxOffset"]) == (c["minOffset"], c["maxOffset"])
    assert qr["recordsSaved"] == c["maxOffset"] - k
    assert qr["ours"]["redispatchFrom"] == units[k]["phyOffset"]
    text = run("recover", root, "--broker-version", v, "--dry-run").output
    assert f"broker leaves offsets {c['minOffset']}..{k + 1}" in text and f"we leave {c['minOffset']}..{c['maxOffset']}" in text
    r = run("recover", root, "--broker-version", v)
    assert "verify after apply: 0 errors, 0 warnings" in r.output, r.output
    assert run("verify", root).exit_code == 0
    src = broker_store(name)
    for sub in ("consumequeue",):
        for dp, _, fn in os.walk(src / sub):
            for n in fn:
                rel = os.path.relpath(os.path.join(dp, n), src)
                assert (root / rel).read_bytes() == (src / rel).read_bytes(), rel


def test_swapped_units_are_not_kept_and_nothing_is_shifted(store_copy):
    """Two swapped units: each names a record whose QUEUEOFFSET is the other's position."""
    root = store_copy("4.9.3-clean")
    qdir = root / "consumequeue" / "OracleTopicA" / "2"
    (f,) = os.listdir(qdir)
    data = bytearray((qdir / f).read_bytes())
    data[200:240] = data[220:240] + data[200:220]
    (qdir / f).write_bytes(bytes(data))
    p = plan(root, 4)
    assert [(q["firstBadOffset"], q["code"]) for q in p.queue_repairs] == [(10, "CQ_QUEUE_OFFSET")]
    assert run("recover", root).exit_code == 0
    assert (qdir / f).read_bytes() == (broker_store("4.9.3-clean") / "consumequeue/OracleTopicA/2" / f).read_bytes()


def test_gap_in_queue_offsets_is_refused_not_shifted(store_copy):
    """A record whose QUEUEOFFSET field is changed (not covered by the CRC): the log cannot supply that
    offset, so the queue is refused (left as the broker leaves it), never shifted."""
    root = store_copy("4.9.3-clean")
    e = [e for e in broker_read("4.9.3-clean")["cqe"] if (e["topic"], e["queueId"]) == ("OracleTopicA", 3)][20]
    rec = next(m for m in clmsgs("4.9.3-clean") if m["offset"] == e["phyOffset"])
    start = rec["offset"] - rec["offset"] % SEG
    patch(seg_path(root, start), rec["offset"] - start + 20, struct.pack(">q", 999999))  # QUEUEOFFSET (§2.1 @20)
    p = plan(root, 4)
    (ref,) = p.refused_queues
    assert (ref["topic"], ref["queueId"], ref["firstBadOffset"]) == ("OracleTopicA", 3, 20)
    qfile = root / "consumequeue" / "OracleTopicA" / "3" / os.listdir(root / "consumequeue" / "OracleTopicA" / "3")[0]
    before = qfile.read_bytes()
    run("recover", root)
    assert qfile.read_bytes() == before  # the queue is left alone, not cut or shifted


def test_lying_index_entry_rebuilds_from_its_file(store_copy):
    """An entry whose phyOffset names another record: that file and the ones after it are rebuilt, the
    earlier files stay, and the index content equals the broker's."""
    from . import fuzzlib

    root = store_copy("4.9.3-clean")
    names = sorted(os.listdir(root / "index"))
    info = {f["name"]: f for f in broker_read("4.9.3-clean")["index"][0]["files"]}
    victim = names[12]
    slots = int(broker_read("4.9.3-clean")["store"][0]["maxHashSlotNum"])
    pos = 40 + slots * 4 + (info[victim]["indexCount"] // 2) * 20 + 4
    data = bytearray((root / "index" / victim).read_bytes())
    old = struct.unpack_from(">q", data, pos)[0]
    other = next(m["offset"] for m in clmsgs("4.9.3-clean") if m["offset"] > old + 5000)
    struct.pack_into(">q", data, pos, other)
    (root / "index" / victim).write_bytes(bytes(data))
    p = plan(root, 4)
    # the victim and the files after it; the earlier ones are kept (even when the record a kept file ends
    # with has keys in the victim: they are re-indexed from the first key the kept file lacks)
    first = names.index(p.index_deleted[0])
    assert first == 12 and p.index_deleted == names[first:]
    assert run("recover", root).exit_code == 0
    assert sorted(os.listdir(root / "index"))[:first] == names[:first]
    assert fuzzlib.index_content(root, slots) == fuzzlib.index_content(broker_store("4.9.3-clean"), slots)
