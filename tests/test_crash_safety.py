"""Crash safety: SIGKILL during append (segment rolls, index file creation, between writes), during recover
and during rebuild; the next recover leaves a store verify passes, holding every acknowledged message in
order and nothing that was not sent.

The writer runs in a child process. Kills come from the parent at random moments, or from inside the child
at chosen system calls (creating the n-th commitlog / index file, the n-th fsync / write / rename): a
process killed there leaves exactly the on-disk state a crash at that instruction leaves.
Acknowledgements: the child prints one JSON line per put after it returned (``--fsync always``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests import fuzzlib
from tests.conftest import REPO, broker_read, copy_store

NAME = "5.3.3-v2topic"  # 16 KiB commitlog files, 30-unit consume queue files, 63-entry index files: many rolls
RUNS = int(os.environ.get("RMQSTORE_CRASH_RUNS", "56"))
SEED = int(os.environ.get("RMQSTORE_FUZZ_SEED", str(int(time.time()) % 100000)))
MESSAGES = 90

CHILD = r'''
import os, sys, signal, json
mode, target, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
args = json.loads(sys.argv[4])
count = [0]
_open, _ftruncate, _fsync, _pwrite, _pwritev, _rename, _replace, _unlink = (
    os.open, os.ftruncate, os.fsync, os.pwrite, getattr(os, "pwritev", None), os.rename, os.replace, os.unlink)
new_fds = {}

def hit():
    count[0] += 1
    if count[0] == nth:
        os.kill(os.getpid(), signal.SIGKILL)

def p_open(path, flags, mode_=0o777, *a, **k):
    new = bool(flags & os.O_CREAT) and not os.path.exists(path)
    fd = _open(path, flags, mode_, *a, **k)
    if new:
        new_fds[fd] = os.fspath(path)
        if mode == "create" and ("/%s/" % target) in new_fds[fd]:
            hit()
    return fd

def p_ftruncate(fd, size):
    _ftruncate(fd, size)
    if mode == "alloc" and ("/%s/" % target) in new_fds.get(fd, ""):
        hit()

def p_fsync(fd):
    _fsync(fd)
    if mode in ("fsync", "anywrite"):
        hit()

def p_pwrite(fd, data, pos):
    if mode == "anywrite":
        # half the bytes, then die: a torn write
        if count[0] + 1 == nth and len(data) > 1:
            _pwrite(fd, bytes(data)[: len(data) // 2], pos)
        hit()
    return _pwrite(fd, data, pos)

def p_pwritev(fd, bufs, pos, *a):
    if mode == "anywrite":
        hit()
    return _pwritev(fd, bufs, pos, *a)

def p_rename(a, b, *x, **k):
    if mode == "anywrite":
        hit()
    return _rename(a, b, *x, **k)

def p_replace(a, b, *x, **k):
    if mode == "anywrite":
        hit()
    return _replace(a, b, *x, **k)

def p_unlink(p, *x, **k):
    if mode == "anywrite":
        hit()
    return _unlink(p, *x, **k)

os.open, os.ftruncate, os.fsync, os.pwrite, os.rename, os.replace, os.unlink = (
    p_open, p_ftruncate, p_fsync, p_pwrite, p_rename, p_replace, p_unlink)
if _pwritev is not None:
    os.pwritev = p_pwritev
sys.argv = ["rmqstore"] + args
from rmqstore_cli.app import main
main()
'''


def child_cmd(script: Path, mode: str, target: str, nth: int, args: list[str]) -> list[str]:
    return [sys.executable, "-u", str(script), mode, target, str(nth), json.dumps(args)]


def make_messages(rng: random.Random, run: int) -> list[dict]:
    out = []
    for i in range(MESSAGES):
        topic, qid = rng.choice([("ShortTopic", 1), ("CrashTopic", 0), ("CrashTopic", 1)])
        body = rng.randbytes(rng.randrange(60, 1400))
        out.append({"topic": topic, "queueId": qid, "bodyHex": body.hex(), "bornTimestamp": 1700000000000 + i,
                    "properties": {"UNIQ_KEY": f"C{run:05d}{i:06d}", "KEYS": f"k{run}-{i} x{i % 7}", "TAGS": f"t{i % 3}"}})
    return out


def read_acks(text: str) -> list[dict]:
    acks = []
    for line in text.splitlines():
        try:
            o = json.loads(line)
        except ValueError:
            continue  # a line cut by the kill was never acknowledged
        if isinstance(o, dict) and "offset" in o and "msgId" in o:
            acks.append(o)
    return acks


@pytest.fixture(scope="module")
def crash_env(tmp_path_factory):
    base = Path(tempfile.mkdtemp(prefix="rmqstore-crash-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    script = base / "child.py"
    script.write_text(CHILD)
    yield base, script
    shutil.rmtree(base, ignore_errors=True)


def check_recovered(root: Path, original: list, sent: list[dict], acks: list[dict], what: str) -> list[str]:
    """recover, then: verify clean, the broker's records untouched, the sent messages a prefix in order."""
    probs = []
    bk = root.parent / (root.name + "-bk")
    rr = fuzzlib.run_cli(["recover", "--backup-dir", str(bk), str(root)])
    probs += [f"recover: {p}" for p in fuzzlib.problems_of(rr, {0, 1})]
    vr = fuzzlib.run_cli(["verify", "--json", str(root)])
    bad = [f for f in fuzzlib.json_lines(vr.stdout) if f.get("severity") in ("error", "warning")]
    if vr.exit_code != 0 or bad:
        probs.append(f"verify after recover: exit {vr.exit_code}, {[(f['code'], f.get('message', '')[:120]) for f in bad][:4]}")
    dr = fuzzlib.run_cli(["dump", "commitlog", "--json", "--body", "hex", str(root)])
    recs = [o for o in fuzzlib.json_lines(dr.stdout) if "offset" in o]
    head, tail = recs[: len(original)], recs[len(original):]
    if [(r["offset"], r["msgId"]) for r in head] != [(o, m["msgId"]) for o, _, m in original]:
        probs.append("the broker-written records are not all intact after recover")
    if len(tail) > len(sent):
        probs.append(f"{len(tail)} records after the broker's, but only {len(sent)} were sent (invented records)")
    for j, r in enumerate(tail[: len(sent)]):
        s = sent[j]
        if (r["topic"], r["queueId"], r.get("bodyHex"), r["properties"].get("UNIQ_KEY")) != \
                (s["topic"], s["queueId"], s["bodyHex"], s["properties"]["UNIQ_KEY"]):
            probs.append(f"record {j} after the broker's is not message {j} as sent (order or content differs)")
            break
    if len(tail) < len(acks):
        probs.append(f"{len(acks)} puts acknowledged but only {len(tail)} records survive ({what})")
    for j, a in enumerate(acks[: len(tail)]):
        if (tail[j]["offset"], tail[j]["msgId"]) != (a["offset"], a["msgId"]):
            probs.append(f"acknowledged put {j} was at {a['offset']}/{a['msgId']}, now {tail[j]['offset']}/{tail[j]['msgId']}")
            break
    shutil.rmtree(bk, ignore_errors=True)
    return probs


