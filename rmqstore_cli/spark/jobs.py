"""The distributed jobs behind ``rmqstore spark ...``: export, verify, stats.

Each job returns a plain summary dict (the command prints it); nothing here prints.
Rebuild lives in :mod:`rmqstore_cli.spark.rebuild`.
"""

from __future__ import annotations

import os
import time

from rmqstore_cli.engine.errors import UsageError

from .common import (CODECS, DEFAULT_CODEC, EXPORT_FORMATS, SPARK_CODECS, _write_findings, commitlog_bytes,  # noqa: F401
                     finding_rows, is_local_path, local_path, read_records)

PARTITION_COLUMNS = ("topic", "date", "queueId", "store")
EXPORT_WRITERS = ("auto", "arrow", "spark")


def export_writer(fmt: str, partition_by: list[str] | None, to: str, writer: str = "auto",
                  compression: str | None = None) -> str:
    """Which writer :func:`export` uses ("arrow" or "spark"); raises UsageError for a combination it refuses.

    Known before the session starts, so the command can start a JVM tuned for the writer.
    """
    if fmt not in EXPORT_FORMATS:
        raise UsageError(f"--format must be one of {', '.join(EXPORT_FORMATS)}")
    if writer not in EXPORT_WRITERS:
        raise UsageError(f"--writer must be one of {', '.join(EXPORT_WRITERS)}")
    if compression is not None and compression not in CODECS:
        raise UsageError(f"--compression must be one of {', '.join(CODECS)}")
    if compression is not None and fmt != "parquet":
        raise UsageError("--compression applies to --format parquet only")
    parts = [p for p in (partition_by or []) if p]
    for p in parts:
        if p not in PARTITION_COLUMNS:
            raise UsageError(f"--partition-by accepts {', '.join(PARTITION_COLUMNS)}, not {p!r}")
    arrow_ok = fmt == "parquet" and not parts and is_local_path(to)
    if writer == "arrow" and not arrow_ok:
        raise UsageError("--writer arrow writes unpartitioned Parquet to a file-system path only")
    return "arrow" if writer == "arrow" or (writer == "auto" and arrow_ok) else "spark"


def export(spark, roots: list[str], to: str, *, fmt: str = "parquet", partition_by: list[str] | None = None,
           body: bool = True, overwrite: bool = False, options: dict | None = None, writer: str = "auto",
           compression: str | None = None) -> dict:
    """Write every record of every store to ``to`` as Parquet or JSON Lines; findings rows included.

    ``writer``: ``arrow`` writes Parquet from the executors with Arrow's writer
    (:mod:`rmqstore_cli.spark.arrow_export`), ``spark`` hands the rows to Spark's DataFrameWriter;
    ``auto`` (default) takes ``arrow`` for an unpartitioned Parquet export to a local or shared
    file-system path and ``spark`` otherwise (JSON, ``partition_by``, ``hdfs://``/``s3a://`` URIs).
    ``compression``: Parquet codec (snappy, the default of both writers; zstd, gzip, lz4, none).
    """
    from pyspark.sql import functions as F

    use_arrow = export_writer(fmt, partition_by, to, writer, compression) == "arrow"
    codec = compression or DEFAULT_CODEC
    parts = [p for p in (partition_by or []) if p]
    if use_arrow:
        to = local_path(to)
    if os.path.exists(to) and not overwrite:
        raise UsageError(f"{to} already exists (use --overwrite to replace it)")
    t0 = time.monotonic()
    in_bytes = sum(commitlog_bytes(r) for r in roots)
    if use_arrow:
        from .arrow_export import export_parquet

        got = export_parquet(spark, roots, to, with_body=body, overwrite=overwrite, options=options or {}, codec=codec)
        elapsed = time.monotonic() - t0
        ok = {True: (got["records"], got["recordBytes"]), False: (got["findings"], 0)}
        tasks = got["tasks"]
    else:
        df = read_records(spark, roots, body=body, options=options)
        if "date" in parts:
            df = df.withColumn("date", F.to_date("storeTimestamp"))
        # Timestamps as Parquet TIMESTAMP_MICROS (UTC-adjusted), not Spark's deprecated INT96 default: the
        # same column type `dump commitlog --format parquet` writes without Spark, readable by any tool.
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        out = df.write.mode("overwrite" if overwrite else "errorifexists")
        if fmt == "json":
            out = out.option("ignoreNullFields", "false")  # every line carries every field name
        else:
            out = out.option("compression", SPARK_CODECS.get(codec, codec))
        if parts:
            out = out.partitionBy(*parts)
        getattr(out, fmt)(to)
        elapsed = time.monotonic() - t0
        # Counting from what was written keeps the summary honest (and re-reads only metadata for Parquet).
        back = getattr(spark.read.schema(df.schema), fmt)(to)
        counts = back.groupBy((F.col("finding").isNull()).alias("ok")).agg(F.count("*").alias("n"),
                                                                            F.sum("storeSize").alias("bytes")).collect()
        ok = {r["ok"]: (r["n"], r["bytes"] or 0) for r in counts}
        tasks = None  # Spark's writer: as many as the data source planned (not asked, to save a planning pass)
    return {
        "to": os.path.abspath(to), "format": fmt, "writer": "arrow" if use_arrow else "spark",
        "partitionBy": parts, "stores": len(roots),
        "records": ok.get(True, (0, 0))[0], "recordBytes": ok.get(True, (0, 0))[1],
        "findings": ok.get(False, (0, 0))[0], "commitlogBytes": in_bytes, "seconds": round(elapsed, 3),
        "tasks": tasks, "MBps": round(in_bytes / elapsed / 1e6, 1) if elapsed > 0 else None,
    }


