"""``rebuild consumequeue`` and ``rebuild all`` on a timer store. The timer queue rmq_sys_wheel_timer/0 is
dispatched like any queue: each unit goes at its record's own QUEUEOFFSET (nothing is renumbered), so the
offsets timercheck counts in (lastTimerQueueOffset / masterTimerQueueOffset) still name the same records.
On both broker-written samples, rebuilding after deleting consumequeue/ gives back the broker's queue files
byte for byte (the timer queue and the real topics'), verify finds what it found before, and the timer
store reads the same (dump timer --json unchanged)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.conftest import shared_store, tree_digest
from tests.test_timer import jsonl, run

SAMPLES = ("timer-5.3.3", "timer-5.3.3-crash")


def _codes(root) -> list:
    p = run("verify", root, "--json")
    assert p.returncode in (0, 1), p.stderr
    return sorted((o["code"], o["severity"], o.get("path"), o.get("offset")) for o in jsonl(p.stdout) if "code" in o)


def _cq_size(name: str) -> int:
    """The broker's consume-queue file size on the sample (the geometry the deleted folder took with it)."""
    d = os.path.join(shared_store(name), "consumequeue", "rmq_sys_wheel_timer", "0")
    return os.path.getsize(os.path.join(d, sorted(os.listdir(d))[0]))


@pytest.mark.parametrize("what", ["consumequeue", "all"])
@pytest.mark.parametrize("name", SAMPLES)
def test_rebuilt_consume_queues_are_the_brokers(store_copy, tmp_path, name, what):
    root = store_copy(name)
    timer_before = run("dump", "timer", root, "--json").stdout
    findings_before = _codes(root)
    cp_before = open(os.path.join(root, "config", "timercheck"), "rb").read()
    shutil.rmtree(os.path.join(root, "consumequeue"))
    p = run("rebuild", what, root, "--cq-file-size", _cq_size(name), "--yes", "--backup-dir", tmp_path / "bk")
    assert p.returncode == 0, p.stdout + p.stderr
    truth = tree_digest(os.path.join(shared_store(name), "consumequeue"))
    got = tree_digest(os.path.join(root, "consumequeue"))
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in truth.items()}
    assert any(k.startswith("rmq_sys_wheel_timer") for k in truth)
    assert _codes(root) == findings_before
    assert run("dump", "timer", root, "--json").stdout == timer_before
    assert open(os.path.join(root, "config", "timercheck"), "rb").read() == cp_before
    # the checkpoint's queue offset still names the end of what the timer read: the queue ends there
    cp = jsonl(timer_before)[-2]
    units = [o for o in jsonl(run("dump", "consumequeue", root, "--topic", "rmq_sys_wheel_timer", "--json").stdout)]
    assert cp["type"] == "timercheck" and max(u["queueOffset"] for u in units) + 1 >= cp["lastTimerQueueOffset"] > 0


def test_rebuild_consumequeue_dry_run_changes_nothing(store_copy):
    root = store_copy("timer-5.3.3")
    before = tree_digest(root)
    p = run("rebuild", "consumequeue", root, "--dry-run")
    assert p.returncode == 0, p.stdout + p.stderr
    assert tree_digest(root) == before