def plan_kill(rng: random.Random, run: int, full_time: float):
    kind = run % 6
    if kind == 0:
        return ("none", "-", 0, rng.uniform(0.0, full_time))  # parent kill at a random moment
    if kind == 1:
        return ("create", "commitlog", rng.randrange(1, 4), None)  # right after a new segment file appears
    if kind == 2:
        return ("alloc", "commitlog", rng.randrange(1, 4), None)  # segment allocated, nothing written yet
    if kind == 3:
        return (rng.choice(["create", "alloc"]), "index", rng.randrange(1, 3), None)  # during index file creation
    if kind == 4:
        return ("create", "consumequeue", rng.randrange(1, 4), None)
    return ("anywrite", "-", rng.randrange(1, 400), None)  # between (or in the middle of) any two writes


def drain_stderr(proc: subprocess.Popen):
    """Read the child's stderr in a thread (a full stderr pipe would block the child while the test reads
    stdout); returns a function giving all of it once the child ended. stdout is read only by the test,
    through ``proc.stdout`` alone: mixing its buffered reader with ``communicate()`` loses lines."""
    import threading

    chunks: list[str] = []
    t = threading.Thread(target=lambda: chunks.append(proc.stderr.read()), daemon=True)
    t.start()

    def result() -> str:
        t.join(timeout=300)
        return "".join(chunks)

    return result


