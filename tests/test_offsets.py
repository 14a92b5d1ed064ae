"""Consumer offsets and the broker's config files: audit (dump offsets, verify, stats), the consumers' side of
truncate/recover/rebuild, ``repair config`` and ``offsets set``.

The shared broker stores have no broker-written ``config/`` (see ../shared/stores/README.md): every test
writes the files, built from the format in tests/configfixtures.py, into a copy of a shared store. Queue
bounds and message sizes expected here come from what the broker read (broker-read.jsonl.gz ``cq`` and
``cqe`` lines), not from our consume-queue reader.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from rmqstore_cli.formats import fastjson
from tests import fuzzlib
from tests.configfixtures import A, B, queue_max, set_mtime, write_config
from tests.conftest import broker_read, tree_digest

VERSIONED = [("4.9.3-clean", 4), ("5.3.3-clean", 5)]


def run(*args):
    return fuzzlib.run_cli([str(a) for a in args])


def lines(r, kind=None):
    out = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return [o for o in out if kind is None or o.get("type") == kind]


def sizes(name):
    """{(topic, queueId): {queueOffset: size}} from the broker's consume-queue entries."""
    out: dict = {}
    for e in broker_read(name)["cqe"]:
        out.setdefault((e["topic"], e["queueId"]), {})[e["queueOffset"]] = e["size"]
    return out


def row(rows, group, topic, q):
    return next(r for r in rows if (r["group"], r["topic"], r["queueId"]) == (group, topic, q))


# --- audit ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,version", VERSIONED)
def test_dump_offsets_audits_every_case(store_copy, name, version):
    root = store_copy(name)
    cases = write_config(root, name, version)
    before = tree_digest(root)
    r = run("dump", "offsets", "--json", root)
    assert r.exit_code == 0, r.stderr
    rows = lines(r, "offset")
    mx, sz = queue_max(name), sizes(name)

    g, t, q, off = cases["in_range"]
    x = row(rows, g, t, q)
    assert (x["committed"], x["minOffset"], x["maxOffset"], x["nextPull"]) == (off, 0, mx[(t, q)], "none")
    assert x["lagMessages"] == mx[(t, q)] - off
    assert x["lagBytes"] == sum(s for o, s in sz[(t, q)].items() if o >= off)

    g, t, q, off = cases["caught_up"]
    assert row(rows, g, t, q)["lagMessages"] == 0 and row(rows, g, t, q)["nextPull"] == "none"

    g, t, q, off = cases["above_max"]
    x = row(rows, g, t, q)
    if version < 5:  # 4.9.3 getMessage: OFFSET_OVERFLOW_BADLY with min 0 moves the offset to min
        assert (x["nextPull"], x["nextOffset"], x["redelivered"], x["skipped"]) == ("move to min (0)", 0, mx[(t, q)], 0)
    else:  # 5.3.3: always to max
        assert (x["nextPull"], x["nextOffset"], x["skipped"]) == ("move to max", mx[(t, q)], off - mx[(t, q)])
    assert x["code"] == "CO_ABOVE_MAX"

    assert row(rows, *cases["unknown_topic"][:3])["code"] == "CO_UNKNOWN_TOPIC"
    assert row(rows, *cases["unknown_queue"][:3])["code"] == "CO_UNKNOWN_QUEUE"
    delay = {d["level"]: d for d in lines(r, "delay-offset")}
    assert delay[18]["committed"] == mx[("SCHEDULE_TOPIC_XXXX", 17)] + 3
    assert delay[18]["correctedAtStart"] == mx[("SCHEDULE_TOPIC_XXXX", 17)]  # ScheduleMessageService.correctDelayOffset
    assert tree_digest(root) == before


