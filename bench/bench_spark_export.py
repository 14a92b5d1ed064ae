"""Benchmark: ``spark export`` (local[2], Parquet) vs the single-process reader on the same store.

    .venv/bin/python bench/bench_spark_export.py [--gib 1.05] [--dir DIR] [--keep] [--master local[2]]
        [--writer auto|arrow|spark] [--compression snappy|zstd|gzip|lz4|none] [--no-reader]

``--dir DIR`` with an existing ``DIR/store`` (e.g. a copy of bench/.cache/v3/1KiB) reuses that store.

The store is generated with the engine's own appender (``rmqstore_cli.engine.log.appender.Appender``,
broker geometry: 1 GiB commitlog files, so the data spans two segments and the first one is
split into 64 MiB tasks). 1000 distinct messages (4 topics x 8 queues, bodies 200-2000 B,
TAGS/KEYS/UNIQ_KEY) are appended round-robin until the commitlog holds ``--gib`` GiB.
The files are read once before timing (the page cache does not reliably stay warm here).

Printed figures, all in MB/s of commitlog bytes:
  reader scan     CommitLog.scan with body CRC (numpy header columns, one process)
  reader records  CommitLog.records: every record decoded to a dict with body (one process)
  spark export    rmqstore spark export --format parquet with local[2] (includes Parquet write),
                  after the session start and a warm-up query, which are printed apart (fixed costs)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rmqstore_cli.engine.log.appender import Appender  # noqa: E402
from rmqstore_cli.engine.config.storeconfig import StoreConfig  # noqa: E402
from rmqstore_cli.engine.log.messages import MessageBuilder  # noqa: E402
from rmqstore_cli.engine.store import Store  # noqa: E402


def generate(root: str, target: int) -> int:
    cfg = StoreConfig(version=4)
    builder = MessageBuilder(cfg, cluster="DefaultCluster")
    msgs = []
    for i in range(1000):
        size = 200 + (i * 37) % 1800
        body = (f"payload-{i}-".encode() * (size // 10 + 1))[:size]
        msgs.append(builder.from_options(topic=f"BenchTopic{i % 4}", queue_id=(i // 4) % 8, body=body, tags=f"Tag{i % 5}",
                                         keys=f"order-{i} customer-{i % 97}", born_host="10.0.0.7:51234",
                                         store_host="10.0.0.1:10911"))
    written = 0
    with Appender(root, cfg) as app:
        while written < target:
            for m in msgs:
                for r in app.put([m]):
                    written += r.size
    return written


def warm(root: str) -> int:
    total = 0
    d = os.path.join(root, "commitlog")
    for n in sorted(os.listdir(d)):
        with open(os.path.join(d, n), "rb") as f:
            while chunk := f.read(64 << 20):
                total += len(chunk)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.05)
    ap.add_argument("--dir", default=None, help="where the store is generated (kept and reused if it exists)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--writer", default="auto", help="jobs.export writer: auto|arrow|spark")
    ap.add_argument("--compression", default=None, help="Parquet codec (default: the export's default)")
    ap.add_argument("--no-reader", action="store_true", help="skip the single-process reader figures")
    args = ap.parse_args()

    base = args.dir or tempfile.mkdtemp(prefix="bench-spark-")
    root = os.path.join(base, "store")
    if not os.path.isdir(os.path.join(root, "commitlog")):
        t = time.perf_counter()
        n = generate(root, int(args.gib * (1 << 30)))
        print(f"generated     {n / 2**30:.2f} GiB of records with the appender in {time.perf_counter() - t:.1f} s")
    try:
        warm(root)
        with Store.open(root) as st:
            t = time.perf_counter()
            records = nbytes = 0
            for chunk in st.commitlog.scan(check_crc=True):
                records += len(chunk.headers)
                nbytes += int(chunk.headers.totalSize.sum())
            scan_s = time.perf_counter() - t
            print(f"store         {records:,} records, {nbytes / 1e6:,.0f} MB of records")
            print(f"reader scan     {nbytes / scan_s / 1e6:8.1f} MB/s  ({scan_s:.1f} s, 1 process)")
            if not args.no_reader:
                t = time.perf_counter()
                n2 = sum(1 for _ in st.commitlog.records(check_crc=True, with_body=True))
                rec_s = time.perf_counter() - t
                assert n2 == records
                print(f"reader records  {nbytes / rec_s / 1e6:8.1f} MB/s  ({rec_s:.1f} s, 1 process)")

        from rmqstore_cli.spark import jobs
        from rmqstore_cli.spark.session import build_session

        t = time.perf_counter()
        spark = build_session(args.master, "rmqstore-bench", driver_memory="4g")
        start_s = time.perf_counter() - t
        t = time.perf_counter()
        spark.read.format("rocketmq").option("body", "false").load(root).limit(1).collect()  # JVM + worker warm-up
        warm_s = time.perf_counter() - t
        print(f"spark start     {start_s:8.1f} s session, {warm_s:.1f} s first query (fixed costs, not in the figure below)")
        out = os.path.join(base, "export")
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        res = jobs.export(spark, [root], out, fmt="parquet", writer=args.writer, compression=args.compression)
        sp_s = time.perf_counter() - t
        assert res["records"] == records, res
        print(f"spark export    {nbytes / sp_s / 1e6:8.1f} MB/s  ({sp_s:.1f} s, {args.master}, Parquet, "
              f"writer {res['writer']}, {res['tasks'] or 'planned'} tasks)")
        spark.stop()
        shutil.rmtree(out, ignore_errors=True)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
