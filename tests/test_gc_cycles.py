"""The command line runs Python's cyclic garbage collector less often than Python does by default
(``app.COLLECT_AFTER``): that is safe for memory only because a command's walk makes no reference cycles,
so that nothing waits for the collector but the few objects the imports leave. These tests hold both."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys

import pytest

from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify import commitlog as verify_commitlog
from tests.conftest import REPO

DEMO = REPO / "fixtures" / "stores" / "4.9.3-clean"
WINDOW = 4096  # ~900 windows over the demo store's 56 segments: a cycle made per window or per chunk shows


def _cyclic_garbage(run) -> int:
    """Objects only the cyclic collector would free, left by ``run()`` (collected first, collector off meanwhile)."""
    gc.collect()
    gc.disable()
    try:
        run()
        return gc.collect()
    finally:
        gc.enable()


def _windows() -> int:
    with Store.open(str(DEMO)) as st:
        return sum(len(verify_commitlog.window_starts(s, st.commitlog.segments.file_size, WINDOW))
                   for s in st.commitlog.segments.segments)


@pytest.mark.parametrize("command", ["verify", "recover-plan"])
def test_a_walk_leaves_no_cyclic_garbage_per_window(tmp_path, monkeypatch, command):
    """verify and recover's plan (the walk along, the derived check, the dispatch prediction) over ~900 windows
    leave the collector no more than over one window a segment: what they leave (a store's files and their
    mapping budgets: a few hundred objects) is per command, not per window or chunk."""
    from rmqstore_cli.engine.repair.recovery import plan_recovery
    from rmqstore_cli.engine.verify.pipeline import verify_store

    root = tmp_path / "store"
    shutil.copytree(DEMO, root)
    if command == "recover-plan":
        (root / "abort").write_bytes(b"")  # a crash: the whole log is walked and its dispatch predicted

    def run():
        with Store.open(str(root)) as st:
            if command == "verify":
                verify_store(st)
            else:
                plan_recovery(st, with_verify=True)

    run()  # imports and first-use caches out of the way
    left = {}
    for window in (WINDOW, 1 << 20):
        monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", window)
        left[window] = _cyclic_garbage(run)
    windows = _windows()
    print(f"{command}: objects left for the collector {left} (windows of {WINDOW} bytes: {windows})")
    assert windows > 500
    assert left[WINDOW] <= left[1 << 20] + 50


def test_a_cycle_per_window_would_be_seen():
    """The measure above can fail: a reference cycle made for every window is counted."""
    from rmqstore_cli.engine.verify.pipeline import verify_store

    def run():
        with Store.open(str(DEMO)) as st:
            verify_store(st)
            for seg in st.commitlog.segments.segments:
                for _ in verify_commitlog.window_starts(seg, st.commitlog.segments.file_size, WINDOW):
                    node: dict = {}
                    node["self"] = node

    assert _cyclic_garbage(run) >= 500  # against the 50 allowed above


PROBE = """
import atexit, gc, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(gc.get_threshold())))
sys.argv[0] = "rmqstore"
from rmqstore_cli.app import run
run()
"""


def test_the_command_line_collects_less_often(tmp_path):
    """The process entry (the `rmqstore` script, `python -m rmqstore_cli`) raises the youngest generation's
    threshold before the command runs, and keeps the older generations' ratios."""
    from rmqstore_cli import app

    out = tmp_path / "threshold.json"
    p = subprocess.run([sys.executable, "-c", PROBE, str(out), "verify", str(DEMO)], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    young, older, oldest = json.loads(out.read_text())
    assert young >= app.COLLECT_AFTER > gc.get_threshold()[0]
    assert (older, oldest) == gc.get_threshold()[1:]
