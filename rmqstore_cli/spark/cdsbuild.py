"""Make the class-data archive of Spark's driver JVM (:mod:`.cds` finds it and maps it): a verify, a rebuild and an
export of a small store written for the purpose, run under ``-XX:ArchiveClassesAtExit``, then a JVM that must map
the archive runs a job before it is put in place and sealed with its size.

``python -m rmqstore_cli.spark.cdsbuild`` (scripts/setup.sh runs it; RMQSTORE_SPARK_CDS=0 skips it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from .cds import ENV, QUIET, archive_path, seal_path
from .session import build_session, log4j_config_path


def check_archive(path: str) -> None:
    """Start a Spark session that must map ``path`` (``-Xshare:on``: the JVM refuses to start otherwise) and run a
    job on it; raises if that fails."""
    code = ("import sys; from rmqstore_cli.spark import cds, session; "
            "cds.java_flags = lambda: '-XX:SharedArchiveFile=' + sys.argv[1] + ' -Xshare:on'; "
            "s = session.build_session('local[1]', 'rmqstore-cds-check'); assert s.range(3).count() == 3")
    env = dict(os.environ, **{ENV: "1"})
    with tempfile.TemporaryDirectory(prefix="rmqstore-cds-check-") as cwd:  # where a JVM that crashes writes hs_err
        p = subprocess.run([sys.executable, "-c", code, os.path.abspath(path)], env=env, cwd=cwd,
                           capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"a JVM could not start on the archive: {(p.stderr or p.stdout).strip()[-300:]}")


def _training_store(root: str) -> None:
    """A small store (two topics, keys, tags; two segments) whose verify, rebuild and export load the classes any
    job loads."""
    from rmqstore_cli.engine.config.storeconfig import StoreConfig
    from rmqstore_cli.engine.log.appender import Appender
    from rmqstore_cli.engine.log.messages import MessageBuilder

    cfg = StoreConfig(version=4, mappedFileSizeCommitLog=64 << 10)
    builder = MessageBuilder(cfg)
    with Appender(root, cfg) as app:
        for i in range(400):
            app.put([builder.from_json({"topic": f"CdsTopic{i % 2}", "queueId": i % 4,
                                        "storeTimestamp": 1_700_000_000_000 + i, "bornTimestamp": 1_700_000_000_000 + i,
                                        "properties": {"KEYS": f"key-{i}", "TAGS": f"tag{i % 3}"},
                                        "bodyHex": (b"m%05d" % i * 20).hex()})])
    os.makedirs(os.path.join(root, "config"), exist_ok=True)


def build_archive() -> str:
    """Write the archive (replacing an older one for this pyspark and JDK); returns its path."""
    path = archive_path()
    if path is None:
        raise RuntimeError("no java binary (JAVA_HOME or PATH) or no pyspark")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    os.environ[ENV] = "0"  # this JVM dumps an archive; it maps none
    work = tempfile.mkdtemp(prefix="rmqstore-cds-")
    proc = None
    try:
        store, out = os.path.join(work, "store"), os.path.join(work, "out")
        _training_store(store)
        spark = build_session("local[2]", "rmqstore-cds", conf={
            "spark.driver.extraJavaOptions": _session_java_opts(f"-XX:ArchiveClassesAtExit={tmp} {QUIET}")})
        proc = getattr(spark.sparkContext._gateway, "proc", None)
        if proc is None:
            raise RuntimeError("the Spark JVM was not started by this process")
        from . import jobs, rebuild
        from rmqstore_cli.engine.store import Store

        jobs.verify(spark, [store], check_crc=True)
        with Store.open(store) as st:
            rebuild.rebuild_consumequeue(spark, st, os.path.join(out, "rebuilt"))
            rebuild.rebuild_index(spark, st, os.path.join(out, "rebuilt"))
        jobs.export(spark, [store], os.path.join(out, "export"), writer="arrow")
        spark.stop()
        _end_jvm(proc)
        if not os.path.isfile(tmp) or os.path.getsize(tmp) == 0:
            raise RuntimeError("the JVM wrote no archive (a JDK before 13 has no dynamic archives)")
        check_archive(tmp)
        size = os.path.getsize(tmp)
        if os.path.exists(seal_path(path)):
            os.unlink(seal_path(path))  # no start maps the old seal with the new file, or the reverse
        os.replace(tmp, path)
        with open(seal_path(path) + ".tmp", "w") as f:
            f.write(f"{size}\n")
        os.replace(seal_path(path) + ".tmp", seal_path(path))
        return path
    finally:
        if proc is not None and proc.poll() is None:
            _end_jvm(proc)  # a failed run: let its JVM write its archive now, so the file removed below stays removed
        shutil.rmtree(work, ignore_errors=True)
        if os.path.exists(tmp):
            os.unlink(tmp)


def _end_jvm(proc) -> None:
    """The JVM writes the archive as it exits, and it exits once its standard input closes."""
    if proc.stdin and not proc.stdin.closed:
        proc.stdin.close()
    proc.wait(timeout=300)


def _session_java_opts(extra: str) -> str:
    return f"-Dlog4j.configurationFile=file:{log4j_config_path()} {extra}"


def main() -> int:
    if os.environ.get(ENV) == "0":
        print("rmqstore: Spark class-data archive: skipped (RMQSTORE_SPARK_CDS=0)")
        return 0
    try:
        path = build_archive()
    except Exception as e:  # noqa: BLE001 - set-up goes on: spark commands start as they would without it
        print(f"rmqstore: no Spark class-data archive ({type(e).__name__}: {e}); spark commands start slower",
              file=sys.stderr)
        return 1
    print(f"rmqstore: Spark class-data archive ready ({os.path.getsize(path) >> 20} MiB: {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
