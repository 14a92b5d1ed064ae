"""``spark export --format parquet`` written by Arrow's Parquet writer inside the executors.

The export's rows are the Arrow batches the ``rocketmq`` data source builds (formats.arrow,
from the numpy header columns of the commitlog kernels). Handing them to Spark's own
``DataFrameWriter`` costs far more than building them: the JVM reads the Arrow stream,
turns every batch into rows and re-encodes them with parquet-mr (profile on a 256 MiB slice
of the 1 KiB bench store: JVM 6.6 CPU-s against 1.0 CPU-s in Python). Here each Spark task
plans nothing and converts nothing: it walks its message-aligned ranges, builds the same
batches and writes them straight to one Parquet file with ``pyarrow.parquet`` (C++), so the
bytes never cross into the JVM. The file schema is the one Spark derives from the data
source's DDL (tested equal to what Spark's writer produces), with Spark's row metadata so
Spark reads the exact column types back.

Commit protocol, as Spark's file committer does it for a local or shared file system: each
task attempt writes under ``DEST/_temporary/JOB/ATTEMPT/``; only the attempt whose result
reaches the driver is moved into ``DEST``; then ``_temporary`` is removed and ``_SUCCESS``
written. A failed job leaves no part files behind, even with tasks still running after the
job failed (Spark does not wait for the other tasks of a failed stage, and a Python worker can
outlive its killed task): the driver creates ``_temporary/JOB`` before the tasks start, a task
creates only its own attempt folder in it, so a task that starts after the clean-up cannot
re-create ``DEST``, and the clean-up repeats while a late task adds a file during it.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
import uuid

from . import datasource
from .common import CODECS, DEFAULT_CODEC, commitlog_file_sizes

# Columns stored without a dictionary: their values are almost never repeated (bodies, offsets, CRCs, times, unique
# keys; the keys and property maps of each record), so the writer would only fill a dictionary to throw it away at
# its size limit. Measured on 256 MiB of the 1 KiB bench store: the Parquet write's CPU 0.36-0.47 s with
# dictionaries for all but the body, 0.26 s without these, and the file 2 MB smaller (26 MB).
NO_DICTIONARY = ("body", "commitLogOffset", "queueOffset", "physicalOffsetField", "bodyCRC", "uniqKey", "bornTimestamp",
                 "storeTimestamp", "storeSize", "keys", "properties")
SPARK_ROW_METADATA = "org.apache.spark.sql.parquet.row.metadata"


def split_for(total_bytes: int, parallelism: int, default: int = datasource.DEFAULT_SPLIT, files: list = ()) -> int:
    """Task size: ``default`` (64 MiB), smaller when that would leave cores idle; a whole commitlog file when the
    files (``files``: their sizes) are larger than that and there are at least two per core.

    At least two tasks per core when the store is small enough, so a slow task does not leave
    the other cores waiting at the end; never below 1 MiB (per-task overhead). A file larger than a task is cut
    by the driver, which walks every record's header to find where to cut (a 1 GiB segment of 1 KiB messages:
    ~0.3 s before any task starts; at 1 TB, minutes of one process): with enough files for every core, a task per
    file needs no cut, and its own walk finds where its records end.
    """
    if files and len(files) >= 2 * parallelism > 0 and max(files) > default:
        return max(files)
    if total_bytes <= 0 or parallelism <= 0:
        return default
    return int(max(1 << 20, min(default, -(-total_bytes // (2 * parallelism)))))


def _task(index, groups, *, schema_bytes: bytes, dest: str, job: str, codec: str, with_body: bool, check_crc: bool,
          batch_rows: int, failfast: bool, batch_bytes: int = datasource.DEFAULT_BATCH_BYTES):
    """Executor side: one Parquet file for the ranges of this partition; yields one summary dict."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark import TaskContext

    schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
    ctx = TaskContext.get()
    attempt = ctx.attemptNumber() if ctx is not None else 0
    name = part_name(index, job, codec)
    tmp_dir = os.path.join(dest, "_temporary", job, f"{index:05d}-{attempt}")
    # Only the attempt's own folder: after a failed job's clean-up its parent is gone and this fails,
    # instead of creating DEST again.
    try:
        os.mkdir(tmp_dir)
    except FileExistsError:
        pass
    tmp = os.path.join(tmp_dir, name)
    writer = None
    records = record_bytes = findings = 0
    try:
        for g in groups:
            for batch in datasource.group_batches(g.ranges, schema, with_body=with_body, check_crc=check_crc,
                                                  batch_rows=batch_rows, failfast=failfast,
                                                  batch_bytes=batch_bytes):
                if writer is None:
                    writer = open_writer(tmp, schema, codec)
                writer.write_batch(batch)
                ok = pc.is_null(batch.column("finding"))
                good = int(pc.sum(ok).as_py() or 0)
                records += good
                findings += batch.num_rows - good
                record_bytes += int(pc.sum(pc.filter(batch.column("storeSize"), ok)).as_py() or 0)
    finally:
        if writer is not None:
            writer.close()
    yield {"index": index, "tmp": tmp if writer is not None else None, "name": name, "records": records,
           "recordBytes": record_bytes, "findings": findings}


