"""``dump commitlog --follow`` on a DLedger store: a copy of a broker-written sample is cut back to a prefix of its
entries, then grown again entry by entry with the sample's own bytes, as the leader appends them (one entry torn
in two writes, a blank and a new data file at each roll); the followed messages are the broker's read-back.

Waits are generous upper bounds (a busy CI machine), never assertions on speed."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from .conftest import STORES, copy_store
from .test_dledger_read import read_back
from .test_follow import WAIT, _collect, _reader, interruptible

CLI = [sys.executable, "-m", "rmqstore_cli"]
SAMPLE = "dledger-4.9.3-clean"
KEEP = 300  # entries left in the copy before following starts


def _data_dir(root) -> str:
    [d] = [os.path.join(root, n, "data") for n in os.listdir(root) if n.startswith("dledger-")]
    return d


def _start(root, *extra) -> tuple[subprocess.Popen, queue.Queue]:
    p = subprocess.Popen(CLI + ["dump", "commitlog", str(root), "--follow", "--json", "--body", "hex", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    sink: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(p.stdout, sink), daemon=True).start()
    # stderr drained as it comes: a full pipe would block the follower, which then never sees the SIGINT through
    p.err_lines = []  # type: ignore[attr-defined]
    p.err_thread = threading.Thread(target=lambda: p.err_lines.extend(p.stderr), daemon=True)  # type: ignore[attr-defined]
    p.err_thread.start()
    return p, sink


def _stop(p: subprocess.Popen) -> str:
    p.send_signal(signal.SIGINT)
    try:
        rc = p.wait(timeout=WAIT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise AssertionError(f"the follower did not stop within {WAIT} s of SIGINT; its stderr: "
                             f"{''.join(p.err_lines)[-3000:]!r}") from None
    p.err_thread.join(WAIT)  # the rest of stderr, up to its end
    err = "".join(p.err_lines)
    assert rc == 0 and "Traceback" not in err, err
    return err


def _key(m: dict) -> tuple:
    return m["commitLogOffset"], m["topic"], m["queueId"], m["queueOffset"], m["storeTimestamp"]


def _ours(line: str) -> tuple:
    m = json.loads(line)
    return _key(m) + (hashlib.sha256(bytes.fromhex(m["bodyHex"])).hexdigest(),)


def test_follow_sees_entries_the_leader_appends(tmp_path):
    entries = read_back(SAMPLE, "broker-read.jsonl.gz")["dledger_entry"]
    assert len(entries) > KEEP + 1000
    src = _data_dir(STORES / SAMPLE / "store")
    names = sorted(os.listdir(src))
    file_size = os.path.getsize(os.path.join(src, names[0]))
    original = {int(n): open(os.path.join(src, n), "rb").read() for n in names}
    root = copy_store(SAMPLE, tmp_path / "store")
    data = _data_dir(root)
    # the copy holds the first KEEP entries: the rest of their file zeroed, the later data files gone
    cut = entries[KEEP]["pos"]
    first_file = cut - cut % file_size
    for n in names:
        if int(n) > first_file:
            os.remove(os.path.join(data, n))
    with open(os.path.join(data, names[0] if first_file == 0 else "%020d" % first_file), "r+b") as f:
        f.seek(cut - first_file)
        f.write(bytes(file_size - (cut - first_file)))

    tail, tail_sink = _start(root)  # from the end, like tail -f
    whole, whole_sink = _start(root, "--from", "0")
    try:
        head = _collect(whole_sink, KEEP, time.monotonic() + WAIT)
        assert len(head) == KEEP
        time.sleep(1.0)
        assert tail.poll() is None and tail_sink.empty()
        written_to = cut  # the leader's write position
        torn = entries[KEEP + 5]["pos"]
        for e in entries[KEEP:]:
            pos, size = e["pos"], e["size"]
            base = pos - pos % file_size
            if base != written_to - written_to % file_size:  # roll: the blank, then the next file
                prev = written_to - written_to % file_size
                with open(os.path.join(data, "%020d" % prev), "r+b") as f:
                    f.seek(written_to - prev)
                    f.write(original[prev][written_to - prev:])
                with open(os.path.join(data, "%020d" % base), "wb") as f:
                    f.truncate(file_size)
            blob = original[base][pos - base:pos - base + size]
            with open(os.path.join(data, "%020d" % base), "r+b") as f:
                f.seek(pos - base)
                if pos == torn:  # header and half the message first; the rest after a few polls
                    f.write(blob[:size // 2])
                    f.flush()
                    time.sleep(0.5)
                    f.seek(pos - base + size // 2)
                f.write(blob[size // 2:] if pos == torn else blob)
            written_to = pos + size
        rest = len(entries) - KEEP
        got_tail = _collect(tail_sink, rest, time.monotonic() + WAIT)
        got_whole = head + _collect(whole_sink, rest, time.monotonic() + WAIT)
    finally:
        errs = [_stop(tail), _stop(whole)]
    want = [_key(e["message"]) + (e["message"]["bodySha256"],) for e in entries]
    assert [_ours(x) for x in got_whole] == want
    assert [_ours(x) for x in got_tail] == want[KEEP:]
    assert len(os.listdir(data)) == len(names)  # it did follow the rolls
    assert errs == ["", ""]


def test_follow_goes_past_a_damaged_entry_that_later_entries_follow():
    """A message failing its CRC inside an entry with entries after it is finished, not being written: followed
    past, and passed on as the plain listing passes it on (the broker's reput dispatches it without the CRC)."""
    root = STORES / "dledger-4.9.3-torn" / "store-corrupt"
    damage = {d["variant"]: d for d in json.loads((STORES / "dledger-4.9.3-torn" / "damage.json").read_text())}
    bad = damage["corrupt"]["entryPos"] + 48
    listing = subprocess.run(CLI + ["dump", "commitlog", str(root), "--json", "--body", "hex"], capture_output=True,
                             text=True, timeout=300).stdout.splitlines(keepends=True)
    p, sink = _start(root, "--from", "0")
    try:
        got = _collect(sink, len(listing), time.monotonic() + WAIT)
    finally:
        _stop(p)
    assert len(listing) > 1000 and bad in {json.loads(x)["commitLogOffset"] for x in listing[:-1]}
    assert got == listing