@pytest.mark.parametrize("name,version", VERSIONED)
def test_verify_and_stats_report_the_offsets(store_copy, name, version):
    root = store_copy(name)
    cases = write_config(root, name, version)
    r = run("verify", "--json", root)
    assert r.exit_code == 1
    found = [o for o in lines(r) if "code" in o]
    g, t, q, off = cases["above_max"]
    above = [f for f in found if f["code"] == "CO_ABOVE_MAX"]
    assert len(above) == 1 and (above[0]["group"], above[0]["topic"], above[0]["queueId"]) == (g, t, q)
    m = queue_max(name)[(t, q)]
    assert (above[0]["skipped"], above[0]["redelivered"]) == ((0, m) if version < 5 else (off - m, 0))
    assert str(above[0]["skipped"] or above[0]["redelivered"]) in above[0]["message"]
    missing = [f for f in found if f["code"] == "CFG_TOPIC_MISSING"]
    assert [f["topic"][:9] for f in missing] == ["LongTopic"]
    assert {"CO_UNKNOWN_TOPIC", "CO_UNKNOWN_QUEUE", "DO_OUT_OF_RANGE"} <= {f["code"] for f in found}
    s = run("stats", "--json", root)
    assert s.exit_code == 0
    st = json.loads(s.stdout)
    assert len(st["consumerOffsets"]) == (9 if version < 5 else 10) and st["consumerOffsetsFile"].endswith("consumerOffset.json")
    if version >= 5:
        bc = row(st["consumerOffsets"], "group_bc", A, 0)
        assert (bc["suffix"], bc["committed"], bc["nextPull"]) == ("broadcast", 10, "none")
    cfgs = {o["file"]: o for o in lines(run("dump", "config", "--json", root), "config-file")}
    assert cfgs["consumerOffset.json"]["brokerLoads"] == "main"
    std = cfgs["consumerOffset.json"]["content"]["offsetTable"][f"{A}@group_a"]  # standard JSON: keys are strings
    assert std == {str(k): v for k, v in fastjson.loads((root / "config" / "consumerOffset.json").read_text())
                   ["offsetTable"][f"{A}@group_a"].items()}
    tbl = run("stats", root)
    assert "consumer offsets" in tbl.stdout and "move to" in tbl.stdout


@pytest.mark.parametrize("name,version", VERSIONED)
def test_offsets_below_min_after_the_oldest_commitlog_file_expired(store_copy, name, version, tmp_path):
    """The broker deletes expired commitlog files; units pointing into them are below the queue's min offset."""
    root = store_copy(name)
    write_config(root, name, version)
    first = sorted(os.listdir(root / "commitlog"))[0]
    size = os.path.getsize(root / "commitlog" / first)
    shutil.move(root / "commitlog" / first, tmp_path / first)
    lo = min(e["queueOffset"] for e in broker_read(name)["cqe"]
             if (e["topic"], e["queueId"]) == (A, 0) and e["phyOffset"] >= size)
    assert lo > 0
    r = run("dump", "offsets", "--json", "--group", "group_b", root)
    x = row(lines(r, "offset"), "group_b", A, 0)
    assert (x["minOffset"], x["nextPull"], x["nextOffset"], x["skipped"], x["code"]) == (lo, "move to min", lo, lo, "CO_BELOW_MIN")


def test_damaged_offsets_file_is_a_finding_with_its_position(store_copy):
    root = store_copy("4.9.3-clean")
    write_config(root, "4.9.3-clean", 4)
    p = root / "config" / "consumerOffset.json"
    text = p.read_text()
    p.write_text(text[:text.index("}")] + "\x00\x00garbage")
    r = run("verify", "--json", root)
    f = next(o for o in lines(r) if o.get("code") == "CFG_PARSE")
    assert f["severity"] == "error" and f["brokerLoads"] == "nothing"  # no .bak: the broker starts without offsets
    assert f["offset"] == len(text[:text.index("}")].encode()) and f["line"] == text[:text.index("}")].count("\n") + 1
    d = run("dump", "config", "--json", root)
    assert d.exit_code == 1 and "Traceback" not in d.stderr
    co = next(o for o in lines(d, "config-file") if o["file"] == "consumerOffset.json")
    assert co["main"]["parses"] is False and co["main"]["offset"] == f["offset"] and co["content"] is None


# --- the consumers' side of repairs -------------------------------------------------------------------


