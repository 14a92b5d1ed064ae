"""The benchmark harness: fixed synthetic stores, every workload, targets pass/fail, memory.

    ./.venv/bin/python -m bench.run [--repeat 3] [--only verify,dump,memory] [--timeout 300] [--json-out FILE]

Stores (1 GiB commitlog, 64 MiB segments, 100 B / 1 KiB / 4 KiB bodies, 2 topics x 8 queues,
keys on every message, default index geometry; plus, for the memory rows, 1 GiB and 4 GiB of
100 B messages in the broker's default 1 GiB segments) are generated once into bench/.cache/
(see bench/gen.py). Each workload runs as its
own process (the real CLI where one exists) after the files were read once (warm page cache); we
report the median wall time of ``--repeat`` runs as MB/s and msg/s, and the sampled RssAnon peak
of the child (bench/memory.py; ru_maxrss only as information: it counts mapped file pages).
The memory rows run verify, recover --dry-run (crash and normal shutdown), rebuild all,
salvage --jsonl, stats and dump --json once each on the 1 GiB and the 4 GiB store of 100 B
messages in 1 GiB segments. A run longer than ``--timeout``
seconds is killed and reported "timed out after N s" (a FAIL); a workload whose command does not
exist prints "not available"; nothing is estimated.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench import gen
from bench.memory import run_sampled

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "bench", ".cache", f"v{gen.VERSION}")
WORK = os.path.join(ROOT, "bench", ".cache", "work")
RMQ = [sys.executable, "-m", "rmqstore_cli"]
MB = 1e6
DUMP_RECORDS = 200_000
SLOW_BUDGET = 20  # seconds: a workload is not repeated when the repeats would take longer than this
TIMEOUT = 300  # seconds per child run (--timeout): longer runs are killed and reported as FAILED
KILL_ABOVE_MB = 8000  # a child whose RssAnon passes this is killed (shared machine; reported as FAILED)
SALVAGE_RECORDS = 1_000_000  # memory rows: salvage --jsonl of this prefix (a multiple of 64: whole store ms)
SALVAGE_ROW = f"salvage --jsonl (first {SALVAGE_RECORDS:,} records)"


def _cached(path: str, label: str, make) -> dict:
    """The store at ``path``, made once by ``make(path)`` (its summary, with the wall and CPU seconds it took,
    kept in ``path.json``); the summary with ``root``."""
    meta = path + ".json"
    if not os.path.exists(meta):
        t, c = time.perf_counter(), time.process_time()
        info = make(path)
        info["generate_seconds"] = round(time.perf_counter() - t, 1)
        info["generate_cpu_seconds"] = round(time.process_time() - c, 1)
        with open(meta, "w") as f:
            json.dump(info, f)
        print(f"# generated {label}: {info}", file=sys.stderr)
    with open(meta) as f:
        info = json.load(f)
    info["root"] = path
    return info


def store(name: str) -> dict:
    path = os.path.join(CACHE, name)
    if not os.path.exists(path + ".json"):
        _drop_stale_caches()

    def make(path):
        from bench.production import PRODUCTION_LAYOUT

        layouts = {**gen.MEMORY_STORES_LAYOUT, **PRODUCTION_LAYOUT}
        if name in gen.TEXT_STORES:
            body, text = gen.TEXT_STORES[name]
            return gen.generate(path, body, text=text)
        body, total, seg = layouts.get(name, (gen.BODY_SIZES.get(name), gen.TOTAL_SIZE, gen.SEGMENT_SIZE))
        return gen.generate(path, body, total, seg)

    return _cached(path, name, make)


def dledger_store(name: str, info: dict) -> dict:
    """The DLedger store of the same messages as classic store ``name`` (bench/gendledger.py), cached beside it."""
    from bench import gendledger

    path = os.path.join(os.path.dirname(info["root"]), name + "-dledger")
    return _cached(path, name + "-dledger", lambda path: gendledger.convert(info["root"], path))


DLEDGER_ROW = "verify (DLedger)"
DLEDGER_BESIDE = "verify (classic, beside DLedger)"


def dledger_rows(b: "Bench", name: str, info: dict) -> None:
    """``verify`` on the DLedger store of the same messages as ``name``, and ``verify`` on the classic one, the two
    in turns (Bench.measure_side_by_side). Both rates count the same bytes, the classic records' (the entry headers
    are the DLedger log's own overhead), so their ratio is the inverse ratio of the wall times."""
    d = dledger_store(name, info)
    warm(info["root"])
    warm(d["root"])
    b.measure_side_by_side([dict(name=DLEDGER_BESIDE, store_name=name, cmd_for=RMQ + ["verify", info["root"], "--json"],
                                 records=info["records"], nbytes=info["bytes"]),
                            dict(name=DLEDGER_ROW, store_name=name, cmd_for=RMQ + ["verify", d["root"], "--json"],
                                 records=info["records"], nbytes=info["bytes"])])


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


