"""``spark export``'s Arrow writer (rmqstore_cli.spark.arrow_export) against Spark's own writer and the broker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import STORE_NAMES, broker_read, shared_store

pytest.importorskip("pyspark", reason="pyspark is an optional extra (pip install -e .[spark])")
pytestmark = pytest.mark.spark


def _table(path):
    import pyarrow.parquet as pq

    t = pq.read_table(str(path))
    return t.sort_by([("store", "ascending"), ("commitLogOffset", "ascending")])


def _export_both(spark, roots, tmp_path, **kw):
    from rmqstore_cli.spark import jobs

    a = jobs.export(spark, roots, str(tmp_path / "arrow"), writer="arrow", **kw)
    s = jobs.export(spark, roots, str(tmp_path / "spark"), writer="spark", **kw)
    assert (a["writer"], s["writer"]) == ("arrow", "spark")
    for k in ("records", "recordBytes", "findings", "commitlogBytes", "stores"):
        assert a[k] == s[k], k
    ta, ts = _table(tmp_path / "arrow"), _table(tmp_path / "spark")
    assert ta.schema.remove_metadata() == ts.schema.remove_metadata()
    assert ta.to_pylist() == ts.to_pylist()
    return a, ta


def test_arrow_writer_writes_what_spark_writes_and_the_broker_read(spark, tmp_path):
    """Every shared store in one export: the Arrow writer's files hold the rows of Spark's writer, and the
    records the broker read back (bodies included)."""
    roots = [str(shared_store(n)) for n in STORE_NAMES]
    res, table = _export_both(spark, roots, tmp_path)
    rows = table.to_pylist()
    assert res["findings"] == 0 and res["records"] == len(rows)
    for name, root in zip(STORE_NAMES, roots):
        mine = [r for r in rows if r["store"] == root]
        broker = broker_read(name)["clmsg"]
        assert [r["commitLogOffset"] for r in mine] == [b["offset"] for b in broker]
        for r, b in zip(mine, broker):
            msg = b["msg"]
            assert r["body"].hex() == msg["bodyHex"] and r["topic"] == msg["topic"]
            assert dict(r["properties"]) == msg["properties"] and r["queueOffset"] == msg["queueOffset"]
            assert round(r["storeTimestamp"].timestamp() * 1000) == msg["storeTimestamp"]
    # Spark reads the files back with the data source's own column types (Spark's row metadata is written).
    back = spark.read.parquet(str(tmp_path / "arrow"))
    assert back.schema == spark.read.format("rocketmq").load(roots[0]).schema
    assert back.count() == len(rows)


def _corrupt(root):
    from rmqstore_cli.formats import fast

    segs = sorted((root / "commitlog").iterdir())
    data = segs[2].read_bytes()
    offs = fast.walk(data).offsets
    h = fast.decode_headers(data, offs[3:4])
    with open(segs[2], "r+b") as f:  # one body byte: CL_BODY_CRC
        f.seek(int(h.bodyStart[0]))
        b = f.read(1)
        f.seek(int(h.bodyStart[0]))
        f.write(bytes([b[0] ^ 0xFF]))
    data = segs[5].read_bytes()
    pos = int(fast.walk(data).offsets[2])
    with open(segs[5], "r+b") as f:  # a record's magic: CL_GARBAGE, the rest of that segment unread
        f.seek(pos + 4)
        f.write(b"\x12\x34\x56\x78")
    return int(segs[2].name) + int(offs[3]), int(segs[5].name) + pos


def test_arrow_writer_keeps_finding_rows_and_failfast_leaves_nothing(spark, store_copy, tmp_path):
    from pyspark.errors import PythonException

    from rmqstore_cli.spark.arrow_export import export_parquet

    root = store_copy("4.9.3-clean")
    crc_at, garbage_at = _corrupt(root)
    res, table = _export_both(spark, [str(root)], tmp_path, body=False)
    assert "body" not in table.schema.names
    found = {(r["finding"], r["commitLogOffset"]) for r in table.to_pylist() if r["finding"] is not None}
    assert found == {("CL_BODY_CRC", crc_at), ("CL_GARBAGE", garbage_at)} and res["findings"] == 2
    dest = tmp_path / "failfast"
    with pytest.raises(PythonException, match="CL_BODY_CRC|CL_GARBAGE"):
        export_parquet(spark, [str(root)], str(dest), with_body=True, overwrite=False, options={}, mode="failfast")
    assert not dest.exists()


def _task_for(root, dest, job, with_body=False, batch_bytes=None):
    """The executor side of one export task over the whole of ``root``, as the job would launch it."""
    import functools

    from rmqstore_cli.formats.arrow import arrow_schema
    from rmqstore_cli.spark import arrow_export, datasource

    groups = datasource.group_ranges(datasource.plan([str(root)], {}), 1 << 40)
    return functools.partial(arrow_export._task, schema_bytes=arrow_schema(with_body).serialize().to_pybytes(),
                             dest=str(dest), job=job, codec="snappy", with_body=with_body, check_crc=True,
                             batch_rows=datasource.DEFAULT_BATCH_ROWS, failfast=False,
                             batch_bytes=batch_bytes or datasource.DEFAULT_BATCH_BYTES)(0, iter(groups))


def test_a_task_that_outlives_a_failed_export_cannot_recreate_it(tmp_path):
    """Spark reports a failed job while its other tasks may still run: a task that starts after the
    driver removed DEST fails instead of creating DEST again; with the job's folder there it writes
    its attempt's file."""
    root = shared_store("4.9.3-clean")
    dest = tmp_path / "out"
    with pytest.raises(FileNotFoundError):
        list(_task_for(root, dest, "job-1"))
    assert not dest.exists()
    (dest / "_temporary" / "job-1").mkdir(parents=True)
    (summary,) = list(_task_for(root, dest, "job-1"))
    assert summary["tmp"].startswith(str(dest / "_temporary" / "job-1" / "00000-0"))
    assert os.path.getsize(summary["tmp"]) > 0 and summary["records"] == len(broker_read("4.9.3-clean")["clmsg"])


