"""Batch consume queues (FORMAT.md §9) on the store the real 5.3.3 store code wrote (stores/batchcq-5.3.3):
reads against the broker's read-back (bcqRaw, get, offset tables), writes against the broker's own files."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.derived.batchcq import batch_fields

from .conftest import STORES, broker_read, files_of, json_lines, recover_plan, tree_digest

NAME = "batchcq-5.3.3"
CONF = STORES / NAME / "broker.conf"
TOPIC = "BatchTopicX"
runner = CliRunner()

# config/topics.json as a 5.x broker writes it (fastjson, tab indented, fields sorted; FORMAT.md §15)
TOPICS_JSON = """{
\t"dataVersion":{
\t\t"counter":2,
\t\t"stateVersion":0,
\t\t"timestamp":1795659525000
\t},
\t"topicConfigTable":{
\t\t"BatchTopicX":{
\t\t\t"attributes":{
\t\t\t\t"queue.type":"BatchCQ"
\t\t\t},
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":2,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"BatchTopicX",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":2
\t\t},
\t\t"PlainTopicY":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":2,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"PlainTopicY",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":2
\t\t}
\t}
}"""


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def derived(root) -> dict:
    return {"cq": files_of(root, "consumequeue"), "bcq": files_of(root, "batchconsumequeue")}


def bcq_raw():
    return broker_read(NAME)["bcqRaw"]


def offset_tables() -> dict:
    out = {}
    for t in broker_read(NAME)["offsetTable"]:
        out.update(t["entries"])
    return out


def test_batch_fields_rule():
    assert batch_fields({"INNER_NUM": "4", "INNER_BASE": "10"}, 10) == (10, 4)
    assert batch_fields({"INNER_NUM": "4"}, 7) == (7, 1)  # both are needed (setBatchSizeIfNeeded)
    assert batch_fields({}, 7) == (7, 1)
    for bad in ({"INNER_NUM": "x", "INNER_BASE": "1"}, {"INNER_NUM": "40000", "INNER_BASE": "1"},
                {"INNER_NUM": "2", "INNER_BASE": ""}):
        with pytest.raises(ValueError):
            batch_fields(bad, 0)


# --- reads --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("with_conf", [True, False])
def test_verify_dump_match_broker(with_conf):
    root = STORES / NAME / "store"
    before = tree_digest(root)
    conf = ["--config", CONF] if with_conf else []  # without it the geometry comes from the files
    r = run("verify", root, "--json", *conf)
    assert r.exit_code == 0, r.output
    assert [o for o in json_lines(r.stdout) if o.get("severity") in ("error", "warning")] == []
    rows = json_lines(run("dump", "consumequeue", root, "--json", *conf).stdout)
    got = sorted((o["topic"], o["queueId"], o["phyOffset"], o["size"], o["tagsCode"], o["storeTime"], o["queueOffset"],
                  o["batchSize"], o["compactedOffset"], o["reserved"]) for o in rows if o.get("queueType") == "BatchCQ")
    want = sorted((u["file"].split("/")[1], int(u["file"].split("/")[2]), u["phyOffset"], u["size"], u["tagsCode"],
                   u["storeTime"], u["msgBaseOffset"], u["batchSize"], u["compactedOffset"], u["reserved"]) for u in bcq_raw())
    assert got == want and len(want) == 164
    plain = sorted((o["topic"], o["queueId"], o["queueOffset"], o["phyOffset"]) for o in rows if "queueType" not in o)
    assert plain == sorted((u["topic"], u["queueId"], u["queueOffset"], u["phyOffset"]) for u in broker_read(NAME)["cqUnit"])
    assert tree_digest(root) == before


def test_get_inside_batches_returns_what_the_broker_returns():
    root = STORES / NAME / "store"
    gets = [g for g in broker_read(NAME)["get"] if g["topic"] == TOPIC]
    found = [g for g in gets if g["status"] == "FOUND"]
    assert len(found) == 234 + 360
    for g in found[::7] + found[-3:]:  # every 7th offset (inside batches and at their first offset) and the last ones
        r = run("get", root, "--topic", TOPIC, "--queue", g["queueId"], "--queue-offset", g["offset"], "--json")
        assert r.exit_code == 0, (g, r.output)
        m = json_lines(r.stdout)[0]
        assert (m["commitLogOffset"], m["storeSize"], m["messageCount"], m["nextBeginOffset"]) == (
            g["bufferPhyOffsets"][0], g["bufferSizes"][0], g["messageCount"], g["nextBeginOffset"]), g
    for g in gets:
        if g["status"] == "OFFSET_OVERFLOW_ONE":
            assert run("get", root, "--topic", TOPIC, "--queue", g["queueId"], "--queue-offset", g["offset"]).exit_code != 0


def test_stats_count_messages():
    s = json.loads(run("stats", STORES / NAME / "store", "--json").stdout)
    tables = offset_tables()
    for q in s["queues"]:
        assert q["maxQueueOffset"] + 1 == tables[f"{q['topic']}-{q['queueId']}"]
        assert q["messages"] == tables[f"{q['topic']}-{q['queueId']}"]  # every queue starts at 0 here
    assert s["records"] == 200 and s["messages"] == sum(tables.values())
    lag = {(r["topic"], r["queueId"]): r for r in s["consumeQueueLag"]}
    assert all(r["lagMessages"] == 0 for r in lag.values()) and lag[(TOPIC, 1)]["cqMaxOffset"] == 360


def test_recover_dry_run_plans_nothing():
    root = STORES / NAME / "store"
    before = tree_digest(root)
    r = run("recover", root, "--dry-run", "--json", "--config", CONF)
    plan = recover_plan(r.stdout)
    assert plan["dataLoss"] == [] and plan["refusals"] == [] and plan["queueRepairs"] == [] and plan["refusedQueues"] == []
    # the only action: the confirmPhyOffset the broker's next start writes (its reopen wrote 200958, README)
    assert [(a["action"], a["fields"]["confirmPhyOffset"]) for a in plan["actions"]] == [("checkpoint", 200958)]
    summary = next(o for o in json_lines(r.stdout) if o.get("type") == "recover")
    assert {f"{q['topic']}-{q['queueId']}": q["maxOffset"] for q in summary["queues"]} == offset_tables()
    phys = {(q["topic"], q["queueId"]): q["maxPhysicOffset"] for q in summary["queues"] if q.get("queueType")}
    assert phys == {(q["topic"], q["queueId"]): q["maxPhysicOffset"] for q in broker_read(NAME)["queue"]
                    if q["cqType"] == "BatchCQ"}  # the broker keeps the last record's start for a batch queue
    assert tree_digest(root) == before


# --- writes ---------------------------------------------------------------------------------------------------

def test_rebuild_gives_batch_queues_back_byte_for_byte(store_copy, tmp_path):
    root = store_copy(NAME)
    want = derived(root)
    shutil.rmtree(root / "batchconsumequeue")
    os.makedirs(root / "config")
    (root / "config" / "topics.json").write_text(TOPICS_JSON)
    r = run("rebuild", "consumequeue", root, "--config", CONF, "--backup-dir", tmp_path / "bk")
    assert r.exit_code == 0, r.output
    assert derived(root) == want
    # and on the intact store without topics.json (the folders say which topics are batch topics), in parallel
    os.remove(root / "config" / "topics.json")
    r = run("rebuild", "consumequeue", root, "--backup-dir", tmp_path / "bk2", "-j", 2)
    assert r.exit_code == 0, r.output
    assert derived(root) == want


def _unit_path(root, qid, file_start=0):
    return root / "batchconsumequeue" / TOPIC / str(qid) / ("%020d" % file_start)


def test_wrong_batch_size_found_and_repaired(store_copy, tmp_path):
    root = store_copy(NAME)
    want = derived(root)
    p = _unit_path(root, 0)
    d = bytearray(p.read_bytes())
    struct.pack_into(">h", d, 5 * 46 + 36, 9)  # unit 5: batchSize 9
    p.write_bytes(bytes(d))
    r = run("verify", root, "--json")
    codes = {o["code"] for o in json_lines(r.stdout) if o.get("severity") == "error"}
    assert r.exit_code == 1 and "BCQ_BATCH_SIZE" in codes
    plan = recover_plan(run("recover", root, "--dry-run", "--json").stdout)
    assert plan["dataLoss"] == [] and plan["refusedQueues"] == [] and plan["expectedApplyExitCode"] == 0
    assert run("recover", root, "--backup-dir", tmp_path / "bk").exit_code == 0
    assert derived(root) == want
    assert run("verify", root).exit_code == 0


def test_truncated_batch_queue_redispatched(store_copy, tmp_path):
    root = store_copy(NAME)
    want = derived(root)
    p = _unit_path(root, 1)
    d = bytearray(p.read_bytes())
    d[20 * 46:] = bytes(len(d) - 20 * 46)
    p.write_bytes(bytes(d))
    os.remove(_unit_path(root, 1, 2300))
    r = run("verify", root, "--json")
    (f,) = [o for o in json_lines(r.stdout) if o.get("severity") == "error"]
    units = sorted((u for u in bcq_raw() if u["file"].startswith(f"batchconsumequeue/{TOPIC}/1/")),
                   key=lambda u: u["msgBaseOffset"])
    kept = [u for u in broker_read(NAME)["cqUnit"] + bcq_raw() if not any(u is x for x in units[20:])]
    high = max(u["phyOffset"] + u["size"] for u in kept)  # the broker re-dispatches from there at start: lag, not lost
    lost = [u for u in units[20:] if u["phyOffset"] < high]
    assert (f["code"], f["topic"], f["queueId"], f["queueOffset"], f["count"]) == (
        "CQ_NOT_DISPATCHED", TOPIC, 1, units[20]["msgBaseOffset"], len(lost))  # counted per record, not message
    assert len(lost) < len(units) - 20
    assert run("recover", root, "--backup-dir", tmp_path / "bk").exit_code == 0
    assert derived(root) == want


def test_batch_unit_past_the_log_end(store_copy, tmp_path):
    root = store_copy(NAME)
    clmsgs = sorted(broker_read(NAME)["clmsg"], key=lambda m: m["offset"])
    cut = clmsgs[-1]["offset"]  # the last record is lost (zeroed): units still point at it
    seg = max(int(n) for n in os.listdir(root / "commitlog"))
    p = root / "commitlog" / ("%020d" % seg)
    d = bytearray(p.read_bytes())
    d[cut - seg:] = bytes(len(d) - (cut - seg))
    p.write_bytes(bytes(d))
    r = run("verify", root, "--json")
    assert r.exit_code == 1 and "CL_LOST_TAIL" in {o["code"] for o in json_lines(r.stdout)}
    plan = recover_plan(run("recover", root, "--dry-run", "--json").stdout)
    assert plan["expectedApplyExitCode"] == 0
    assert run("recover", root, "--backup-dir", tmp_path / "bk").exit_code == 0
    assert run("verify", root).exit_code == 0
    rows = json_lines(run("dump", "consumequeue", root, "--json").stdout)
    got = sorted((o["queueId"], o["phyOffset"]) for o in rows if o.get("queueType") == "BatchCQ")
    assert got == sorted((int(u["file"].split("/")[2]), u["phyOffset"]) for u in bcq_raw() if u["phyOffset"] < cut)


def test_truncate_cuts_batch_queues(store_copy, tmp_path):
    root = store_copy(NAME)
    cut = sorted(m["offset"] for m in broker_read(NAME)["clmsg"])[120]
    r = run("truncate", root, "--offset", cut, "--backup-dir", tmp_path / "bk")
    assert r.exit_code == 0, r.output
    rows = json_lines(run("dump", "consumequeue", root, "--json").stdout)
    got = sorted((o["queueId"], o["phyOffset"]) for o in rows if o.get("queueType") == "BatchCQ")
    assert got == sorted((int(u["file"].split("/")[2]), u["phyOffset"]) for u in bcq_raw() if u["phyOffset"] < cut)
    assert run("verify", root).exit_code == 0


def test_batch_topic_offsets_against_batch_queues(store_copy):
    """A group's committed offsets of a batch topic count messages: they are checked against the batch queues."""
    root = store_copy(NAME)
    os.makedirs(root / "config")
    (root / "config" / "consumerOffset.json").write_text(
        '{\n\t"offsetTable":{\n\t\t"BatchTopicX@g1":{0:230,1:400\n\t\t}\n\t}\n}')
    tables = offset_tables()
    rows = {o["queueId"]: o for o in json_lines(run("dump", "offsets", root, "--json").stdout) if o.get("type") == "offset"}
    assert (rows[0]["maxOffset"], rows[0]["lagMessages"], rows[0]["code"]) == (tables[f"{TOPIC}-0"], tables[f"{TOPIC}-0"] - 230, None)
    assert (rows[1]["maxOffset"], rows[1]["code"]) == (tables[f"{TOPIC}-1"], "CO_ABOVE_MAX")
    s = json.loads(run("dump", "store", root, "--json").stdout.splitlines()[0])
    assert {(q["topic"], q["queueId"]): q["maxOffset"] for q in s["queues"]} == {
        tuple(k.rsplit("-", 1)[:1]) + (int(k.rsplit("-", 1)[1]),): v for k, v in tables.items()}


