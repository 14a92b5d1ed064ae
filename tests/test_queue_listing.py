"""Thousands of queues: a command lists the store's queue folders a few times, never once per queue. ``diff``
asked for the list of each side's queues once per queue it compared (quadratic: 2048 queues took 22.8 s, 8192
queues minutes); each command here is run on a broker-written store with the folder listing counted."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine import store as store_module
from rmqstore_cli.engine.derived import consumequeue
from tests.conftest import require_shared, shared_store

STORE = "4.9.3-clean"  # 13 queues
COMMANDS = [["verify", "{s}"], ["stats", "{s}"], ["diff", "{s}", "{s}"], ["dump", "consumequeue", "{s}"],
            ["dump", "store", "{s}"], ["recover", "{s}", "--dry-run"], ["rebuild", "all", "{s}", "--dry-run"],
            ["truncate", "{s}", "--offset", "0", "--dry-run"], ["repair", "config", "{s}", "--dry-run"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(w for w in c if w != "{s}"))
def test_queue_folders_listed_a_few_times(monkeypatch, command):
    require_shared()
    root = str(shared_store(STORE))
    real, calls = consumequeue.list_queues, []

    def counting(*a, **k):
        out = real(*a, **k)
        calls.append(len(out))
        return out

    monkeypatch.setattr(consumequeue, "list_queues", counting)
    monkeypatch.setattr(store_module, "list_queues", counting)
    r = CliRunner().invoke(app, [w.replace("{s}", root) for w in command])
    assert r.exit_code in (0, 1), r.output
    queues = max(calls, default=0)
    assert queues >= 10, calls  # the listing was counted, on a store with queues
    assert len(calls) <= 8 < queues, calls
