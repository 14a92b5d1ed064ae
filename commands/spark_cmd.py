"""``rmqstore spark export|verify|rebuild|stats``: the same jobs, distributed on Apache Spark.

pyspark is imported only when one of these commands runs (``pip install rmqstore[spark]``).
"""

from __future__ import annotations

import os
from typing import List, Optional

import typer

from rmqstore_cli.engine.errors import EXIT_CORRUPT, UsageError

from .common import Geometry, JsonOpt, SinceOpt, UntilOpt, geometry_options, parse_time_option
from .output import Output, handle_errors, stderr

spark_app = typer.Typer(help="Run store jobs on Apache Spark (local by default, or --master spark://...).",
                        no_args_is_help=True)

StoresArg = typer.Argument(..., help="One or more store roots.", show_default=False)
MasterOpt = typer.Option(None, "--master", help="Spark master URL (default local[*]).")
DriverMemOpt = typer.Option("2g", "--driver-memory", help="spark.driver.memory.")


def _session(master: Optional[str], driver_memory: str, *, fast_jvm: bool = False):
    try:
        from rmqstore_cli.spark.session import build_session
    except ImportError as e:
        raise UsageError(f"pyspark is not installed ({e}); install rmqstore[spark]") from None
    return build_session(master, "rmqstore", driver_memory=driver_memory, fast_jvm=fast_jvm)


def _overrides(g: Geometry) -> dict:
    if g.broker_version is not None and g.broker_version not in (4, 5):
        raise UsageError("--broker-version must be 4 or 5")
    return {"version": g.broker_version, "mappedFileSizeCommitLog": g.commitlog_file_size,
            "mappedFileSizeConsumeQueue": g.cq_file_size, "maxHashSlotNum": g.index_slots,
            "maxIndexNum": g.index_entries}


def _check_roots(stores: List[str], command: str = "spark") -> list[str]:
    from rmqstore_cli.engine.store import Store

    roots = []
    for s in stores:
        st = Store.open(s)  # one-line error + exit code for a missing / non-store directory
        try:
            st.require(command)
        finally:
            st.close()
        roots.append(st.root)
    return roots


