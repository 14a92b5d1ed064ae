"""Many queues: the commands an on-call person runs first, on a broker's shape with thousands of queues.

    python -m bench.manyqueues                    # 2048 queues against 16, 1 GiB of 1 KiB messages
    python -m bench.manyqueues --queues 512 --mib 256

The bench's messages (1 KiB bodies, KEYS and UNIQ_KEY on each) in the broker's 1 GiB segments, spread round-robin
over 16 queues (2 topics x 8) and over N (N / 8 topics x 8): the same bytes, the same records, only the number of
queues differs. What a command pays per queue and window (a 1 GiB segment is 16 windows) shows as the difference.
Each store is made once and kept under bench/.cache. Disk: a queue file is the broker's default 6 MB and the
Appender reserves its blocks, so N queues need N x 6 MB (12 GB for 2048).

Prints, per command, the median seconds of ``--repeat`` runs (in turns: 16 queues, N queues, 16, ...), the ratio
and the RssAnon peaks. No target: the rows show whether the per-queue work stays small beside the walk.
"""

from __future__ import annotations

import argparse
import os
import statistics
from contextlib import contextmanager

from bench import gen
from bench.run import CACHE, RMQ, run, warm

QUEUES_PER_TOPIC = 8


@contextmanager
def _spread(topics: int):
    """gen's layout (its TOPICS x QUEUES round-robin) with ``topics`` topics, while a store is written."""
    saved = gen.TOPICS, gen.QUEUES
    gen.TOPICS = tuple(b"BenchTopic%04d" % t for t in range(topics))
    gen.QUEUES = QUEUES_PER_TOPIC
    try:
        yield
    finally:
        gen.TOPICS, gen.QUEUES = saved


def store(queues: int, mib: int) -> tuple[str, str]:
    """(clean store, its crash copy) with ``queues`` queues and ``mib`` MiB of commitlog in one segment."""
    root = os.path.join(CACHE, f"1KiB-{mib}MiB-{queues}q")
    crash = root + "-crash"
    if not os.path.isdir(os.path.join(root, "commitlog")):
        with _spread(max(1, queues // QUEUES_PER_TOPIC)):
            info = gen.generate(root, 1024, total=mib << 20, seg_size=mib << 20)
        print(f"# generated {root}: {info['records']} records")
    if not os.path.exists(os.path.join(crash, "abort")):
        gen.make_crash_copy(root, crash)
    return root, crash


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=2048)
    ap.add_argument("--mib", type=int, default=1024, help="commitlog size (one segment of this size)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    few, many = store(16, args.mib), store(args.queues, args.mib)
    commands = [("verify", lambda s: RMQ + ["verify", s[0]]),
                ("verify -j 2", lambda s: RMQ + ["verify", s[0], "-j", "2"]),
                ("recover --dry-run (crash copy)", lambda s: RMQ + ["recover", s[1], "--dry-run"]),
                ("rebuild all --dry-run", lambda s: RMQ + ["rebuild", "all", s[0], "--dry-run"])]
    print(f"| command ({args.mib} MiB, 1 KiB messages) | 16 queues s | {args.queues} queues s | ratio | "
          f"RssAnon peak MB (16 / {args.queues}) |")
    print("|---|---|---|---|---|")
    for label, cmd in commands:
        got: dict = {16: [], args.queues: []}
        for _ in range(args.repeat):
            for n, s in ((16, few), (args.queues, many)):
                warm(os.path.join(s[0], "commitlog"))  # the queue files: a few written pages in 6 MB reserved
                got[n].append(run(cmd(s)))
        sec = {n: statistics.median(c.seconds for c in runs) for n, runs in got.items()}
        rss = {n: max(c.rss_anon_peak for c in runs) / (1 << 20) for n, runs in got.items()}
        print(f"| {label} | {sec[16]:.2f} | {sec[args.queues]:.2f} | {sec[args.queues] / sec[16]:.2f}x | "
              f"{rss[16]:.0f} / {rss[args.queues]:.0f} |")


if __name__ == "__main__":
    main()