# --- verify ---------------------------------------------------------------------------


def verify(spark, roots: list[str], **kw) -> dict:
    """Distributed ``verify`` (see :mod:`rmqstore_cli.spark.verify_job`)."""
    from .verify_job import verify as distributed_verify

    return distributed_verify(spark, roots, **kw)


# --- stats -----------------------------------------------------------------------------


def _stats_task(groups):
    """Executor side: the engine's StatsAccumulator over the records of some planned ranges."""
    import numpy as np

    from rmqstore_cli.formats import fast
    from rmqstore_cli.engine.log.segments import Segment
    from rmqstore_cli.engine.query.stats import StatsAccumulator

    acc = StatsAccumulator()
    for p in (r for g in groups for r in g.ranges):
        if not p.path or p.end <= p.pos:
            continue
        if p.dledger:
            _dledger_stats(p, acc)
            continue
        seg = Segment(p.path, p.name, p.start, p.size)
        try:
            buf = seg.buffer()
            u8 = fast.as_u8(buf)
            pos = p.pos
            while pos < p.end:
                w = fast.walk(buf, pos, p.end, max_records=65536)
                if len(w.offsets):
                    h = fast.decode_headers(buf, w.offsets, u8)
                    good = np.flatnonzero(h.reason == fast.R_OK)
                    if len(good) < len(h):
                        h = _select(h, good)
                    acc.add_chunk(buf, h)
                    del h
                pos = w.stop
                if w.kind != fast.STOP_CHUNK:
                    break
        finally:
            seg.close()
    yield acc


def _dledger_stats(p, acc) -> None:
    """The messages that parse in one DLedger data file's entries, into ``acc`` (the broker serves the damaged
    ones; their fields are not counted)."""
    from rmqstore_cli.formats import fast
    from rmqstore_cli.engine.config.storeconfig import StoreConfig
    from rmqstore_cli.engine.log.dledger import DLedgerCommitLog, walk_entries
    from rmqstore_cli.engine.log.segments import Segment

    seg = Segment(p.path, p.name, p.start, p.size)
    cl = DLedgerCommitLog.__new__(DLedgerCommitLog)
    cl.config = StoreConfig(version=p.version, forceVerifyPropCRC=p.force_prop_crc)
    try:
        for ec in walk_entries([seg], chunk=65536):
            h, _ = cl.messages(ec, False, cl.prop_crc_policy(False), cl.magics(False))
            ok = h.reason == fast.R_OK
            acc.add_chunk(ec.buf, h if ok.all() else h.select(ok))
    finally:
        seg.close()


def _select(h, idx):
    from rmqstore_cli.formats.fast import Headers

    out = Headers()
    for name in Headers.__slots__:
        setattr(out, name, getattr(h, name)[idx])
    return out


def stats(spark, root: str, *, overrides: dict | None = None, config_file: str | None = None,
          split: int | None = None) -> dict:
    """The ``stats`` report of one store, its commitlog aggregated on the executors."""
    from rmqstore_cli.formats import fast
    from rmqstore_cli.engine.query.stats import StatsAccumulator, index_stats, lmq_queues, queue_lag
    from rmqstore_cli.engine.store import Store

    from .datasource import DEFAULT_SPLIT, dledger_range, group_ranges, plan_segment

    st = Store.open(root, config_file=config_file, overrides=overrides)
    try:
        cl = st.commitlog
        dledger = getattr(cl, "is_dledger", False)
        parts = []
        for seg in cl.segments:
            parts.extend([dledger_range(st.root, seg, st.config)] if dledger else
                         plan_segment(st.root, seg, cl.segments.file_size, st.config, split or DEFAULT_SPLIT))
        acc = StatsAccumulator()
        if parts:
            groups = group_ranges(parts, split or DEFAULT_SPLIT)
            rdd = spark.sparkContext.parallelize(groups, numSlices=len(groups))
            for partial in rdd.mapPartitions(_stats_task).collect():
                acc.merge(partial)
        out = acc.result()
        segs = cl.segments.segments
        tails = [p for p in parts if p.tail_kind is not None]
        stop = next((p for p in tails if p.tail_kind != fast.STOP_BLANK), tails[-1] if tails else None)
        blanks = [p for p in tails if p.tail_kind == fast.STOP_BLANK]
        if stop is not None and stop.tail_kind != fast.STOP_BLANK:
            blanks = [p for p in blanks if p.start < stop.start]  # the broker's walk never gets past ``stop``
        out["commitlog"] = {
            "minOffset": cl.min_offset if segs else 0,
            "maxOffset": stop.start + stop.end if stop else 0,
            "files": len(segs),
            "fileSize": st.config.mappedFileSizeCommitLog,
            "stop": stop.tail_kind if stop else None,
            "blankCount": len(blanks),
            "blankBytes": int(sum(p.tail_size for p in blanks)),
        }
        if dledger:  # where the entries end, from the driver's walk of the entry headers
            from rmqstore_cli.engine.log.dledger import EntryWalk, walk_entries

            walk = EntryWalk()
            for _ in walk_entries(segs, result=walk):
                pass
            out["commitlog"].update(maxOffset=walk.stop.offset if walk.stop else 0,
                                    stop=walk.stop.kind if walk.stop else None, blankCount=len(walk.blanks),
                                    blankBytes=int(sum(size for _, size in walk.blanks)))
        out["index"] = index_stats(st)
        out["consumeQueueLag"] = queue_lag(st, out["queues"])
        out["lmqQueues"] = lmq_queues(st)
        return out
    finally:
        st.close()