def test_kill_during_append(crash_env):
    base, script = crash_env
    original = [(o, s, m) for o, s, m in fuzzlib.model(NAME).clmsg]
    rng = random.Random(f"{SEED}:crash")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # one uninterrupted run: the happy path, and how long a run takes (kill times are drawn within it)
    root = copy_store(NAME, base / "full")
    sent = make_messages(rng, 99999)
    (base / "full.jsonl").write_text("".join(json.dumps(m) + "\n" for m in sent))
    args = ["append", "--from", str(base / "full.jsonl"), "--fsync", "always", "--json", str(root)]
    proc = subprocess.Popen(child_cmd(script, "none", "-", 0, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    stderr = drain_stderr(proc)
    first = proc.stdout.readline()
    t0 = time.time()
    # the rest through the same reader: communicate() would read the descriptor itself and lose whatever
    # readline() had already buffered beyond the first line (about 20 acknowledgements)
    out = proc.stdout.read()
    proc.wait(timeout=300)
    full_time = time.time() - t0  # from the first acknowledgement to the end
    err = stderr()
    assert proc.returncode == 0, err[-2000:]
    acks = read_acks(first + out)
    assert len(acks) == MESSAGES
    assert not check_recovered(root, original, sent, acks, "no kill")
    shutil.rmtree(root)

    failures, killed, stats = [], 0, {}
    print(f"\ncrash seed {SEED}: {RUNS} kill runs (RMQSTORE_FUZZ_SEED={SEED}); a full run takes {full_time:.1f}s")
    for run in range(RUNS):
        root = copy_store(NAME, base / f"run{run}")
        sent = make_messages(rng, run)
        src = base / f"run{run}.jsonl"
        src.write_text("".join(json.dumps(m) + "\n" for m in sent))
        mode, target, nth, delay = plan_kill(rng, run, full_time)
        args = ["append", "--from", str(src), "--fsync", "always", "--json", str(root)]
        proc = subprocess.Popen(child_cmd(script, mode, target, nth, args), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        stderr = drain_stderr(proc)
        first = ""
        if delay is not None:
            first = proc.stdout.readline()  # appending has begun: kill somewhere inside the appends
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
        # read through the same file objects: readline() may have buffered more than one line
        out = first + proc.stdout.read()
        proc.wait(timeout=300)
        err = stderr()
        died = proc.returncode == -signal.SIGKILL
        killed += died
        key = f"{mode}:{target}"
        stats[key] = stats.get(key, 0) + died
        acks = read_acks(out)
        if not died and proc.returncode != 0:
            failures.append(f"run {run} ({key}#{nth}): append failed without a kill: {err.strip()[-300:]}")
            continue
        probs = check_recovered(root, original, sent, acks, f"{key}#{nth}")
        if probs:
            failures.append(f"run {run} ({key}#{nth}, killed={died}, {len(acks)} acks): " + "; ".join(probs[:3]))
        shutil.rmtree(root, ignore_errors=True)
    print(f"crash: {killed} of {RUNS} runs were killed mid-append; killed per kind {stats}")
    assert not failures, f"seed {SEED}:\n" + "\n".join(failures[:10])
    assert killed >= 50, f"only {killed} runs were killed (need at least 50)"
    assert stats.get("create:commitlog", 0) + stats.get("alloc:commitlog", 0) >= 5
    assert stats.get("create:index", 0) + stats.get("alloc:index", 0) >= 3


def _crashed_store(base: Path, script: Path, env: dict, rng: random.Random, run: int, sent: list[dict]) -> tuple[Path, list]:
    root = copy_store(NAME, base / f"w{run}")
    src = base / f"w{run}.jsonl"
    src.write_text("".join(json.dumps(m) + "\n" for m in sent))
    args = ["append", "--from", str(src), "--fsync", "always", "--json", str(root)]
    p = subprocess.run(child_cmd(script, "anywrite", "-", rng.randrange(50, 300), args), capture_output=True, text=True,
                       env=env, timeout=300)
    return root, read_acks(p.stdout)


@pytest.mark.parametrize("command", ["recover", "rebuild"])
def test_kill_during_repair(crash_env, command):
    """A kill in the middle of recover / rebuild apply: the next recover finishes the job."""
    base, script = crash_env
    original = [(o, s, m) for o, s, m in fuzzlib.model(NAME).clmsg]
    rng = random.Random(f"{SEED}:{command}")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    failures, killed = [], 0
    runs = 12
    for run in range(runs):
        sent = make_messages(rng, 50000 + run)
        root, acks = _crashed_store(base, script, env, rng, 1000 * (command == "rebuild") + run, sent)
        bk = base / f"bk-{command}-{run}"
        if command == "recover":
            args = ["recover", "--backup-dir", str(bk), str(root)]
        else:
            args = ["rebuild", "all", "--backup-dir", str(bk), str(root)]
        nth = rng.randrange(1, 40)
        p = subprocess.run(child_cmd(script, "anywrite", "-", nth, args), capture_output=True, text=True, env=env, timeout=300)
        died = p.returncode == -signal.SIGKILL
        killed += died
        if not died and p.returncode not in (0, 1):
            failures.append(f"run {run}: {command} exit {p.returncode} without a kill: {p.stderr.strip()[-300:]}")
        keep = os.environ.get("RMQSTORE_KEEP_FAILED")
        if keep:
            shutil.rmtree(Path(keep) / f"{command}{run}", ignore_errors=True)
            shutil.copytree(root, Path(keep) / f"{command}{run}")
        probs = check_recovered(root, original, sent, acks, f"{command} killed at write #{nth}")
        if probs:
            failures.append(f"run {run} ({command} killed={died} at write #{nth}): " + "; ".join(probs[:3]))
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(bk, ignore_errors=True)
    print(f"\n{command}: {killed} of {runs} runs killed mid-apply")
    assert not failures, f"seed {SEED}:\n" + "\n".join(failures[:8])
    assert killed >= runs // 2, f"only {killed} {command} runs were killed mid-apply"
