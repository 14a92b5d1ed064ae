"""stats against counts derived from the broker's read-back (broker-read.jsonl.gz)."""

from __future__ import annotations

import collections
import json
import os
import random

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.log.commitlog import ScanResult
from rmqstore_cli.engine.query.stats import StatsAccumulator, compute_stats
from rmqstore_cli.engine.store import Store

from .conftest import STORE_NAMES, broker_read, shared_store


@pytest.mark.parametrize("name", STORE_NAMES)
def test_stats_equal_broker_counts(name):
    br = broker_read(name)
    s = compute_stats(Store.open(str(shared_store(name))))
    want = collections.defaultdict(lambda: {"count": 0, "bytes": 0, "q": [], "t": [], "retry": 0, "dlq": 0,
                                            "scheduled": 0, "tx": 0})
    for c in br["clmsg"]:
        m = c["msg"]
        w = want[(m["topic"], m["queueId"])]
        w["count"] += 1
        w["bytes"] += c["size"]
        w["t"].append(m["storeTimestamp"])
        if m["sysFlag"] & 0x0C in (0, 0x08):
            w["q"].append(m["queueOffset"])
        w["retry"] += m["topic"].startswith("%RETRY%") or m["reconsumeTimes"] > 0
        w["dlq"] += m["topic"].startswith("%DLQ%")
        w["scheduled"] += m["topic"] == "SCHEDULE_TOPIC_XXXX"
        w["tx"] += (m["sysFlag"] & 0x0C) != 0 or m["topic"].startswith("RMQ_SYS_TRANS")
    got = {(r["topic"], r["queueId"]): r for r in s["queues"]}
    assert set(got) == set(want)
    for k, w in want.items():
        r = got[k]
        assert (r["count"], r["bytes"]) == (w["count"], w["bytes"]), k
        assert (r["firstStoreTimestamp"], r["lastStoreTimestamp"]) == (min(w["t"]), max(w["t"]))
        assert (r["minQueueOffset"], r["maxQueueOffset"]) == ((min(w["q"]), max(w["q"])) if w["q"] else (None, None))
        assert (r["retry"], r["dlq"], r["scheduled"], r["transactional"]) == (w["retry"], w["dlq"], w["scheduled"], w["tx"])
    assert s["records"] == len(br["clmsg"])
    assert s["bytes"] == sum(c["size"] for c in br["clmsg"])
    assert sum(s["sizeHistogram"]["counts"]) == len(br["clmsg"]) == sum(s["timeline"]["counts"])
    assert s["commitlog"]["blankCount"] == len(br["blank"])
    assert s["commitlog"]["blankBytes"] == sum(b["totalSize"] for b in br["blank"])
    # the consume queues on disk end where the broker says (no lag in these stores)
    cq = {(c["topic"], c["queueId"]): c for c in br["cq"]}
    lag = {(r["topic"], r["queueId"]): r for r in s["consumeQueueLag"]}
    for k, c in cq.items():
        if k not in lag:  # the broker also lists delay-level queues that have no files
            assert c["maxOffset"] == 0 and k not in got
            continue
        assert lag[k]["cqMaxOffset"] == c["maxOffset"]
        assert lag[k]["lagMessages"] in (None, 0)
    assert set(lag) <= set(cq)
    if name != "4.9.3-crash":  # the crash store's index was rebuilt by the broker before it was read back
        files = {f["name"]: f for f in br["index"][0]["files"]}
        assert [r["name"] for r in s["index"]] == sorted(files)
        for r in s["index"]:
            assert r["entries"] == files[r["name"]]["indexCount"] - 1
            assert r["hashSlotCount"] == files[r["name"]]["hashSlotCount"]


def test_partial_accumulators_merge_to_the_same_result():
    """The Spark job's contract: per-partition accumulators merged == one pass."""
    st = Store.open(str(shared_store("4.9.3-clean")))
    whole, a, b = StatsAccumulator(), StatsAccumulator(), StatsAccumulator()
    for i, ch in enumerate(st.commitlog.scan(check_crc=False, result=ScanResult(), chunk_records=50)):
        whole.add_chunk(ch.buf, ch.headers)
        (a if i % 2 else b).add_chunk(ch.buf, ch.headers)
    a.merge(b)
    assert a.result() == whole.result()


