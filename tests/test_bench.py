"""The benchmark harness itself (bench/): its RssAnon sampler, its target evaluation and its memory
workloads' command lines, on tiny inputs, so a broken harness fails here rather than in a 20-minute
run. No timing is asserted (only that a timeout or a memory cap is reported as a failure)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from bench import gen, memory, run, targets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "fixtures", "stores", "4.9.3-clean")
PY = sys.executable
# Touches every page of 50 MB of anonymous memory, then stays alive long enough to be sampled.
ALLOCATE_50MB = "import time; b = bytearray(50 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.5)"
IDLE = "import time; time.sleep(0.5)"


def test_sampler_sees_anonymous_memory_of_the_child():
    big = memory.run_sampled([PY, "-c", ALLOCATE_50MB])
    small = memory.run_sampled([PY, "-c", IDLE])
    assert big.returncode == 0 and small.returncode == 0
    assert big.samples > 0 and small.samples > 0
    assert small.rss_anon_peak > 0
    assert big.rss_anon_peak >= small.rss_anon_peak + 40e6, (big.rss_anon_peak, small.rss_anon_peak)
    assert small.rss_anon_peak < 40e6, small.rss_anon_peak  # an interpreter, not 50 MB
    assert not big.timed_out and not big.killed_rss


def test_sampler_ignores_mapped_file_pages(tmp_path):
    """RssAnon, unlike ru_maxrss, does not count a file's pages the child read through a mapping."""
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.truncate(64 << 20)
    code = ("import mmap, sys, time; f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); "
            "s = sum(m[i] for i in range(0, len(m), 4096)); time.sleep(0.3)")
    c = memory.run_sampled([PY, "-c", code, str(path)])
    assert c.returncode == 0
    assert c.ru_maxrss >= c.rss_anon_peak + 50e6, (c.ru_maxrss, c.rss_anon_peak)


def test_sampler_keeps_a_jvm_apart_from_the_workers():
    """A descendant named ``java`` (Spark's JVM) is sampled apart: the workers' peak is the other descendants'."""
    child = ("import subprocess, sys; procs = [subprocess.Popen([sys.executable, '-c', c]) for c in sys.argv[1:]]; "
             "[p.wait() for p in procs]")
    java = "open('/proc/self/comm', 'w').write('java'); " + ALLOCATE_50MB
    c = memory.run_sampled([PY, "-c", child, java, IDLE])
    assert c.returncode == 0 and c.workers_seen >= 2
    assert c.jvm_rss_anon_peak >= 40e6, c.jvm_rss_anon_peak
    assert 0 < c.worker_rss_anon_peak < 40e6, c.worker_rss_anon_peak


def test_sampler_counts_no_worker_for_a_process_gone_while_sampled(monkeypatch):
    """A descendant that exits between its RssAnon reading and its name's (Spark's JVM at the end of an export) is
    judged by no name: its last reading counts as neither a worker's nor the JVM's. Here a made-up descendant whose
    name reads ``java`` until its memory is read, and nothing after (it is gone)."""
    gone_pid = 1 << 30  # no such process
    gone = []
    real_descendants, real_rss, real_name = memory.descendants, memory.rss_anon_bytes, memory._command_name

    def descendants(pid):
        return real_descendants(pid) + [gone_pid]

    def rss_anon_bytes(pid):
        if pid != gone_pid:
            return real_rss(pid)
        if gone:
            return None
        gone.append(True)
        return 400 << 20

    def command_name(pid):
        return real_name(pid) if pid != gone_pid else (None if gone else "java")

    monkeypatch.setattr(memory, "descendants", descendants)
    monkeypatch.setattr(memory, "rss_anon_bytes", rss_anon_bytes)
    monkeypatch.setattr(memory, "_command_name", command_name)
    c = memory.run_sampled([PY, "-c", IDLE])
    assert gone, "the sampler never read the made-up descendant"
    assert c.returncode == 0 and c.worker_rss_anon_peak < 300 << 20 and c.jvm_rss_anon_peak < 300 << 20, (
        c.worker_rss_anon_peak, c.jvm_rss_anon_peak)


