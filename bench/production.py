"""The production-shape rows: 8 GiB of 1 KiB messages in the broker's 1 GiB segments (the incident host in miniature).

    ./.venv/bin/python -m bench.run --only production

verify, recover of a crash copy (abort present, checkpoint at the start: the whole log is walked) and rebuild all,
each at ``-j 1`` and ``-j 2``, the two in turns (-j 1, -j 2, -j 1, ...: the ratio compares runs made at the same
time), with the fixed start measured on the demo store so that the rates and the ``-j`` ratio are also given net of
it; and ``spark export`` local[2] on the same store, large enough
that the JVM's start is not the figure. Every row keeps the RssAnon peak of the main process and, separately, the
highest of any one ``-j`` worker (bench/memory.py). A command without ``-j`` gets a "not available" row for ``-j 2``,
which fails its target: nothing is estimated.
"""

from __future__ import annotations

import os
import shutil

PRODUCTION_STORE = "1KiB-8GiB-1Gseg"
PRODUCTION_LAYOUT = {PRODUCTION_STORE: (1024, 8 << 30, 1 << 30)}  # body, commitlog bytes, segment size
JOBS = (1, 2)
# seconds of timed runs per row a round of the -j 1 / -j 2 pair may take and still be repeated: at 8 GiB a round of
# recover took 20 + 13 s on this host at its slowest, so the pair still gets its three rounds (one run each was too
# few here: docs/benchmarks.md)
PAIR_BUDGET = 45


def row_name(command: str, jobs: int) -> str:
    return f"{command} -j {jobs} (8 GiB)"


def production_suite(b, info: dict) -> None:
    """Adds the rows to ``b`` (a bench.run.Bench)."""
    from bench.run import (FIXTURE, RMQ, WORK, crash_copy, fresh_copy, has_command, tiny_copy, warm, _rm)

    root, records, nbytes = info["root"], info["records"], info["bytes"]

    def jflag(command: str, jobs: int) -> list[str] | None:
        """``-j N`` for the command, [] when it has no such option and N is 1, None when it cannot run N."""
        if has_command(*command.split(), option="--jobs"):
            return ["-j", str(jobs)]
        return [] if jobs == 1 else None

    side = []  # the -j 1 and -j 2 rows of a command run in turns (Bench.measure_side_by_side)
    for jobs in JOBS:
        j = jflag("verify", jobs)
        if j is None:
            b.unavailable(row_name("verify", jobs), PRODUCTION_STORE, "`rmqstore verify` has no -j/--jobs")
        else:
            side.append(dict(name=row_name("verify", jobs), store_name=PRODUCTION_STORE, records=records, nbytes=nbytes,
                             cmd_for=RMQ + ["verify", root, "--json"] + j, start=RMQ + ["verify", FIXTURE, "--json"] + j))
    warm(root)
    b.measure_side_by_side(side, budget=PAIR_BUDGET)
    crash = crash_copy(PRODUCTION_STORE, info)

    def fresh_crash(dest):  # recover works on a copy of the crash copy, its last segment and derived files real
        fresh_copy(crash, dest, real_last=True, copy=("consumequeue", "index"))
        warm(dest)

    def fresh_store(dest):  # rebuild works on a copy whose commitlog is hard-linked (it never writes it)
        fresh_copy(root, dest)
        warm(root)

    # (row, command words, how the 8 GiB copy is made, the same command's demo-store copy)
    writing = (("recover (crash)", ["recover"], fresh_crash, lambda tiny: tiny_copy(tiny, crash=True)),
               ("rebuild all", ["rebuild", "all"], fresh_store, tiny_copy))
    for label, words, fresh, tiny_of in writing:
        side = []
        for jobs in JOBS:
            j = jflag(words[0], jobs)
            name = row_name(label, jobs)
            if j is None:
                b.unavailable(name, PRODUCTION_STORE, f"`rmqstore {words[0]}` has no -j/--jobs")
                continue
            dest = os.path.join(WORK, f"{words[0]}-8g")
            tiny = os.path.join(WORK, f"{words[0]}-tiny")

            def prepare(dest=dest, j=j, fresh=fresh, words=words):
                _rm(dest + ".bak")
                fresh(dest)
                return RMQ + words + [dest, "--backup-dir", dest + ".bak"] + j

            side.append(dict(name=name, store_name=PRODUCTION_STORE, cmd_for=None, records=records, nbytes=nbytes,
                             prepare=prepare, cleanup=lambda dest=dest: (_rm(dest), _rm(dest + ".bak")),
                             start=lambda j=j, words=words, tiny=tiny, tiny_of=tiny_of:
                             RMQ + words + [tiny_of(tiny), "--backup-dir", tiny + ".bak"] + j))
        b.measure_side_by_side(side, budget=PAIR_BUDGET)
    if has_command("spark", "export"):
        dest = os.path.join(WORK, "spark-export-8g")

        def prep_spark():
            shutil.rmtree(dest, ignore_errors=True)
            warm(root)
            return RMQ + ["spark", "export", root, "--to", dest]

        b.measure("spark export local[2] (8 GiB)", PRODUCTION_STORE, info, None, records, nbytes, prepare=prep_spark,
                  cleanup=lambda: shutil.rmtree(dest, ignore_errors=True),
                  start=lambda: (shutil.rmtree(dest, ignore_errors=True), RMQ + ["spark", "export", FIXTURE, "--to", dest])[1])
        shutil.rmtree(dest, ignore_errors=True)
    else:
        b.unavailable("spark export local[2] (8 GiB)", PRODUCTION_STORE, "no `rmqstore spark export`")