class RunFailed(RuntimeError):
    def __init__(self, msg: str, child=None, short: str | None = None):
        super().__init__(msg)
        self.child = child
        self.short = short or msg  # without the command line: for table cells


def run(cmd: list[str], stdout=subprocess.DEVNULL, ok=(0, 1), timeout: float | None = None):
    """One child process, measured (bench.memory.ChildRun); RunFailed on a bad exit or a timeout.

    The page cache's dirty pages are written out first (``sync``, untimed): a writing row's copy of the store (the
    crash copy's real last segment, its consume queues and index: ~1.6 GB at 8 GiB) and the previous run's writes
    were otherwise still being written back when the command started, and its first fsync waited for them (1.4 s
    of `recover -j 2`'s 12.5 s on the 8 GiB copy, ~0.5 s of the 1 GiB copy's, measured 2026-11-28). A broker's
    store after a crash holds no dirty pages of a copy made seconds before."""
    timeout = TIMEOUT if timeout is None else timeout
    os.sync()
    c = run_sampled(cmd, stdout=stdout, cwd=ROOT, timeout=timeout, kill_above=KILL_ABOVE_MB * MB)
    if c.timed_out:
        raise RunFailed(f"timed out after {timeout:g} s", c)
    if c.killed_rss:
        raise RunFailed(f"killed at RssAnon > {KILL_ABOVE_MB} MB", c)
    if c.returncode not in ok:
        tail = c.stderr.decode(errors="replace").strip()[-500:]
        raise RunFailed(f"{' '.join(cmd)} exited {c.returncode}: {tail}", c, f"exited {c.returncode}: {tail[-120:]}")
    return c


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
        self.memory: list[dict] = []

    def measure(self, name: str, store_name: str, info: dict, cmd_for, records: int, nbytes: int, prepare=None,
                cleanup=None, start=None):
        """``start``: the same command on the tiny fixture store (a list, or a callable that prepares and
        returns one). Its median is the command's fixed cost (interpreter, imports, numba, opening a store),
        shown beside the figure with the rate net of it: information on where the time goes, not a target."""
        return self.measure_side_by_side([dict(name=name, store_name=store_name, cmd_for=cmd_for, records=records,
                                               nbytes=nbytes, prepare=prepare, cleanup=cleanup, start=start)])[0]

    def measure_side_by_side(self, variants: list[dict], budget: float = SLOW_BUDGET) -> list:
        """Rows measured in turns: run 1 of each variant, then run 2 of each, ..., and their fixed starts the same
        way. For the rows a ratio target compares (-j 2 against -j 1, DLedger against classic): the speed of this
        shared host drifts by up to 2x over minutes, and rows measured one after the other would compare two
        hosts. Each variant has :meth:`measure`'s arguments (``name``, ``store_name``, ``cmd_for``, ``records``,
        ``nbytes``, ``prepare``, ``cleanup``, ``start``); ``budget``: seconds of timed runs a round may take and
        still be repeated. Returns the rows (None for a variant that failed, reported as failed)."""
        times: list[list] = [[] for _ in variants]
        peaks = [[0, 0, 0, 0, 0] for _ in variants]  # anon, maxrss, worker, workers, jvm
        failed: list = [None] * len(variants)
        for k in range(self.repeat):
            took = 0.0
            for i, v in enumerate(variants):
                if failed[i] is not None:
                    continue
                try:
                    cmd = v["prepare"]() if v.get("prepare") else v["cmd_for"]
                    try:
                        c = run(cmd)
                    finally:
                        if v.get("cleanup"):
                            v["cleanup"]()
                except Exception as e:  # a failing command is reported, never hidden or estimated
                    failed[i] = e
                    continue
                times[i].append(c.seconds)
                took += c.seconds
                pk = peaks[i]
                pk[:] = [max(pk[0], c.rss_anon_peak), max(pk[1], c.ru_maxrss), max(pk[2], c.worker_rss_anon_peak),
                         max(pk[3], c.workers_seen), max(pk[4], c.jvm_rss_anon_peak)]
            if took * (self.repeat - k - 1) > budget * len(variants):  # keep the whole run under 20 minutes
                break
        rows = []
        for v, t, pk, e in zip(variants, times, peaks, failed):
            if e is not None or not t:
                self.results.append({"workload": v["name"], "store": v["store_name"], "failed": str(e)[:300]})
                print(f"# {v['name']} {v['store_name']}: FAILED {e}", file=sys.stderr)
                rows.append(None)
                continue
            rows.append(self._row(v["name"], v["store_name"], t, pk, v["records"], v["nbytes"]))
        starts = [[] for _ in variants]
        for _ in range(CLI_START_RUNS):
            for i, v in enumerate(variants):
                if rows[i] is None or v.get("start") is None or rows[i].get("start_failed"):
                    continue
                try:
                    st = v["start"]
                    starts[i].append(run(st() if callable(st) else st).seconds)
                except Exception as e:  # noqa: BLE001 -- the main figure stands; the split is reported missing
                    rows[i]["start_failed"] = str(e)[:200]
        for i, v in enumerate(variants):
            row = rows[i]
            if row is None or v.get("start") is None:
                continue
            if starts[i] and not row.get("start_failed"):
                add_start_cost(row, starts[i], v["records"], v["nbytes"])
            print(f"# {v['name']} {v['store_name']}: fixed start {row.get('start_seconds')} s, net of it "
                  f"{row.get('net_MB_s')} MB/s {row.get('net_msg_s')} msg/s", file=sys.stderr)
        return rows

    def _row(self, name, store_name, times, peaks, records, nbytes) -> dict:
        anon, maxrss, worker, workers, jvm = peaks
        med = statistics.median(times)
        row = {"workload": name, "store": store_name, "seconds": round(med, 3), "runs": [round(t, 3) for t in times],
               "MB_s": round(nbytes / med / MB, 1), "msg_s": round(records / med),
               "rss_anon_MB": round(anon / MB, 1), "maxrss_MB": round(maxrss / MB, 1)}
        if workers:  # -j workers (or any child process): the highest RssAnon of any one of them
            row.update(worker_rss_anon_MB=round(worker / MB, 1), workers=workers)
        if jvm:  # Spark's JVM, apart: its heap is Spark's own setting (--driver-memory), not rmqstore's memory
            row.update(jvm_rss_anon_MB=round(jvm / MB, 1))
        self.results.append(row)
        print(f"# {name} {store_name}: {row['MB_s']} MB/s {row['msg_s']} msg/s RssAnon {row['rss_anon_MB']} MB",
              file=sys.stderr)
        return row

    def measure_memory(self, command: str, store_name: str, cmd_or_prepare, cleanup=None):
        """One run; the sampled RssAnon peak is the figure (a timed-out run keeps its peak so far)."""
        row = {"command": command, "store": store_name}
        try:
            cmd = cmd_or_prepare() if callable(cmd_or_prepare) else cmd_or_prepare
            c = run(cmd)
            row.update(complete=True, seconds=round(c.seconds, 1), rss_anon_MB=round(c.rss_anon_peak / MB, 1),
                       maxrss_MB=round(c.ru_maxrss / MB, 1), samples=c.samples)
        except RunFailed as e:
            c = e.child
            row.update(complete=False, why=e.short[:200])
            if c is not None:
                row.update(seconds=round(c.seconds, 1), rss_anon_MB=round(c.rss_anon_peak / MB, 1),
                           maxrss_MB=round(c.ru_maxrss / MB, 1), samples=c.samples)
        except Exception as e:  # noqa: BLE001 -- reported in the table, never hidden
            row.update(complete=False, why=f"FAILED: {e}"[:300])
        finally:
            if cleanup:
                cleanup()
        self.memory.append(row)
        print(f"# memory {command} {store_name}: {row}", file=sys.stderr)
        return row

    def unavailable(self, name: str, store_name: str, why: str):
        self.results.append({"workload": name, "store": store_name, "not_available": why})
        print(f"# {name} {store_name}: not available ({why})", file=sys.stderr)


