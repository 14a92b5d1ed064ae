"""stats against counts derived from the broker's read-back (broker-read.jsonl.gz)."""

from __future__ import annotations

import collections
import json

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.commitlog import ScanResult
from rmqstore_cli.engine.stats import StatsAccumulator, compute_stats
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
