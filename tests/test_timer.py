"""The 5.x timer store (FORMAT.md appendix C) read back like the broker reads it, and verify's TM_* checks.

Expected values come from the broker's own read-back (broker-read.jsonl.gz: every timerlog unit with the
message it points at, every wheel slot, timercheck, timermetrics) and from FORMAT.md's byte layouts
(damage is written with struct at the documented offsets), never from the code under test.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
from collections import Counter

import pytest

from rmqstore_cli.formats.timer import (TIMER_CHECKPOINT, TIMER_CHECKPOINT_DTYPE, TIMER_SLOT, TIMER_SLOT_DTYPE, TIMER_UNIT,
                           TIMER_UNIT_DTYPE, TIMER_UNIT_SIZE, WHEEL_FILE_SIZE, encode_unit)
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify.pipeline import verify_store
from tests.conftest import broker_read, shared_store, tree_digest

RMQSTORE = [sys.executable, "-m", "rmqstore_cli"]
SAMPLES = ("timer-5.3.3", "timer-5.3.3-crash")


def run(*args) -> subprocess.CompletedProcess:
    """``rmqstore ARGS`` in this process (the CLI end to end, without an interpreter start per call)."""
    from tests.fuzzlib import run_cli

    r = run_cli([str(a) for a in args])
    assert r.exception is None, "".join(__import__("traceback").format_exception(r.exception))
    return subprocess.CompletedProcess(r.args, r.exit_code, r.stdout, r.stderr)


def run_process(*args) -> subprocess.CompletedProcess:
    return subprocess.run(RMQSTORE + [str(a) for a in args], capture_output=True, text=True, timeout=300)


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# --- format declarations ---------------------------------------------------------------------------

def test_declared_layouts_match_appendix_c():
    assert TIMER_UNIT.sizeof() == TIMER_UNIT_DTYPE.itemsize == 52
    assert TIMER_SLOT.sizeof() == TIMER_SLOT_DTYPE.itemsize == 32
    assert TIMER_CHECKPOINT.sizeof() == TIMER_CHECKPOINT_DTYPE.itemsize == 56
    assert WHEEL_FILE_SIZE == 38707200
    # byte offsets of appendix C's unit table
    offsets = {name: TIMER_UNIT_DTYPE.fields[name][1] for name in TIMER_UNIT_DTYPE.names}
    assert offsets == {"size": 0, "prevPos": 4, "magic": 12, "currWriteTime": 16, "delay": 24, "offsetPy": 28,
                       "sizePy": 36, "realTopicHash": 40, "reserved": 44}
    raw = struct.pack(">iqiqiqiiq", 52, 1040, 3, 1795656724000, 30000, 2981, 505, -1336785090, 0)
    assert encode_unit(size=52, prevPos=1040, magic=3, currWriteTime=1795656724000, delay=30000, offsetPy=2981,
                       sizePy=505, realTopicHash=-1336785090) == raw
    import numpy as np

    rec = np.frombuffer(raw, TIMER_UNIT_DTYPE)[0]
    parsed = TIMER_UNIT.parse(raw)
    assert {k: parsed[k] for k in TIMER_UNIT_DTYPE.names} == {k: int(rec[k]) for k in TIMER_UNIT_DTYPE.names}


# --- dump timer against the broker's read-back -----------------------------------------------------

@pytest.mark.parametrize("name", SAMPLES)
def test_dump_timer_json_is_what_the_broker_read(name):
    root = shared_store(name)
    before = tree_digest(root)
    truth = broker_read(name)
    p = run_process("dump", "timer", root, "--json")
    assert p.returncode == 0, p.stderr
    rows = jsonl(p.stdout)
    by_type: dict[str, list] = {}
    for r in rows:
        by_type.setdefault(r["type"], []).append(r)
    units = by_type["timerlog_unit"]
    assert len(units) == len(truth["timerlog_unit"])
    for got, want in zip(units, truth["timerlog_unit"]):
        assert (got["pos"], got["prevPos"], got["magic"], got["currWriteTime"], got["delayMs"], got["offsetPy"],
                got["sizePy"], got["realTopicHash"]) == (want["pos"], want["prevPos"], want["magic"], want["currWriteTime"],
                                                         want["delayTimeMs"], want["offsetPy"], want["sizePy"],
                                                         want["realTopicHash"])
        msg = want["message"]
        assert got["realTopic"] == want["realTopic"] == msg["properties"]["REAL_TOPIC"]
        assert got["realQueueId"] == int(msg["properties"]["REAL_QID"])
        assert got["uniqKey"] == msg["uniqKey"] and got["keys"] == msg["keys"]
        assert got["deliverTimeMs"] == int(msg["properties"]["TIMER_OUT_MS"])
        assert got["magicText"] == {1: "default", 3: "default+roll"}[want["magic"]]
    slots = by_type["timerwheel_slot"]
    assert [(s["slotIndex"], s["timeMs"], s["firstPos"], s["lastPos"], s["num"]) for s in slots] == [
        (s["slotIndex"], s["timeMs"], s["firstPos"], s["lastPos"], s["num"]) for s in truth["timerwheel_slot"]]
    for s in slots:  # the chain ends at -1 and has num units, from lastPos back to firstPos
        assert s["chainEnd"] == "-1" and len(s["chain"]) == s["num"]
        assert s["chain"][0] == s["lastPos"] and s["chain"][-1] == s["firstPos"]
    (cp,) = by_type["timercheck"]
    want_cp = truth["timercheck"][0]
    assert {k: cp[k] for k in ("lastReadTimeMs", "lastTimerLogFlushPos", "lastTimerQueueOffset",
                               "masterTimerQueueOffset", "dataVersion")} == {k: want_cp[k] for k in (
        "lastReadTimeMs", "lastTimerLogFlushPos", "lastTimerQueueOffset", "masterTimerQueueOffset", "dataVersion")}
    (tm,) = by_type["timermetrics"]
    assert tm["timingCount"] == truth["timermetrics"][0]["timingCount"]
    assert tree_digest(root) == before


@pytest.mark.parametrize("name", SAMPLES)
def test_pending_per_topic_equals_the_broker_metrics(name):
    root = shared_store(name)
    truth = broker_read(name)
    p = run("dump", "timer", root, "--pending", "--json")
    assert p.returncode == 0, p.stderr
    rows = jsonl(p.stdout)
    metrics = {t: v["count"] for t, v in truth["timermetrics"][0]["timingCount"].items()}
    assert Counter(r["realTopic"] for r in rows) == metrics
    assert len({r["uniqKey"] for r in rows}) == len(rows)  # a rolled message once
    # each row's delivery time is its message's TIMER_OUT_MS as the broker read it
    timer_out = {u["message"]["uniqKey"]: int(u["message"]["properties"]["TIMER_OUT_MS"]) for u in truth["timerlog_unit"]}
    assert all(r["deliverTimeMs"] == timer_out[r["uniqKey"]] for r in rows)
    # filters: --topic and --since/--until on the delivery time
    topic = sorted(metrics)[0]
    p = run("dump", "timer", root, "--pending", "--json", "--topic", topic)
    assert len(jsonl(p.stdout)) == metrics[topic]
    times = sorted(r["deliverTimeMs"] for r in rows)
    mid = times[len(times) // 2]
    p = run("dump", "timer", root, "--pending", "--json", "--since", mid)
    assert len(jsonl(p.stdout)) == sum(t >= mid for t in times)
    p = run("dump", "timer", root, "--pending", "--json", "--until", mid)
    assert len(jsonl(p.stdout)) == sum(t <= mid for t in times)


def test_pending_of_the_clean_sample_is_puts_minus_deliveries():
    """Independent of the metrics file: timer puts minus messages the timer delivered back (clean stop)."""
    from tests.conftest import broker_puts

    name = "timer-5.3.3"
    puts = Counter(x["realTopic"] for x in broker_puts(name) if x["storedTopic"] == "rmq_sys_wheel_timer")
    delivered = Counter(u["topic"] for u in broker_read(name)["cq_unit"] if u["deliveredByTimer"])
    rows = jsonl(run("dump", "timer", shared_store(name), "--pending", "--json").stdout)
    assert Counter(r["realTopic"] for r in rows) == {t: puts[t] - delivered[t] for t in puts}


@pytest.mark.parametrize("name", SAMPLES)
def test_verify_is_clean_on_the_samples(name):
    root = shared_store(name)
    before = tree_digest(root)
    p = run_process("verify", root, "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    assert not [f for f in jsonl(p.stdout) if f["code"].startswith("TM_")]
    assert tree_digest(root) == before


# --- seeded damage -----------------------------------------------------------------------------------

def _unit_file(root, pos: int, file_size: int) -> tuple[str, int]:
    start = pos - pos % file_size
    return os.path.join(root, "timerlog", f"{start:020d}"), pos % file_size


def _patch(path: str, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _timer_findings(root) -> list:
    with Store.open(str(root)) as st:
        return [f for f in verify_store(st).findings if f.code.startswith("TM_")]


def damage(root, kind: str, rng: random.Random, name: str) -> dict:
    """One documented kind of damage, written at FORMAT.md appendix C offsets; returns what was hit."""
    truth = broker_read(name)
    file_size = truth["timerlog_file"][0]["fileSize"]
    units = truth["timerlog_unit"]
    if kind == "slot_num":
        s = rng.choice(truth["timerwheel_slot"])
        _patch(os.path.join(root, "timerwheel"), s["slotIndex"] * 32 + 24, struct.pack(">i", s["num"] + 1))
        return {"code": "TM_SLOT_NUM", "path": os.path.join(root, "timerwheel"), "offset": s["slotIndex"] * 32}
    if kind == "prev_pos":
        u = rng.choice(units)
        other = rng.choice([v["pos"] for v in units if v["pos"] != u["prevPos"] and v["pos"] != u["pos"]])
        path, at = _unit_file(root, u["pos"], file_size)
        _patch(path, at + 4, struct.pack(">q", other))
        return {"code": "TM_PREV_POS", "path": path, "offset": at, "pos": u["pos"]}
    if kind == "offset_mid":
        u = rng.choice(units)
        path, at = _unit_file(root, u["pos"], file_size)
        _patch(path, at + 28, struct.pack(">q", u["offsetPy"] + rng.randrange(1, u["sizePy"])))
        return {"code": "TM_MSG_OFFSET", "path": path, "offset": at, "pos": u["pos"]}
    if kind in ("unit_size", "unit_magic"):
        u = rng.choice(units)
        path, at = _unit_file(root, u["pos"], file_size)
        if kind == "unit_size":
            _patch(path, at, struct.pack(">i", rng.choice([0, 51, 53, 104, -52])))
        else:
            _patch(path, at + 12, struct.pack(">i", u["magic"] | (0x10 << rng.randrange(0, 20))))
        return {"code": "TM_UNIT_SIZE" if kind == "unit_size" else "TM_UNIT_MAGIC", "path": path, "offset": at,
                "pos": u["pos"]}
    if kind == "check_ahead":
        cp = truth["timercheck"][0]
        path = os.path.join(root, "config", "timercheck")
        _patch(path, 8, struct.pack(">q", cp["lastTimerLogFlushPos"] + TIMER_UNIT_SIZE * rng.randrange(1, 50)))
        return {"code": "TM_CHECK_AHEAD", "path": path, "offset": 8}
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["slot_num", "prev_pos", "offset_mid", "check_ahead", "unit_size", "unit_magic"])
@pytest.mark.parametrize("name", SAMPLES)
def test_verify_finds_seeded_damage(store_copy, name, kind):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    root = store_copy(name)
    hit = damage(root, kind, rng, name)
    found = _timer_findings(root)
    codes = {f.code for f in found}
    assert hit["code"] in codes, (seed, [f.as_json() for f in found])
    f = next(f for f in found if f.code == hit["code"])
    assert (f.path, f.offset) == (hit["path"], hit["offset"]), seed
    p = run("verify", root)
    assert p.returncode == 1


# --- stats -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SAMPLES)
def test_stats_timer_section(name):
    root = shared_store(name)
    truth = broker_read(name)
    p = run("stats", root, "--json")
    assert p.returncode == 0, p.stderr
    t = json.loads(p.stdout)["timer"]
    metrics = {k: v["count"] for k, v in truth["timermetrics"][0]["timingCount"].items()}
    assert t["pendingByTopic"] == metrics and t["pending"] == sum(metrics.values())
    # due-time histogram, computed here from the broker's read-back: units whose slot the timer has not
    # read (slot time >= lastReadTimeMs), delivered at their message's TIMER_OUT_MS
    ref = truth["timercheck"][0]["lastReadTimeMs"]
    due = Counter()
    for u in truth["timerlog_unit"]:
        if u["currWriteTime"] + u["delayTimeMs"] >= ref:
            d = int(u["message"]["properties"]["TIMER_OUT_MS"]) - ref
            due["overdue" if d < 0 else "nextMinute" if d < 60_000 else "nextHour" if d < 3_600_000
                else "nextDay" if d < 86_400_000 else "later"] += 1
    assert t["referenceTimeMs"] == ref
    assert {k: v for k, v in t["dueIn"].items() if v} == dict(due)
    assert t["timerQueue"]["records"] == next(s["maxOffset"] for s in truth["cq_summary"]
                                              if s["topic"] == "rmq_sys_wheel_timer")
    p = run_process("stats", root)  # a separate process: the table path, closing every mapping at exit
    assert p.returncode == 0, p.stderr
    assert "pending timer messages per real topic" in p.stdout and "next hour" in p.stdout


# --- repairs -----------------------------------------------------------------------------------------

def _pending_by_topic(root) -> Counter:
    p = run("dump", "timer", root, "--pending", "--json")
    assert p.returncode == 0, p.stderr
    return Counter(r["realTopic"] for r in jsonl(p.stdout))


@pytest.mark.parametrize("name", SAMPLES)
def test_recover_repairs_seeded_damage_without_losing_pending(store_copy, name):
    """All four kinds of damage on one copy (each found by verify above): recover, then verify exits 0,
    every unit is as the broker read it and every pending message is still there."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    root = store_copy(name)
    codes = {damage(root, kind, rng, name)["code"] for kind in ("slot_num", "prev_pos", "offset_mid", "check_ahead")}
    p = run("recover", root, "--dry-run", "--json")
    plan = next(o for o in jsonl(p.stdout) if o["type"] == "recover-plan")
    assert "timer" in [a["action"] for a in plan["actions"]], seed
    p = run("recover", root, "--yes")
    assert p.returncode == 0, (seed, codes, p.stdout[-3000:], p.stderr[-3000:])
    v = run("verify", root, "--json")
    assert v.returncode == 0, (seed, v.stdout)
    truth = broker_read(name)
    metrics = {t: c["count"] for t, c in truth["timermetrics"][0]["timingCount"].items()}
    assert _pending_by_topic(root) == metrics, seed
    rows = jsonl(run("dump", "timer", root, "--json").stdout)
    units = [r for r in rows if r["type"] == "timerlog_unit"]
    assert [(u["pos"], u["prevPos"], u["offsetPy"]) for u in units] == [
        (u["pos"], u["prevPos"], u["offsetPy"]) for u in truth["timerlog_unit"]], seed
    slots = [(r["slotIndex"], r["firstPos"], r["lastPos"], r["num"]) for r in rows if r["type"] == "timerwheel_slot"]
    assert slots == [(r["slotIndex"], r["firstPos"], r["lastPos"], r["num"]) for r in truth["timerwheel_slot"]], seed
    (cp,) = [r for r in rows if r["type"] == "timercheck"]
    assert cp["lastTimerLogFlushPos"] == truth["timercheck"][0]["lastTimerLogFlushPos"], seed


