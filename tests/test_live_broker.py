"""Live broker: another process holds the store's lock exactly as the broker does (fcntl.lockf
LOCK_EX|LOCK_NB on byte 0, length 1, of ``lock``). Every writing command refuses with exit 4 and
changes nothing; every reading command still works and warns, in one stderr line, that the store is live.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import fuzzlib
from tests.conftest import broker_read, copy_store

NAME = "4.9.3-ext"  # has every kind of file: commitlog, consume queues, ext, index, checkpoint, config

HOLDER = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
print("locked", flush=True)
sys.stdin.read()  # hold until the parent closes our stdin (or kills us)
"""


class Broker:
    """A process that holds the lock like a running broker."""

    def __init__(self, root):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(root / "lock")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "locked"

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def live(tmp_path):
    root = copy_store(NAME, tmp_path / "store")
    # a backup folder to restore from, made while the store was not live
    bk = tmp_path / "bk"
    end = max(o + s for o, s, _ in fuzzlib.model(NAME).clmsg)
    last = fuzzlib.model(NAME).clmsg[-1][0]
    scratch = copy_store(NAME, tmp_path / "scratch")
    r = fuzzlib.run_cli(["truncate", "--offset", str(last), "--backup-dir", str(bk), str(scratch)])
    assert r.exit_code in (0, 1), r.stderr
    broker = Broker(root)
    yield root, bk, end, last, tmp_path
    broker.stop()


def writing_commands(root, bk, end, last, tmp):
    return {
        "append": ["append", "--topic", "LiveTopic", "--body", "x", str(root)],
        "append --from": ["append", "--from", str(tmp / "msgs.jsonl"), str(root)],
        "recover": ["recover", "--backup-dir", str(tmp / "b1"), str(root)],
        "truncate": ["truncate", "--offset", str(last), "--backup-dir", str(tmp / "b2"), str(root)],
        "rebuild all": ["rebuild", "all", "--backup-dir", str(tmp / "b3"), str(root)],
        "rebuild consumequeue": ["rebuild", "consumequeue", "--backup-dir", str(tmp / "b4"), str(root)],
        "rebuild index": ["rebuild", "index", "--backup-dir", str(tmp / "b5"), str(root)],
        "restore": ["restore", "--store", str(root), str(bk)],
        # a repair plan made under a running broker would describe a moving target: refused too
        "recover --dry-run": ["recover", "--dry-run", str(root)],
        "truncate --dry-run": ["truncate", "--dry-run", "--offset", str(last), str(root)],
    }


def reading_commands(root):
    rec = broker_read(NAME)["clmsg"][5]
    q = broker_read(NAME)["query"][0]
    return {
        "dump commitlog": ["dump", "commitlog", "--json", "--limit", "5", str(root)],
        "dump consumequeue": ["dump", "consumequeue", "--json", "--topic", "OracleTopicA", "--queue", "0", str(root)],
        "dump cqext": ["dump", "cqext", "--json", "--topic", "OracleTopicA", "--queue", "0", str(root)],
        "dump index": ["dump", "index", "--json", str(root)],
        "dump checkpoint": ["dump", "checkpoint", "--json", str(root)],
        "dump store": ["dump", "store", "--json", str(root)],
        "verify": ["verify", "--json", str(root)],
        "get": ["get", "--json", "--offset", str(rec["offset"]), str(root)],
        "index query": ["index", "query", "--json", "--topic", q["topic"], "--key", q["key"], str(root)],
        "stats": ["stats", "--json", str(root)],
    }


def test_writing_commands_refuse_with_exit_4(live):
    root, bk, end, last, tmp = live
    (tmp / "msgs.jsonl").write_text('{"topic":"LiveTopic","queueId":0,"bodyText":"x"}\n')
    before = fuzzlib.digest(root)
    wrong = {}
    for name, args in writing_commands(root, bk, end, last, tmp).items():
        r = fuzzlib.run_cli(args)
        probs = fuzzlib.problems_of(r, {4})
        if probs:
            wrong[name] = probs
        elif not r.stderr.strip() or len(r.stderr.strip().splitlines()) > 3:
            wrong[name] = [f"expected a short error on stderr, got {r.stderr!r}"]
        assert fuzzlib.digest(root) == before, f"{name} changed a live store"
    assert not wrong, wrong
    # no backup folder was created for a refused command
    assert not any((tmp / b).exists() for b in ("b1", "b2", "b3", "b4", "b5"))


def test_reading_commands_work_and_warn(live):
    root, *_ = live
    before = fuzzlib.digest(root)
    wrong = {}
    for name, args in reading_commands(root).items():
        r = fuzzlib.run_cli(args)
        probs = fuzzlib.problems_of(r, {0, 1})
        warns = [ln for ln in r.stderr.splitlines() if "live" in ln and "lock" in ln]
        if probs:
            wrong[name] = probs
        elif len(warns) != 1:
            wrong[name] = [f"expected one 'store is live' warning line on stderr, got {r.stderr!r}"]
        elif not r.stdout.strip():
            wrong[name] = ["printed nothing"]
    assert not wrong, wrong
    assert fuzzlib.digest(root) == before


def test_no_warning_once_the_broker_stopped(tmp_path):
    root = copy_store(NAME, tmp_path / "store")
    b = Broker(root)
    assert "live" in fuzzlib.run_cli(["dump", "checkpoint", "--json", str(root)]).stderr
    b.stop()
    r = fuzzlib.run_cli(["dump", "checkpoint", "--json", str(root)])
    assert r.exit_code == 0 and "live" not in r.stderr
    # and a writing command works again
    r = fuzzlib.run_cli(["append", "--topic", "LiveTopic", "--body", "x", str(root)])
    assert r.exit_code == 0, r.stderr


def test_lock_held_by_flock_is_not_the_broker_lock(tmp_path):
    """The broker's lock is a POSIX record lock; the probe must use fcntl, so a flock() holder (not what the
    broker takes) is invisible, while a lockf() holder is seen: this pins the probe to the broker's kind."""
    root = copy_store(NAME, tmp_path / "store")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.replace("fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)",
                                                                     "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)"),
                               str(root / "lock")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    try:
        r = fuzzlib.run_cli(["dump", "checkpoint", "--json", str(root)])
        assert "live" not in r.stderr
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
