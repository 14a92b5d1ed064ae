"""stats against counts derived from the broker's read-back (broker-read.jsonl.gz)."""

from __future__ import annotations

import collections
import json

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