def test_sampler_judges_a_child_a_jvm_thread_forked_as_the_jvm(monkeypatch):
    """A child a JVM thread has just forked shares the JVM's memory (its RssAnon is the JVM's) and carries the thread's
    name (``Executor task l``) until it runs Python: its program, java, makes it the JVM's reading, not a worker's.
    Here a made-up descendant with that name, that program and 400 MB."""
    forked = 1 << 30  # no such process
    real_descendants, real_rss, real_comm, real_program = (memory.descendants, memory.rss_anon_bytes, memory._comm,
                                                           memory._program)
    monkeypatch.setattr(memory, "descendants", lambda pid: real_descendants(pid) + [forked])
    monkeypatch.setattr(memory, "rss_anon_bytes", lambda pid: 400 << 20 if pid == forked else real_rss(pid))
    monkeypatch.setattr(memory, "_comm", lambda pid: "Executor task l" if pid == forked else real_comm(pid))
    monkeypatch.setattr(memory, "_program", lambda pid: "java" if pid == forked else real_program(pid))
    c = memory.run_sampled([PY, "-c", IDLE])
    assert c.returncode == 0 and c.jvm_rss_anon_peak == 400 << 20, c.jvm_rss_anon_peak
    assert c.worker_rss_anon_peak < 300 << 20, c.worker_rss_anon_peak


