"""``dump commitlog --follow`` sees what another process appends, across segment rolls.

Waits are generous upper bounds (a busy CI machine), never assertions on speed: the latency seen
is printed for the record.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from .conftest import tree_digest

CLI = [sys.executable, "-m", "rmqstore_cli"]
WAIT = 60.0


def interruptible() -> None:
    """Popen's preexec_fn: SIGINT at its default and not blocked in the follower, as a terminal user's Ctrl-C finds
    it. A process started with SIGINT ignored (a job a non-interactive shell runs in the background: CI runners,
    ``cmd &``) or blocked never turns it into KeyboardInterrupt: the follower would not stop, as ``tail -f`` would
    not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _reader(stream, sink: queue.Queue):
    for line in stream:  # one reader for the whole pipe: nothing buffered is lost
        sink.put(line)
    sink.put(None)


def _collect(sink: queue.Queue, n: int, deadline: float) -> list[str]:
    got = []
    while len(got) < n and time.monotonic() < deadline:
        try:
            line = sink.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            break
        got.append(line)
    return got


def test_follow_sees_appends_from_another_process_and_rolls(store_copy):
    root = store_copy("4.9.3-clean")
    end_before = sorted(os.listdir(root / "commitlog"))
    follower = subprocess.Popen(CLI + ["dump", "commitlog", str(root), "--follow", "--json", "--body", "hex"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    sink: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(follower.stdout, sink), daemon=True).start()
    try:
        time.sleep(2.0)  # let it reach the end of the log (it starts there, like tail -f)
        assert follower.poll() is None, follower.stderr.read()
        t0 = time.monotonic()
        p = subprocess.run(CLI + ["append", str(root), "--topic", "FollowT", "--body", "first", "--quiet"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        first = _collect(sink, 1, time.monotonic() + WAIT)
        print(f"first appended message seen after {time.monotonic() - t0:.3f} s")
        assert len(first) == 1
        m = json.loads(first[0])
        assert m["topic"] == "FollowT" and bytes.fromhex(m["bodyHex"]) == b"first"
        # enough 1 KiB messages to roll over several 64 KiB segments
        lines = "".join(json.dumps({"topic": "FollowT", "queueId": 1, "bodyHex": ("%04d" % i) * 256,
                                    "properties": {"KEYS": f"k{i}"}}) + "\n" for i in range(150))
        p = subprocess.run(CLI + ["append", str(root), "--from", "-", "--quiet"], input=lines, capture_output=True,
                           text=True)
        assert p.returncode == 0, p.stderr
        rest = _collect(sink, 150, time.monotonic() + WAIT)
        assert len(rest) == 150
        assert [json.loads(x)["properties"]["KEYS"] for x in rest] == [f"k{i}" for i in range(150)]
        assert len(os.listdir(root / "commitlog")) >= len(end_before) + 2  # it did follow segment rolls
        # exactly what a plain dump of the same range prints
        dump = subprocess.run(CLI + ["dump", "commitlog", str(root), "--json", "--body", "hex", "--from",
                                     str(m["commitLogOffset"])], capture_output=True, text=True)
        assert dump.stdout.splitlines(keepends=True) == first + rest
    finally:
        follower.send_signal(signal.SIGINT)
        try:
            rc = follower.wait(timeout=WAIT)
        finally:
            if follower.poll() is None:
                follower.kill()
    err = follower.stderr.read()
    assert rc == 0 and "Traceback" not in err, err


def test_follow_is_read_only_and_takes_no_lock(store_copy):
    from .conftest import shared_store

    original = shared_store("5.3.3-clean")
    before = tree_digest(original)
    root = store_copy("5.3.3-clean")
    followers = [subprocess.Popen(CLI + ["dump", "commitlog", str(r), "--follow"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, preexec_fn=interruptible) for r in (original, root)]
    try:
        time.sleep(2.0)
        # a writer still gets the store's lock while it is followed (exit 4 would mean it was taken)
        p = subprocess.run(CLI + ["append", str(root), "--topic", "T", "--body", "x", "--quiet"], capture_output=True,
                           text=True)
        assert p.returncode == 0, p.stderr
    finally:
        for f in followers:
            f.send_signal(signal.SIGINT)
            f.wait(timeout=WAIT)
    assert [f.returncode for f in followers] == [0, 0]
    assert tree_digest(original) == before


def test_follow_rejects_until():
    from .conftest import shared_store

    p = subprocess.run(CLI + ["dump", "commitlog", str(shared_store("4.9.3-clean")), "--follow", "--until", "0"],
                       capture_output=True, text=True)
    assert p.returncode == 3 and "--follow" in p.stderr
