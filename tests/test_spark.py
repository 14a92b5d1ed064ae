"""The Spark pipeline against the broker-written stores: data source, export, verify, rebuild, stats."""

from __future__ import annotations

import datetime
import os
import struct

import pytest

from .conftest import CLEAN_STORES, STORE_NAMES, broker_read, shared_store, tree_digest

pytest.importorskip("pyspark", reason="pyspark is an optional extra (pip install -e .[spark])")
pytestmark = pytest.mark.spark


@pytest.fixture(scope="session")
def all_rows(spark):
    """Every row of every shared store, read in one query, grouped by store root."""
    df = spark.read.format("rocketmq").load(",".join(str(shared_store(n)) for n in STORE_NAMES))
    out: dict[str, list] = {}
    for r in df.collect():
        out.setdefault(r["store"], []).append(r)
    for rows in out.values():
        rows.sort(key=lambda r: r["commitLogOffset"])
    return out


def _ms(ts) -> int:
    return round(ts.timestamp() * 1000)


def _host(h: dict) -> str:
    return f"[{h['ip']}]:{h['port']}" if ":" in h["ip"] else f"{h['ip']}:{h['port']}"


@pytest.mark.parametrize("name", STORE_NAMES)
def test_dataframe_equals_reader_and_broker(all_rows, name):
    from rmqstore_cli.engine.store import Store

    rows = all_rows[str(shared_store(name))]
    assert all(r["finding"] is None for r in rows)
    with Store.open(str(shared_store(name))) as st:
        ours = list(st.commitlog.records(check_crc=True))
    assert [r["commitLogOffset"] for r in rows] == [m["offset"] for m in ours]
    for r, m in zip(rows, ours):
        assert (r["topic"], r["queueId"], r["queueOffset"], r["storeSize"], r["sysFlag"], r["flag"], r["bodyCRC"],
                r["reconsumeTimes"], r["preparedTransactionOffset"], r["magicVersion"], r["physicalOffsetField"]) == (
            m["topic"], m["queueId"], m["queueOffset"], m["storeSize"], m["sysFlag"], m["flag"], m["bodyCRC"],
            m["reconsumeTimes"], m["preparedTransactionOffset"], m["magicVersion"], m["commitLogOffset"])
        assert (_ms(r["bornTimestamp"]), _ms(r["storeTimestamp"])) == (m["bornTimestamp"], m["storeTimestamp"])
        assert (r["bornHost"], r["storeHost"]) == (_host(m["bornHost"]), _host(m["storeHost"]))
        assert r["properties"] == m["properties"] and bytes(r["body"]) == m["body"] and r["crcOk"] is True
    broker = broker_read(name)["clmsg"]
    assert [r["commitLogOffset"] for r in rows] == [b["offset"] for b in broker]
    for r, b in zip(rows, broker):
        msg, disp = b["msg"], b["dispatch"]
        assert r["storeSize"] == b["size"] and r["topic"] == msg["topic"] and r["queueId"] == msg["queueId"]
        assert r["queueOffset"] == msg["queueOffset"] and r["sysFlag"] == msg["sysFlag"] and r["flag"] == msg["flag"]
        assert _ms(r["storeTimestamp"]) == msg["storeTimestamp"] and _ms(r["bornTimestamp"]) == msg["bornTimestamp"]
        assert r["bornHost"] == _host(msg["bornHost"]) and r["storeHost"] == _host(msg["storeHost"])
        assert r["bodyCRC"] == msg["bodyCRC"] and bytes(r["body"]).hex() == msg["bodyHex"]
        assert r["properties"] == msg["properties"] and r["tags"] == msg["properties"].get("TAGS")
        assert r["uniqKey"] == disp.get("uniqKey")
        assert r["keys"] == [k for k in (disp.get("keys") or "").split(" ") if k]
        assert r["preparedTransactionOffset"] == msg["preparedTransactionOffset"]