def add_start_cost(row: dict, start_runs: list[float], records: int, nbytes: int) -> dict:
    """Adds the fixed start (median of the tiny-store runs) and the rate net of it to a measured row."""
    start = statistics.median(start_runs)
    row["start_seconds"] = round(start, 3)
    rest = row["seconds"] - start
    if rest > 0:
        row["net_MB_s"], row["net_msg_s"] = round(nbytes / rest / MB, 1), round(records / rest)
    return row


def tiny_copy(dest: str, crash: bool = False) -> str:
    """A writable copy of the fixture store (the start-cost runs of the writing commands); ``crash``: abort
    present and the checkpoint zeroed, so recovery walks everything, as in the crash copy."""
    _rm(dest)
    _rm(dest + ".bak")
    shutil.copytree(FIXTURE, dest)
    for dirpath, dirs, files in os.walk(dest):
        for n in dirs:
            os.chmod(os.path.join(dirpath, n), 0o755)
        for n in files:
            os.chmod(os.path.join(dirpath, n), 0o644)
    if crash:
        open(os.path.join(dest, "abort"), "wb").close()
        with open(os.path.join(dest, "checkpoint"), "r+b") as f:
            f.write(b"\0" * 24)
    return dest


def crash_copy(name: str, info: dict) -> str:
    """The cached crash copy of a store (abort present, checkpoint at the start): made once."""
    crash = os.path.join(CACHE, f"{name}-crash")
    if not os.path.exists(os.path.join(crash, "abort")):
        gen.make_crash_copy(info["root"], crash)
    return crash