@spark_app.command("export")
@handle_errors
@geometry_options(only=("config", "broker_version", "commitlog_file_size"))
def export_cmd(
    stores: List[str] = StoresArg,
    to: str = typer.Option(..., "--to", help="Output directory (Spark writes one file per task)."),
    fmt: str = typer.Option("parquet", "--format", help="parquet|json"),
    partition_by: Optional[str] = typer.Option(None, "--partition-by", help="Comma-separated: topic,date,queueId,store."),
    no_body: bool = typer.Option(False, "--no-body", help="Leave the body column out."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --to if it exists."),
    writer: str = typer.Option("auto", "--writer", help="auto|arrow|spark: arrow writes Parquet from the executors "
                               "with Arrow's writer (auto's choice for unpartitioned Parquet to a file-system path); "
                               "spark uses Spark's DataFrameWriter (JSON, --partition-by, hdfs:// or s3a:// URIs)."),
    compression: Optional[str] = typer.Option(None, "--compression",
                                              help="Parquet codec: snappy (default), zstd, gzip, lz4, none."),
    since: Optional[str] = SinceOpt,
    until: Optional[str] = UntilOpt,
    master: Optional[str] = MasterOpt,
    driver_memory: str = DriverMemOpt,
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Every commitlog record of every STORE as Parquet or JSON (one row per record)."""
    from rmqstore_cli.spark import jobs
    from rmqstore_cli.spark.session import job_progress

    since_ms, until_ms = parse_time_option(since, "--since"), parse_time_option(until, "--until")
    roots = _check_roots(stores, "spark export")
    parts = (partition_by or "").split(",")
    # The Arrow writer leaves the JVM only scheduling: C1-only JIT and the serial collector halve its start-up CPU.
    arrow = jobs.export_writer(fmt, parts, to, writer, compression) == "arrow"
    spark = _session(master, driver_memory, fast_jvm=arrow)
    options = {"brokerVersion": geometry.broker_version, "commitlogFileSize": geometry.commitlog_file_size,
               "config": geometry.config, "since": since_ms, "until": until_ms}
    with job_progress(spark, "export"):
        res = jobs.export(spark, roots, to, fmt=fmt, partition_by=parts, body=not no_body, writer=writer,
                          compression=compression, overwrite=overwrite, options=options)
    Output(json_).kv(res, title="spark export")
    if res["findings"]:
        raise typer.Exit(1)


@spark_app.command("verify")
@handle_errors
@geometry_options
def verify_cmd(
    stores: List[str] = StoresArg,
    out: Optional[str] = typer.Option(None, "--out", help="Write the findings as a dataset here."),
    out_format: str = typer.Option("json", "--out-format", help="parquet|json"),
    no_crc: bool = typer.Option(False, "--no-crc", help="Skip body CRC checks."),
    master: Optional[str] = MasterOpt,
    driver_memory: str = DriverMemOpt,
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """CRC and structure of every record (on the executors), plus consume-queue, index and checkpoint
    cross-checks. Exit 0 clean, 1 findings, 2 unreadable."""
    from rmqstore_cli.spark import jobs
    from rmqstore_cli.spark.session import job_progress

    roots = _check_roots(stores, "spark verify")
    spark = _session(master, driver_memory)
    with job_progress(spark, "verify"):
        res = jobs.verify(spark, roots, check_crc=not no_crc, out=out, out_format=out_format,
                          overrides=_overrides(geometry), config_file=geometry.config)
    o = Output(json_)
    if res["findings"] or json_:
        o.table(res["findings"], [("severity", "severity"), ("code", "code"), ("path", "file"),
                                  ("offset", "offset"), ("message", "what")], title="spark verify")
    for summary in res["stores"]:
        c, cl = summary["findings"], summary["commitlog"]
        stderr.print(f"rmqstore: spark verify: {summary['root']}: {cl['records']} records in {cl['files']} commitlog files; "
                     f"{c['error']} errors, {c['warning']} warnings, {c['info']} info", markup=False, highlight=False)
    if res["out"]:
        stderr.print(f"rmqstore: spark verify: findings written to {res['out']}", markup=False, highlight=False)
    raise typer.Exit(res["exitCode"])


@spark_app.command("rebuild")
@handle_errors
@geometry_options
def rebuild_cmd(
    store: str = typer.Argument(..., help="Store root.", show_default=False),
    what: str = typer.Option(..., "--what", help="consumequeue|index|all (both, in one Spark session)"),
    out: str = typer.Option(..., "--out", help="New directory to write consumequeue/ (+ consumequeue_ext/) or index/ into; "
                            "the store itself is never changed."),
    master: Optional[str] = MasterOpt,
    driver_memory: str = DriverMemOpt,
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Compute consume queues (one task per queue), index files (one task per file) or both from the commitlog."""
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.spark import rebuild
    from rmqstore_cli.spark.session import job_progress

    if what not in ("consumequeue", "index", "all"):
        raise UsageError("--what must be consumequeue, index or all")
    parts = ("consumequeue", "index") if what == "all" else (what,)
    for part in parts:
        target = os.path.join(out, part)
        if os.path.exists(target) or (part == "consumequeue" and os.path.exists(os.path.join(out, "consumequeue_ext"))):
            raise UsageError(f"{target} already exists; give a new --out directory")
    ov = _overrides(geometry)
    st = Store.open(store, config_file=geometry.config, overrides=ov)
    st.require(f"spark rebuild {what}")
    os.makedirs(out, exist_ok=True)
    spark = _session(master, driver_memory)
    done = []
    try:
        for part in parts:  # one session for both: the JVM's start and its first job's warm-up are paid once
            with job_progress(spark, f"rebuild {part}"):
                fn = rebuild.rebuild_consumequeue if part == "consumequeue" else rebuild.rebuild_index
                done.append((part, fn(spark, st, os.path.abspath(out), overrides=ov, config_file=geometry.config)))
    finally:
        st.close()
    o = Output(json_)
    for part, res in done:
        if part == "consumequeue":
            o.table(res["queues"], [("topic", "topic"), ("queueId", "queue"), ("units", "units"), ("files", "files"),
                                    ("skipped", "skipped")], title=f"consume queues written to {out}")
        else:
            o.table(res["files"], [("name", "file"), ("entries", "entries")], title=f"index files written to {out}")


@spark_app.command("stats")
@handle_errors
@geometry_options
def stats_cmd(
    stores: List[str] = StoresArg,
    master: Optional[str] = MasterOpt,
    driver_memory: str = DriverMemOpt,
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """The ``stats`` report (per topic/queue counts, sizes, times, index fill, queue lag), computed on Spark."""
    from rmqstore_cli.spark import jobs
    from rmqstore_cli.spark.session import job_progress

    roots = _check_roots(stores, "spark stats")
    spark = _session(master, driver_memory)
    o = Output(json_)
    for root in roots:
        with job_progress(spark, "stats"):
            res = jobs.stats(spark, root, overrides=_overrides(geometry), config_file=geometry.config)
        res["root"] = root
        if json_:
            o.line(res)
            continue
        o.kv({k: res[k] for k in ("root", "records", "bytes", "topics", "firstStoreTimestamp", "lastStoreTimestamp")}
             | {"commitlog": res["commitlog"]}, title="spark stats")
        o.table(res["queues"], [("topic", "topic"), ("queueId", "queue"), ("count", "records"), ("bytes", "bytes"),
                                ("minQueueOffset", "min qoff"), ("maxQueueOffset", "max qoff"),
                                ("retryShare", "retry"), ("scheduledShare", "sched"), ("transactionalShare", "tx")])


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.add_typer(spark_app, name="spark", rich_help_panel=panel)


__all__ = ["register", "EXIT_CORRUPT"]