def test_a_failed_export_is_removed_even_when_a_late_task_writes_during_the_clean_up(spark, store_copy, tmp_path,
                                                                                     monkeypatch):
    import shutil

    from pyspark.errors import PythonException

    from rmqstore_cli.spark.arrow_export import export_parquet

    root = store_copy("4.9.3-clean")
    _corrupt(root)
    dest = tmp_path / "failfast"
    real_rmtree, calls = shutil.rmtree, []

    def rmtree_with_a_late_write(path, *a, **k):
        calls.append(path)
        real_rmtree(path, *a, **k)
        if len(calls) == 1:  # a task that outlived the job wrote while the folder was being removed
            os.makedirs(os.path.join(path, "_temporary", "late"))

    monkeypatch.setattr(shutil, "rmtree", rmtree_with_a_late_write)
    with pytest.raises(PythonException, match="CL_BODY_CRC|CL_GARBAGE"):
        export_parquet(spark, [str(root)], str(dest), with_body=True, overwrite=False, options={}, mode="failfast")
    assert not dest.exists() and len(calls) >= 2


def test_arrow_writer_layout_overwrite_and_codec(spark, tmp_path):
    import pyarrow.parquet as pq

    from rmqstore_cli.engine.errors import UsageError
    from rmqstore_cli.spark import jobs

    root = str(shared_store("5.3.3-clean"))
    dest = tmp_path / "out"
    first = jobs.export(spark, [root], str(dest))
    assert first["writer"] == "arrow" and first["tasks"] >= 2  # a small store is still cut for both cores
    names = sorted(os.listdir(dest))
    parts = [n for n in names if n.startswith("part-")]
    assert names == ["_SUCCESS"] + parts and len(parts) == first["tasks"]
    assert all(n.endswith(".snappy.parquet") for n in parts)
    with pytest.raises(UsageError, match="already exists"):
        jobs.export(spark, [root], str(dest))
    again = jobs.export(spark, [root], f"file://{dest}", overwrite=True, compression="zstd")
    new = sorted(n for n in os.listdir(dest) if n.startswith("part-"))
    assert not set(new) & set(parts) and all(n.endswith(".zstd.parquet") for n in new)
    assert again["records"] == first["records"] == len(broker_read("5.3.3-clean")["clmsg"])
    meta = pq.ParquetFile(str(dest / new[0])).metadata
    cols = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(meta.num_columns)}
    assert {c.compression for c in cols.values()} == {"ZSTD"}
    assert not any("DICTIONARY" in e for e in cols["body"].encodings)  # bodies: no dictionary
    assert any("DICTIONARY" in e for e in cols["topic"].encodings)