def memory_commands(apply_recover: bool = False) -> tuple[str, ...]:
    recover = "recover (crash)" if apply_recover else "recover --dry-run (crash copy)"
    return ("verify", recover, "recover --dry-run (normal shutdown)", "rebuild all",
            SALVAGE_ROW, "stats", "dump commitlog --json")


def memory_suite(b: Bench, infos: dict, apply_recover: bool = False, commands: tuple[str, ...] | None = None) -> None:
    """The memory rows: every command's RssAnon peak on 1 GiB and 4 GiB of 100 B messages,
    both in the broker's 1 GiB segments (gen.MEMORY_STORES_LAYOUT: one segment holds ~3.6 M
    records, so a table per segment would show here, where 64 MiB segments hid it).

    Each command runs once per store: verify; ``recover --dry-run`` of a crash copy (abort present,
    checkpoint at the start: the whole log is walked and the recovery planned; with
    ``apply_recover`` the plan is applied to a copy and verified, as the broker's start would:
    156 s at 1 GiB here, over the timeout at 4 GiB); ``recover --dry-run`` of the store as
    generated (normal shutdown, consume queues and index files present: the broker's normal
    start checks the last segments and the index files); rebuild all on a copy; salvage --jsonl of
    the first SALVAGE_RECORDS records (``--until`` their last store time; salvage renders every
    record in Python, ~30k msg/s: the whole 4 GiB store would take ~8 min) into a temp file deleted
    after (salvage fsyncs it, which /dev/null refuses); stats; dump commitlog --json of every record
    to /dev/null. A command the throughput runs already sampled on the same store with the same
    command line is not run again: its row is their peak (none today: the throughput stores
    have 64 MiB segments).
    """
    from bench.targets import MEMORY_STORES

    commands = commands or memory_commands(apply_recover)
    for name in MEMORY_STORES:
        info = infos[name]
        root = info["root"]
        warm(root)
        dest = os.path.join(WORK, "memory")

        def clean(dest=dest):
            _rm(dest)
            _rm(dest + ".bak")

        def prep_recover(name=name, info=info, dest=dest):
            clean()
            fresh_copy(crash_copy(name, info), dest, real_last=True, copy=("consumequeue", "index"))
            return RMQ + ["recover", dest, "--backup-dir", dest + ".bak"]

        def prep_rebuild(root=root, dest=dest):
            clean()
            fresh_copy(root, dest)
            return RMQ + ["rebuild", "all", dest, "--backup-dir", dest + ".bak"]

        jsonl = os.path.join(WORK, "salvage.jsonl")
        until = gen.store_time(SALVAGE_RECORDS - 1)
        runs = {"verify": (RMQ + ["verify", root, "--json"], None),
                "recover (crash)": (prep_recover, clean),
                "recover --dry-run (crash copy)": (lambda name=name, info=info: RMQ + [
                    "recover", crash_copy(name, info), "--dry-run"], None),
                # the store as generated: no abort file, its consume queues and index files present
                "recover --dry-run (normal shutdown)": (RMQ + ["recover", root, "--dry-run"], None),
                "rebuild all": (prep_rebuild, clean),
                SALVAGE_ROW: (RMQ + ["salvage", root, "--jsonl", jsonl, "--until", str(until)],
                              lambda: os.path.exists(jsonl) and os.unlink(jsonl)),
                "stats": (RMQ + ["stats", root, "--json"], None),
                "dump commitlog --json": (RMQ + ["dump", "commitlog", root, "--json"], None)}
        for command in commands:
            cmd, cleanup = runs[command]
            same = next((r for r in b.results if r["workload"] == command and r["store"] == name
                         and r.get("rss_anon_MB")), None)
            if same is not None:  # the throughput runs already sampled this command on this store
                row = {"command": command, "store": name, "complete": True, "seconds": round(same["seconds"], 1),
                       "rss_anon_MB": same["rss_anon_MB"], "maxrss_MB": same["maxrss_MB"],
                       "note": f"peak of the {len(same['runs'])} throughput run(s)"}
                b.memory.append(row)
                print(f"# memory {command} {name}: {row}", file=sys.stderr)
                continue
            b.measure_memory(command, name, cmd, cleanup=cleanup)


