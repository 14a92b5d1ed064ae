"""--explain (index query, get) and the broker's start-up cost (recover --dry-run, dump store), checked
against what the real broker wrote and read back (../shared/stores), on copies where a file is removed."""

from __future__ import annotations

import json
import os
import struct

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.query.explain import explain_key, explain_msgid
from rmqstore_cli.engine.store import Store

from .conftest import STORES, broker_read, json_lines, shared_store, tree_digest

runner = CliRunner()
TIME_MAX = (1 << 63) - 1


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def java_string_hash(s: str) -> int:
    """Java String.hashCode (UTF-16 units), written here independently of formats.hashing."""
    h = 0
    b = s.encode("utf-16-be")
    for i in range(0, len(b), 2):
        h = (31 * h + ((b[i] << 8) | b[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def records(name: str) -> list[dict]:
    return broker_read(name)["clmsg"]


def keys_of(rec: dict) -> list[str]:
    return [k for k in (rec["dispatch"].get("keys") or "").split(" ") if k]


def single_record_uniq_key(name: str) -> dict:
    """A record whose UNIQ_KEY no other record carries (so one answer is expected)."""
    count: dict = {}
    for r in records(name):
        u = r["dispatch"].get("uniqKey")
        if u:
            count[u] = count.get(u, 0) + 1
    for r in records(name)[200:]:
        u = r["dispatch"].get("uniqKey")
        if u and count[u] == 1 and r["msg"]["sysFlag"] & 0xC != 0xC:
            return r
    raise AssertionError("no single-record UNIQ_KEY in the store")


# --- index query --explain -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_time_range_excluding_store_time_is_explained(name):
    rec = single_record_uniq_key(name)
    topic, key, off = rec["msg"]["topic"], rec["dispatch"]["uniqKey"], rec["offset"]
    store_ts, born_ts = rec["msg"]["storeTimestamp"], rec["msg"]["bornTimestamp"]
    root = shared_store(name)
    before = tree_digest(root)
    # a range around the producer's (born) time: it excludes the store time
    r = run("index", "query", root, "--topic", topic, "--key", key, "--begin", born_ts - 1000, "--end", born_ts + 1000,
            "--explain", "--json")
    assert r.exit_code == 1, r.output
    (ex,) = [o for o in json_lines(r.stdout) if o["type"] == "explain-key"]
    assert ex["brokerAnswer"] == []
    (found,) = ex["records"]
    assert found["offset"] == off
    assert found["storeTimestamp"] == store_ts and found["bornTimestamp"] == born_ts
    assert found["storeMinusBornMs"] == store_ts - born_ts
    assert found["inRange"] is False and found["bornInRange"] is True and found["inBrokerAnswer"] is False
    assert found["foundBy"] == "index"
    why = " ".join(ex["reasons"])
    assert str(off) in why and "outside the query's range" in why and "producer's clock" in why
    # the terminal screen says the same
    r = run("index", "query", root, "--topic", topic, "--key", key, "--begin", store_ts + 1, "--explain")
    assert r.exit_code == 1 and str(off) in r.stdout and str(store_ts) in r.stdout and str(born_ts) in r.stdout
    assert tree_digest(root) == before


def test_index_time_is_whole_seconds():
    """The index keeps store time in whole seconds after the file's begin: a range starting at the
    exact store time can miss the record; the explanation says so."""
    name = "4.9.3-clean"
    st = Store.open(str(shared_store(name)))
    with st:
        for rec in records(name)[300:]:
            u = rec["dispatch"].get("uniqKey")
            if not u or rec["msg"]["sysFlag"] & 0xC == 0xC:
                continue
            ex = explain_key(st, rec["msg"]["topic"], u, rec["msg"]["storeTimestamp"], TIME_MAX)
            hit = [x for x in ex.records if x["offset"] == rec["offset"]]
            if hit and hit[0]["indexTimestamp"] < rec["msg"]["storeTimestamp"]:
                assert not hit[0]["inBrokerAnswer"] and hit[0]["inRange"]
                assert any("whole seconds" in s and str(rec["offset"]) in s for s in ex.reasons)
                return
    raise AssertionError("no record with a rounded-down index time found")


def _index_files(name: str) -> list[dict]:
    (idx,) = broker_read(name)["index"]
    return idx["files"]


def test_removed_index_file_found_by_scan_and_gap_named(store_copy):
    name = "4.9.3-clean"
    files = _index_files(name)
    k = len(files) // 2
    gone = files[k]
    root = store_copy(name)
    os.remove(root / "index" / gone["name"])
    # a record indexed only in the removed file: strictly inside its offset range, with a plain key
    rec = next(r for r in records(name) if gone["beginPhyOffset"] < r["offset"] < gone["endPhyOffset"] and keys_of(r))
    topic, key = rec["msg"]["topic"], keys_of(rec)[0]
    r = run("index", "query", root, "--topic", topic, "--key", key, "--explain", "--json")
    (ex,) = [o for o in json_lines(r.stdout) if o["type"] == "explain-key"]
    (found,) = [x for x in ex["records"] if x["offset"] == rec["offset"]]
    assert found["foundBy"] == "scan" and found["inBrokerAnswer"] is False
    gap = ex["gaps"][found["gap"]]
    assert gap["kind"] == "between"
    assert gap["previousIndexFile"] == files[k - 1]["name"] and gap["nextIndexFile"] == files[k + 1]["name"]
    assert gone["beginPhyOffset"] <= gap["firstOffset"] <= rec["offset"] <= gap["lastOffset"] <= gone["endPhyOffset"]
    assert gone["beginTimestamp"] <= gap["firstStoreTimestamp"] <= gap["lastStoreTimestamp"] <= gone["endTimestamp"]
    assert ex["scan"]["bytes"] > 0
    why = " ".join(ex["reasons"])
    assert files[k - 1]["name"] in why and files[k + 1]["name"] in why and str(rec["offset"]) in why
    r = run("index", "query", root, "--topic", topic, "--key", key, "--explain")
    assert files[k - 1]["name"] in r.stdout and str(gap["firstOffset"]) in r.stdout


def test_no_index_files_scans_the_whole_log(store_copy):
    name = "5.3.3-clean"
    root = store_copy(name)
    for f in os.listdir(root / "index"):
        os.remove(root / "index" / f)
    rec = single_record_uniq_key(name)
    with Store.open(str(root)) as st:
        ex = explain_key(st, rec["msg"]["topic"], rec["dispatch"]["uniqKey"])
    (found,) = ex.records
    assert found["offset"] == rec["offset"] and found["foundBy"] == "scan"
    assert [g.kind for g in ex.gaps] == ["no-index"]
    assert ex.gaps[0].first_offset == records(name)[0]["offset"]


def test_removed_last_index_file_is_an_after_last_gap(store_copy):
    name = "4.9.3-clean"
    files = _index_files(name)
    root = store_copy(name)
    os.remove(root / "index" / files[-1]["name"])
    rec = next(r for r in reversed(records(name)) if r["dispatch"].get("uniqKey") and r["offset"] > files[-1]["beginPhyOffset"])
    with Store.open(str(root)) as st:
        ex = explain_key(st, rec["msg"]["topic"], rec["dispatch"]["uniqKey"])
    (found,) = [x for x in ex.records if x["offset"] == rec["offset"]]
    g = ex.gaps[found["gap"]]
    assert g.kind == "after-last" and g.previous_file == files[-2]["name"] and g.next_file is None


def _colliding(key: str) -> str | None:
    """Another ASCII key with the same Java hashCode: two adjacent chars (a, b) -> (a+1, b-31) or (a-1, b+31)."""
    for i in range(len(key) - 1):
        a, b = ord(key[i]), ord(key[i + 1])
        for da, db in ((1, -31), (-1, 31)):
            x, y = a + da, b + db
            if 0x21 <= x < 0x7F and 0x21 <= y < 0x7F:
                return key[:i] + chr(x) + chr(y) + key[i + 2:]
    return None


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_colliding_key_lists_the_other_key(name):
    all_keys = {(r["msg"]["topic"], k) for r in records(name) for k in keys_of(r) + [r["dispatch"].get("uniqKey") or ""]}
    rec, key, other = None, None, None
    for r in records(name):
        for k in keys_of(r):
            c = _colliding(k) if k.isascii() else None
            if c and (r["msg"]["topic"], c) not in all_keys:
                rec, key, other = r, k, c
                break
        if rec:
            break
    topic = rec["msg"]["topic"]
    assert java_string_hash(f"{topic}#{other}") == java_string_hash(f"{topic}#{key}")
    r = run("index", "query", shared_store(name), "--topic", topic, "--key", other, "--explain", "--json")
    assert r.exit_code == 1, r.output
    (ex,) = [o for o in json_lines(r.stdout) if o["type"] == "explain-key"]
    assert ex["records"] == []
    assert rec["offset"] in ex["brokerAnswer"]  # the broker returns the other key's record
    assert any(c["offset"] == rec["offset"] and f"{topic}#{key}" in c["otherKeys"] for c in ex["collisions"])
    assert any(key in s and "same slot and stored hash" in s for s in ex["reasons"])
    r = run("index", "query", shared_store(name), "--topic", topic, "--key", other, "--explain")
    assert f"{topic}#{key}" in r.stdout


# --- get --explain ---------------------------------------------------------------------------


def test_expired_msgid_is_explained(store_copy):
    name = "4.9.3-clean"
    root = store_copy(name)
    (store_line,) = broker_read(name)["store"]
    size = store_line["mappedFileSizeCommitLog"]
    first = sorted(os.listdir(root / "commitlog"))[0]
    os.remove(root / "commitlog" / first)
    old = next(r for r in records(name) if r["offset"] < size)
    kept = next(r for r in records(name) if r["offset"] >= size)
    r = run("get", root, "--msg-id", old["msg"]["msgId"], "--explain", "--json")
    assert r.exit_code == 1, r.output
    (d,) = json_lines(r.stdout)
    assert d["status"] == "expired" and d["offset"] == old["offset"] and d["commitlogMinOffset"] == size
    assert d["expiredFile"] == first and "below" in d["why"]
    r = run("get", root, "--msg-id", old["msg"]["msgId"], "--explain")
    assert "expired" in r.stdout and str(size) in r.stdout
    r = run("get", root, "--msg-id", kept["msg"]["msgId"], "--explain", "--json")
    assert r.exit_code == 0
    (d,) = json_lines(r.stdout)
    assert d["status"] == "found" and d["record"]["offset"] == kept["offset"]
    assert d["record"]["storeTimestamp"] == kept["msg"]["storeTimestamp"]


def test_msgid_past_end_and_between_records():
    name = "4.9.3-clean"
    (store_line,) = broker_read(name)["store"]
    recs = records(name)
    a, b = recs[100], recs[101]
    st = Store.open(str(shared_store(name)))
    with st:
        mid = a["msg"]["msgId"]
        ip_hex, off_hex = mid[:-16], mid[-16:]
        inside = ip_hex + format(a["offset"] + 1, "016X")
        d = explain_msgid(st, inside)
        assert d["status"] == "not-a-record" and d["nearestBefore"] == a["offset"] and d["nearestAfter"] == b["offset"]
        past = ip_hex + format(store_line["maxPhyOffset"] + 8, "016X")
        assert explain_msgid(st, past)["status"] == "past-end"
        assert int(off_hex, 16) == a["offset"]


def test_get_uniq_key_explain(store_copy):
    name = "5.3.3-clean"
    rec = single_record_uniq_key(name)
    r = run("get", shared_store(name), "--uniq-key", rec["dispatch"]["uniqKey"], "--explain", "--json")
    assert r.exit_code == 0, r.output
    (ex,) = json_lines(r.stdout)
    assert [x["offset"] for x in ex["records"]] == [rec["offset"]]
    assert run("get", shared_store(name), "--offset", 0, "--explain").exit_code == 3


# --- start-up cost ---------------------------------------------------------------------------


def _broker_start_file(name: str, root, physic: int, logics: int, index_ts: int) -> tuple[str, int]:
    """The broker's abnormal-recovery start file (FORMAT.md §13.5), from the files on disk and the
    first records' store times as the broker read them back."""
    cfg = broker_puts_config(name)
    limit = max(0, min(physic, logics) - 3000)
    if cfg["messageIndexEnable"] and cfg["messageIndexSafe"]:
        limit = min(limit, index_ts)
    first_ts = {r["offset"]: r["msg"]["storeTimestamp"] for r in records(name)}
    names = sorted(os.listdir(root / "commitlog"))
    for n in reversed(names):
        ts = first_ts.get(int(n))
        if ts and ts <= limit:
            return n, int(n)
    return names[0], int(names[0])


def broker_puts_config(name: str) -> dict:
    from .conftest import broker_puts

    return broker_puts(name)[0]["config"]


def test_crash_store_start_file_and_bytes_match_broker_recovery():
    name = "4.9.3-crash"
    with open(STORES / name / "broker-recover.json") as f:
        rec = json.load(f)
    root = shared_store(name)
    cp = rec["checkpointBeforeOpen"]
    start_name, start = _broker_start_file(name, root, cp["physicMsgTimestamp"], cp["logicsMsgTimestamp"],
                                           cp["indexMsgTimestamp"])
    r = run("recover", root, "--dry-run", "--json")
    (plan,) = [o for o in json_lines(r.stdout) if o.get("type") == "recover-plan"]
    cost = plan["startupCost"]
    assert cost["mode"] == ("normal" if rec["lastExitOK"] else "abnormal")
    assert cost["startFile"] == start_name and cost["startOffset"] == start
    assert cost["endOffset"] == rec["maxPhyOffset"]
    assert cost["bytesRead"] == rec["maxPhyOffset"] - start
    assert cost["crcChecked"] == rec["checkCRCOnRecover"]
    assert cost["bytesCrcChecked"] == (cost["bytesRead"] if rec["checkCRCOnRecover"] else 0)
    assert cost["indexFiles"]["files"] == rec["indexFilesOnDisk"]
    assert cost["estimate"]["scanRateMBps"] == 395 and "NOTES-performance" in cost["estimate"]["scanRateSource"]
    r = run("recover", root, "--dry-run")
    assert f"from {start_name}" in r.output and f"{rec['maxPhyOffset'] - start} bytes read" in r.output


def test_crash_store_with_newer_checkpoint_starts_later(store_copy):
    """Move the checkpoint so a later file is old enough: the start follows the broker's rule."""
    name = "4.9.3-crash"
    with open(STORES / name / "broker-recover.json") as f:
        rec = json.load(f)
    root = store_copy(name)
    firsts = sorted((r["offset"], r["msg"]["storeTimestamp"]) for r in records(name)
                    if r["offset"] % broker_read(name)["store"][0]["mappedFileSizeCommitLog"] == 0)
    target_ts = firsts[len(firsts) * 2 // 3][1]
    physic = logics = target_ts + 3000
    with open(root / "checkpoint", "r+b") as f:
        head = bytearray(f.read(24))
        struct.pack_into(">qq", head, 0, physic, logics)
        f.seek(0)
        f.write(head)
    index_ts = struct.unpack_from(">q", head, 16)[0]
    start_name, start = _broker_start_file(name, root, physic, logics, index_ts)
    assert start > 0
    r = run("recover", root, "--dry-run", "--json")
    (plan,) = [o for o in json_lines(r.stdout) if o.get("type") == "recover-plan"]
    cost = plan["startupCost"]
    assert (cost["startFile"], cost["bytesRead"]) == (start_name, rec["maxPhyOffset"] - start)


def test_applied_recover_says_what_the_next_start_reads(store_copy):
    name = "4.9.3-crash"
    with open(STORES / name / "broker-recover.json") as f:
        rec = json.load(f)
    root = store_copy(name)
    r = run("recover", root, "--json")
    assert r.exit_code == 0, r.output
    (nxt,) = [o for o in json_lines(r.stdout) if o.get("type") == "next-start"]
    # after a clean shutdown 4.9.3 walks the last three commitlog files (FORMAT.md §13.4)
    files = [f.split(":")[0] for f in broker_read(name)["store"][0]["commitlogFiles"]]
    assert nxt["mode"] == "normal" and nxt["startFile"] == files[-3]
    assert nxt["bytesRead"] == rec["maxPhyOffset"] - int(files[-3])
    assert nxt["before"]["bytesRead"] > nxt["bytesRead"]


def test_dump_store_shows_startup_cost():
    root = shared_store("5.3.3-clean")
    d = json_lines(run("dump", "store", root, "--json").stdout)[0]
    plan = [o for o in json_lines(run("recover", root, "--dry-run", "--json").stdout) if o.get("type") == "recover-plan"][0]
    assert d["startupCost"] == plan["startupCost"]
    assert d["startupCost"]["mode"] == "normal" and d["startupCost"]["estimate"]["scanRateMBps"] == 223
    assert "next broker start" in run("dump", "store", root).stdout


def test_explain_and_startup_cost_leave_a_writable_store_untouched(store_copy):
    """On a writable copy (a write would succeed): --explain, recover --dry-run and dump store change nothing."""
    name = "4.9.3-crash"
    root = store_copy(name)
    rec = single_record_uniq_key(name)
    before = tree_digest(root)
    for args in (["index", "query", root, "--topic", rec["msg"]["topic"], "--key", rec["dispatch"]["uniqKey"], "--explain"],
                 ["get", root, "--msg-id", rec["msg"]["msgId"], "--explain"],
                 ["get", root, "--uniq-key", rec["dispatch"]["uniqKey"], "--explain", "--json"],
                 ["recover", root, "--dry-run"], ["dump", "store", root]):
        r = run(*args)
        assert r.exit_code in (0, 1), (args, r.output)
    assert tree_digest(root) == before


def test_result_cap_is_named_when_hits_outnumber_it():
    """--max plays the broker's maxNum (capped at maxMsgsNumBatch 64): hits beyond it are explained by the cap."""
    name = "4.9.3-clean"
    by_key: dict = {}
    for r in records(name):
        if r["msg"]["sysFlag"] & 0xC == 0xC:
            continue  # the broker never indexes a rollback record
        for k in set(keys_of(r)):
            by_key.setdefault((r["msg"]["topic"], k), []).append(r["offset"])
    (topic, key), offsets = max(by_key.items(), key=lambda kv: len(kv[1]))
    assert len(offsets) >= 3
    r = run("index", "query", shared_store(name), "--topic", topic, "--key", key, "--max", 2, "--explain", "--json")
    (ex,) = [o for o in json_lines(r.stdout) if o["type"] == "explain-key"]
    assert ex["brokerCap"] == 2 and ex["capped"] and ex["hitsInRange"] >= len(offsets)
    assert sorted(x["offset"] for x in ex["records"]) == sorted(offsets)
    assert sum(x["inBrokerAnswer"] for x in ex["records"]) <= 2
    missing = [x["offset"] for x in ex["records"] if not x["inBrokerAnswer"]]
    assert len(missing) >= len(offsets) - 2
    assert any("result cap" in s and str(missing[0]) in s for s in ex["reasons"])