def remove_tree(path: str, attempts: int = 50, pause: float = 0.1) -> None:
    """Remove ``path`` entirely; again while a task that outlived the failed job adds a file to a
    folder being removed (rmtree's last rmdir then fails with ENOTEMPTY)."""
    for _ in range(attempts):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(pause)


def part_name(index: int, job: str, codec: str) -> str:
    ext = "" if codec == "none" else f".{codec}"
    return f"part-{index:05d}-{job}-c000{ext}.parquet"


def open_writer(path: str, schema, codec: str):
    import pyarrow.parquet as pq

    return pq.ParquetWriter(path, schema, compression=CODECS[codec],
                            use_dictionary=[n for n in schema.names if n not in NO_DICTIONARY])


def spark_schema(with_body: bool):
    """The Spark schema of the data source's DDL (formats.arrow.COLUMNS), built in Python: asking the
    JVM to parse the DDL would load Spark's SQL parser for this alone."""
    from pyspark.sql import types as T

    from rmqstore_cli.formats.arrow import BODY_COLUMN, COLUMNS

    simple = {"string": T.StringType(), "bigint": T.LongType(), "int": T.IntegerType(), "boolean": T.BooleanType(),
              "binary": T.BinaryType(), "timestamp": T.TimestampType(),
              "array<string>": T.ArrayType(T.StringType(), True),
              "map<string,string>": T.MapType(T.StringType(), T.StringType(), True)}
    return T.StructType([T.StructField(n, simple[t], True) for n, t in COLUMNS if with_body or n != BODY_COLUMN])


def export_parquet(spark, roots: list[str], dest: str, *, with_body: bool, overwrite: bool, options: dict,
                   codec: str = DEFAULT_CODEC, mode: str = "permissive") -> dict:
    """Write every record of ``roots`` to ``dest`` as Parquet; returns counts taken from the written batches."""
    from rmqstore_cli.engine.errors import UsageError

    from rmqstore_cli.formats.arrow import arrow_schema

    if os.path.lexists(dest) and not overwrite:
        raise UsageError(f"{dest} already exists (use --overwrite to replace it)")
    opts = {str(k).lower(): v for k, v in options.items() if v is not None}
    # Spark's writer stores its schema under this key; Spark reads it back instead of inferring one.
    schema = arrow_schema(with_body).with_metadata({SPARK_ROW_METADATA: spark_schema(with_body).json()})
    if "splitsize" in opts:
        split = int(opts["splitsize"])
    else:
        files = [size for r in roots for size in commitlog_file_sizes(r)]
        split = split_for(sum(files), spark.sparkContext.defaultParallelism, files=files)
        opts["splitsize"] = split
    groups = datasource.group_ranges(datasource.plan(roots, opts), split)
    if os.path.lexists(dest):
        if os.path.isdir(dest) and not os.path.islink(dest):
            shutil.rmtree(dest)
        else:
            os.remove(dest)
    job = str(uuid.uuid4())
    os.makedirs(os.path.join(dest, "_temporary", job))
    task = functools.partial(
        _task, schema_bytes=schema.serialize().to_pybytes(), dest=dest, job=job, codec=codec, with_body=with_body,
        check_crc=str(opts.get("checkcrc", "true")).lower() in ("true", "1", "yes"),
        batch_rows=int(opts.get("batchrows") or datasource.DEFAULT_BATCH_ROWS), failfast=mode == "failfast",
        batch_bytes=datasource.batch_bytes_of(opts))
    try:
        results = []
        if groups:
            rdd = spark.sparkContext.parallelize(groups, numSlices=len(groups))
            results = rdd.mapPartitionsWithIndex(task).collect()
        written = 0
        for r in sorted(results, key=lambda r: r["index"]):
            if r["tmp"]:
                os.replace(r["tmp"], os.path.join(dest, r["name"]))
                written += 1
        if not written:  # an empty export still carries its schema, as Spark's writer does
            open_writer(os.path.join(dest, part_name(0, job, codec)), schema, codec).close()
    except BaseException:
        remove_tree(dest)
        raise
    shutil.rmtree(os.path.join(dest, "_temporary"), ignore_errors=True)
    with open(os.path.join(dest, "_SUCCESS"), "wb"):
        pass
    return {"records": sum(r["records"] for r in results), "recordBytes": sum(r["recordBytes"] for r in results),
            "findings": sum(r["findings"] for r in results), "tasks": len(groups)}
