"""``append --from`` and store times: a replayed message older than the log's newest store time is refused
(exit 3, the lines before it kept) unless ``--keep-store-times``; then it is written as given and verify
reports the backstep (CL_STORE_TIME), as for a broker whose clock went back.

Store times come from the broker's read-back of the shared store, never from the code under test.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.store import Store

from .conftest import broker_read, tree_digest

NAME = "4.9.3-clean"


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def replay_lines(shared, first: int, count: int) -> list[str]:
    """`dump commitlog --json --body hex` lines of records ``first .. first+count-1`` of a shared store."""
    offset = broker_read(NAME)["clmsg"][first]["offset"]
    r = run("dump", "commitlog", shared, "--json", "--body", "hex", "--from", offset, "--limit", count)
    assert r.exit_code == 0, r.output
    return [ln for ln in r.stdout.splitlines() if ln.startswith("{")]


def content(root) -> dict:
    return {k: v[0] for k, v in tree_digest(root).items() if k != "lock"}


def newest_store_time() -> int:
    return max(m["msg"]["storeTimestamp"] for m in broker_read(NAME)["clmsg"])


def test_replayed_older_store_time_is_refused(store_copy, tmp_path):
    root = store_copy(NAME)
    src = tmp_path / "old.jsonl"
    src.write_text("\n".join(replay_lines(root, 0, 3)) + "\n")
    before = content(root)
    r = run("append", root, "--from", src)
    assert r.exit_code == 3, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "line 1" in lines[0] and "--keep-store-times" in lines[0], r.output
    assert str(newest_store_time()) in lines[0]
    assert content(root) == before
    assert not (root / "abort").exists()
    assert run("verify", root).exit_code == 0


def test_refused_line_keeps_the_lines_before_it(store_copy, tmp_path):
    root = store_copy(NAME)
    recs = broker_read(NAME)["clmsg"]
    new = json.loads(replay_lines(root, 0, 1)[0])
    new["storeTimestamp"] = newest_store_time() + 1000
    old = replay_lines(root, 5, 1)[0]
    src = tmp_path / "mixed.jsonl"
    src.write_text(json.dumps(new) + "\n" + old + "\n")
    r = run("append", root, "--from", src, "--quiet")
    assert r.exit_code == 3 and "line 2" in r.output, r.output
    with Store.open(str(root)) as st:
        got = list(st.commitlog.records())
    assert len(got) == len(recs) + 1 and got[-1]["storeTimestamp"] == newest_store_time() + 1000
    assert not (root / "abort").exists()
    assert run("verify", root).exit_code == 0


def test_keep_store_times_writes_them_and_verify_explains(store_copy, tmp_path):
    root = store_copy(NAME)
    recs = broker_read(NAME)["clmsg"]
    src = tmp_path / "old.jsonl"
    src.write_text("\n".join(replay_lines(root, 0, 3)) + "\n")
    r = run("append", root, "--from", src, "--keep-store-times", "--quiet")
    assert r.exit_code == 0, r.output
    with Store.open(str(root)) as st:
        got = list(st.commitlog.records())
    assert [g["storeTimestamp"] for g in got[-3:]] == [m["msg"]["storeTimestamp"] for m in recs[:3]]
    r = run("verify", root, "--json")
    assert r.exit_code == 1
    found = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    severe = [f for f in found if f["severity"] != "info"]
    assert [f["code"] for f in severe] == ["CL_STORE_TIME"], severe
    assert severe[0]["phyOffset"] == got[-3]["offset"]
    assert "clock" in severe[0]["message"] and "--keep-store-times" in severe[0]["message"]
