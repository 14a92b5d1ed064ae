"""The RocksDB consume queue (5.3 storeType=defaultRocksDB) read offline, against the broker's read-back.

Truth: ``rocksdbcq-5.3.3`` (a RocksDBMessageStore written and read back by the 5.3.3 store classes):
``broker-read.jsonl.gz`` (cqUnit per queue offset with the raw 28-byte value, queue min/max, the
checkpoint as maxPhyOffsetInConsumeQueue) and ``rocksdb-raw.jsonl.gz`` (every key/value of both column
families dumped by stock RocksJava). Damage is made in copies with rocksdict itself (the database is
the broker's format: a test cannot damage it with byte edits), never in the shared store.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmqstore_cli.formats import rocksdbcq as fmt
from rmqstore_cli.app import app
from rmqstore_cli.engine.errors import UsageError
from rmqstore_cli.engine.query.lookup import get_by_queue
from rmqstore_cli.engine.store import Store

from .conftest import REPO, STORES, broker_read, copy_store, tree_digest

NAME = "rocksdbcq-5.3.3"
GEOMETRY = ["--index-slots", "500", "--index-entries", "1000"]  # broker.conf of the sample
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def lines(out: str) -> list[dict]:
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def raw_dump() -> list[dict]:
    with gzip.open(STORES / NAME / "rocksdb-raw.jsonl.gz", "rt") as f:
        return [json.loads(x) for x in f]


@pytest.fixture
def store(tmp_path) -> Path:
    return copy_store(NAME, tmp_path / "store")


def broker_units() -> dict:
    return {(u["topic"], u["queueId"], u["queueOffset"]): u for u in broker_read(NAME)["cqUnit"]}


# --- the layouts ------------------------------------------------------------------------------


def test_layouts_decode_every_raw_entry_rocksjava_dumped():
    """Every key and value of both column families, as stock RocksJava dumped them, decodes to its fields."""
    n_units = n_offsets = 0
    for e in raw_dump():
        if e["type"] != "rocksdbKV":
            continue
        key, value = bytes.fromhex(e["keyHex"]), bytes.fromhex(e["valueHex"])
        if e["cf"] == "default":
            assert fmt.parse_unit_key(key) == (e["topic"], e["queueId"], e["queueOffset"])
            assert fmt.unit_key(e["topic"], e["queueId"], e["queueOffset"]) == key
            v = fmt.decode_values(value, 1)[0]
            assert (int(v["phyOffset"]), int(v["size"]), int(v["tagsCode"]), int(v["storeTime"])) == (
                e["phyOffset"], e["size"], e["tagsCode"], e["storeTime"])
            n_units += 1
        else:
            n_offsets += 1
            topic, kind, qid = fmt.parse_offset_key(key)
            assert fmt.offset_key(topic, qid, kind.encode()) == key
            if topic == fmt.CHECKPOINT_TOPIC:
                assert key == fmt.CHECKPOINT_KEY
                assert fmt.parse_checkpoint_value(value) == broker_read(NAME)["store"][0]["maxPhyOffsetInConsumeQueue"]
            else:
                q = next(q for q in broker_read(NAME)["queue"] if (q["topic"], q["queueId"]) == (topic, qid))
                phy, cq = fmt.parse_offset_value(value)
                assert kind == "max" and cq + 1 == q["maxOffset"] and phy == q["maxPhysicOffset"]
    assert n_units == 500 and n_offsets == 8


def test_malformed_keys_are_not_units():
    key = fmt.unit_key("T", 1, 2)
    assert fmt.parse_unit_key(key[:-1]) is None and fmt.parse_unit_key(key + b"\0") is None
    assert fmt.parse_unit_key(b"\xff" * 3) is None and fmt.parse_offset_key(key) is None
    start, end = fmt.queue_range("T", 1)
    assert start < key < end and not (start < fmt.unit_key("T", 2, 0) < end)


# --- reads against the broker ---------------------------------------------------------------------


def test_dump_consumequeue_is_the_broker_read_back_and_changes_nothing(store):
    before = tree_digest(store)
    r = run("dump", "consumequeue", store, "--json")
    assert r.exit_code == 0, r.output
    rows = lines(r.stdout)
    assert tree_digest(store) == before  # every byte, every mtime, and no file added (rocksdict-config.json)
    want = broker_units()
    assert len(rows) == len(want) == 500
    for row in rows:
        u = want[(row["topic"], row["queueId"], row["queueOffset"])]
        assert (row["phyOffset"], row["size"], row["tagsCode"], row["storeTime"]) == (
            u["kvPhyOffset"], u["kvSize"], u["kvTagsCode"], u["storeTime"])
        assert (row["phyOffset"], row["size"], row["tagsCode"]) == (u["phyOffset"], u["size"], u["tagsCode"])
        assert "dirty" not in row
    # selection options: one queue, a range, a store-time window
    r = run("dump", "consumequeue", store, "--json", "--topic", "RdbTopicB", "--queue", 1, "--from", 10, "--to", 20)
    assert [x["queueOffset"] for x in lines(r.stdout)] == list(range(10, 20))
    times = sorted(u["storeTime"] for u in want.values())
    r = run("dump", "consumequeue", store, "--json", "--since", times[100], "--until", times[199])
    assert len(lines(r.stdout)) == sum(1 for t in times if times[100] <= t <= times[199])


def test_queue_bounds_and_checkpoint_are_the_broker_read_back(store):
    with Store.open(str(store)) as st:
        assert st.layout.has("rocksdb-cq")
        assert st.queues() == sorted((q["topic"], q["queueId"]) for q in broker_read(NAME)["queue"])
        for q in broker_read(NAME)["queue"]:
            cq = st.queue(q["topic"], q["queueId"])
            assert (cq.min_offset(), cq.max_offset, cq.max_entry.phy_offset) == (q["minOffset"], q["maxOffset"],
                                                                                  q["maxPhysicOffset"])
            present = [o for (t, i, o) in broker_units() if (t, i) == (q["topic"], q["queueId"])]
            it = next(x for x in broker_read(NAME)["iterate"] if (x["topic"], x["queueId"]) == (q["topic"], q["queueId"]))
            assert cq.units().queue_offsets.tolist() == sorted(present) == it["queueOffsets"]
        assert st.rocksdb.checkpoint == broker_read(NAME)["store"][0]["maxPhyOffsetInConsumeQueue"]
        tmp = st.rocksdb._tmp
        assert os.path.isdir(tmp)
    assert not os.path.exists(tmp)  # the private copy is gone with the store


def test_blocks_are_bounded_and_ordered(store):
    """A queue is read in blocks of at most ``block`` units, in queue-offset order (memory flat)."""
    with Store.open(str(store)) as st:
        cq = st.queue("RdbTopicC", 0)
        blocks = list(cq.blocks(block=16))
        assert max(len(q) for q, _ in blocks) == 16 and len(blocks) == -(-161 // 16)
        offs = [int(o) for q, _ in blocks for o in q]
        assert offs == list(range(161))


def test_get_by_queue_offset_returns_the_broker_record(store):
    with Store.open(str(store)) as st:
        for (topic, qid, qoff), u in broker_units().items():
            m = get_by_queue(st, topic, qid, qoff, with_body=False)
            want = u["msg"]
            assert (m["offset"], m["storeSize"], m["queueOffset"], m["storeTimestamp"]) == (
                want["commitLogOffset"], want["storeSize"], want["queueOffset"], want["storeTimestamp"])
            assert (m["properties"].get("UNIQ_KEY"), m["properties"].get("KEYS"), m["properties"].get("TAGS")) == (
                want["uniqKey"], want["keys"], want["tags"])
    before = tree_digest(store)
    r = run("get", store, "--topic", "RdbTopicB", "--queue", 1, "--queue-offset", 100, "--json", "--body", "none")
    assert r.exit_code == 0, r.output
    assert lines(r.stdout)[0]["commitLogOffset"] == broker_units()[("RdbTopicB", 1, 100)]["phyOffset"]
    r = run("get", store, "--topic", "RdbTopicB", "--queue", 1, "--queue-offset", 103)
    assert r.exit_code == 1 and "past the end of the queue (max offset 103)" in r.output
    assert tree_digest(store) == before


def test_get_by_time_is_the_first_unit_stored_at_or_after(store):
    """getOffsetInQueueByTime (LOWER) on the units' own store times: the first offset stored at or after the
    time; the max offset when every unit is older (expected values from the broker's units)."""
    units = broker_units()
    from rmqstore_cli.engine.query.timesearch import offset_by_time

    with Store.open(str(store)) as st:
        for q in broker_read(NAME)["queue"]:
            times = [units[(q["topic"], q["queueId"], o)]["storeTime"] for o in range(q["maxOffset"])]
            probes = sorted({times[0] - 1, times[-1] + 1, *times[:: max(1, len(times) // 7)],
                             *(t + 1 for t in times[:: max(1, len(times) // 5)])})
            for t in probes:
                want = next((o for o, s in enumerate(times) if s >= t), q["maxOffset"])
                assert offset_by_time(st, q["topic"], q["queueId"], t) == want, (q["topic"], q["queueId"], t)


def test_verify_clean_without_false_dispatch_lag(store):
    before = tree_digest(store)
    r = run("verify", store, "--json", *GEOMETRY)
    assert tree_digest(store) == before
    assert r.exit_code == 0, r.output
    assert lines(r.stdout) == []  # no finding at all, no CQ_DISPATCH_LAG


def test_stats_and_offsets_lag(store):
    (store / "config").mkdir()
    committed = {("RdbTopicA", 0): 10, ("RdbTopicA", 1): 34, ("RdbTopicB", 1): 100, ("RdbTopicC", 0): 0}
    table = {}
    for (t, q), o in committed.items():
        table.setdefault(f"{t}@g1", {})[str(q)] = o
    (store / "config" / "consumerOffset.json").write_text(json.dumps({"offsetTable": table}))
    before = tree_digest(store)
    r = run("dump", "offsets", store, "--json")
    assert r.exit_code == 0, r.output
    units = broker_units()
    maxes = {(q["topic"], q["queueId"]): q["maxOffset"] for q in broker_read(NAME)["queue"]}
    got = {(x["topic"], x["queueId"]): x for x in lines(r.stdout) if x.get("type") == "offset"}
    assert set(got) == set(committed)
    for key, o in committed.items():
        want_bytes = sum(units[(*key, k)]["size"] for k in range(o, maxes[key]))
        assert (got[key]["maxOffset"], got[key]["lagMessages"], got[key]["lagBytes"]) == (maxes[key], maxes[key] - o,
                                                                                          want_bytes)
    r = run("stats", store, "--json")
    assert r.exit_code == 0, r.output
    lag = {(x["topic"], x["queueId"]): x for x in json.loads(r.stdout)["consumeQueueLag"]}
    for q in broker_read(NAME)["queue"]:
        row = lag[(q["topic"], q["queueId"])]
        assert (row["cqMinOffset"], row["cqMaxOffset"], row["lagMessages"]) == (q["minOffset"], q["maxOffset"], 0)
    store_line = broker_read(NAME)["store"][0]
    assert json.loads(r.stdout)["rocksdbConsumeQueue"]["checkpoint"] == store_line["maxPhyOffsetInConsumeQueue"]
    assert json.loads(r.stdout)["rocksdbConsumeQueue"]["dispatchBehindBytes"] == store_line["dispatchBehindBytes"] == 0
    assert tree_digest(store) == before


def test_index_query_answers_like_the_broker(store):
    before = tree_digest(store)
    qs = [q for q in broker_read(NAME)["query"] if q["key"].startswith("rkey-533-1")][:5]
    for q in qs:
        r = run("index", "query", store, "--topic", q["topic"], "--key", q["key"], "--json", *GEOMETRY)
        assert r.exit_code == 0, r.output
        assert sorted(x["offset"] for x in lines(r.stdout) if "offset" in x) == sorted(q["offsets"])
    assert tree_digest(store) == before


# --- writes refused -----------------------------------------------------------------------------------


WRITES = [
    ["recover"], ["recover", "--dry-run"], ["rebuild", "consumequeue"], ["rebuild", "index"], ["rebuild", "all"],
    ["truncate", "--offset", "690"], ["append", "--topic", "RdbTopicA", "--body", "x"],
    ["offsets", "set", "--group", "g1", "--topic", "RdbTopicA", "--to-offset", "1"], ["repair", "config"],
]


def _with_store(args: list, store: Path) -> list:
    if args[0] in ("rebuild",):
        return [args[0], args[1], str(store), *args[2:]]
    if args[0] in ("offsets", "repair"):
        return [args[0], args[1], str(store), *args[2:]]
    return [args[0], str(store), *args[1:]]


@pytest.mark.parametrize("args", WRITES, ids=[" ".join(a[:2]) for a in WRITES])
def test_writing_commands_refuse_and_change_nothing(store, args):
    before = tree_digest(store)
    r = run(*_with_store(args, store))
    assert r.exit_code == 3, r.output
    assert "a RocksDB consume queue" in r.output and "does not write it the way the broker does" in r.output
    assert "nothing was changed" in r.output
    assert tree_digest(store) == before
    assert not any(p.name.startswith(store.name + ".rmqstore-backup") for p in store.parent.iterdir())


def test_salvage_to_refuses_and_jsonl_reads_the_log(store, tmp_path):
    before = tree_digest(store)
    r = run("salvage", store, "--to", tmp_path / "new")
    assert r.exit_code == 3 and not (tmp_path / "new").exists()
    assert "salvage --jsonl" in r.output and "nothing was changed" in r.output
    r = run("salvage", store, "--jsonl", tmp_path / "out.jsonl")
    assert r.exit_code == 0, r.output
    got = [json.loads(x)["offset"] for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert got == sorted(m["offset"] for m in broker_read(NAME)["clmsg"])
    assert tree_digest(store) == before


def test_refusal_is_one_line_from_the_real_cli(store):
    p = subprocess.run([sys.executable, "-m", "rmqstore_cli", "rebuild", "consumequeue", str(store)], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert p.returncode == 3 and p.stdout == ""
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "does not write it the way the broker does" in err[0] and "Traceback" not in p.stderr


# --- detection from the settings, damage ------------------------------------------------------------


def test_store_type_setting_on_file_queues_is_a_usage_error(tmp_path):
    root = copy_store("5.3.3-clean", tmp_path / "classic")
    conf = tmp_path / "broker.conf"
    conf.write_text("storeType=defaultRocksDB\n")
    r = run("dump", "consumequeue", root, "--config", conf)
    assert r.exit_code == 3 and "holds file consume queues" in r.output


def test_store_type_setting_without_database_reads_no_queue(store, tmp_path):
    """storeType=defaultRocksDB and no database yet: no unit; the broker dispatches every record at start."""
    for n in os.listdir(store / "consumequeue"):
        os.unlink(store / "consumequeue" / n)
    conf = tmp_path / "broker.conf"
    conf.write_text("storeType=defaultRocksDB\nmaxHashSlotNum=500\nmaxIndexNum=1000\n")
    r = run("verify", store, "--json", "--config", conf)
    codes = [f["code"] for f in lines(r.stdout)]
    assert r.exit_code == 0 and codes == ["CQ_DISPATCH_LAG"], r.output
    assert lines(r.stdout)[0]["count"] == 500


def _damage(store: Path, *, delete=(), put=(), delete_offsets=(), put_offsets=()):
    """Change the copy's database the way RocksDB writes it (rocksdict read-write, on the copy only)."""
    from rocksdict import Options, Rdict

    db = Rdict(str(store / "consumequeue"), options=Options(raw_mode=True),
               column_families={fmt.OFFSET_CF: Options(raw_mode=True)})
    off = db.get_column_family(fmt.OFFSET_CF)
    for k in delete:
        db.delete(k)
    for k, v in put:
        db[k] = v
    for k in delete_offsets:
        off.delete(k)
    for k, v in put_offsets:
        off[k] = v
    del off
    db.close()


def _value(u: dict, **change) -> bytes:
    d = {"phyOffset": u["phyOffset"], "size": u["size"], "tagsCode": u["tagsCode"], "storeTime": u["storeTime"], **change}
    return fmt.CQ_VALUE.build(d)


def verify_codes(store) -> tuple[int, dict]:
    r = run("verify", store, "--json", *GEOMETRY)
    return r.exit_code, {f["code"]: f for f in lines(r.stdout)}


def test_verify_finds_a_missing_unit_and_the_record_it_leaves_undispatched(store):
    u = broker_units()[("RdbTopicA", 0, 5)]
    _damage(store, delete=[fmt.unit_key("RdbTopicA", 0, 5)])
    code, found = verify_codes(store)
    assert code == 1 and set(found) == {"RDB_UNIT_MISSING", "CQ_NOT_DISPATCHED"}
    assert found["RDB_UNIT_MISSING"]["queueOffset"] == 5
    assert found["CQ_NOT_DISPATCHED"]["phyOffset"] == u["phyOffset"]


def test_verify_finds_units_that_differ_from_their_records(store):
    u = broker_units()[("RdbTopicB", 1, 7)]
    v = broker_units()[("RdbTopicC", 0, 9)]
    _damage(store, put=[(fmt.unit_key("RdbTopicB", 1, 7), _value(u, size=u["size"] + 1)),
                        (fmt.unit_key("RdbTopicC", 0, 9), _value(v, tagsCode=v["tagsCode"] + 1))])
    code, found = verify_codes(store)
    assert code == 1 and set(found) == {"CQ_SIZE", "CQ_TAGS"}
    assert found["CQ_SIZE"]["queueOffset"] == 7 and found["CQ_TAGS"]["queueOffset"] == 9


def test_verify_checks_the_offset_table(store):
    q = next(q for q in broker_read(NAME)["queue"] if q["topic"] == "RdbTopicA" and q["queueId"] == 2)
    _damage(store, put_offsets=[(fmt.offset_key("RdbTopicA", 2), fmt.OFFSET_VALUE.build(
        {"phyOffset": q["maxPhysicOffset"] + 1, "cqOffset": q["maxOffset"] - 1}))],
        delete_offsets=[fmt.offset_key("RdbTopicB", 0)])
    r = run("verify", store, "--json", *GEOMETRY)
    found = lines(r.stdout)
    assert r.exit_code == 1 and {f["code"] for f in found} == {"RDB_MAX_OFFSET"}, found
    # the wrong phy offset, and RdbTopicB/0 without a max entry
    assert sorted((f["topic"], f["queueId"]) for f in found) == [("RdbTopicA", 2), ("RdbTopicB", 0)]


def test_verify_dispatch_completeness_follows_the_checkpoint(store):
    """Units of the last records missing: after a checkpoint that says so, they are dispatch lag (the broker
    dispatches them at start, info); with the checkpoint still past them, they are never dispatched (error)."""
    clmsgs = sorted(broker_read(NAME)["clmsg"], key=lambda m: m["offset"])
    last = clmsgs[-3:]
    keys = [fmt.unit_key(m["topic"], m["queueId"], m["queueOffset"]) for m in last]
    _damage(store, delete=keys)
    code, found = verify_codes(store)
    assert code == 1 and "CQ_NOT_DISPATCHED" in found and "CQ_DISPATCH_LAG" not in found

    _damage(store, put_offsets=[(fmt.CHECKPOINT_KEY, fmt.CHECKPOINT_VALUE.build({"maxPhyOffset": last[0]["offset"]}))])
    code, found = verify_codes(store)
    # the max entries of those queues still name the deleted units: the offset table is wrong too
    assert "CQ_NOT_DISPATCHED" not in found and found["CQ_DISPATCH_LAG"]["count"] == 3
    assert found["CQ_DISPATCH_LAG"]["phyOffset"] == last[0]["offset"]


def test_verify_checkpoint_missing_or_past_the_log(store):
    _damage(store, put_offsets=[(fmt.CHECKPOINT_KEY, fmt.CHECKPOINT_VALUE.build({"maxPhyOffset": 10 ** 7}))])
    code, found = verify_codes(store)
    assert code == 1 and set(found) == {"RDB_CHECKPOINT"} and found["RDB_CHECKPOINT"]["checkpoint"] == 10 ** 7
    _damage(store, delete_offsets=[fmt.CHECKPOINT_KEY])
    code, found = verify_codes(store)
    assert code == 1 and "RDB_CHECKPOINT" in found


def test_without_rocksdict_one_line_says_what_to_install(store, monkeypatch):
    monkeypatch.setitem(sys.modules, "rocksdict", None)
    with Store.open(str(store)) as st:
        with pytest.raises(UsageError, match=r"rmqstore\[rocksdb\]"):
            st.queues()


def test_verify_finds_undecodable_entries_and_units_pointing_nowhere(store):
    u = broker_units()[("RdbTopicA", 3, 4)]
    w = broker_units()[("RdbTopicB", 0, 2)]
    _damage(store, put=[(fmt.unit_key("RdbTopicA", 3, 4), _value(u)[:20]),  # a 20-byte value
                        (fmt.unit_key("RdbTopicB", 0, 2), _value(w, phyOffset=w["phyOffset"] + 1)),
                        (b"\x00\x00\x00\x01garbage", b"x")])
    r = run("verify", store, "--json", *GEOMETRY)
    found = {f["code"]: f for f in lines(r.stdout)}
    assert r.exit_code == 1
    assert set(found) == {"RDB_UNIT_KEY", "RDB_UNIT_VALUE", "RDB_UNIT_MISSING", "CQ_NO_RECORD", "CQ_NOT_DISPATCHED"}, found
    assert (found["RDB_UNIT_MISSING"]["topic"], found["RDB_UNIT_MISSING"]["queueOffset"]) == ("RdbTopicA", 4)
    assert (found["CQ_NO_RECORD"]["topic"], found["CQ_NO_RECORD"]["queueOffset"]) == ("RdbTopicB", 2)
    # the records of both damaged units (one finding per queue)
    assert sorted((f["topic"], f["queueId"], f["phyOffset"]) for f in lines(r.stdout) if f["code"] == "CQ_NOT_DISPATCHED") \
        == [("RdbTopicA", 3, u["phyOffset"]), ("RdbTopicB", 0, w["phyOffset"])]
    assert found["RDB_UNIT_KEY"]["path"] == str(store / "consumequeue")


def test_min_entry_and_dirty_units(store):
    """A min entry (written when the broker corrects a queue's min offset) is the queue's min while its unit is
    in the log; units past the max entry are dirty: not served, not checked, reported as info."""
    units = broker_units()
    u3 = units[("RdbTopicA", 0, 3)]
    stray = units[("RdbTopicC", 0, 0)]
    _damage(store, put_offsets=[(fmt.offset_key("RdbTopicA", 0, fmt.MIN_KIND),
                                 fmt.OFFSET_VALUE.build({"phyOffset": u3["phyOffset"], "cqOffset": 3}))],
            put=[(fmt.unit_key("RdbTopicA", 0, 37), _value(stray))])
    with Store.open(str(store)) as st:
        cq = st.queue("RdbTopicA", 0)
        assert (cq.min_offset(), cq.max_offset) == (3, 37)
        assert cq.units().queue_offsets.tolist() == list(range(3, 37))
    rows = lines(run("dump", "consumequeue", store, "--json", "--topic", "RdbTopicA", "--queue", 0).stdout)
    assert [r["queueOffset"] for r in rows] == list(range(38)) and [r for r in rows if r.get("dirty")] == [rows[-1]]
    r = run("verify", store, "--json", *GEOMETRY)
    found = lines(r.stdout)
    assert r.exit_code == 0 and [f["code"] for f in found] == ["RDB_DIRTY_UNITS"], found
    assert (found[0]["queueOffset"], found[0]["count"]) == (37, 1)
    r = run("get", store, "--topic", "RdbTopicA", "--queue", 0, "--queue-offset", 37)
    assert r.exit_code == 1 and "past the end of the queue" in r.output


def test_wrong_min_entry(store):
    u3 = broker_units()[("RdbTopicA", 0, 3)]
    _damage(store, put_offsets=[(fmt.offset_key("RdbTopicA", 0, fmt.MIN_KIND),
                                 fmt.OFFSET_VALUE.build({"phyOffset": u3["phyOffset"] + 1, "cqOffset": 3}))])
    r = run("verify", store, "--json", *GEOMETRY)
    found = lines(r.stdout)
    assert r.exit_code == 1 and [f["code"] for f in found] == ["RDB_MIN_OFFSET"] and found[0]["queueOffset"] == 3


@pytest.mark.parametrize("command", ["verify", "dump"])
def test_a_damaged_table_stops_the_read_with_one_line(store, command):
    """A table whose checksum fails must not read as a shorter queue: exit 2 naming the store's file."""
    sst = max((p for p in (store / "consumequeue").iterdir() if p.suffix == ".sst"), key=lambda p: p.stat().st_size)
    b = bytearray(sst.read_bytes())
    for i in range(len(b) // 4, len(b) // 4 + 16):
        b[i] ^= 0xFF
    sst.write_bytes(bytes(b))
    before = tree_digest(store)
    r = run("verify", store, *GEOMETRY) if command == "verify" else run("dump", "consumequeue", store)
    assert r.exit_code == 2, r.output
    assert "cannot be read" in r.output and str(sst) in r.output
    assert tree_digest(store) == before


def test_a_database_without_current_is_refused(store):
    os.unlink(store / "consumequeue" / "CURRENT")
    r = run("dump", "consumequeue", store)
    assert r.exit_code == 2 and "no CURRENT file" in r.output


def test_a_failed_copy_leaves_no_temporary_folder(store, tmp_path, monkeypatch):
    """The private copy goes to TMPDIR; a copy that fails (here: a full disk) leaves nothing there."""
    import tempfile

    from rmqstore_cli.engine.derived import rocksdbqueue

    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rocksdbqueue, "_clone_or_copy", full)
    with Store.open(str(store)) as st:
        with pytest.raises(UsageError, match="No space left on device"):
            st.queues()
        assert list(tmp.iterdir()) == []


def test_expired_commitlog_file_and_units_the_compaction_filter_dropped(store):
    """The broker deletes old commitlog files; its compaction filter then drops units pointing before the first
    file, in any order. That is no damage: verify is clean, and a queue's min offset is its first unit pointing
    into the log (expected values from the broker's units)."""
    file_size = 65536  # mappedFileSizeCommitLog of the sample (broker.conf)
    os.unlink(store / "commitlog" / ("%020d" % 0))
    units = sorted(broker_units().values(), key=lambda u: u["phyOffset"])
    dropped = [u for i, u in enumerate(units) if u["phyOffset"] < file_size and i % 2 == 0]
    assert len(dropped) > 20
    _damage(store, delete=[fmt.unit_key(u["topic"], u["queueId"], u["queueOffset"]) for u in dropped])
    r = run("verify", store, "--json", *GEOMETRY)
    assert r.exit_code == 0 and lines(r.stdout) == [], r.output
    r = run("stats", store, "--json")
    lag = {(x["topic"], x["queueId"]): x for x in json.loads(r.stdout)["consumeQueueLag"]}
    for q in broker_read(NAME)["queue"]:
        live = [u["queueOffset"] for u in units if (u["topic"], u["queueId"]) == (q["topic"], q["queueId"])
                and u["phyOffset"] >= file_size]
        assert lag[(q["topic"], q["queueId"])]["cqMinOffset"] == min(live)
        assert lag[(q["topic"], q["queueId"])]["cqMaxOffset"] == q["maxOffset"]


def test_dump_store_shows_the_broker_bounds_and_checkpoint(store):
    before = tree_digest(store)
    r = run("dump", "store", store, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert tree_digest(store) == before
    got = {(q["topic"], q["queueId"]): (q["minOffset"], q["maxOffset"]) for q in d["queues"]}
    assert got == {(q["topic"], q["queueId"]): (q["minOffset"], q["maxOffset"]) for q in broker_read(NAME)["queue"]}
    assert d["rocksdbConsumeQueue"]["checkpoint"] == broker_read(NAME)["store"][0]["maxPhyOffsetInConsumeQueue"]
    assert d["startupCost"] == {}  # the file queues' start-up plan is not made for a RocksDB store