FIXTURE = os.path.join(ROOT, "fixtures", "stores", "4.9.3-clean")
CLI_START_RUNS = 5


def installed_cli() -> list[str] | None:
    """The `rmqstore` script beside this Python when it calls the current entry point (rmqstore_cli.app:run);
    a script installed before that entry point (it calls main) is not what a fresh install runs."""
    exe = os.path.join(os.path.dirname(sys.executable), "rmqstore")
    try:
        with open(exe, encoding="utf-8", errors="replace") as f:
            current = "import run" in f.read(4096)
    except OSError:
        return None
    return [exe] if current else None


def cli_start(runs: int = CLI_START_RUNS) -> dict:
    """Wall time of a CLI start: `--version`, the record-reading commands on a tiny store (dump --limit 1,
    verify, recover --dry-run, rebuild all --dry-run), and what numba adds to dump's (its import and the
    cached kernels' load, timed in process)."""
    cli = installed_cli() or RMQ
    py = sys.executable

    def median(cmd):
        run(cmd, timeout=60)  # first run: pages and caches in
        return round(statistics.median(run(cmd, timeout=60).seconds for _ in range(runs)), 3)

    out = {"runs": runs,
           "version_s": median(cli + ["--version"]),
           "dump_limit1_s": median(cli + ["dump", "commitlog", FIXTURE, "--limit", "1", "--json"]),
           # the plan-only modes change nothing, so they run on the fixture itself
           "verify_s": median(cli + ["verify", FIXTURE]),
           "recover_dry_s": median(cli + ["recover", FIXTURE, "--dry-run"]),
           "rebuild_dry_s": median(cli + ["rebuild", "all", FIXTURE, "--dry-run"]),
           "import_app_s": median([py, "-c", "import rmqstore_cli.app"]),
           "import_app_kernel_s": median([py, "-c", "import rmqstore_cli.app, rmqstore_cli.formats.kernel"])}
    inproc = []
    for _ in range(runs):
        p = subprocess.run([py, "-m", "bench.clistart", FIXTURE], capture_output=True, text=True, cwd=ROOT,
                           check=True, timeout=60)
        inproc.append(json.loads(p.stdout.strip().splitlines()[-1]))
    for key in ("numba_import_s", "kernel_load_s", "numba_added_s"):
        out[key] = round(statistics.median(r[key] for r in inproc), 3)
    return out


def compile_sources() -> None:
    """Write the project's bytecode caches before anything is timed. With PYTHONDONTWRITEBYTECODE set (as
    on the shared machine) a checkout whose caches are stale compiles every module it imports from source
    at every start (~0.15 s of CPU per command on the demo store), which an installed wheel never does.
    commands/ and formats/ are compiled where they are (compileall does not follow the links to them)."""
    import compileall

    for part in ("rmqstore_cli", "commands", "formats", "bench"):
        compileall.compile_dir(os.path.join(ROOT, part), quiet=1)