def test_ranges_are_message_aligned_and_splitting_changes_nothing(spark):
    from rmqstore_cli.formats import fast
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.spark.datasource import plan_segment

    root = str(shared_store("4.9.3-clean"))
    with Store.open(root) as st:
        seg = st.commitlog.segments.segments[3]
        starts = set(fast.walk(seg.buffer(), 0, seg.size).offsets.tolist())
        ranges = plan_segment(st.root, seg, seg.size, st.config, 8000)
    assert len(ranges) > 3 and all(r.pos in starts for r in ranges) and ranges[-1].tail_kind == fast.STOP_BLANK
    small = spark.read.format("rocketmq").option("splitSize", "300000").option("body", "false").load(root)
    assert "body" not in small.columns
    whole = spark.read.format("rocketmq").option("body", "false").load(root)
    assert small.rdd.getNumPartitions() > whole.rdd.getNumPartitions()
    a = sorted(r[0] for r in small.select("commitLogOffset").collect())
    b = sorted(r[0] for r in whole.select("commitLogOffset").collect())
    assert a == b == [m["offset"] for m in broker_read("4.9.3-clean")["clmsg"]]


def test_export_round_trips_through_parquet(spark, tmp_path, all_rows):
    from rmqstore_cli.spark import jobs

    names = ["4.9.3-clean", "5.3.3-v2topic"]
    roots = [str(shared_store(n)) for n in names]
    res = jobs.export(spark, roots, str(tmp_path / "out"), partition_by=["topic", "date"])
    expected = [r for root in roots for r in all_rows[root]]
    assert res["records"] == len(expected) and res["findings"] == 0
    back = spark.read.parquet(str(tmp_path / "out")).collect()
    key = lambda r: (r["store"], r["commitLogOffset"])  # noqa: E731
    back.sort(key=key)
    expected.sort(key=key)
    cols = [c for c in expected[0].asDict() if c not in ("date",)]
    assert [[r[c] for c in cols] for r in back] == [[r[c] for c in cols] for r in expected]
    # the date column is the store time's date in the session's zone (UTC); collect() gives naive local datetimes,
    # so the expected dates are taken in UTC whatever the machine's zone
    utc = datetime.timezone.utc
    assert {str(r["date"]) for r in back} == {datetime.datetime.fromtimestamp(r["storeTimestamp"].timestamp(), utc)
                                             .strftime("%Y-%m-%d") for r in expected}
    # The long and the '%' topic survive partition-directory escaping.
    assert {r["topic"] for r in back} >= {"oracle_topic-B%x"} | {t for t in (r["topic"] for r in expected) if len(t) >= 127}


def _first_record(store_root, seg_index=2, k=3):
    from rmqstore_cli.formats import fast

    seg_path = sorted((store_root / "commitlog").iterdir())[seg_index]
    data = seg_path.read_bytes()
    offs = fast.walk(data).offsets
    h = fast.decode_headers(data, offs[k:k + 1])
    return seg_path, int(offs[k]), h


def test_corrupt_regions_are_findings_or_failfast(spark, store_copy):
    from pyspark.errors import PythonException

    root = store_copy("4.9.3-clean")
    seg_path, pos, h = _first_record(root)
    body = int(h.bodyStart[0])
    with open(seg_path, "r+b") as f:
        f.seek(body)
        b = f.read(1)
        f.seek(body)
        f.write(bytes([b[0] ^ 0xFF]))
    seg2, pos2, _ = _first_record(root, seg_index=5, k=2)
    with open(seg2, "r+b") as f:
        f.seek(pos2 + 4)
        f.write(b"\x12\x34\x56\x78")  # magic of a record: the walk cannot go on in this segment
    start = int(seg_path.name)
    df = spark.read.format("rocketmq").option("body", "false").load(str(root))
    found = {(r["finding"], r["commitLogOffset"]): r for r in df.filter("finding is not null").collect()}
    assert set(found) == {("CL_BODY_CRC", start + pos), ("CL_GARBAGE", int(seg2.name) + pos2)}
    assert found[("CL_BODY_CRC", start + pos)]["crcOk"] is False
    total = df.count()
    assert total > 1900  # everything else is still read
    with pytest.raises(PythonException, match="CL_BODY_CRC|CL_GARBAGE"):
        spark.read.format("rocketmq").option("mode", "failfast").load(str(root)).count()


