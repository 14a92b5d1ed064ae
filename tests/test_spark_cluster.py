"""export and verify on a real standalone Spark cluster (a master and two workers on 127.0.0.1).

Started from the pip package's ``bin/spark-class`` on free ports and stopped by PID at the end.
Run with ``pytest -m cluster`` (scripts/test.sh does, as a second pass).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from .conftest import broker_read, shared_store

pytest.importorskip("pyspark", reason="pyspark is an optional extra (pip install -e .[spark])")
pytestmark = [pytest.mark.cluster, pytest.mark.spark]


def _free_ports(n: int) -> list[int]:
    """n distinct free ports: every socket stays bound until all are chosen, so none is handed out twice."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _state(web_port: int, master_url: str) -> dict | None:
    """The master's JSON status, or None while it is not up (or the port answers with something that is not it)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=2) as r:
            st = json.loads(r.read())
    except (OSError, ValueError):
        return None
    return st if isinstance(st, dict) and st.get("url") == master_url else None


def _stop(procs) -> None:
    # Workers first, then the master; each by the PID we started (spark-class execs java).
    for p in procs[1:] + procs[:1]:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _start_cluster(spark_class: str, env: dict, work) -> tuple[str, list, str | None]:
    """One attempt: a master and two workers on fresh ports. Returns (url, processes, None) or (url, processes, why)."""
    port, web, web0, web1 = _free_ports(4)
    url = f"spark://127.0.0.1:{port}"
    procs = []

    def launch(args, name):
        with open(work / f"{name}.log", "wb") as log:
            procs.append(subprocess.Popen([spark_class, *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True))

    launch(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
            "--webui-port", str(web)], "master")
    for i, wport in enumerate((web0, web1)):
        launch(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                "--webui-port", str(wport), "--work-dir", str(work / f"worker{i}"), url], f"worker{i}")
    deadline = time.monotonic() + 90
    st = None
    while True:
        st = _state(web, url)
        if st and st.get("status") == "ALIVE" and sum(w.get("state") == "ALIVE" for w in st.get("workers", [])) == 2:
            return url, procs, None
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            logs = "\n".join((work / f).read_text(errors="replace")[-2000:] for f in os.listdir(work) if f.endswith(".log"))
            return url, procs, f"last status {st}\n{logs}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import pyspark

    from rmqstore_cli.spark.session import log4j_config_path

    home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(home, "bin", "spark-class")
    # The master's REST submission server listens on a fixed port (6066) that another Spark on a shared
    # CI machine may hold; these tests do not submit through it.
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
               SPARK_DAEMON_JAVA_OPTS=f"-Dlog4j.configurationFile=file:{log4j_config_path()} -XX:+UseSerialGC")
    # A busy machine can take a port between choosing it and the JVM binding it: then the daemon moves to
    # another port (or fails) and we start again on fresh ports, up to three times.
    failures = []
    procs: list = []
    try:
        for attempt in range(3):
            work = tmp_path_factory.mktemp(f"spark-cluster{attempt}")
            env.update(SPARK_WORKER_DIR=str(work), SPARK_LOG_DIR=str(work))
            url, procs, why = _start_cluster(spark_class, env, work)
            if why is None:
                break
            failures.append(why)
            _stop(procs)
            procs = []
        else:
            pytest.fail("standalone cluster did not come up in 3 attempts:\n" + "\n----\n".join(failures))
        yield url
    finally:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
        _stop(procs)


@pytest.fixture(scope="module")
def spark(cluster):
    from rmqstore_cli.spark.session import build_session

    s = build_session(cluster, "rmqstore-cluster-test", fast_jvm=True, driver_memory="1g", executor_memory="1g",
                      conf={"spark.executor.cores": "1", "spark.cores.max": "2", "spark.sql.shuffle.partitions": "2"})
    yield s
    s.stop()


def test_export_on_cluster(spark, tmp_path):
    from rmqstore_cli.spark import jobs

    assert spark.sparkContext.master.startswith("spark://127.0.0.1:")
    names = ["4.9.3-clean", "5.3.3-v2topic"]
    res = jobs.export(spark, [str(shared_store(n)) for n in names], str(tmp_path / "out"), partition_by=["topic"],
                      options={"splitSize": 400_000})
    back = spark.read.parquet(str(tmp_path / "out")).select("store", "commitLogOffset", "storeSize", "topic", "body").collect()
    want = sorted((str(shared_store(n)), b["offset"], b["size"], b["msg"]["topic"], b["msg"]["bodyHex"])
                  for n in names for b in broker_read(n)["clmsg"])
    got = sorted((r["store"], r["commitLogOffset"], r["storeSize"], r["topic"], bytes(r["body"]).hex()) for r in back)
    assert got == want and res["records"] == len(want)
    # The Arrow writer (unpartitioned Parquet): the executors write the part files themselves.
    flat = jobs.export(spark, [str(shared_store(n)) for n in names], str(tmp_path / "flat"),
                       options={"splitSize": 400_000})
    assert flat["writer"] == "arrow" and flat["records"] == len(want) and flat["tasks"] > 2
    back = spark.read.parquet(str(tmp_path / "flat")).select("store", "commitLogOffset", "storeSize", "topic", "body")
    assert sorted((r["store"], r["commitLogOffset"], r["storeSize"], r["topic"], bytes(r["body"]).hex())
                  for r in back.collect()) == want
    assert not (tmp_path / "flat" / "_temporary").exists() and (tmp_path / "flat" / "_SUCCESS").exists()
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
    assert executors >= 3  # the driver plus the two workers' executors


def test_verify_on_cluster(spark, tmp_path):
    from rmqstore_cli.formats import fast
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store
    from rmqstore_cli.spark import jobs

    root = tmp_path / "store"
    shutil.copytree(shared_store("5.3.3-clean"), root)
    for dirpath, _, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    seg = sorted((root / "commitlog").iterdir())[9]
    data = seg.read_bytes()
    h = fast.decode_headers(data, fast.walk(data).offsets[4:5])
    with open(seg, "r+b") as f:
        f.seek(int(h.bodyStart[0]))
        f.write(b"\xff\xfe")
    with Store.open(str(root)) as st:
        single = verify_store(st)
    res = jobs.verify(spark, [str(root)], split=300_000, out=str(tmp_path / "findings"))
    assert res["tasks"] > 1
    want = sorted((f.code, f.path, f.offset, f.message) for f in single.findings)
    got = sorted((r["code"], r["path"], r["offset"], r["message"]) for r in res["findings"])
    assert got == want and "CL_BODY_CRC" in {w[0] for w in want}
    assert res["exitCode"] == 1
    assert {r["code"] for r in spark.read.json(str(tmp_path / "findings")).collect()} == {w[0] for w in want}


def test_rebuild_on_cluster(spark, tmp_path):
    """Consume queues (+ ext) and index files rebuilt through the standalone master equal the broker's."""
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.spark.rebuild import rebuild_consumequeue, rebuild_index

    def files(d):
        return {os.path.relpath(os.path.join(p, f), d): open(os.path.join(p, f), "rb").read()
                for p, _, fs in os.walk(d) for f in fs}

    src = shared_store("4.9.3-ext")
    with Store.open(str(src)) as st:
        rebuild_consumequeue(spark, st, str(tmp_path / "cq"))
        rebuild_index(spark, st, str(tmp_path / "idx"))
    assert files(tmp_path / "cq" / "consumequeue") == files(src / "consumequeue")
    assert files(tmp_path / "cq" / "consumequeue_ext") == files(src / "consumequeue_ext")
    # content-identical, in creation order (the broker names a file by its creation time, we by its first entry's)
    ours, theirs = files(tmp_path / "idx" / "index"), files(src / "index")
    assert [ours[k] for k in sorted(ours)] == [theirs[k] for k in sorted(theirs)]
    assert spark.sparkContext.getConf().get("spark.executor.memory") == "1g"
