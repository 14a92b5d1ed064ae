"""Benchmark: append N messages of 1 KiB with dispatch to consume queues and index.

    .venv/bin/python bench/bench_append.py [N] [--body-size 1024] [--queues 8] [--dir DIR] [--batch 1]

Messages are validated and built first (timed separately: "build"), then appended through
``Appender.put`` (commitlog through mmap, consume queue units, UNIQ_KEY + one KEYS entry per
message in the index, checkpoint) and flushed with fsync at the end ("append", the figure
that counts).  Default geometry is the broker's (1 GiB commitlog files, 6 MB consume queue
files, 5M-slot index files).
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("count", nargs="?", type=int, default=1_000_000)
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1, help="messages per put (classic batch if > 1)")
    ap.add_argument("--version", type=int, default=5, choices=(4, 5))
    ap.add_argument("--dir", default=None, help="store directory (default: a temporary one, removed after)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    base = args.dir or tempfile.mkdtemp(prefix="bench-append-")
    root = os.path.join(base, "store")
    shutil.rmtree(root, ignore_errors=True)
    cfg = StoreConfig(version=args.version)
    builder = MessageBuilder(cfg, cluster="DefaultCluster")
    body = (b"0123456789abcdef" * (args.body_size // 16 + 1))[: args.body_size]

    t0 = time.perf_counter()
    template = builder.from_options(topic="BenchTopic", body=body, tags="TagA", keys="k", born_host="10.0.0.1:5000",
                                    store_host="10.0.0.2:10911")
    # Per-message keys differ (UNIQ_KEY, KEYS): rebuild the property bytes cheaply from the template.
    msgs = []
    for i in range(args.count):
        m = builder.from_options(topic="BenchTopic", queue_id=i % args.queues, body=body, tags="TagA",
                                 keys=f"order-{i}", born_host="10.0.0.1:5000", store_host="10.0.0.2:10911",
                                 born_timestamp=template.born_timestamp) if i < 1000 else None
        if m is None:
            prev = msgs[i % 1000]
            uniq = "%032X" % i
            props = dict(prev.props_map)
            props["KEYS"] = f"order-{i}"
            props["UNIQ_KEY"] = uniq
            raw = prev.props_b.replace(prev.props_map["KEYS"].encode(), props["KEYS"].encode()).replace(
                prev.props_map["UNIQ_KEY"].encode(), uniq.encode())
            m = type(prev)(prev.topic, prev.topic_b, prev.queue_id, prev.flag, prev.sysflag, prev.born_timestamp,
                           prev.born_host, prev.store_host, prev.reconsume_times, prev.prepared_offset, prev.body,
                           raw, prev.crc_prop, prev.magic, None, props,
                           prev.total_size - len(prev.props_b) + len(raw))
        msgs.append(m)
    t1 = time.perf_counter()

    nbytes = 0
    with Appender(root, cfg) as app:
        t2 = time.perf_counter()
        c2 = time.process_time()
        step = args.batch
        for i in range(0, len(msgs), step):
            group = msgs[i : i + step]
            for r in app.put(group):
                nbytes += r.size
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    cpu = time.process_time() - c2
    elapsed = t4 - t2
    print(f"messages      {args.count}  ({args.body_size} B bodies, {args.queues} queues, batch {args.batch}, "
          f"{args.version}.x)")
    print(f"build         {t1 - t0:8.2f} s")
    print(f"append+dispatch {t3 - t2:6.2f} s, flush/fsync/close {t4 - t3:.2f} s")
    print(f"throughput    {args.count / elapsed:,.0f} msg/s   {nbytes / elapsed / 1e6:,.1f} MB/s  (commitlog bytes)")
    # The machines are shared: CPU time shows what one uncontended core would do.
    print(f"cpu           {cpu:8.2f} s  -> {args.count / cpu:,.0f} msg/s   {nbytes / cpu / 1e6:,.1f} MB/s per CPU second")
    if not args.keep and args.dir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