def test_append_refused_on_batch_store(store_copy):
    """Appends would need inner batches (INNER_BASE assignment): refused, nothing written."""
    root = store_copy(NAME)
    before = tree_digest(root)
    r = run("append", root, "--topic", TOPIC, "--body", "x")
    assert r.exit_code == 3 and "batch consume queues" in r.output
    assert tree_digest(root) == before


def test_deleted_batch_queue_recreated_by_recover(store_copy, tmp_path):
    root = store_copy(NAME)
    want = derived(root)
    shutil.rmtree(root / "batchconsumequeue" / TOPIC / "1")
    plan = recover_plan(run("recover", root, "--dry-run", "--json").stdout)
    assert plan["refusedQueues"] == [] and plan["dataLoss"] == []
    assert run("recover", root, "--backup-dir", tmp_path / "bk").exit_code == 0
    assert derived(root) == want


@pytest.mark.parametrize("damage", ["tail", "deleted", "abort", "lost_log_tail", "none"])
def test_windowed_batch_check_plans_as_the_whole_table(store_copy, damage, monkeypatch):
    """The batch queues' check window by window gives the plan the whole-record-table check gives."""
    from rmqstore_cli.engine.repair import batchrecovery
    from rmqstore_cli.engine.repair.recovery import plan_recovery
    from rmqstore_cli.engine.store import Store

    root = store_copy(NAME)
    if damage in ("tail", "abort"):
        p = _unit_path(root, 1)
        d = bytearray(p.read_bytes())
        d[20 * 46:] = bytes(len(d) - 20 * 46)
        p.write_bytes(bytes(d))
        os.remove(_unit_path(root, 1, 2300))
        if damage == "abort":
            (root / "abort").write_bytes(b"")
    elif damage == "deleted":
        shutil.rmtree(root / "batchconsumequeue" / TOPIC / "0")
    elif damage == "lost_log_tail":
        cut = sorted(m["offset"] for m in broker_read(NAME)["clmsg"])[-3]
        seg = max(int(n) for n in os.listdir(root / "commitlog"))
        p = root / "commitlog" / ("%020d" % seg)
        d = bytearray(p.read_bytes())
        d[cut - seg:] = bytes(len(d) - (cut - seg))
        p.write_bytes(bytes(d))

    def plan():
        with Store.open(str(root)) as st:
            p = plan_recovery(st)
            return [a.__dict__ for a in p.actions], p.notes, p.dispatch, p.summary, p.refused_queues

    used = []
    windowed = batchrecovery._windowed
    monkeypatch.setattr(batchrecovery, "_windowed", lambda planner: used.append(windowed(planner)) or used[-1])
    first = plan()
    assert used == [True]  # the windowed check decided
    monkeypatch.setattr(batchrecovery, "_windowed", lambda planner: False)
    assert plan() == first