@pytest.mark.parametrize("name,version", VERSIONED)
def test_truncate_plan_and_verify_show_offsets_past_max(store_copy, name, version):
    root = store_copy(name)
    cases = write_config(root, name, version)
    g, t, q, off = cases["caught_up"]  # committed == max before the cut
    ents = sorted((e["queueOffset"], e["phyOffset"]) for e in broker_read(name)["cqe"] if (e["topic"], e["queueId"]) == (t, q))
    cut = ents[len(ents) - 12][1]  # cut at the record of the queue's 12th-last message
    new_max = sum(1 for _, p in ents if p < cut)
    assert new_max == len(ents) - 12
    r = run("truncate", "--offset", cut, "--dry-run", "--json", root)
    assert r.exit_code == 1, r.stderr
    impact = lines(r, "consumer-impact")[0]
    x = row(impact["groups"], g, t, q)
    assert (x["committed"], x["before"], x["after"]) == (off, [0, off], [0, new_max])
    expect = {"skipped": 0, "redelivered": new_max} if version < 5 else {"skipped": off - new_max, "redelivered": 0}
    assert {k: x[k] for k in expect} == expect
    assert all(v["after"][1] < v["committed"] for v in impact["groups"])
    text = run("truncate", "--offset", cut, "--dry-run", root)
    assert "consumer groups whose committed offset goes out of range" in text.stdout
    applied = run("truncate", "--offset", cut, "--backup-dir", root.parent / "bk", root)
    assert applied.exit_code in (0, 1), applied.stderr
    v = run("verify", "--json", root)
    f = next(o for o in lines(v) if o.get("code") == "CO_ABOVE_MAX" and (o["topic"], o["queueId"]) == (t, q)
             and o["group"] == g)
    assert (f["skipped"], f["redelivered"]) == (expect["skipped"], expect["redelivered"])


def test_recover_and_rebuild_carry_the_consumer_impact(store_copy):
    root = store_copy("4.9.3-crash")
    write_config(root, "4.9.3-clean", 4, with_topics=False)  # the crash store holds the same puts
    r = run("recover", "--dry-run", "--json", root)
    imp = lines(r, "consumer-impact")
    assert len(imp) == 1 and imp[0]["offsetsFile"] == "consumerOffset.json"
    # a consume queue lost and rebuilt from the commitlog: offsets still in range, nothing listed
    root2 = store_copy("4.9.3-clean", "rb")
    write_config(root2, "4.9.3-clean", 4)
    shutil.rmtree(root2 / "consumequeue" / A / "2")  # group_a's offset there is in range once rebuilt
    # queue A/1 holds two stray units past its real end (a copy of its last unit), and group_a committed past
    # them: the rebuilt queue ends two earlier, so that group's offset goes out of range
    m = queue_max("4.9.3-clean")[(A, 1)]
    cq = root2 / "consumequeue" / A / "1" / sorted(os.listdir(root2 / "consumequeue" / A / "1"))[-1]
    data = bytearray(cq.read_bytes())
    last = data[(m - 1) * 20:m * 20]
    data[m * 20:(m + 2) * 20] = last * 2
    cq.write_bytes(bytes(data))
    p = root2 / "config" / "consumerOffset.json"
    p.write_text(p.read_text().replace(f",1:{m},", f",1:{m + 2},"))
    rb = run("rebuild", "consumequeue", "--json", "--backup-dir", root2.parent / "bk2", root2)
    imp = lines(rb, "consumer-impact")
    assert len(imp) == 1
    x = row(imp[0]["groups"], "group_a", A, 1)
    assert (x["committed"], x["before"], x["after"]) == (m + 2, [0, m + 2], [0, m])
    # out-of-range offsets the rebuild does not change (B/0 was past max before) are not listed
    assert [(g["topic"], g["queueId"]) for g in imp[0]["groups"]] == [(A, 1)]


