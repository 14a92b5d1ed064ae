"""A quiet, offline Spark session for rmqstore jobs, and our own progress display.

Settings follow shared/NOTES-spark.md: no UI, no console progress bar, log4j at WARN from
our packaged ``log4j2.properties``, loopback bind unless the user set SPARK_LOCAL_IP, and
nothing that would download jars (``spark.jars.packages`` is never set).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from importlib import resources

# Fast JVM start-up for short jobs and tests (NOTES-spark.md: ~40 s -> ~25 s on a small suite).
FAST_JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def log4j_config_path() -> str:
    return str(resources.files("rmqstore_cli.spark").joinpath("log4j2.properties"))


def build_session(master: str | None = None, app_name: str = "rmqstore", *, driver_memory: str = "2g",
                  executor_memory: str | None = None, fast_jvm: bool = False, conf: dict | None = None):
    """A SparkSession for ``master`` (default ``local[*]``) with the ``rocketmq`` source registered.

    An existing session for another master is stopped first: ``getOrCreate`` would
    otherwise silently hand it back whatever master was asked for.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Executors must run the interpreter that has rmqstore installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    master = master or "local[*]"
    active = SparkSession.getActiveSession()
    if active is not None:
        if active.sparkContext.master == master:
            register_sources(active)
            return active
        active.stop()
    from .cds import java_flags

    java_opts = f"-Dlog4j.configurationFile=file:{log4j_config_path()}"
    cds = java_flags()  # the class-data archive set-up made (cds.py): a start in about half the time
    if cds:
        java_opts += " " + cds
    if fast_jvm:
        java_opts += " " + FAST_JVM_FLAGS
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
        .config("spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"])
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.sources.partitionOverwriteMode", "static")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.debug.maxToStringFields", "200")
    )
    if executor_memory:
        builder = builder.config("spark.executor.memory", executor_memory)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _quiet_python_loggers()
    register_sources(spark)
    return spark


def _quiet_python_loggers() -> None:
    """PySpark logs every analysis error as a multi-line JSON record; our commands print one line."""
    import logging

    try:
        from pyspark.logger import PySparkLogger
    except ImportError:
        return
    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def register_sources(spark) -> None:
    from .datasource import RocketMQDataSource
    from .verify_sources import SOURCES

    spark.dataSource.register(RocketMQDataSource)
    for source in SOURCES:
        spark.dataSource.register(source)


@contextlib.contextmanager
def job_progress(spark, description: str):
    """Our own progress bar (tasks done / total of the running stages) on a terminal's stderr.

    Spark's console progress is off; this polls the status tracker instead, so nothing is
    printed when stderr is not a terminal (tests, pipes, CI logs).
    """
    if not sys.stderr.isatty():
        yield
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from rmqstore_cli.commands.output import stderr

    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=stderr, transient=True) as p:
        task = p.add_task(description, total=None)

        def poll():
            seen: dict[int, tuple[int, int]] = {}
            while not stop.wait(0.25):
                try:
                    for sid in tracker.getActiveStageIds():
                        info = tracker.getStageInfo(sid)
                        if info is not None:
                            seen[sid] = (info.numCompletedTasks, info.numTasks)
                except Exception:  # noqa: BLE001 - the JVM may be shutting down; progress is cosmetic
                    return
                done = sum(d for d, _ in seen.values())
                total = sum(t for _, t in seen.values())
                if total:
                    p.update(task, completed=done, total=total)

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join(timeout=2)
            time.sleep(0)
