"""No read command changes a byte or an mtime of the store (run on writable copies, so a write would succeed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import tree_digest

RMQSTORE = [sys.executable, "-m", "rmqstore_cli"]
COMMANDS = [
    ["dump", "commitlog", "--body", "hex"],
    ["dump", "consumequeue", "--msg"],
    ["dump", "cqext"],
    ["dump", "index"],
    ["dump", "index", "--entries"],
    ["dump", "checkpoint"],
    ["dump", "store"],
    ["verify"],
]


@pytest.mark.parametrize("name,tables", [("4.9.3-crash", False), ("4.9.3-ext", True)])
def test_read_commands_leave_store_untouched(store_copy, name, tables):
    """Every dump subcommand and verify, as JSON; on one store also as tables (the terminal path)."""
    root = store_copy(name)
    before = tree_digest(root)
    for cmd in COMMANDS:
        limit = ["--limit", "30"] if cmd[0] == "dump" and cmd[1] not in ("checkpoint", "store") else []
        for extra in ([limit, ["--json"]] if tables else [["--json"]]):
            p = subprocess.run(RMQSTORE + cmd[:2] + [str(root)] + cmd[2:] + extra, capture_output=True, text=True)
            assert p.returncode in (0, 1), (cmd, p.stderr)
            if cmd == ["verify"] or (cmd == ["dump", "cqext"] and name == "4.9.3-crash"):
                continue  # nothing to report / no ext files
            assert p.stdout, cmd
    assert tree_digest(root) == before