def test_arrow_writer_empty_export_carries_the_schema(spark, tmp_path):
    from rmqstore_cli.spark import jobs

    root = str(shared_store("5.3.3-clean"))
    res = jobs.export(spark, [root], str(tmp_path / "none"), options={"since": 4_000_000_000_000})
    assert res["records"] == res["findings"] == 0 and res["tasks"] == 0
    back = spark.read.parquet(str(tmp_path / "none"))
    assert back.count() == 0 and back.schema == spark.read.format("rocketmq").load(root).schema


def test_split_for_keeps_every_core_busy():
    from rmqstore_cli.spark.arrow_export import split_for

    assert split_for(1 << 30, 2) == 64 << 20  # 16 tasks of the default 64 MiB
    assert split_for(100 << 20, 2) == 25 << 20  # 4 tasks: two per core
    assert split_for(3 << 20, 8) == 1 << 20  # never below 1 MiB
    assert split_for(0, 2) == 64 << 20
    # commitlog files larger than a task, at least two per core: a task per file (the driver cuts none)
    assert split_for(8 << 30, 2, files=[1 << 30] * 8) == 1 << 30
    assert split_for(8 << 30, 8, files=[1 << 30] * 8) == 64 << 20  # too few files for 8 cores: cut into 64 MiB
    assert split_for(1 << 30, 2, files=[64 << 20] * 16) == 64 << 20  # files no larger than a task: as before


@pytest.mark.parametrize("args,error", [
    (["--writer", "arrow", "--partition-by", "topic"], "unpartitioned Parquet"),
    (["--writer", "arrow", "--format", "json"], "unpartitioned Parquet"),
    (["--writer", "fast"], "--writer must be one of"),
    (["--compression", "brotli"], "--compression must be one of"),
])
def test_export_refuses_bad_writer_options_before_starting_spark(tmp_path, args, error):
    root = str(shared_store("4.9.3-clean"))
    p = subprocess.run([sys.executable, "-m", "rmqstore_cli", "spark", "export", root, "--to", str(tmp_path / "o"),
                        *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr
    assert error in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "o").exists()


def test_unwalked_segments_report_the_same_tails_as_planned_ranges(spark, store_copy):
    """Segments no larger than a task are planned without a driver walk: their damaged tails (unknown
    magic, a record cut by the end of the file) come out as the finding rows of walked, cut ranges."""
    from rmqstore_cli.spark.datasource import plan

    root = store_copy("4.9.3-clean")
    _corrupt(root)
    last = sorted((root / "commitlog").iterdir())[-1]
    os.truncate(last, 30000)
    whole = plan([str(root)], {})
    assert all(r.tail_kind is None for r in whole)  # nothing was walked on the driver
    cut = plan([str(root)], {"splitsize": 8000})
    assert len(cut) > len(whole) and any(r.tail_kind is not None for r in cut)

    def rows(split):
        df = spark.read.format("rocketmq").option("body", "false").option("splitSize", split).load(str(root))
        return sorted((r["commitLogOffset"], r["finding"], r["storeSize"]) for r in df.collect())

    a, b = rows(64 << 20), rows(8000)
    assert a == b
    assert {f for _, f, _ in a if f} == {"CL_BODY_CRC", "CL_GARBAGE", "CL_TORN_TAIL"}


@pytest.mark.parametrize("body", [True, False])
def test_spark_schema_built_in_python_equals_the_parsed_ddl(spark, body):
    from pyspark.sql.types import _parse_datatype_string

    from rmqstore_cli.formats.arrow import ddl
    from rmqstore_cli.spark.arrow_export import spark_schema

    assert spark_schema(body) == _parse_datatype_string(ddl(body))


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_lz4_is_lz4_raw_in_both_writers(spark, tmp_path, writer):
    import pyarrow.parquet as pq

    from rmqstore_cli.spark import jobs

    root = str(shared_store("5.3.3-v2topic"))
    jobs.export(spark, [root], str(tmp_path / "o"), writer=writer, compression="lz4")
    part = next(p for p in sorted((tmp_path / "o").iterdir()) if p.name.startswith("part-"))
    meta = pq.ParquetFile(str(part)).metadata
    assert meta.row_group(0).column(0).compression == "LZ4"  # pyarrow's name of LZ4_RAW (Spark's plain lz4: UNKNOWN)
    assert _table(tmp_path / "o").num_rows == len(broker_read("5.3.3-v2topic")["clmsg"])
