"""Bad input: a one-line error on stderr and the documented exit code, never a traceback."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

RMQSTORE = [sys.executable, "-m", "rmqstore_cli"]
READ_COMMANDS = [["dump", "commitlog"], ["dump", "consumequeue"], ["dump", "cqext"], ["dump", "index"],
                 ["dump", "checkpoint"], ["dump", "store"], ["verify"]]


def run(cmd, path, *extra):
    return subprocess.run(RMQSTORE + cmd + [str(path), *extra], capture_output=True, text=True, timeout=60)


def one_line_error(p, code: int) -> None:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rmqstore:"), p.stderr


def _foreign(tmp_path):
    d = tmp_path / "foreign"
    d.mkdir()
    (d / "notes.txt").write_text("not a store")
    (d / "sub").mkdir()
    return d


def _empty(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    return d


def _file(tmp_path):
    f = tmp_path / "afile"
    f.write_bytes(b"hello")
    return f


def _missing(tmp_path):
    return tmp_path / "does-not-exist"


@pytest.mark.parametrize("cmd", READ_COMMANDS, ids=lambda c: "-".join(c))
def test_foreign_directory_is_a_usage_error(tmp_path, cmd):
    one_line_error(run(cmd, _foreign(tmp_path)), 3)


# Every command opens the store the same way (commands.common.open_store); two suffice for the rest.
@pytest.mark.parametrize("make", [_empty, _file, _missing], ids=["empty", "file", "missing"])
@pytest.mark.parametrize("cmd", [["dump", "commitlog"], ["verify"]], ids=lambda c: "-".join(c))
def test_not_a_store_is_a_usage_error(tmp_path, make, cmd):
    one_line_error(run(cmd, make(tmp_path)), 3)


@pytest.fixture
def random_commitlog(tmp_path):
    root = tmp_path / "random"
    (root / "commitlog").mkdir(parents=True)
    rnd = random.Random(1234)
    data = bytes(rnd.getrandbits(8) for _ in range(65536))
    (root / "commitlog" / "00000000000000000000").write_bytes(data)
    return root


def test_random_commitlog_dump_is_corruption(random_commitlog):
    p = run(["dump", "commitlog"], random_commitlog, "--json")
    one_line_error(p, 2)
    assert p.stdout == ""


def test_random_commitlog_verify_reports_garbage(random_commitlog):
    p = run(["verify"], random_commitlog, "--json")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    garbage = [r for r in rows if r["code"] == "CL_GARBAGE"]
    assert garbage and garbage[0]["offset"] == 0
    assert garbage[0]["path"] == os.path.join(str(random_commitlog), "commitlog", "00000000000000000000")


@pytest.mark.parametrize("cmd", [c for c in READ_COMMANDS if c != ["dump", "commitlog"]], ids=lambda c: "-".join(c))
def test_random_commitlog_other_commands_do_not_crash(random_commitlog, cmd):
    p = run(cmd, random_commitlog, "--json")
    assert "Traceback" not in p.stderr
    assert p.returncode in (0, 1, 2)
    assert len(p.stderr.strip().splitlines()) <= 1


def test_bad_option_values(tmp_path):
    from tests.conftest import shared_store

    one_line_error(run(["dump", "commitlog"], shared_store("5.3.3-v2topic"), "--body", "rot13"), 3)
    one_line_error(run(["dump", "consumequeue"], shared_store("5.3.3-v2topic"), "--topic", "NoSuchTopic"), 1)