@pytest.mark.parametrize("kind", ["slot_num", "missing"])
def test_rebuild_timer_writes_the_broker_wheel(store_copy, kind):
    name = "timer-5.3.3"
    root = store_copy(name)
    wheel = os.path.join(root, "timerwheel")
    original = open(shared_store(name) / "timerwheel", "rb").read()
    if kind == "missing":
        os.unlink(wheel)
    else:
        damage(root, "slot_num", random.Random(1), name)
    before = tree_digest(root)
    p = run("rebuild", "timer", root, "--dry-run")
    assert p.returncode == 1 and tree_digest(root) == before, p.stderr
    p = run("rebuild", "timer", root)
    assert p.returncode == 0, p.stderr
    assert open(wheel, "rb").read() == original  # byte for byte the wheel the broker wrote
    backup = p.stderr.split("rmqstore restore ")[1].split(")")[0].strip()
    assert run("restore", backup).returncode == 0
    assert os.path.exists(wheel) == (kind != "missing")


def test_truncate_cuts_the_timer_units_past_the_new_end(store_copy):
    name = "timer-5.3.3"
    truth = broker_read(name)
    units = truth["timerlog_unit"]
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    cut = random.Random(seed).choice(units[len(units) // 3:])["offsetPy"]  # a timer record's start
    root = store_copy(name)
    p = run("truncate", root, "--offset", cut, "--yes")
    assert p.returncode == 0, (seed, p.stderr[-3000:])
    assert run("verify", root).returncode == 0, seed
    kept = [u for u in units if u["offsetPy"] + u["sizePy"] <= cut]
    got = [r for r in jsonl(run("dump", "timer", root, "--json").stdout) if r["type"] == "timerlog_unit"]
    assert [u["pos"] for u in got] == [u["pos"] for u in kept], seed
    ref = truth["timercheck"][0]["lastReadTimeMs"]
    want = Counter(u["realTopic"] for u in kept if u["currWriteTime"] + u["delayTimeMs"] >= ref)
    assert _pending_by_topic(root) == want, seed
    cp = jsonl(run("dump", "timer", root, "--json").stdout)[-2]
    assert cp["type"] == "timercheck" and cp["lastTimerLogFlushPos"] <= (kept[-1]["pos"] + 52 if kept else 0)


def test_recover_and_truncate_are_no_longer_refused_on_a_timer_store(store_copy):
    """A consistent timer store: recover plans no timer change (its only action on the clean sample is the
    checkpoint housekeeping every 5.3.3 start does), changes nothing with --dry-run; rebuild cqext
    is still refused (rebuild consumequeue / all: tests/test_timer_rebuild.py)."""
    root = store_copy("timer-5.3.3")
    before = tree_digest(root)
    for args in (("recover", root), ("truncate", root, "--offset", 305106)):
        p = run(*args, "--dry-run", "--json")
        assert p.returncode in (0, 1), p.stderr
        plan = next(o for o in jsonl(p.stdout) if o["type"] in ("recover-plan", "truncate-plan", "plan"))
        assert [a["action"] for a in plan["actions"]] == ["checkpoint"], plan["actions"]
    assert tree_digest(root) == before
    assert run("rebuild", "cqext", root).returncode == 3


def test_stale_timermetrics_are_information_not_damage(store_copy):
    """The broker persists timermetrics now and then (the clean sample's are older than its stop): a count
    that trails the timerlog is reported as info and verify still exits 0."""
    root = store_copy("timer-5.3.3")
    path = os.path.join(root, "config", "timermetrics")
    obj = json.load(open(path))
    topic = sorted(obj["timingCount"])[0]
    obj["timingCount"][topic]["count"] += 3
    open(path, "w").write(json.dumps(obj))
    found = [f for f in _timer_findings(root) if f.code == "TM_METRICS"]
    assert [(f.severity, f.extra["topic"], f.extra["metricsCount"] - f.extra["pending"]) for f in found] == [
        ("info", topic, 3)]
    assert run("verify", root).returncode == 0


def test_a_rolled_message_counts_once_when_the_read_clock_lags(store_copy):
    """A crash after a roll unit's slot fired and its re-put was enqueued, before timercheck moved on:
    lastReadTimeMs set back to the roll slots of the clean sample makes both units of 130 rolled
    messages pending; each still counts once (the broker's metrics), in --pending and in stats."""
    name = "timer-5.3.3"
    truth = broker_read(name)
    rolls = sorted({u["currWriteTime"] + u["delayTimeMs"] for u in truth["timerlog_unit"]
                    if u["magic"] == 3 and u["currWriteTime"] + u["delayTimeMs"] < truth["timercheck"][0]["lastReadTimeMs"]})
    root = store_copy(name)
    _patch(os.path.join(root, "config", "timercheck"), 0, struct.pack(">q", rolls[0]))
    metrics = {t: c["count"] for t, c in truth["timermetrics"][0]["timingCount"].items()}
    rows = jsonl(run("dump", "timer", root, "--pending", "--json").stdout)
    assert Counter(r["realTopic"] for r in rows) == metrics
    assert len({r["uniqKey"] for r in rows}) == len(rows)
    assert json.loads(run("stats", root, "--json").stdout)["timer"]["pendingByTopic"] == metrics


def _wheel_before(root, name: str, flush_pos: int) -> int:
    """The wheel as the broker's last flush left it when units from ``flush_pos`` on were enqueued after it
    (computed from the broker's read-back: each touched slot set back to its chain before those units);
    timercheck's flush position set to ``flush_pos``. Returns how many slots were set back."""
    truth = broker_read(name)
    slots = {s["timeMs"]: s for s in truth["timerwheel_slot"]}
    late: dict[int, list] = {}
    for u in truth["timerlog_unit"]:
        if u["pos"] >= flush_pos:
            late.setdefault(u["currWriteTime"] + u["delayTimeMs"], []).append(u)
    for t, us in late.items():
        s = slots[t]
        prev = min(us, key=lambda u: u["pos"])["prevPos"]
        data = bytes(32) if prev == -1 else struct.pack(">qqqii", t // 1000, s["firstPos"], prev, s["num"] - len(us), 0)
        _patch(os.path.join(root, "timerwheel"), s["slotIndex"] * 32, data)
    _patch(os.path.join(root, "config", "timercheck"), 8, struct.pack(">q", flush_pos))
    return len(late)


def test_a_wheel_behind_the_timerlog_after_a_crash_is_not_damage(store_copy):
    name = "timer-5.3.3-crash"
    units = broker_read(name)["timerlog_unit"]
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    flush_pos = units[-random.Random(seed).randrange(5, 60)]["pos"]
    root = store_copy(name)
    touched = _wheel_before(root, name, flush_pos)
    found = _timer_findings(root)
    assert {f.code for f in found} == {"TM_WHEEL_BEHIND"} and len(found) == touched, (seed, [f.as_json() for f in found])
    assert run("verify", root).returncode == 0, seed
    # the same wheel after a clean shutdown is damage (the broker flushes the wheel when it stops)
    clean = store_copy(name, "no-abort")
    _wheel_before(clean, name, flush_pos)
    os.unlink(os.path.join(clean, "abort"))
    assert {f.code for f in _timer_findings(clean)} & {"TM_SLOT_NUM", "TM_SLOT_POS", "TM_SLOT_MISSING"}, seed
    # recover links the slots again: the wheel the broker read
    assert run("recover", root, "--yes").returncode == 0, seed
    assert open(os.path.join(root, "timerwheel"), "rb").read() == open(shared_store(name) / "timerwheel", "rb").read()


@pytest.mark.parametrize("per_file,precision", [(25, 1000), (7, 500), (40, 100)])
def test_geometry_comes_from_the_files(store_copy, per_file, precision):
    """The sample's units laid out again (written here from the broker's read-back, FORMAT.md appendix C):
    timerlog files of another size and a wheel at another precision. Nothing is given on the command line:
    the file size comes from the files, the precision from a wheel slot and its last unit."""
    name = "timer-5.3.3"
    truth = broker_read(name)
    root = store_copy(name)
    file_size = 52 * per_file + 40  # per_file units, then a 40-byte end-of-file blank
    tl = os.path.join(root, "timerlog")
    for f in os.listdir(tl):
        os.unlink(os.path.join(tl, f))
    last: dict[int, int] = {}
    first: dict[int, int] = {}
    num: Counter = Counter()
    new_pos = {}
    files: dict[int, bytearray] = {}
    for k, u in enumerate(truth["timerlog_unit"]):
        start, at = (k // per_file) * file_size, (k % per_file) * 52
        pos = start + at
        new_pos[u["pos"]] = pos
        slot = u["currWriteTime"] + u["delayTimeMs"]
        buf = files.setdefault(start, bytearray(file_size))
        buf[at:at + 52] = struct.pack(">iqiqiqiiq", 52, last.get(slot, -1), u["magic"], u["currWriteTime"],
                                      u["delayTimeMs"], u["offsetPy"], u["sizePy"], u["realTopicHash"], 0)
        last[slot] = pos
        first.setdefault(slot, pos)
        num[slot] += 1
    for start, buf in files.items():
        if start != max(files):
            buf[52 * per_file:52 * per_file + 16] = struct.pack(">iqi", 40, 0, -875286124)
        open(os.path.join(tl, f"{start:020d}"), "wb").write(buf)
    wheel = bytearray(38707200)
    for slot in last:
        i = (slot // precision) % 1209600
        wheel[i * 32:i * 32 + 32] = struct.pack(">qqqii", slot // precision, first[slot], last[slot], num[slot], 0)
    open(os.path.join(root, "timerwheel"), "wb").write(wheel)
    end = max(new_pos.values()) + 52
    _patch(os.path.join(root, "config", "timercheck"), 8, struct.pack(">q", end))
    assert _timer_findings(root) == []
    rows = jsonl(run("dump", "timer", root, "--json").stdout)
    units = [r for r in rows if r["type"] == "timerlog_unit"]
    assert [(u["pos"], u["offsetPy"], u["uniqKey"]) for u in units] == [
        (new_pos[u["pos"]], u["offsetPy"], u["message"]["uniqKey"]) for u in truth["timerlog_unit"]]
    slots = [r for r in rows if r["type"] == "timerwheel_slot"]
    assert sorted((s["timeMs"], s["num"]) for s in slots) == sorted((t, num[t]) for t in last)
    metrics = {t: c["count"] for t, c in truth["timermetrics"][0]["timingCount"].items()}
    assert _pending_by_topic(root) == metrics


@pytest.mark.parametrize("kind", ["unit_size", "unit_magic"])
def test_recover_restores_a_unit_the_broker_would_truncate_at(store_copy, kind):
    """The broker's recovery truncates the timerlog at a unit of the wrong size or magic and loses every
    unit after it; when the unit's other fields still name a timer record of its real topic, recover
    gives it its size and magic back instead: every unit and pending message kept."""
    name = "timer-5.3.3-crash"
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    root = store_copy(name)
    damage(root, kind, random.Random(seed), name)
    assert run("recover", root, "--yes").returncode == 0, seed
    assert run("verify", root).returncode == 0, seed
    truth = broker_read(name)
    units = [r for r in jsonl(run("dump", "timer", root, "--json").stdout) if r["type"] == "timerlog_unit"]
    assert [(u["pos"], u["magic"], u["prevPos"], u["offsetPy"]) for u in units] == [
        (u["pos"], u["magic"], u["prevPos"], u["offsetPy"]) for u in truth["timerlog_unit"]], seed
    metrics = {t: c["count"] for t, c in truth["timermetrics"][0]["timingCount"].items()}
    assert _pending_by_topic(root) == metrics, seed


def test_recover_cuts_where_the_broker_cuts_a_unit_it_cannot_restore(store_copy):
    """A unit whose fields name no record: cut there as TimerMessageStore.recover truncates, the loss
    counted in the plan (from the broker's read-back: the units after it, and the pending ones), the wheel
    and timercheck following, verify clean after; rebuild timer refuses to build a wheel from that walk."""
    name = "timer-5.3.3"
    truth = broker_read(name)
    units = truth["timerlog_unit"]
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    k = random.Random(seed).randrange(len(units) // 2, len(units) - 1)
    u = units[k]
    root = store_copy(name)
    path, at = _unit_file(root, u["pos"], truth["timerlog_file"][0]["fileSize"])
    _patch(path, at, struct.pack(">iqiqiqii", 51, 0, 1, 0, 0, 0, 0, 0))
    before = tree_digest(root)
    assert run("rebuild", "timer", root).returncode == 1 and tree_digest(root) == before, seed
    ref = truth["timercheck"][0]["lastReadTimeMs"]
    later = units[k + 1:]
    pending_later = sum(1 for v in later if v["currWriteTime"] + v["delayTimeMs"] >= ref)
    p = run("recover", root, "--dry-run")
    assert f"{len(later)} later unit(s) go, {pending_later} of them pending" in p.stderr, (seed, p.stderr[-2000:])
    assert run("recover", root, "--yes").returncode == 0, seed
    assert run("verify", root).returncode == 0, seed
    got = [r["pos"] for r in jsonl(run("dump", "timer", root, "--json").stdout) if r["type"] == "timerlog_unit"]
    assert got == [v["pos"] for v in units[:k]], seed