# --- repair config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,version", VERSIONED)
@pytest.mark.parametrize("bak_age", ["older", "newer"])
def test_garbage_main_file_is_restored_from_a_good_bak(store_copy, name, version, bak_age):
    root = store_copy(name)
    write_config(root, name, version)
    cfg = root / "config"
    good = (cfg / "consumerOffset.json").read_text()
    (cfg / "consumerOffset.json.bak").write_text(good)
    garbage = b"\x00\x00\x00\x00{\"offsetTable\":{\"Oracle"
    (cfg / "consumerOffset.json").write_bytes(garbage)
    set_mtime(cfg / "consumerOffset.json.bak", 1_700_000_000_000 + (-60_000 if bak_age == "older" else 60_000))
    set_mtime(cfg / "consumerOffset.json", 1_700_000_000_000)
    v = run("verify", "--json", root)
    f = next(o for o in lines(v) if o.get("code") == "CFG_PARSE")
    assert f["severity"] == "warning" and f["brokerLoads"] == "bak" and f["offset"] == 0
    before = tree_digest(root)
    dry = run("repair", "config", "--dry-run", root)
    assert dry.exit_code == 1 and tree_digest(root) == before
    assert ("older than the main file" in dry.stderr) == (bak_age == "older")
    r = run("repair", "config", "--json", "--backup-dir", root.parent / "bk", root)
    assert r.exit_code == 0, r.stderr
    fixed = (cfg / "consumerOffset.json").read_text()
    assert fixed == good  # the .bak's content, in the broker's format (the .bak was in it)
    assert "\t" in fixed and "{0:" in fixed and '"0"' not in fixed
    assert (cfg / "consumerOffset.json.bak").read_text() == good
    assert not (cfg / "consumerOffset.json.tmp").exists()
    after = run("verify", "--json", root)
    assert not [o for o in lines(after) if o.get("code", "").startswith("CFG_PARSE")]
    # the garbage is in the backup folder: restore brings it back
    rs = run("restore", root.parent / "bk")
    assert rs.exit_code == 0, rs.stderr
    assert (cfg / "consumerOffset.json").read_bytes() == garbage


def test_a_bak_in_another_layout_is_rewritten_in_the_broker_format(store_copy):
    root = store_copy("5.3.3-clean")
    write_config(root, "5.3.3-clean", 5)
    cfg = root / "config"
    broker_text = (cfg / "consumerOffset.json").read_text()
    value = fastjson.loads(broker_text)
    (cfg / "consumerOffset.json.bak").write_text(json.dumps(fastjson.to_standard(value), indent=2))  # quoted keys
    (cfg / "consumerOffset.json").write_text("")
    r = run("repair", "config", "--backup-dir", root.parent / "bk", root)
    assert r.exit_code == 0, r.stderr
    text = (cfg / "consumerOffset.json").read_text()
    assert text == broker_text  # the .bak's entries in their order, laid out as the broker writes them
    assert fastjson.to_standard(fastjson.loads(text)) == fastjson.to_standard(value)
    assert '\t"offsetTable":{' in text and not text.endswith("\n")


@pytest.mark.parametrize("name,version", VERSIONED)
def test_neither_copy_decodes_rebuilt_from_what_is_left(store_copy, name, version):
    root = store_copy(name)
    cases = write_config(root, name, version)
    cfg = root / "config"
    text = (cfg / "consumerOffset.json").read_text()
    cut = text.index("\"GoneTopic@")  # cut-off main file: the two first topic@group entries are complete
    (cfg / "consumerOffset.json").write_text(text[:cut])
    (cfg / "consumerOffset.json.bak").write_text("\x00" * 64)
    (cfg / "delayOffset.json").write_text("")
    (cfg / "topics.json").write_text('{"dataVersion":{"counter":1,"timestamp":0},"topicConfigTable":{"Or')
    v = run("verify", "--json", root)
    f = next(o for o in lines(v) if o.get("code") == "CFG_PARSE" and o["file"] == "consumerOffset.json")
    assert f["severity"] == "error" and f["brokerLoads"] == "refuses"  # .bak present but broken: load() fails
    r = run("repair", "config", "--json", "--backup-dir", root.parent / "bk", root)
    assert r.exit_code == 0, r.stderr
    plan = lines(r, "config-plan")[0]
    assert {c["file"]: c["action"] for c in plan["changes"]} == {
        "consumerOffset.json": "rebuild", "delayOffset.json": "rebuild", "topics.json": "rebuild"}
    co = fastjson.loads((cfg / "consumerOffset.json").read_text())
    mx = queue_max(name)
    g, t, q, off = cases["above_max"]
    assert co["offsetTable"][f"{t}@{g}"][q] == off  # kept as it was: clamping needs --clamp-offsets
    assert "GoneTopic@group_gone" not in co["offsetTable"]
    assert ("dataVersion" in co) == (version >= 5)
    topics = fastjson.loads((cfg / "topics.json").read_text())["topicConfigTable"]
    assert topics[A]["readQueueNums"] == 4 and topics["SCHEDULE_TOPIC_XXXX"]["writeQueueNums"] == 18
    delay = fastjson.loads((cfg / "delayOffset.json").read_text())["offsetTable"]
    assert delay == {18: 0}  # from the schedule queue that exists (level 18 = queue 17), at its min
    assert run("dump", "config", root).exit_code == 0
    # clamping, when asked
    r2 = run("repair", "config", "--clamp-offsets", "--backup-dir", root.parent / "bk2", root)
    assert r2.exit_code == 0, r2.stderr
    co2 = fastjson.loads((cfg / "consumerOffset.json").read_text())
    assert co2["offsetTable"][f"{t}@{g}"][q] == mx[(t, q)]
    assert fastjson.loads((cfg / "consumerOffset.json.bak").read_text()) == co  # previous (good) content kept as .bak


