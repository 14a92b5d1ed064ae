"""salvage on a store with one corrupted record in the middle of a segment: every other record
is rescued (the broker read-back minus one), the new store passes verify, the source is untouched."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.store import Store

from .conftest import broker_read, tree_digest

runner = CliRunner()
SEG = 65536


def corrupt_middle_record(root, name):
    recs = broker_read(name)["clmsg"]
    seg = 20 * SEG
    in_seg = [m for m in recs if seg <= m["offset"] < seg + SEG]
    victim = in_seg[len(in_seg) // 2]
    pos = victim["offset"] - seg + 100 + len(victim["msg"]["bodyHex"]) // 4
    path = root / "commitlog" / ("%020d" % seg)
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0xA5]))
    return recs, victim


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_salvage_to_new_store(name, store_copy, tmp_path):
    root = store_copy(name)
    recs, victim = corrupt_middle_record(root, name)
    before = tree_digest(root)
    new = tmp_path / "new"
    r = runner.invoke(app, ["salvage", str(root), "--to", str(new), "--json"])
    assert r.exit_code == 1, r.output  # one range skipped
    rep = json.loads(r.stdout.splitlines()[-1])
    assert rep["records"] == len(recs) - 1
    assert rep["skippedRanges"][0][:2] == [victim["offset"], victim["offset"] + victim["size"]]
    assert tree_digest(root) == before  # never writes the source
    v = runner.invoke(app, ["verify", str(new)])
    assert v.exit_code == 0, v.output
    with Store.open(str(new)) as st:
        got = [(m["topic"], m["queueId"], m["storeTimestamp"], m["propertiesRaw"]) for m in st.commitlog.records(with_body=False)]
    want = [(m["msg"]["topic"], m["msg"]["queueId"], m["msg"]["storeTimestamp"], m["msg"]["propertiesRaw"])
            for m in recs if m["offset"] != victim["offset"]]
    assert got == want


def test_salvage_jsonl(store_copy, tmp_path):
    root = store_copy("4.9.3-clean")
    recs, victim = corrupt_middle_record(root, "4.9.3-clean")
    out = tmp_path / "rescued.jsonl"
    r = runner.invoke(app, ["salvage", str(root), "--jsonl", str(out)])
    assert r.exit_code == 1
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["offset"] for x in lines] == [m["offset"] for m in recs if m["offset"] != victim["offset"]]
    by_off = {m["offset"]: m["msg"] for m in recs}
    for x in lines[::97]:
        assert x["bodyHex"] == by_off[x["offset"]]["bodyHex"]
        assert x["propertiesRaw"] == by_off[x["offset"]]["propertiesRaw"]


def test_salvage_jsonl_to_a_device_that_cannot_be_synced(store_copy):
    """`--jsonl /dev/null` (or a pipe): fsync is for regular files; a device says EINVAL and the
    salvage must still succeed (exit 0 on a clean store), not fail after writing everything."""
    root = store_copy("4.9.3-clean")
    r = runner.invoke(app, ["salvage", str(root), "--jsonl", "/dev/null"])
    assert r.exit_code == 0, r.output
