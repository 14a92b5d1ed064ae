"""Issue #6 benchmark harness: fixed synthetic stores, every workload, targets pass/fail.

    ./.venv/bin/python -m bench.run [--repeat 3] [--only verify,dump] [--json-out FILE]

Stores (1 GiB commitlog, 64 MiB segments, 100 B / 1 KiB / 4 KiB bodies, 2 topics x 8 queues,
keys on every message, default index geometry) are generated once into bench/.cache/ (see
bench/gen.py). Each workload runs as its own process (the real CLI where one exists) after the
files were read once (warm page cache); we report the median wall time of ``--repeat`` runs as
MB/s and msg/s, and the largest peak RSS of the runs. A workload whose command does not exist
prints "not available"; nothing is estimated.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from bench import gen

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "bench", ".cache", f"v{gen.VERSION}")
WORK = os.path.join(ROOT, "bench", ".cache", "work")
RMQ = [sys.executable, "-m", "rmqstore_cli"]
MB = 1e6
DUMP_RECORDS = 200_000
SLOW_BUDGET = 60  # seconds: a workload is not repeated when the repeats would take longer than this


def store(name: str) -> str:
    path = os.path.join(CACHE, name)
    meta = path + ".json"
    if not os.path.exists(meta):
        _drop_stale_caches()
        t, c = time.perf_counter(), time.process_time()
        info = gen.generate(path, gen.BODY_SIZES[name])
        info["generate_seconds"] = round(time.perf_counter() - t, 1)
        info["generate_cpu_seconds"] = round(time.process_time() - c, 1)
        with open(meta, "w") as f:
            json.dump(info, f)
        print(f"# generated {name}: {info}", file=sys.stderr)
    with open(meta) as f:
        info = json.load(f)
    info["root"] = path
    return info


def _drop_stale_caches() -> None:
    """Stores of an older ``gen.VERSION`` are never read again (they hold ~4 GB each), and the
    work files (the append input dumped from the old 1 KiB store) were derived from them."""
    top = os.path.dirname(CACHE)
    stale = [n for n in (os.listdir(top) if os.path.isdir(top) else ())
             if n.startswith("v") and n[1:].isdigit() and os.path.join(top, n) != CACHE]
    for name in stale:
        shutil.rmtree(os.path.join(top, name), ignore_errors=True)
    if stale:
        shutil.rmtree(WORK, ignore_errors=True)
        os.makedirs(WORK)


def warm(root: str) -> None:
    """Read every file once: the page cache does not reliably stay warm between runs here."""
    buf = bytearray(8 << 20)
    paths = [root] if os.path.isfile(root) else [os.path.join(dp, n) for dp, _, fn in os.walk(root) for n in fn]
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def run(cmd: list[str], stdout=subprocess.DEVNULL, ok=(0, 1)) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one child process."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, cwd=ROOT)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {err.decode(errors='replace')[-500:]}")
    return dt, usage.ru_maxrss * 1024


def has_command(*words: str, option: str | None = None) -> bool:
    p = subprocess.run(RMQ + list(words) + ["--help"], capture_output=True, text=True, cwd=ROOT)
    return p.returncode == 0 and (option is None or option in p.stdout)


def fresh_copy(src: str, dest: str, parts=("commitlog", "config"), real_last=False, copy=()) -> str:
    """Commitlog hard-linked (read-only use), checkpoint copied, ``copy`` dirs copied for real."""
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for part in parts:
        s = os.path.join(src, part)
        if os.path.isdir(s):
            os.makedirs(os.path.join(dest, part))
            names = sorted(os.listdir(s))
            for i, n in enumerate(names):
                if real_last and i == len(names) - 1:
                    shutil.copy2(os.path.join(s, n), os.path.join(dest, part, n))
                else:
                    os.link(os.path.join(s, n), os.path.join(dest, part, n))
    for part in copy:
        subprocess.run(["cp", "-a", "--sparse=always", os.path.join(src, part), os.path.join(dest, part)], check=True)
    for f in ("checkpoint", "abort"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy2(os.path.join(src, f), os.path.join(dest, f))
    return dest


class Bench:
    def __init__(self, repeat: int):
        self.repeat = repeat
        self.results: list[dict] = []

    def measure(self, name: str, store_name: str, info: dict, cmd_for, records: int, nbytes: int, prepare=None):
        try:
            return self._measure(name, store_name, cmd_for, records, nbytes, prepare)
        except Exception as e:  # a failing command is reported, never hidden or estimated
            self.results.append({"workload": name, "store": store_name, "failed": str(e)[:300]})
            print(f"# {name} {store_name}: FAILED {e}", file=sys.stderr)

    def _measure(self, name, store_name, cmd_for, records, nbytes, prepare):
        times, rss = [], 0
        for k in range(self.repeat):
            cmd = prepare() if prepare else cmd_for
            dt, r = run(cmd)
            times.append(dt)
            rss = max(rss, r)
            if dt * (self.repeat - k - 1) > SLOW_BUDGET:  # keep the whole run under ~15 minutes
                break
        med = statistics.median(times)
        row = {"workload": name, "store": store_name, "seconds": round(med, 3), "runs": [round(t, 3) for t in times],
               "MB_s": round(nbytes / med / MB, 1), "msg_s": round(records / med), "peak_rss_MB": round(rss / MB, 1)}
        self.results.append(row)
        print(f"# {name} {store_name}: {row['MB_s']} MB/s {row['msg_s']} msg/s rss {row['peak_rss_MB']} MB", file=sys.stderr)
        return row

    def unavailable(self, name: str, store_name: str, why: str):
        self.results.append({"workload": name, "store": store_name, "not_available": why})
        print(f"# {name} {store_name}: not available ({why})", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated workloads (kernel,scan,verify,verify-j2,dump,rebuild,rebuild-j2,"
                                               "recover,index-query,append,spark-export)")
    ap.add_argument("--json-out", default=os.path.join(ROOT, "bench", "results", "latest.json"))
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    want = lambda w: not only or w in only  # noqa: E731
    os.makedirs(WORK, exist_ok=True)
    b = Bench(args.repeat)
    infos = {n: store(n) for n in gen.BODY_SIZES}
    k1 = infos["1KiB"]
    py = sys.executable

    if want("kernel"):
        for n in ("100B", "1KiB"):
            info = infos[n]
            warm(info["root"])
            name = "commitlog kernel (walk+CRC)"
            try:  # timed inside the process: the kernel alone, against the issue #11 targets
                out = subprocess.run([py, "-m", "bench.kernel", info["root"], "--repeat", str(max(args.repeat, 3))],
                                     capture_output=True, text=True, cwd=ROOT, check=True)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row.update(workload=name, store=n)
                b.results.append(row)
                print(f"# {name} {n}: {row['MB_s']} MB/s {row['msg_s']} msg/s (per CPU second: {row['cpu_MB_s']} MB/s "
                      f"{row['cpu_msg_s']} msg/s)", file=sys.stderr)
            except (subprocess.CalledProcessError, ValueError, KeyError) as e:
                b.results.append({"workload": name, "store": n, "failed": str(e)[:300]})
    if want("scan"):
        for n, info in infos.items():
            warm(info["root"])
            b.measure("commitlog scan (walk+CRC)", n, info, [py, "-m", "bench.scan", info["root"]], info["records"], info["bytes"])
    if want("verify"):
        if has_command("verify"):
            for n, info in infos.items():
                warm(info["root"])
                b.measure("verify", n, info, RMQ + ["verify", info["root"], "--json"], info["records"], info["bytes"])
        else:
            b.unavailable("verify", "*", "no `rmqstore verify`")
    if want("verify-j2"):
        if has_command("verify", option="--jobs"):
            warm(k1["root"])
            b.measure("verify -j 2", "1KiB", k1, RMQ + ["verify", k1["root"], "--json", "-j", "2"], k1["records"], k1["bytes"])
        else:
            b.unavailable("verify -j 2", "1KiB", "`rmqstore verify` has no -j/--jobs")
    if want("dump"):
        warm(k1["root"])
        # msg/s is the target: the first DUMP_RECORDS records keep a slow dump inside the time budget
        count = min(DUMP_RECORDS, k1["records"])
        b.measure("dump commitlog --json", "1KiB", k1, RMQ + ["dump", "commitlog", k1["root"], "--json", "--limit", str(count)],
                  count, count * k1["record_size"])
    for label, jobs in (("rebuild", None), ("rebuild-j2", 2)):
        if not want(label):
            continue
        name = "rebuild all" + (" -j 2" if jobs else "")
        if not has_command("rebuild") or (jobs and not has_command("rebuild", option="--jobs")):
            b.unavailable(name, "1KiB", "no `rmqstore rebuild`" + (" -j/--jobs" if jobs else ""))
            continue
        dest = os.path.join(WORK, "rebuild")

        def prep(dest=dest, jobs=jobs):
            _rm(dest + ".bak")
            fresh_copy(k1["root"], dest)
            return RMQ + ["rebuild", "all", dest, "--backup-dir", dest + ".bak"] + (["-j", str(jobs)] if jobs else [])

        warm(k1["root"])
        b.measure(name, "1KiB", k1, None, k1["records"], k1["bytes"], prepare=prep)
    if want("recover"):
        if has_command("recover"):
            crash = os.path.join(CACHE, "1KiB-crash")
            if not os.path.exists(os.path.join(crash, "abort")):
                gen.make_crash_copy(k1["root"], crash)
            dest = os.path.join(WORK, "recover")

            def prep_recover():
                _rm(dest + ".bak")
                fresh_copy(crash, dest, real_last=True, copy=("consumequeue", "index"))
                warm(dest)
                return RMQ + ["recover", dest, "--backup-dir", dest + ".bak"]

            b.measure("recover (crash)", "1KiB", k1, None, k1["records"], k1["bytes"], prepare=prep_recover)
        else:
            b.unavailable("recover (crash)", "1KiB", "no `rmqstore recover`")
    if want("index-query"):
        warm(os.path.join(k1["root"], "index"))
        out = subprocess.run([py, "-m", "bench.index_query", k1["root"], str(k1["records"])], capture_output=True,
                             text=True, cwd=ROOT, check=True)
        row = json.loads(out.stdout)
        row.update(workload="index query", store="1KiB")
        b.results.append(row)
        print(f"# index query: {row}", file=sys.stderr)
    if want("append"):
        if has_command("append", option="--from"):
            src = os.path.join(WORK, "append-input.jsonl")
            count = 100_000
            if not os.path.exists(src):
                with open(src + ".tmp", "wb") as f:
                    run(RMQ + ["dump", "commitlog", k1["root"], "--json", "--body", "base64", "--limit", str(count)], stdout=f)
                os.rename(src + ".tmp", src)
            dest = os.path.join(WORK, "append")

            def prep_append():
                shutil.rmtree(dest, ignore_errors=True)
                warm(src)
                return RMQ + ["append", dest, "--from", src, "--commitlog-file-size", str(gen.SEGMENT_SIZE)]

            b.measure("append --from (dispatch)", "1KiB", k1, None, count, count * k1["record_size"], prepare=prep_append)
        else:
            b.unavailable("append --from", "1KiB", "no `rmqstore append --from`")
    if want("spark-export"):
        if has_command("spark", "export"):
            dest = os.path.join(WORK, "spark-export")

            def prep_spark():
                shutil.rmtree(dest, ignore_errors=True)
                return RMQ + ["spark", "export", k1["root"], "--to", dest]

            warm(k1["root"])
            b.measure("spark export local[2]", "1KiB", k1, None, k1["records"], k1["bytes"], prepare=prep_spark)
            shutil.rmtree(dest, ignore_errors=True)
        else:
            b.unavailable("spark export", "1KiB", "no `rmqstore spark export`")

    from bench.targets import evaluate, render

    rows = evaluate(b.results)
    print(render(b.results, rows))
    report = {"machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()}, "results": b.results, "targets": rows}
    os.makedirs(os.path.dirname(args.json_out), exist_ok=True)
    with open(args.json_out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report))


def _rm(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