def test_repair_config_refuses_a_live_store(store_copy):
    from tests.test_live_broker import Broker

    root = store_copy("4.9.3-clean")
    write_config(root, "4.9.3-clean", 4)
    (root / "config" / "consumerOffset.json").write_text("")
    b = Broker(root)
    try:
        before = fuzzlib.digest(root)
        for args in (["repair", "config", root], ["offsets", "set", "--group", "g", "--topic", A, "--to-min", root]):
            r = run(*args)
            assert r.exit_code == 4, (args, r.stderr)
        assert fuzzlib.digest(root) == before
    finally:
        b.stop()


# --- offsets set ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,version", VERSIONED)
def test_offsets_set_rewrites_like_the_broker_persists(store_copy, name, version):
    root = store_copy(name)
    write_config(root, name, version)
    cfg = root / "config"
    old_text = (cfg / "consumerOffset.json").read_text()
    old = fastjson.loads(old_text)
    mx = queue_max(name)
    dry = run("offsets", "set", "--group", "group_a", "--topic", A, "--to-min", "--dry-run", root)
    assert dry.exit_code == 1 and (cfg / "consumerOffset.json").read_text() == old_text
    r = run("offsets", "set", "--group", "group_a", "--topic", A, "--queue", 2, "--to-offset", 7,
            "--backup-dir", root.parent / "bk1", root)
    assert r.exit_code == 0, r.stderr
    new = fastjson.loads((cfg / "consumerOffset.json").read_text())
    assert new["offsetTable"][f"{A}@group_a"][2] == 7
    assert (cfg / "consumerOffset.json.bak").read_text() == old_text  # the previous file kept as .bak
    rest = {k: v for k, v in new["offsetTable"].items() if k != f"{A}@group_a"}
    assert rest == {k: v for k, v in old["offsetTable"].items() if k != f"{A}@group_a"}
    if version >= 5:
        assert new["dataVersion"]["counter"] == old["dataVersion"]["counter"] + 1
    r = run("offsets", "set", "--group", "group_new", "--topic", B, "--to-max", "--backup-dir", root.parent / "bk2", root)
    assert r.exit_code == 0, r.stderr
    new = fastjson.loads((cfg / "consumerOffset.json").read_text())
    assert new["offsetTable"][f"{B}@group_new"] == {q: mx[(B, q)] for q in range(4)}
    assert "\t" in (cfg / "consumerOffset.json").read_text()


def _oracle(times: list[int], ts: int, version: int, files: list[range]) -> set[int]:
    """What getOffsetInQueueByTime answers, from the store times alone (times[i] = store time of queue offset i,
    non-decreasing; ``files`` = the queue offsets of each consume-queue file, mtime = its last message's time)."""
    n = len(times)
    if version >= 5:  # LOWER boundary: the first message stored at or after ts, clamped into [0, max]
        return {next((i for i in range(n) if times[i] >= ts), n)}
    f = next((f for f in files if times[f[-1]] >= ts), files[-1])
    exact = {i for i in f if times[i] == ts}
    if exact:
        return exact
    left = [i for i in f if times[i] < ts]
    right = [i for i in f if times[i] > ts]
    if not left:
        return {right[0]}
    if not right:
        return {left[-1]}
    lo, hi = left[-1], right[0]
    return {hi if abs(ts - times[lo]) > abs(times[hi] - ts) else lo}