def main() -> None:
    global TIMEOUT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated workloads (kernel,scan,verify,verify-dledger,verify-j2,dump,rebuild,rebuild-j2,"
                                               "recover,index-query,append,spark-export,memory,production,cli-start)")
    ap.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per child run; longer runs are killed "
                                                                    "and reported 'timed out after N s' (FAIL)")
    ap.add_argument("--memory-recover-apply", action="store_true",
                    help="memory rows: apply recover to a crash copy instead of recover --dry-run on it (slow)")
    ap.add_argument("--json-out", default=os.path.join(ROOT, "bench", "results", "latest.json"))
    args = ap.parse_args()
    TIMEOUT = args.timeout
    only = set(filter(None, args.only.split(",")))
    want = lambda w: not only or w in only  # noqa: E731
    os.makedirs(WORK, exist_ok=True)
    compile_sources()
    started = time.perf_counter()
    b = Bench(args.repeat)
    names = (list(gen.BODY_SIZES) + (list(gen.MEMORY_STORES_LAYOUT) if want("memory") else [])
             + (list(gen.TEXT_STORES) if want("verify") else []))
    # the cli-start row runs on the fixture store: it alone generates no store
    infos = {n: store(n) for n in names} if (not only or only - {"cli-start"}) else {}
    k1 = infos.get("1KiB")
    py = sys.executable

    if want("kernel"):
        for n in ("100B", "1KiB", "4KiB"):  # the ceiling every workload is compared with, per store
            info = infos[n]
            warm(info["root"])
            name = "commitlog kernel (walk+CRC)"
            try:  # timed inside the process: the kernel alone, against the targets
                out = subprocess.run([py, "-m", "bench.kernel", info["root"], "--repeat", str(max(args.repeat, 3))],
                                     capture_output=True, text=True, cwd=ROOT, check=True, timeout=TIMEOUT)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row.update(workload=name, store=n)
                b.results.append(row)
                print(f"# {name} {n}: {row['MB_s']} MB/s {row['msg_s']} msg/s (per CPU second: {row['cpu_MB_s']} MB/s "
                      f"{row['cpu_msg_s']} msg/s)", file=sys.stderr)
            except (subprocess.SubprocessError, ValueError, KeyError) as e:
                b.results.append({"workload": name, "store": n, "failed": str(e)[:300]})
    if "scan" in only:  # CommitLog.find_end in a process: informational, the kernel rows are the ceiling
        for n in gen.BODY_SIZES:
            info = infos[n]
            warm(info["root"])
            b.measure("commitlog scan (walk+CRC)", n, info, [py, "-m", "bench.scan", info["root"]], info["records"], info["bytes"])
    if want("verify"):
        if has_command("verify"):
            # the 1 GiB stores (the 4 GiB one is for the memory rows), and the 100 B one's messages with Chinese keys
            # and tags (information: no target of its own)
            for n in (*gen.BODY_SIZES, *gen.TEXT_STORES):
                info = infos[n]
                warm(info["root"])
                b.measure("verify", n, info, RMQ + ["verify", info["root"], "--json"], info["records"], info["bytes"],
                          start=RMQ + ["verify", FIXTURE, "--json"])
        else:
            b.unavailable("verify", "*", "no `rmqstore verify`")
    if want("verify-dledger"):
        dledger_rows(b, "1KiB", k1)
    if want("verify-j2"):
        if has_command("verify", option="--jobs"):
            warm(k1["root"])
            b.measure("verify -j 2", "1KiB", k1, RMQ + ["verify", k1["root"], "--json", "-j", "2"], k1["records"], k1["bytes"],
                      start=RMQ + ["verify", FIXTURE, "--json", "-j", "2"])
        else:
            b.unavailable("verify -j 2", "1KiB", "`rmqstore verify` has no -j/--jobs")
    if want("dump"):
        warm(k1["root"])
        # msg/s is the target: the first DUMP_RECORDS records keep a slow dump inside the time budget
        count = min(DUMP_RECORDS, k1["records"])
        b.measure("dump commitlog --json", "1KiB", k1, RMQ + ["dump", "commitlog", k1["root"], "--json", "--limit", str(count)],
                  count, count * k1["record_size"], start=RMQ + ["dump", "commitlog", FIXTURE, "--json", "--limit", "100"])
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
        tiny = os.path.join(WORK, "rebuild-tiny")
        b.measure(name, "1KiB", k1, None, k1["records"], k1["bytes"], prepare=prep,
                  start=lambda tiny=tiny, jobs=jobs: RMQ + ["rebuild", "all", tiny_copy(tiny), "--backup-dir", tiny + ".bak"]
                  + (["-j", str(jobs)] if jobs else []))
    if want("recover"):
        if has_command("recover"):
            crash = crash_copy("1KiB", k1)
            dest = os.path.join(WORK, "recover")

            def prep_recover():
                _rm(dest + ".bak")
                fresh_copy(crash, dest, real_last=True, copy=("consumequeue", "index"))
                warm(dest)
                return RMQ + ["recover", dest, "--backup-dir", dest + ".bak"]

            tiny = os.path.join(WORK, "recover-tiny")
            b.measure("recover (crash)", "1KiB", k1, None, k1["records"], k1["bytes"], prepare=prep_recover,
                      start=lambda: RMQ + ["recover", tiny_copy(tiny, crash=True), "--backup-dir", tiny + ".bak"])
        else:
            b.unavailable("recover (crash)", "1KiB", "no `rmqstore recover`")
    if want("index-query"):
        warm(os.path.join(k1["root"], "index"))
        try:
            with tempfile.TemporaryFile() as f:
                c = run([py, "-m", "bench.index_query", k1["root"], str(k1["records"])], stdout=f, ok=(0,))
                f.seek(0)
                row = json.loads(f.read())
            row.update(workload="index query", store="1KiB", rss_anon_MB=round(c.rss_anon_peak / MB, 1),
                       maxrss_MB=row.pop("peak_rss_MB"))
        except (RunFailed, ValueError) as e:
            row = {"workload": "index query", "store": "1KiB", "failed": str(e)[:300]}
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

            tiny_src = os.path.join(WORK, "append-input-100.jsonl")
            with open(src, "rb") as f, open(tiny_src, "wb") as out:
                out.writelines(line for _, line in zip(range(100), f))

            def tiny_append():
                shutil.rmtree(dest, ignore_errors=True)
                return RMQ + ["append", dest, "--from", tiny_src, "--commitlog-file-size", str(gen.SEGMENT_SIZE)]

            b.measure("append --from (dispatch)", "1KiB", k1, None, count, count * k1["record_size"], prepare=prep_append,
                      start=tiny_append)
        else:
            b.unavailable("append --from", "1KiB", "no `rmqstore append --from`")
    if want("spark-export"):
        if has_command("spark", "export"):
            dest = os.path.join(WORK, "spark-export")

            def prep_spark():
                shutil.rmtree(dest, ignore_errors=True)
                return RMQ + ["spark", "export", k1["root"], "--to", dest]

            warm(k1["root"])
            b.measure("spark export local[2]", "1KiB", k1, None, k1["records"], k1["bytes"], prepare=prep_spark,
                      start=lambda: (shutil.rmtree(dest, ignore_errors=True), RMQ + ["spark", "export", FIXTURE, "--to", dest])[1])
            shutil.rmtree(dest, ignore_errors=True)
        else:
            b.unavailable("spark export", "1KiB", "no `rmqstore spark export`")

    if want("memory"):
        memory_suite(b, infos, args.memory_recover_apply)
    if want("production"):
        from bench.production import PRODUCTION_STORE, production_suite

        infos[PRODUCTION_STORE] = store(PRODUCTION_STORE)
        production_suite(b, infos[PRODUCTION_STORE])
    start = None
    if want("cli-start"):
        try:
            start = cli_start()
        except (RunFailed, subprocess.SubprocessError, ValueError, KeyError) as e:
            start = {"failed": str(e)[:300]}
        print(f"# CLI start: {start}", file=sys.stderr)

    from bench.targets import evaluate, render

    rows = evaluate(b.results, b.memory, start)
    wall = round(time.perf_counter() - started, 1)
    print(render(b.results, rows, b.memory, start))
    load = os.getloadavg()
    print(f"\nwhole run {wall} s (incl. generation of missing stores); load average now "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    gen_s = {n: i.get("generate_seconds") for n, i in infos.items()}
    print(f"store generation (seconds, recorded when each store was generated; included above only for stores "
          f"generated in this run): {gen_s}")
    report = {"machine": {"cpus": os.cpu_count(), "load_avg": load}, "wall_seconds": wall, "generate_seconds": gen_s,
              "results": b.results,
              "memory": b.memory, "cli_start": start, "targets": rows}
    os.makedirs(os.path.dirname(args.json_out), exist_ok=True)
    with open(args.json_out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report))


def _rm(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