def test_stats_cli():
    root = shared_store("5.3.3-v2topic")
    r = CliRunner().invoke(app, ["stats", str(root), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["records"] == len(broker_read("5.3.3-v2topic")["clmsg"])
    assert any(len(q["topic"]) == 200 for q in s["queues"])
    r = CliRunner().invoke(app, ["stats", str(root)])
    assert r.exit_code == 0 and "record size histogram" in r.stdout and "messages over time" in r.stdout
    r = CliRunner().invoke(app, ["stats", "/nonexistent/store"])
    assert r.exit_code == 3


@pytest.mark.parametrize("name", STORE_NAMES)
def test_queue_bounds_equal_the_units(name, store_copy):
    """ConsumeQueue.bounds (file by file, nothing per unit kept) answers what units() implies, also on a
    queue cut short by an invalid unit."""
    import numpy as np

    from rmqstore_cli.engine.store import Store

    root = store_copy(name)
    with Store.open(str(root)) as st:
        queues = st.queues()
        topic, qid = queues[len(queues) // 2]
        path = st.queue(topic, qid).segments.segments[0].path
    with open(path, "r+b") as f:  # an invalid unit (size 0) in the middle of one queue
        f.seek(20 * 3 + 8)
        f.write(b"\x00\x00\x00\x00")
    with Store.open(str(root)) as st:
        for t, q in st.queues():
            cq = st.queue(t, q)
            u = cq.units()
            want = (int(u.min_offset), int(u.end_offset), int(u.phy[-1] + u.size[-1]) if len(u.phy) else None)
            assert cq.bounds() == want, (t, q)
            if (t, q) == (topic, qid):
                assert want[1] == 3 and np.all(u.size > 0)


def test_timeline_coarsens_past_the_key_limit(monkeypatch):
    """The per-time-key counts stay bounded (ms keys fold into seconds, then minutes) and the timeline
    still counts every record."""
    import numpy as np

    from rmqstore_cli.engine.query import stats as stats_mod

    monkeypatch.setattr(stats_mod, "SECOND_KEYS_LIMIT", 1000)
    acc = StatsAccumulator()
    acc.topics["T"] = 0
    n = 5000
    ts = 1_700_000_000_000 + np.arange(n, dtype=np.int64) * 7  # 5000 distinct ms keys over 35 s
    acc.add_columns(np.zeros(n, np.int64), np.zeros(n), np.arange(n), np.full(n, 100), ts, np.zeros(n), np.zeros(n))
    assert acc.time_unit_ms == 1000 and len(acc.seconds) <= 1000
    tl = acc.result()["timeline"]
    assert sum(tl["counts"]) == n and tl["bucketMs"] % 1000 == 0


STATS_SEED = int(os.environ.get("RMQSTORE_STATS_SEED", random.randrange(1 << 30)))


def test_many_queues_per_chunk_equal_a_plain_tally():
    """Thousands of queues in every chunk (an LMQ-heavy broker): the queue table, kept as sorted columns and
    folded chunk by chunk and partial by partial, equals a tally made record by record in plain Python: sums,
    the lowest and highest dispatched offsets (a PREPARED record is not dispatched), store times, and a queue
    first seen in a later chunk or partial placed in key order."""
    import numpy as np

    print(f"seed {STATS_SEED} (RMQSTORE_STATS_SEED)")
    rng = np.random.default_rng(STATS_SEED)
    topics = ["T%d" % i for i in range(40)] + ["%RETRY%g", "%DLQ%g", "SCHEDULE_TOPIC_XXXX"]
    n = 20_000
    tid = rng.integers(0, len(topics), n)
    qid = rng.integers(-2, 80, n)  # a negative queue id is kept as the broker wrote it
    qid[: n // 2] %= 8  # fewer queues early on: more are first seen in later chunks
    tid[: n // 3] %= 10  # and fewer topics: the others are new to the first partial when merged
    qoff = rng.integers(0, 1 << 40, n)
    size = rng.integers(20, 5000, n)
    ts = 1_700_000_000_000 + rng.integers(0, 10_000_000, n)
    sysflag = rng.choice([0, 0, 0, 4, 8, 12], n)
    reconsume = rng.choice([0, 0, 0, 1], n)
    msgs = rng.choice([1, 1, 3], n)
    ref = {}
    for i in range(n):
        k = (topics[tid[i]], int(qid[i]))
        r = ref.setdefault(k, {"count": 0, "bytes": 0, "min": None, "max": None, "t0": None, "t1": None,
                               "retry": 0, "dlq": 0, "scheduled": 0, "transactional": 0, "messages": 0})
        r["count"] += 1
        r["bytes"] += int(size[i])
        r["messages"] += int(msgs[i])
        tx = int(sysflag[i]) & 0x0C
        if tx in (0, 8):
            lo, hi = int(qoff[i]), int(qoff[i]) + int(msgs[i]) - 1
            r["min"] = lo if r["min"] is None else min(r["min"], lo)
            r["max"] = hi if r["max"] is None else max(r["max"], hi)
        r["t0"] = int(ts[i]) if r["t0"] is None else min(r["t0"], int(ts[i]))
        r["t1"] = int(ts[i]) if r["t1"] is None else max(r["t1"], int(ts[i]))
        r["retry"] += k[0].startswith("%RETRY%") or reconsume[i] > 0
        r["dlq"] += k[0].startswith("%DLQ%")
        r["scheduled"] += k[0] == "SCHEDULE_TOPIC_XXXX"
        r["transactional"] += tx != 0

    def fed(lo, hi, step):
        acc = StatsAccumulator()
        seen = [topics[t] for t in sorted(set(tid[lo:hi].tolist()))]
        for name in seen[::-1] if lo else seen:  # topic ids differ between partials
            acc.topics[name] = len(acc.topics)
        ids = np.array([acc.topics.get(t, -1) for t in topics], np.int64)
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            acc.add_columns(ids[tid[a:b]], qid[a:b], qoff[a:b], size[a:b], ts[a:b], sysflag[a:b], reconsume[a:b],
                            msgs[a:b])
        return acc

    whole = fed(0, n, 997)
    merged = fed(0, n // 3, 500)
    merged.merge(fed(n // 3, 2 * n // 3, 1500))
    merged.merge(fed(2 * n // 3, n, 700))
    for acc in (whole, merged):
        assert np.all(np.diff(acc.queue_keys) > 0)
        rows = acc.result()["queues"]
        assert [(r["topic"], r["queueId"]) for r in rows] == sorted(ref, key=lambda k: (k[0], k[1] & 0xFFFFFFFF))
        for r in rows:
            want = ref[(r["topic"], r["queueId"])]
            got = (r["count"], r["bytes"], r["minQueueOffset"], r["maxQueueOffset"], r["firstStoreTimestamp"],
                   r["lastStoreTimestamp"], r["retry"], r["dlq"], r["scheduled"], r["transactional"], r["messages"])
            assert got == (want["count"], want["bytes"], want["min"], want["max"], want["t0"], want["t1"],
                           want["retry"], want["dlq"], want["scheduled"], want["transactional"], want["messages"]), r
