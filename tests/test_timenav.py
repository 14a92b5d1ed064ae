"""Time navigation (--since/--until, get --time) against what the broker itself read back.

Expected results come from ``broker-read.jsonl.gz`` (the broker's own decode of every record and
consume-queue entry), filtered by store time here in the test, never from our own output.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from rmqstore_cli.formats import fast
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.log.storetime import commitlog_offset_at
from rmqstore_cli.engine.query.timesearch import offset_by_time

from .conftest import broker_read, shared_store, tree_digest

SEED = int(os.environ.get("RMQSTORE_TIMENAV_SEED", "20261124"))
STORES = ["4.9.3-clean", "5.3.3-clean", "5.3.3-v2topic"]


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "rmqstore_cli", *args], capture_output=True, text=True, **kw)


def _records(name):
    return [(o["offset"], o["msg"]["storeTimestamp"]) for o in broker_read(name)["clmsg"]]


def _probe_times(name, k=6):
    """Store times to cut at: real record times (ties included), gaps between them, and both ends."""
    rng = random.Random(f"{SEED}-{name}")
    times = sorted({t for _, t in _records(name)})
    picks = rng.sample(times, min(k, len(times)))
    return sorted(set(picks + [p + 1 for p in picks] + [times[0] - 1, times[-1] + 1]))


@pytest.mark.parametrize("name", STORES)
def test_commitlog_offset_at_equals_a_filter(name):
    print(f"seed {SEED}")
    recs = _records(name)
    with Store.open(str(shared_store(name))) as st:
        for t in _probe_times(name, 20):
            expected = next((o for o, ts in recs if ts >= t), None)
            assert commitlog_offset_at(st.commitlog, t) == expected, t


def test_offset_search_walks_only_the_segment_it_lands_in(monkeypatch):
    """The start is found by binary search: one segment walked, not the log (56 segments here)."""
    walked = []
    real = fast.walk

    def counting(buf, pos=0, end=None, *a, **kw):
        walked.append(kw.get("max_records", 1 << 62))
        return real(buf, pos, end, *a, **kw)

    name = "4.9.3-clean"
    recs = _records(name)
    t = recs[len(recs) * 2 // 3][1]
    with Store.open(str(shared_store(name))) as st:
        monkeypatch.setattr(fast, "walk", counting)  # after opening (version inference reads 1 MiB)
        nseg = len(st.commitlog.segments.segments)
        assert commitlog_offset_at(st.commitlog, t) == next(o for o, ts in recs if ts >= t)
    full_walks = [m for m in walked if m > 1]  # probes read one record (max_records=1)
    assert nseg > 20 and len(full_walks) <= 1, walked
    assert len(walked) <= 2 + nseg.bit_length() * 2  # first-record probes of ~log2(n) segments


@pytest.mark.parametrize("name", STORES)
def test_dump_commitlog_since_until_equals_a_full_filter(name):
    print(f"seed {SEED}")
    recs = _records(name)
    times = _probe_times(name, 4)
    rng = random.Random(f"{SEED}-{name}-pairs")
    for since in times[:4]:
        until = rng.choice([t for t in times if t >= since] + [None])
        args = ["dump", "commitlog", str(shared_store(name)), "--json", "--since", str(since)]
        if until is not None:
            args += ["--until", str(until)]
        p = run(*args)
        assert p.returncode == 0, p.stderr
        got = [json.loads(line)["offset"] for line in p.stdout.splitlines()]
        expected = [o for o, ts in recs if ts >= since and (until is None or ts <= until)]
        assert got == expected, (since, until)
        # the table path (not --json) selects the same records
        p2 = run("dump", "commitlog", str(shared_store(name)), "--since", str(since),
                 *(["--until", str(until)] if until is not None else []))
        assert p2.returncode == 0
        assert sum(1 for line in p2.stdout.splitlines() if line.startswith("│")) == len(expected)


def test_since_accepts_iso_8601_with_and_without_zone():
    name = "5.3.3-clean"
    recs = _records(name)
    t = recs[len(recs) // 2][1]
    from datetime import datetime, timezone

    utc = datetime.fromtimestamp(t / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
    local = datetime.fromtimestamp(t / 1000).isoformat(timespec="milliseconds")  # naive = local zone
    expected = [o for o, ts in recs if ts >= t]
    for text in (utc, utc.replace("+00:00", "Z"), local, str(t)):
        p = run("dump", "commitlog", str(shared_store(name)), "--json", "--since", text)
        assert p.returncode == 0, p.stderr
        assert [json.loads(x)["offset"] for x in p.stdout.splitlines()] == expected, text


def test_bad_time_is_a_usage_error():
    p = run("dump", "commitlog", str(shared_store("4.9.3-clean")), "--since", "yesterday-ish")
    assert p.returncode == 3
    assert "--since" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_dump_consumequeue_since_until(name):
    cqe = broker_read(name)["cqe"]
    times = _probe_times(name, 3)
    since, until = times[1], times[-2]
    p = run("dump", "consumequeue", str(shared_store(name)), "--json", "--since", str(since), "--until", str(until))
    assert p.returncode == 0, p.stderr
    got = sorted((r["topic"], r["queueId"], r["queueOffset"]) for r in map(json.loads, p.stdout.splitlines()))
    expected = sorted((e["topic"], e["queueId"], e["queueOffset"]) for e in cqe
                      if since <= e["msg"]["storeTimestamp"] <= until)
    assert got == expected and expected


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_stats_and_salvage_since_until(name, tmp_path):
    recs = _records(name)
    times = _probe_times(name, 3)
    since, until = times[1], times[-2]
    expected = [o for o, ts in recs if since <= ts <= until]
    p = run("stats", str(shared_store(name)), "--json", "--since", str(since), "--until", str(until))
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["records"] == len(expected) and s["timeRange"] == {"since": since, "until": until}
    before = tree_digest(shared_store(name))
    out = tmp_path / "rescued.jsonl"
    p = run("salvage", str(shared_store(name)), "--jsonl", str(out), "--since", str(since), "--until", str(until))
    assert p.returncode == 0, p.stderr
    assert [json.loads(x)["offset"] for x in out.read_text().splitlines()] == expected
    assert tree_digest(shared_store(name)) == before


def _broker_answer(entries, ts, version):
    """The broker's getOffsetInQueueByTime, read from its rules: 5.x (LOWER): first unit stored at
    or after ts, clamped to [min, max]; 4.9.3: in the first file modified at or after ts (the test
    gives each file its last unit's store time, as a live broker's last write), the nearest unit
    (the earlier on a tie); an exact hit may be any unit of that time."""
    times = [e["msg"]["storeTimestamp"] for e in entries]
    qoffs = [e["queueOffset"] for e in entries]
    if version >= 5:
        later = [q for q, t in zip(qoffs, times) if t >= ts]
        return {later[0] if later else qoffs[-1] + 1}
    per_file = 6000 // 20  # the shared stores' consume-queue file size (spec-sample.json)
    files = [list(range(a, min(a + per_file, len(qoffs)))) for a in range(0, len(qoffs), per_file)]
    pick = next((f for f in files[:-1] if times[f[-1]] >= ts), files[-1])
    qoffs, times = [qoffs[i] for i in pick], [times[i] for i in pick]
    exact = {q for q, t in zip(qoffs, times) if t == ts}
    if exact:
        return exact
    before = [(q, t) for q, t in zip(qoffs, times) if t < ts]
    after = [(q, t) for q, t in zip(qoffs, times) if t > ts]
    if not before:
        return {after[0][0]}
    if not after:
        return {before[-1][0]}
    (lq, lt), (rq, rt) = before[-1], after[0]
    return {rq if abs(ts - lt) > abs(ts - rt) else lq}


def _file_times_as_written(root, cqe):
    """Each consume-queue file gets its last unit's store time as modification time (a copy loses
    the broker's last-write times, which the 4.9.3 search reads)."""
    per_file = 6000 // 20
    by_queue = {}
    for e in cqe:
        by_queue.setdefault((e["topic"], e["queueId"]), {})[e["queueOffset"]] = e["msg"]["storeTimestamp"]
    for (t, q), times in by_queue.items():
        d = root / "consumequeue" / t / str(q)
        for name in os.listdir(d):
            last = min(int(name) // 20 + per_file, max(times) + 1) - 1
            os.utime(d / name, ns=(times[last] * 1_000_000, times[last] * 1_000_000))


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_get_time_is_the_brokers_time_search(name, store_copy):
    print(f"seed {SEED}")
    cqe = broker_read(name)["cqe"]
    version = 5 if name.startswith("5") else 4
    rng = random.Random(f"{SEED}-{name}-get")
    queues = sorted({(e["topic"], e["queueId"]) for e in cqe})
    root = store_copy(name)
    _file_times_as_written(root, cqe)
    with Store.open(str(root)) as st:
        for topic, qid in rng.sample(queues, min(4, len(queues))):
            entries = sorted((e for e in cqe if (e["topic"], e["queueId"]) == (topic, qid)),
                             key=lambda e: e["queueOffset"])
            times = [e["msg"]["storeTimestamp"] for e in entries]
            probes = rng.sample(times, min(5, len(times))) + [times[0] - 10, times[-1] + 10,
                                                               (times[0] + times[-1]) // 2]
            for ts in probes:
                got = offset_by_time(st, topic, qid, ts)
                assert got in _broker_answer(entries, ts, version), (topic, qid, ts, got)
    # the CLI prints the message at that offset
    topic, qid = queues[0]
    entries = sorted((e for e in cqe if (e["topic"], e["queueId"]) == (topic, qid)), key=lambda e: e["queueOffset"])
    ts = entries[len(entries) // 2]["msg"]["storeTimestamp"]
    p = run("get", str(root), "--topic", topic, "--queue", str(qid), "--time", str(ts), "--json",
            "--body", "none")
    assert p.returncode == 0, p.stderr
    msg = json.loads(p.stdout)
    assert msg["storeTimestamp"] == ts and msg["queueOffset"] in _broker_answer(entries, ts, version)