def _zero_last_units(qdir, n):
    """Zero the last ``n`` valid units of a queue: the records they pointed at are no longer dispatched."""
    f0 = sorted(qdir.iterdir())[-1]
    data = f0.read_bytes()
    valid = [i for i in range(len(data) // 20) if struct.unpack_from(">qi", data, i * 20)[1] > 0]
    with open(f0, "r+b") as f:
        for i in valid[-n:]:
            f.seek(i * 20)
            f.write(bytes(20))


def _damage(root, kind):
    if kind == "undispatched":
        _zero_last_units(sorted((root / "consumequeue" / "OracleTopicA").iterdir())[0], 3)
    elif kind == "lag":
        for t in (root / "consumequeue").iterdir():
            for q in t.iterdir():
                _zero_last_units(q, 1)
    elif kind == "store_time":
        # One record inside a segment and the first record of another go back in time (the body CRC
        # does not cover STORETIMESTAMP): backsteps inside a task and across a task boundary.
        for seg_no, rec_no in ((2, 3), (8, 0)):  # split=200_000 groups segments 0-3, 4-7, 8-11, ...
            seg_path, pos, h = _first_record(root, seg_no, rec_no)
            at = pos + 48 + (20 if int(h.sysFlag[0]) & 0x10 else 8)  # after BORNHOST (IPv6: 16 + 4 bytes)
            with open(seg_path, "r+b") as f:
                f.seek(at)
                assert struct.unpack(">q", f.read(8))[0] == int(h.storeTimestamp[0])
                f.seek(at)
                f.write(struct.pack(">q", 1_000))
    elif kind == "body":
        seg_path, pos, h = _first_record(root, 4, 5)
        with open(seg_path, "r+b") as f:
            f.seek(int(h.bodyStart[0]) + 2)
            f.write(b"\x00\x01\x02")
    elif kind == "garbage":
        seg_path, pos, h = _first_record(root, 7, 1)
        with open(seg_path, "r+b") as f:
            f.seek(pos)
            f.write(b"\x7f" * 64)
    elif kind == "cq":
        q = sorted((root / "consumequeue" / "OracleTopicA").iterdir())[0]
        f0 = sorted(q.iterdir())[0]
        with open(f0, "r+b") as f:
            f.seek(20 * 4)
            f.write(struct.pack(">qiq", 123, 77, 5))
    elif kind == "index":
        f0 = sorted((root / "index").iterdir())[3]
        with open(f0, "r+b") as f:
            f.seek(40 + 64 * 4 + 20 * 10 + 4)
            f.write(struct.pack(">q", 999_999))
    elif kind == "truncated":
        last = sorted((root / "commitlog").iterdir())[-1]
        os.truncate(last, 30000)


DAMAGE_KINDS = ["none", "body", "garbage", "cq", "index", "truncated", "undispatched", "lag", "store_time"]


def test_spark_verify_finds_what_verify_finds(spark, store_copy):
    """Each kind of damage on a copy of its own, the copies verified together in one job (a job of its own each
    cost ~10 s of Spark's fixed work): every copy's findings and exit code equal `verify`'s on it."""
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store
    from rmqstore_cli.spark import jobs

    single, roots = {}, {}
    for kind in DAMAGE_KINDS:
        root = store_copy("4.9.3-clean", kind)
        _damage(root, kind)
        with Store.open(str(root)) as st:
            single[kind] = verify_store(st)
            roots[kind] = st.root
    res = jobs.verify(spark, list(roots.values()), split=200_000)
    assert res["tasks"] > len(DAMAGE_KINDS)  # the copies' files split into more than one task each
    assert res["exitCode"] == 1
    for kind, root in roots.items():
        want = _finding_keys_engine(single[kind].findings)
        got = _finding_keys_spark(res["findings"], root)
        assert got == want, kind
        exit_code = 1 if any(severity in ("error", "warning") for _, severity, *_ in got) else 0
        assert exit_code == single[kind].exit_code == (0 if kind == "none" else 1), kind
        if kind != "none":
            assert want, kind  # the damage is seen at all
        expected = {"undispatched": "CQ_NOT_DISPATCHED", "lag": "CQ_DISPATCH_LAG", "store_time": "CL_STORE_TIME"}.get(kind)
        if expected:
            assert expected in {w[0] for w in want}, kind


def test_spark_verify_cross_checks_run_in_executor_tasks(spark, store_copy):
    """The consume-queue and index checks run as executor tasks (counted by an accumulator only those
    tasks add to), one per queue and one per index file, and still find a damaged unit and entry."""
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store
    from rmqstore_cli.spark import jobs

    root = store_copy("4.9.3-clean")
    _damage(root, "cq")
    _damage(root, "index")
    with Store.open(str(root)) as st:
        n_queues, n_files = len(st.queues()), len(st.index.files)
        single = verify_store(st)
    assert n_queues > 1 and n_files > 1
    res = jobs.verify(spark, [str(root)])
    assert res["crossCheckTasks"] == {"queues": n_queues, "indexFiles": n_files}
    codes = {r["code"] for r in res["findings"]}
    assert any(c.startswith("CQ_") for c in codes) and any(c.startswith("IDX_") for c in codes)
    assert sorted((r["code"], r["path"], r["offset"], r["message"]) for r in res["findings"]) == \
        sorted((f.code, f.path, f.offset, f.message) for f in single.findings)
    assert res["stores"][0]["consumeQueues"] == single.summary["consumeQueues"]
    assert res["stores"][0]["index"] == single.summary["index"]


def test_spark_verify_command_exit_codes_and_dataset(spark, store_copy, tmp_path):
    from typer.testing import CliRunner

    from rmqstore_cli.app import app

    root = store_copy("4.9.3-clean")
    _damage(root, "body")
    out = tmp_path / "findings"
    r = CliRunner().invoke(app, ["spark", "verify", str(root), "--master", "local[2]", "--out", str(out)])
    assert r.exit_code == 1, r.output
    assert "CL_BODY_CRC" in r.output
    codes = {row["code"] for row in spark.read.json(str(out)).collect()}
    assert "CL_BODY_CRC" in codes
    clean = CliRunner().invoke(app, ["spark", "verify", str(shared_store("5.3.3-v2topic")), "--master", "local[2]"])
    assert clean.exit_code == 0, clean.output
    missing = CliRunner().invoke(app, ["spark", "verify", str(tmp_path / "nope"), "--master", "local[2]"])
    assert missing.exit_code == 3 and "does not exist" in missing.output


def _files(d):
    return {os.path.relpath(os.path.join(p, f), d): open(os.path.join(p, f), "rb").read()
            for p, _, fs in os.walk(d) for f in fs}


@pytest.mark.parametrize("name", CLEAN_STORES)
def test_spark_rebuild_consume_queues_byte_identical(spark, tmp_path, name):
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.spark.rebuild import rebuild_consumequeue

    src = shared_store(name)
    before = tree_digest(src)
    with Store.open(str(src)) as st:
        res = rebuild_consumequeue(spark, st, str(tmp_path))
    assert _files(tmp_path / "consumequeue") == _files(src / "consumequeue")
    if (src / "consumequeue_ext").is_dir():
        assert _files(tmp_path / "consumequeue_ext") == _files(src / "consumequeue_ext")
    assert res["units"] == len(broker_read(name)["cqe"])
    assert tree_digest(src) == before


@pytest.mark.parametrize("name", CLEAN_STORES)
def test_spark_rebuild_index_content_identical(spark, tmp_path, name):
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.spark.rebuild import rebuild_index

    src = shared_store(name)
    with Store.open(str(src)) as st:
        res = rebuild_index(spark, st, str(tmp_path))
    ours = [open(tmp_path / "index" / f, "rb").read() for f in sorted(os.listdir(tmp_path / "index"))]
    theirs = [open(src / "index" / f, "rb").read() for f in sorted(os.listdir(src / "index"))]
    assert len(ours) == len(theirs) == len(broker_read(name)["index"][0]["files"])
    assert ours == theirs
    assert res["entries"] == sum(max(f["indexCount"], 1) - 1 for f in broker_read(name)["index"][0]["files"])


def test_spark_rebuild_all_writes_both_in_one_command(spark, tmp_path):
    """``spark rebuild --what all``: the consume queues and the index files of one command (the CLI takes the test
    run's Spark session, as it has the same master), each as the broker wrote them; a second run into the same
    folder, or into one that holds either part, is refused before anything is written."""
    import json

    from typer.testing import CliRunner

    from rmqstore_cli.app import app

    name = "4.9.3-clean"
    src = shared_store(name)
    out = tmp_path / "out"
    args = ["spark", "rebuild", str(src), "--what", "all", "--master", "local[2]", "--json", "--out"]
    r = CliRunner().invoke(app, args + [str(out)])
    assert r.exit_code == 0, r.output
    assert _files(out / "consumequeue") == _files(src / "consumequeue")
    # the same contents; a file is named by its first entry's store time, the broker's by when it made it
    assert [open(out / "index" / f, "rb").read() for f in sorted(os.listdir(out / "index"))] == \
        [open(src / "index" / f, "rb").read() for f in sorted(os.listdir(src / "index"))]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert sum(row["units"] for row in rows if "units" in row) == len(broker_read(name)["cqe"])
    assert sorted(row["name"] for row in rows if "entries" in row) == sorted(os.listdir(out / "index"))
    before = _files(out)
    (tmp_path / "only-index" / "index").mkdir(parents=True)
    for target in (out, tmp_path / "only-index"):
        r = CliRunner().invoke(app, args + [str(target)])
        assert r.exit_code == 3 and "already exists" in r.output and "Traceback" not in r.output, r.output
    assert _files(out) == before and not (tmp_path / "only-index" / "consumequeue").exists()


def test_index_file_task_edge_cases(tmp_path):
    import numpy as np

    from rmqstore_cli.spark.rebuild import write_index_file

    # Two keys in one slot chain; the first entry measured against an inherited begin 2.5 s earlier.
    write_index_file(str(tmp_path / "a"), np.array([5, 9, 2]), np.array([100, 200, 300]),
                     np.array([10_000, 12_999, 14_000]), 7_500, 50, 4, 8)
    data = (tmp_path / "a").read_bytes()
    assert len(data) == 40 + 16 + 160
    assert struct.unpack_from(">qqqqii", data, 0) == (10_000, 14_000, 100, 300, 2, 4)
    assert struct.unpack_from(">4i", data, 40) == (0, 2, 3, 0)
    entries = [struct.unpack_from(">iqii", data, 40 + 16 + n * 20) for n in (1, 2, 3)]
    assert entries == [(5, 100, 2, 0), (9, 200, 2, 1), (2, 300, 4, 0)]
    # Created after a full file and never written to: begin = end = the predecessor's end, count 0.
    write_index_file(str(tmp_path / "b"), np.zeros(0), np.zeros(0), np.zeros(0), 777, 55, 4, 8)
    assert struct.unpack_from(">qqqqii", (tmp_path / "b").read_bytes(), 0) == (777, 777, 55, 55, 0, 0)


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_spark_stats_equals_stats(spark, name):
    from rmqstore_cli.engine.query.stats import compute_stats
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.spark import jobs

    with Store.open(str(shared_store(name))) as st:
        want = compute_stats(st)
    got = jobs.stats(spark, str(shared_store(name)), split=100_000)
    assert got == want
    assert got["records"] == len(broker_read(name)["clmsg"])


def test_tasks_yield_arrow_batches_of_batch_rows(spark):
    from rmqstore_cli.spark.datasource import RocketMQReader

    root = str(shared_store("4.9.3-clean"))
    schema = spark.read.format("rocketmq").load(root).schema
    reader = RocketMQReader({"path": root, "batchrows": "500"}, schema)
    parts = reader.partitions()
    assert len(parts) == 1 and len(parts[0].ranges) == 56  # 56 small segments, one task
    sizes = [b.num_rows for b in reader.read(parts[0])]
    assert sum(sizes) == len(broker_read("4.9.3-clean")["clmsg"])
    assert all(n >= 500 for n in sizes[:-1]) and len(sizes) < 10


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-v2topic"])
def test_dump_parquet_without_spark_equals_spark_export(spark, tmp_path, name):
    """``dump commitlog --format parquet`` (pyarrow, no Spark) reads back with the Spark export's
    rows and schema."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from rmqstore_cli.spark import jobs

    root = str(shared_store(name))
    jobs.export(spark, [root], str(tmp_path / "spark"))
    theirs = pq.read_table(str(tmp_path / "spark"))
    p = subprocess.run([sys.executable, "-m", "rmqstore_cli", "dump", "commitlog", root, "--format", "parquet",
                        "--out", str(tmp_path / "ours.parquet"), "--body", "hex"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    ours = pq.read_table(str(tmp_path / "ours.parquet"))
    assert ours.schema.remove_metadata() == theirs.schema.remove_metadata()
    key = [("commitLogOffset", "ascending")]
    a, b = ours.sort_by(key).to_pylist(), theirs.sort_by(key).to_pylist()
    assert len(a) == len(broker_read(name)["clmsg"]) and a == b


def test_export_since_until_selects_by_store_time(spark, tmp_path):
    from rmqstore_cli.spark import jobs

    name = "5.3.3-clean"
    recs = [(o["offset"], o["msg"]["storeTimestamp"]) for o in broker_read(name)["clmsg"]]
    times = sorted({t for _, t in recs})
    since, until = times[len(times) // 3], times[2 * len(times) // 3]
    rows = jobs.read_records(spark, [str(shared_store(name))], body=False,
                             options={"since": since, "until": until}).collect()
    got = sorted(r["commitLogOffset"] for r in rows)
    assert got == [o for o, t in recs if since <= t <= until] and got
    assert all(r["finding"] is None for r in rows)


def _finding_keys_engine(findings):
    return sorted((f.code, f.severity, f.path, f.offset, f.message) for f in findings)


def _finding_keys_spark(rows, root):
    return sorted((r["code"], r["severity"], r["path"], r["offset"], r["message"]) for r in rows if r["store"] == root)


def test_spark_verify_every_shared_store_in_one_job(spark):
    """All broker-written stores verified together (one job, rows keyed by store) equal `verify` on each."""
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store
    from rmqstore_cli.spark import jobs

    roots = [str(shared_store(n)) for n in STORE_NAMES]
    res = jobs.verify(spark, roots, split=1 << 20)
    for root, summary in zip(roots, res["stores"]):
        with Store.open(root) as st:
            single = verify_store(st)
        assert _finding_keys_spark(res["findings"], root) == _finding_keys_engine(single.findings), root
        assert summary == single.summary, root
    assert res["exitCode"] == max(0, *(1 if r["severity"] in ("error", "warning") else 0 for r in res["findings"]))


def test_spark_verify_equals_verify_on_fuzz_cases(spark, tmp_path):
    """A sample of the fuzz suite's damaged stores (4.9.3 and 5.3.3), verified in one job, equal `verify` on each."""
    import random

    from rmqstore_cli.engine.errors import RmqStoreError
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store
    from rmqstore_cli.spark import jobs

    from . import fuzzlib

    seed = int(os.environ.get("RMQSTORE_SPARK_FUZZ_SEED", "1414"))
    n_cases = int(os.environ.get("RMQSTORE_SPARK_FUZZ_CASES", "16"))
    print(f"seed {seed}, {n_cases} cases")
    templates = {n: fuzzlib.make_template(n, tmp_path / "t" / n) for n in STORE_NAMES}
    want, unreadable = {}, []
    for case in range(n_cases):
        rng = random.Random(f"{seed}:{case}")
        name = STORE_NAMES[case % len(STORE_NAMES)]  # every store, so both broker versions
        root = tmp_path / f"case{case}"
        dmg = fuzzlib.plan_and_apply(rng, fuzzlib.model(name), lambda private, r=root, t=templates[name]: fuzzlib.clone(t, r, private))
        try:
            with Store.open(str(root)) as st:
                want[str(root)] = (dmg.describe(), verify_store(st))
        except RmqStoreError as e:
            unreadable.append((str(root), type(e)))
    assert len(want) >= n_cases // 2
    res = jobs.verify(spark, list(want), split=1 << 20)
    for root, (what, single) in want.items():
        assert _finding_keys_spark(res["findings"], root) == _finding_keys_engine(single.findings), f"{root}: {what}"
    for root, err in unreadable:  # what the engine cannot open, the Spark job refuses with the same error
        with pytest.raises(err):
            jobs.verify(spark, [root])


def test_spark_verify_finds_a_removed_index_entry(spark, store_copy):
    """IDX_MISSING in the distributed job: an entry removed cleanly (nothing else notices) from a 4.9.3 store, and
    from a kept file of a store left with an abort file (one also removed from a file the next start deletes,
    which is no loss), found as `verify` finds them, in one job."""
    import struct

    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store
    from rmqstore_cli.spark import jobs

    from .test_verify_index_coverage import _HEADER, _drop_entry, _dropped, _geometry

    clean, phy = _dropped(store_copy, which=3)
    crash = store_copy("4.9.3-crash", "crash-dropped")
    index_ts = struct.unpack_from(">q", open(crash / "checkpoint", "rb").read(24), 16)[0]
    files = _geometry(crash)
    ends = [_HEADER.unpack_from(open(p, "rb").read(_HEADER.size), 0)[1] for p, _, _ in files]
    for k in (max(k for k, t in enumerate(ends) if t > index_ts), 1):  # a doomed file's entry, then a kept one's
        path, slots, entries = files[k]
        count = _HEADER.unpack_from(open(path, "rb").read(_HEADER.size), 0)[5]
        crash_phy = _drop_entry(path, slots, entries, count // 2)
    res = jobs.verify(spark, [str(clean), str(crash)], split=1 << 20)
    for root, want_phy in ((clean, phy), (crash, crash_phy)):
        with Store.open(str(root)) as st:
            single = verify_store(st)
        assert _finding_keys_spark(res["findings"], str(root)) == _finding_keys_engine(single.findings), root
        found = [r for r in res["findings"] if r["store"] == str(root) and r["code"] == "IDX_MISSING"]
        assert len(found) == 1 and found[0]["phyOffset"] == want_phy, found


def test_spark_verify_uses_the_given_geometry(spark):
    """Geometry overrides reach every source and task: a wrong consume-queue file size gives `verify`'s findings."""
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store
    from rmqstore_cli.spark import jobs

    root = str(shared_store("4.9.3-clean"))
    overrides = {"version": None, "mappedFileSizeConsumeQueue": 20 * 100, "maxHashSlotNum": None}
    with Store.open(root, overrides=overrides) as st:
        single = verify_store(st)
    assert any(f.code.startswith("SEG_") for f in single.findings)
    res = jobs.verify(spark, [root], overrides=overrides)
    assert _finding_keys_spark(res["findings"], root) == _finding_keys_engine(single.findings)