@pytest.mark.parametrize("name,version", [("4.9.3-clean", 4), ("5.3.3-clean", 5), ("5.3.3-v2topic", 5), ("5.3.3-v2topic", 4)])
def test_time_search_equals_the_brokers_on_broker_written_queues(store_copy, name, version):
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.query.timesearch import TimeSearch

    root = store_copy(name)
    per_queue: dict = {}
    for e in broker_read(name)["cqe"]:
        per_queue.setdefault((e["topic"], e["queueId"]), []).append((e["queueOffset"], e["msg"]["storeTimestamp"]))
    st = Store.open(str(root), overrides={"version": version})
    unit_files = {}
    for (t, q), ents in per_queue.items():
        ents.sort()
        assert [o for o, _ in ents] == list(range(len(ents)))
        times = [s for _, s in ents]
        assert times == sorted(times), "store times within a queue go forward"
        per_file = st.config.mappedFileSizeConsumeQueue // 20
        files = [range(s, min(s + per_file, len(times))) for s in range(0, len(times), per_file)]
        unit_files[(t, q)] = files
        for i, f in enumerate(sorted(os.listdir(root / "consumequeue" / t / str(q)))):
            set_mtime(root / "consumequeue" / t / str(q) / f, times[files[i][-1]])  # the broker's last write
    search = TimeSearch(st, version)
    checked = 0
    for (t, q), ents in sorted(per_queue.items()):
        times = [s for _, s in ents]
        probes = sorted({times[0] - 1000, times[-1] + 1000} | set(times) | {x + 1 for x in times} | {x - 1 for x in times})
        for ts in probes:
            got = search.offset(t, q, ts)
            want = _oracle(times, ts, version, unit_files[(t, q)])
            assert got in want, (t, q, ts, got, want)
            checked += 1
    st.close()
    assert checked > 1000 or name == "5.3.3-v2topic"
    # the command uses the same search
    (t, q), ents = max(per_queue.items(), key=lambda kv: len(kv[1]))
    mid = ents[len(ents) // 2][1] + 1
    want = _oracle([s for _, s in ents], mid, version, unit_files[(t, q)])
    r = run("offsets", "set", "--group", "g_time", "--topic", t, "--queue", q, "--to-time", mid, "--json",
            "--broker-version", version, "--backup-dir", root.parent / "bk", root)
    assert r.exit_code == 0, r.stderr
    plan = lines(r, "config-plan")[0]
    assert plan["offsets"][0]["after"] in want
    co = fastjson.loads((root / "config" / "consumerOffset.json").read_text())
    assert co["offsetTable"][f"{t}@g_time"][q] in want


def test_damaged_config_files_never_crash_a_command(store_copy):
    """Seeded damage (cuts, flipped bytes, random bytes, huge numbers, deep nesting) to every config file and
    its .bak: every command that reads them answers with findings, never a traceback."""
    import random

    seed = int(os.environ.get("RMQSTORE_FUZZ_SEED", "1616"))
    print(f"config damage seed {seed} (RMQSTORE_FUZZ_SEED)")
    rng = random.Random(seed)
    base = store_copy("5.3.3-clean")
    write_config(base, "5.3.3-clean", 5)
    (base / "config" / "subscriptionGroup.json").write_text(
        '{\n\t"dataVersion":{\n\t\t"counter":1,\n\t\t"stateVersion":0,\n\t\t"timestamp":1\n\t},\n'
        '\t"subscriptionGroupTable":{\n\t\t"group_a":{\n\t\t\t"brokerId":0,\n\t\t\t"groupName":"group_a"\n\t\t}\n\t}\n}')
    names = sorted(os.listdir(base / "config"))
    originals = {n: (base / "config" / n).read_bytes() for n in names}
    for case in range(12):
        for n in names:
            data = bytearray(originals[n])
            op = rng.choice(["cut", "flip", "random", "huge", "nest", "keep"])
            if op == "cut":
                data = data[:rng.randrange(len(data))]
            elif op == "flip":
                for _ in range(rng.randrange(1, 6)):
                    data[rng.randrange(len(data))] = rng.randrange(256)
            elif op == "random":
                data = bytearray(rng.randbytes(rng.randrange(0, 200)))
            elif op == "huge":
                data = bytearray(originals[n].replace(b":0", b":99999999999999999999999", 1))
            elif op == "nest":
                data = bytearray(b"[" * 5000 + b"]" * 5000)
            (base / "config" / n).write_bytes(bytes(data))
            if rng.random() < 0.5:
                (base / "config" / (n + ".bak")).write_bytes(bytes(data[: len(data) // 2]))
        before = tree_digest(base)
        for args in (["verify", "--json", "--no-crc"], ["dump", "offsets", "--json"], ["dump", "config", "--json"],
                     ["dump", "config"], ["stats", "--json"], ["repair", "config", "--dry-run"],
                     ["repair", "config", "--dry-run", "--clamp-offsets"],
                     ["offsets", "set", "--group", "g", "--topic", A, "--to-min", "--dry-run"]):
            r = run(*args, base)
            assert not fuzzlib.problems_of(r, {0, 1, 3}), (case, args, r.stderr[-500:])
        assert tree_digest(base) == before
        for n in list(os.listdir(base / "config")):
            if n.endswith(".bak") and n[:-4] in originals:
                os.unlink(base / "config" / n)


@pytest.mark.parametrize("name,version", VERSIONED)
def test_delay_offsets_rebuilt_from_what_the_schedule_queue_proves_delivered(store_copy, name, version):
    """A scheduled message is delivered by re-putting it under its REAL_TOPIC with the same UNIQ_KEY; the first
    message without such a copy is where the level's offset restarts."""
    root = store_copy(name)
    write_config(root, name, version)
    sched = sorted((e for e in broker_read(name)["cqe"] if e["topic"] == "SCHEDULE_TOPIC_XXXX"),
                   key=lambda e: e["queueOffset"])
    delivered = 5
    for e in sched[:delivered]:
        p = e["msg"]["properties"]
        r = run("append", "--topic", p["REAL_TOPIC"], "--queue", p["REAL_QID"], "--body", "delivered",
                "--property", f"UNIQ_KEY={p['UNIQ_KEY']}", root)
        assert r.exit_code == 0, r.stderr
    (root / "config" / "delayOffset.json").write_bytes(b"\x00" * 40)
    r = run("repair", "config", "--backup-dir", root.parent / "bk", root)
    assert r.exit_code == 0, r.stderr
    assert fastjson.loads((root / "config" / "delayOffset.json").read_text())["offsetTable"] == {18: delivered}


def test_an_interrupted_4_9_3_persist_is_finished_from_its_tmp(store_copy):
    """MixAll.string2File (4.9.3): FILE.tmp written, FILE.bak = previous, FILE deleted, FILE.tmp renamed. Killed
    after the delete, the broker would load the older .bak; the complete .tmp is the newest content."""
    root = store_copy("4.9.3-clean")
    write_config(root, "4.9.3-clean", 4)
    cfg = root / "config"
    newest = (cfg / "consumerOffset.json").read_text()
    older = newest.replace("{0:826,", "{0:700,")
    assert older != newest
    (cfg / "consumerOffset.json.bak").write_text(older)
    os.rename(cfg / "consumerOffset.json", cfg / "consumerOffset.json.tmp")
    set_mtime(cfg / "consumerOffset.json.bak", 1_700_000_000_000)
    set_mtime(cfg / "consumerOffset.json.tmp", 1_700_000_001_000)
    v = run("verify", "--json", root)
    assert next(o for o in lines(v) if o.get("code") == "CFG_MISSING")["brokerLoads"] == "bak"
    r = run("repair", "config", "--json", "--backup-dir", root.parent / "bk", root)
    assert r.exit_code == 0, r.stderr
    assert lines(r, "config-plan")[0]["changes"][0]["action"] == "restore-from-tmp"
    assert (cfg / "consumerOffset.json").read_text() == newest
    assert (cfg / "consumerOffset.json.bak").read_text() == older and not (cfg / "consumerOffset.json.tmp").exists()