def test_timeout_and_memory_cap_are_failures():
    c = memory.run_sampled([PY, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert c.timed_out and c.returncode != 0
    c = memory.run_sampled([PY, "-c", ALLOCATE_50MB], kill_above=20 << 20)
    assert c.killed_rss and c.returncode != 0
    with pytest.raises(run.RunFailed, match="timed out after 0.5 s"):
        run.run([PY, "-c", "import time; time.sleep(30)"], timeout=0.5)
    with pytest.raises(run.RunFailed, match="exited 3"):
        run.run([PY, "-c", "raise SystemExit(3)"])


def _synthetic_results():
    k, prod = targets.KERNEL, targets.PRODUCTION
    return [
        {"workload": k, "store": "1KiB", "MB_s": 8000.0, "msg_s": 6_500_000},
        {"workload": k, "store": "100B", "MB_s": 2000.0, "msg_s": 6_700_000},
        {"workload": "verify", "store": "1KiB", "MB_s": 1000.0, "msg_s": 800_000, "net_MB_s": 3100.0, "net_msg_s": 2_500_000},
        {"workload": "verify", "store": "100B", "MB_s": 1300.0, "msg_s": 4_400_000, "net_MB_s": 1400.0, "net_msg_s": 4_800_000},
        {"workload": "rebuild all", "store": "1KiB", "failed": "rebuild exited 2"},
        {"workload": "dump commitlog --json", "store": "1KiB", "MB_s": 300.0, "msg_s": 250_000},  # no fixed start
        {"workload": "index query", "store": "1KiB", "p50_ms": 0.01, "p99_ms": 0.05},
        {"workload": "verify -j 1 (8 GiB)", "store": prod, "MB_s": 1000.0, "msg_s": 1, "net_MB_s": 1200.0, "net_msg_s": 1,
         "rss_anon_MB": 90.0},
        {"workload": "verify -j 2 (8 GiB)", "store": prod, "MB_s": 1700.0, "msg_s": 1, "net_MB_s": 2280.0, "net_msg_s": 2,
         "rss_anon_MB": 120.0, "worker_rss_anon_MB": 310.0, "workers": 2},
        {"workload": "recover (crash) -j 2 (8 GiB)", "store": prod, "not_available": "no -j"},
        {"workload": "spark export local[2] (8 GiB)", "store": prod, "MB_s": 210.0, "msg_s": 1, "rss_anon_MB": 76.0,
         "worker_rss_anon_MB": 256.0, "workers": 10, "jvm_rss_anon_MB": 410.0},
    ]
SMALL, LARGE = targets.MEMORY_STORES


def _synthetic_memory():
    return [
        {"command": "stats", "store": SMALL, "complete": True, "seconds": 5.0, "rss_anon_MB": 100.0},
        {"command": "stats", "store": LARGE, "complete": True, "seconds": 20.0, "rss_anon_MB": 105.0},
        {"command": "verify", "store": SMALL, "complete": True, "seconds": 9.0, "rss_anon_MB": 1000.0},
        {"command": "verify", "store": LARGE, "complete": True, "seconds": 40.0, "rss_anon_MB": 3900.0},
        {"command": "dump", "store": SMALL, "complete": True, "seconds": 9.0, "rss_anon_MB": 120.0},
        {"command": "dump", "store": LARGE, "complete": True, "seconds": 40.0, "rss_anon_MB": 140.0},
        {"command": "salvage", "store": SMALL, "complete": True, "seconds": 90.0, "rss_anon_MB": 120.0},
        {"command": "salvage", "store": LARGE, "complete": False, "why": "timed out after 300 s",
         "seconds": 300.0, "rss_anon_MB": 121.0},
    ]


def test_evaluate_gives_the_expected_verdicts():
    rows = {r["target"]: r for r in targets.evaluate(_synthetic_results(), _synthetic_memory(),
                                                     {"numba_added_s": 0.45, "dump_limit1_s": 1.2})}
    assert rows["bare walk+CRC >= 6 GB/s at 1 KiB"]["pass"] is True
    assert rows["bare walk+CRC >= 10 M rec/s at 100 B"]["pass"] is False
    assert rows["verify >= 3 GB/s at 1 KiB (net of start)"]["pass"] is True  # 3100 net, though 1000 whole
    assert rows["verify >= 3 GB/s at 1 KiB (net of start)"]["vs_kernel"].startswith("0.125 of kernel")
    assert rows["verify >= 5 M msg/s at 100 B (net of start)"]["pass"] is False  # 4.8 M net
    assert rows["dump --json >= 600k msg/s (net of start)"]["pass"] is None  # its fixed start was not measured
    assert rows["rebuild all >= 1.2 GB/s at 1 KiB (net of start)"]["pass"] is False  # the command failed
    assert rows["verify -j 2 >= 1.8x -j 1 (8 GiB, net)"]["measured"] == 1.9  # 2280 / 1200 net
    assert rows["verify -j 2 >= 1.8x -j 1 (8 GiB, net)"]["pass"] is True
    assert rows["recover (crash) -j 2 >= 1.8x -j 1 (8 GiB, net)"]["pass"] is None
    assert rows["rebuild all -j 2 >= 1.8x -j 1 (8 GiB, net)"]["note"] == "not run"
    prod = {t: r for t, r in rows.items() if "main process and each worker" in t}
    assert prod["verify -j 1 (8 GiB): RssAnon < 300 MB, main process and each worker"]["pass"] is True
    assert prod["verify -j 2 (8 GiB): RssAnon < 300 MB, main process and each worker"]["pass"] is False  # a worker
    spark = prod["spark export local[2] (8 GiB): RssAnon < 300 MB, main process and each worker"]
    assert spark["pass"] is True and spark["measured"] == 256.0 and "JVM 410.0 MB (not judged)" in spark["shown"]
    assert rows["index query p50 < 5 ms"]["pass"] is True
    mem = lambda cmd, what: rows[f"{cmd}: RssAnon " + {  # noqa: E731
        "limit": "< 300 MB at 1 GiB and 4 GiB", "flat": "at 4 GiB within 10 % of 1 GiB"}[what]]["pass"]
    assert mem("stats", "limit") is True and mem("stats", "flat") is True
    assert mem("verify", "limit") is False and mem("verify", "flat") is False
    assert mem("dump", "limit") is True and mem("dump", "flat") is False  # 1.17x
    assert mem("salvage", "limit") is False and mem("salvage", "flat") is False  # the 4 GiB run did not finish
    start = [r for r in rows.values() if r["target"].startswith("CLI start")]
    assert len(start) == 1 and start[0]["pass"] is False


def test_render_prints_every_target_and_the_memory_table():
    results, mem = _synthetic_results(), _synthetic_memory()
    rows = targets.evaluate(results, mem)
    text = targets.render(results, rows, mem, {"runs": 3, "version_s": 0.4})
    for r in rows:
        assert r["target"] in text
    table = targets.render_memory(mem)
    assert "| verify | 1,000.0 | 3,900.0 | 3.9 | FAIL | FAIL |" in table
    assert "| stats | 100.0 | 105.0 | 1.05 | PASS | PASS |" in table
    assert ">= 121.0 (timed out after 300 s)" in table


def test_memory_suite_runs_every_command_on_a_tiny_store(tmp_path, monkeypatch):
    """The memory rows' real command lines (verify, recover of a crash copy, rebuild, salvage,
    stats, dump) all run and finish on the demo store; each gets a sampled RssAnon peak."""
    store = tmp_path / "store"
    shutil.copytree(FIXTURE, store)
    monkeypatch.setattr(run, "WORK", str(tmp_path / "work"))
    monkeypatch.setattr(run, "CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(targets, "MEMORY_STORES", ("100B",))
    os.makedirs(run.WORK)
    os.makedirs(run.CACHE)
    b = run.Bench(1)
    run.memory_suite(b, {"100B": {"root": str(store)}})
    assert [m["command"] for m in b.memory] == list(run.memory_commands())
    for m in b.memory:
        assert m["complete"], m
        assert m["rss_anon_MB"] > 0 and m["samples"] > 0, m
    assert not os.path.exists(os.path.join(run.WORK, "memory"))  # copies removed after each run
    assert not os.path.exists(os.path.join(run.WORK, "salvage.jsonl"))
    b = run.Bench(1)
    throughput = {"workload": "verify", "store": "100B", "seconds": 1.0, "runs": [1.0, 1.1], "rss_anon_MB": 77.7,
                  "maxrss_MB": 99.9}
    b.results.append(throughput)  # verify already sampled by the throughput runs: reused, not run again
    run.memory_suite(b, {"100B": {"root": str(store)}}, commands=("verify", "recover (crash)"))
    recover = [m for m in b.memory if m["command"] == "recover (crash)"]
    assert len(recover) == 1 and recover[0]["complete"], recover
    verify = [m for m in b.memory if m["command"] == "verify"]
    assert len(verify) == 1 and verify[0]["rss_anon_MB"] == 77.7 and "samples" not in verify[0], verify


def test_memory_stores_use_the_brokers_1gib_segments(tmp_path):
    """The memory rows run on stores in 1 GiB segments (a per-segment table holds ~3.6 M records
    there); the throughput stores keep 64 MiB segments (many segments for the -j rows)."""
    assert set(gen.MEMORY_STORES_LAYOUT) == set(targets.MEMORY_STORES)
    for name in targets.MEMORY_STORES:
        body, total, seg = gen.MEMORY_STORES_LAYOUT[name]
        assert body == 100 and seg == 1 << 30 == gen.BROKER_SEGMENT_SIZE
    assert [gen.MEMORY_STORES_LAYOUT[n][1] for n in targets.MEMORY_STORES] == [1 << 30, 4 << 30]
    assert gen.SEGMENT_SIZE == 64 << 20
    # generate() lays the log out in the segment size it is given (tiny here: 2 segments of 64 KiB)
    info = gen.generate(str(tmp_path / "s"), 100, total=128 << 10, seg_size=64 << 10)
    names = sorted(os.listdir(tmp_path / "s" / "commitlog"))
    assert info["segments"] == 2 and info["segment_size"] == 64 << 10
    assert names == ["%020d" % 0, "%020d" % (64 << 10)]
    assert all(os.path.getsize(tmp_path / "s" / "commitlog" / n) == 64 << 10 for n in names)


def test_the_chinese_text_store_holds_the_same_messages_with_chinese_keys_and_tags(tmp_path):
    """The "zh" text (gen.TEXTS) changes only the keys' and tags' text: the store verifies clean (its index holds the
    keys' UTF-16 hashes, which verify recomputes in its compiled pass) and a key's message is found by it."""
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store

    info = gen.generate(str(tmp_path / "zh"), 100, total=128 << 10, seg_size=64 << 10, text="zh")
    root = str(tmp_path / "zh")
    with Store.open(root) as st:
        assert [f.code for f in verify_store(st).findings if f.severity in ("error", "warning")] == []
    key = "\u8ba2\u5355%012d" % 5
    q = subprocess.run([PY, "-m", "rmqstore_cli", "index", "query", root, "--topic", gen._fields(5)[0].decode(),
                        "--key", key, "--json"], capture_output=True, text=True, cwd=REPO)
    assert q.returncode == 0, q.stderr
    found = [json.loads(line) for line in q.stdout.splitlines() if line.strip()]
    assert [r["keys"] for r in found] == [key + " \u652f\u4ed8"], q.stdout[:500]
    assert info["records"] > 0


def test_fixed_start_target_is_judged_by_the_slowest_of_the_four_commands():
    start = {"version_s": 0.07, "dump_limit1_s": 0.30, "verify_s": 0.34, "recover_dry_s": 0.35, "rebuild_dry_s": 0.33}
    row = lambda c: next(r for r in targets.evaluate([], [], c) if r["target"].startswith("start <= 0.35 s"))  # noqa: E731
    assert row(start)["pass"] is True and row(start)["measured"] == 0.35
    assert row({**start, "rebuild_dry_s": 0.36})["pass"] is False
    assert row({k: v for k, v in start.items() if k != "verify_s"})["pass"] is None  # not measured: not judged
    assert row({"failed": "exited 2"})["pass"] is False
    assert "`rmqstore verify <4.9.3-clean>` | 0.34" in targets.render_cli_start(start)


def test_clistart_reports_numba_share():
    p = subprocess.run([PY, "-m", "bench.clistart", FIXTURE], capture_output=True, text=True, cwd=REPO, check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(out) == {"import_app_s", "numba_import_s", "kernel_load_s", "numba_added_s"}
    assert out["numba_import_s"] > 0 and out["numba_added_s"] >= out["numba_import_s"]


def test_start_cost_split_and_its_column():
    """The fixed start (tiny-store median) is taken off the command's time for the net rate, and shown."""
    row = {"workload": "verify", "store": "1KiB", "seconds": 3.0, "MB_s": 357.9, "msg_s": 293_131}
    run.add_start_cost(row, [0.9, 1.2, 1.0], records=879_392, nbytes=1_073_737_632)
    assert row["start_seconds"] == 1.0
    assert row["net_MB_s"] == round(1_073_737_632 / 2.0 / 1e6, 1) and row["net_msg_s"] == 879_392 // 2
    slow_start = run.add_start_cost({"seconds": 3.0}, [4.0, 4.0, 4.0], 1, 1)  # start longer than the run: no net rate
    assert slow_start["start_seconds"] == 4.0 and "net_MB_s" not in slow_start
    table = targets.render([row], [])
    assert "| 1.0 | 536.9, 439,696 |" in table


def test_tiny_copies_are_writable_and_leave_the_fixture_alone(tmp_path):
    before = {p: os.stat(os.path.join(run.FIXTURE, "commitlog", p)).st_nlink
              for p in os.listdir(os.path.join(run.FIXTURE, "commitlog"))}
    crash = run.tiny_copy(str(tmp_path / "crash"), crash=True)
    assert os.path.exists(os.path.join(crash, "abort"))
    assert open(os.path.join(crash, "checkpoint"), "rb").read(24) == b"\0" * 24
    plain = run.tiny_copy(str(tmp_path / "plain"))
    assert not os.path.exists(os.path.join(plain, "abort"))
    for d in (crash, plain):
        for name in os.listdir(os.path.join(d, "commitlog")):
            p = os.path.join(d, "commitlog", name)
            assert os.stat(p).st_nlink == 1 and os.access(p, os.W_OK)  # copies, never links to the fixture
    assert before == {p: os.stat(os.path.join(run.FIXTURE, "commitlog", p)).st_nlink for p in before}


def test_production_rows_run_their_commands_on_the_demo_store(tmp_path, monkeypatch):
    """The 8 GiB rows' command lines (verify, recover of a crash copy and rebuild all at -j 1 and -j 2), given
    the demo store instead: each prepared command runs and finishes, with -j where the command has it and a
    "not available" -j 2 row where it has not; the Spark export's command line is formed, not run."""
    from bench import production

    store = tmp_path / "store"
    shutil.copytree(FIXTURE, store)
    monkeypatch.setattr(run, "WORK", str(tmp_path / "work"))
    monkeypatch.setattr(run, "CACHE", str(tmp_path / "cache"))
    os.makedirs(run.WORK)
    os.makedirs(run.CACHE)
    ran = []

    class Recorder(run.Bench):
        def measure_side_by_side(self, variants, budget=run.SLOW_BUDGET):
            return [self.measure(v["name"], v["store_name"], None, v["cmd_for"], v["records"], v["nbytes"],
                                 v.get("prepare"), v.get("cleanup"), v.get("start")) for v in variants]

        def measure(self, name, store_name, info, cmd_for, records, nbytes, prepare=None, cleanup=None, start=None):
            if name.startswith("spark"):
                ran.append((name, prepare()))
                return
            cmd = prepare() if prepare else cmd_for
            c = run.run(cmd)
            if cleanup:
                cleanup()
            tiny = start() if callable(start) else start
            run.run(tiny)
            ran.append((name, cmd))
            self.results.append({"workload": name, "store": store_name, "seconds": c.seconds})

    b = Recorder(1)
    production.production_suite(b, {"root": str(store), "records": 2080, "bytes": 1})
    names = [n for n, _ in ran] + [r["workload"] for r in b.results if "not_available" in r]
    for command in ("verify", "recover (crash)", "rebuild all"):
        for jobs in production.JOBS:
            assert production.row_name(command, jobs) in names, (command, jobs, names)
    for name, cmd in ran:
        if " -j 2 " in name:
            assert cmd[-2:] == ["-j", "2"], (name, cmd)
    assert any(n.startswith("spark export") for n, _ in ran)
    assert not os.path.exists(os.path.join(run.WORK, "recover-8g")) and not os.path.exists(os.path.join(run.WORK, "rebuild-8g"))


def test_rows_measured_side_by_side_take_turns(monkeypatch):
    """The rows a ratio compares run in turns (A, B, A, B, ...), their fixed starts too; each row's figure is the
    median of its own runs, and a round that would take too long is not repeated."""
    calls = []
    seconds = {"a": [3.0, 1.0, 2.0], "b": [6.0, 4.0, 5.0], "a-start": [0.5] * 9, "b-start": [1.0] * 9}

    class Child:
        def __init__(self, s):
            self.seconds, self.rss_anon_peak, self.ru_maxrss, self.worker_rss_anon_peak, self.workers_seen = s, 1, 1, 0, 0
            self.jvm_rss_anon_peak = 0

    def fake_run(cmd):
        calls.append(cmd[0])
        return Child(seconds[cmd[0]].pop(0))

    monkeypatch.setattr(run, "run", fake_run)
    b = run.Bench(3)
    a_row, b_row = b.measure_side_by_side([
        dict(name="A", store_name="s", cmd_for=["a"], records=100, nbytes=int(10e6), start=["a-start"]),
        dict(name="B", store_name="s", cmd_for=None, prepare=lambda: ["b"], records=100, nbytes=int(10e6),
             start=lambda: ["b-start"])], budget=100)
    assert calls == ["a", "b"] * 3 + ["a-start", "b-start"] * run.CLI_START_RUNS
    assert (a_row["seconds"], a_row["runs"], b_row["seconds"], b_row["runs"]) == (2.0, [3.0, 1.0, 2.0], 5.0, [6.0, 4.0, 5.0])
    assert (a_row["MB_s"], a_row["start_seconds"], a_row["net_MB_s"]) == (5.0, 0.5, round(10 / 1.5, 1))
    assert (b_row["start_seconds"], b_row["net_MB_s"]) == (1.0, 2.5)
    assert [r["workload"] for r in b.results] == ["A", "B"]

    calls.clear()
    seconds.update(a=[30.0, 1.0], b=[30.0, 1.0])
    b = run.Bench(3)
    b.measure_side_by_side([dict(name="A", store_name="s", cmd_for=["a"], records=1, nbytes=1),
                            dict(name="B", store_name="s", cmd_for=["b"], records=1, nbytes=1)], budget=20)
    assert calls == ["a", "b"]  # 60 s a round, two more rounds: over 2 x 20 s, not repeated


def test_dirty_pages_are_written_out_before_a_timed_run(monkeypatch):
    # a writing row's fresh copy of the store must not be written back on the command's clock: sync comes first
    events = []
    monkeypatch.setattr(run.os, "sync", lambda: events.append("sync"))
    real = run.run_sampled

    def sampled(cmd, **kw):
        events.append("child")
        return real(cmd, **kw)

    monkeypatch.setattr(run, "run_sampled", sampled)
    run.run([PY, "-c", "pass"])
    assert events == ["sync", "child"]
