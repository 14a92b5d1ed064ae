"""rebuild all on copies whose consumequeue/, consumequeue_ext/ and index/ were deleted:
consume queue and ext files byte-identical to the broker's, index files with identical content."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.store import Store

from .conftest import CLEAN_STORES, STORES, shared_store, tree_digest

runner = CliRunner()


def geometry(name: str) -> list[str]:
    spec = {"4.9.3-ext": "spec-sample-ext.json", "5.3.3-v2topic": "spec-v2topic.json"}.get(name, "spec-sample.json")
    c = json.loads((STORES / spec).read_text())["storeConfig"]
    args = ["--cq-file-size", c["mappedFileSizeConsumeQueue"], "--index-slots", c["maxHashSlotNum"],
            "--index-entries", c["maxIndexNum"]]
    if c.get("enableConsumeQueueExt"):
        args += ["--ext", "--ext-file-size", c["mappedFileSizeConsumeQueueExt"]]
    return [str(a) for a in args]


def files_under(root, sub):
    base = root / sub
    out = {}
    for dp, _, fn in os.walk(base):
        for f in fn:
            out[os.path.relpath(os.path.join(dp, f), base)] = open(os.path.join(dp, f), "rb").read()
    return out


@pytest.mark.parametrize("name", CLEAN_STORES)
def test_rebuild_all_matches_broker(name, store_copy):
    rebuild_all_matches_broker(name, store_copy(name))


def rebuild_all_matches_broker(name: str, root, *options: str) -> None:
    """``rebuild all`` (with ``options``) of ``root``, a copy of shared store ``name`` without its derived files,
    writes consume queues, ext files and index files byte for byte as the broker wrote them."""
    for sub in ("consumequeue", "consumequeue_ext", "index"):
        shutil.rmtree(root / sub, ignore_errors=True)
    r = runner.invoke(app, ["rebuild", "all", str(root), *options, *geometry(name)])
    assert r.exit_code == 0, r.output
    src = shared_store(name)
    assert files_under(root, "consumequeue") == files_under(src, "consumequeue")
    assert files_under(root, "consumequeue_ext") == files_under(src, "consumequeue_ext")
    with Store.open(str(root)) as a, Store.open(str(src)) as b:
        fa, fb = a.index.files, b.index.files
        assert len(fa) == len(fb)
        for x, y in zip(fa, fb):
            assert x.header() == y.header()
            assert bytes(x.segment.buffer()) == bytes(y.segment.buffer())


def test_rebuild_replaces_and_restores(store_copy):
    root = store_copy("4.9.3-clean")
    qfile = root / "consumequeue" / "OracleTopicA" / "1" / "00000000000000000000"
    with open(qfile, "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 40)
    damaged = {k: v[0] for k, v in tree_digest(root).items()}
    r = runner.invoke(app, ["rebuild", "consumequeue", str(root), "--topic", "OracleTopicA"])
    assert r.exit_code == 0, r.output
    src = shared_store("4.9.3-clean")
    assert files_under(root, "consumequeue/OracleTopicA") == files_under(src, "consumequeue/OracleTopicA")
    parent = root.parent / (root.name + ".rmqstore-backup")
    assert runner.invoke(app, ["restore", str(parent / os.listdir(parent)[0])]).exit_code == 0
    assert {k: v[0] for k, v in tree_digest(root).items()} == damaged


def test_rebuild_from_offset_keeps_units_before_and_restores_units_after(store_copy):
    """--from-offset PHY: units of records before PHY are kept as they are on disk (a full rebuild
    would rewrite them); units from PHY on are rebuilt to the broker's bytes."""
    import numpy as np

    from .conftest import broker_read

    name = "4.9.3-clean"
    root = store_copy(name)
    offsets = [m["offset"] for m in broker_read(name)["clmsg"]]
    cut = offsets[len(offsets) * 3 // 5]
    original = files_under(shared_store(name), "consumequeue")
    marked = None
    for rel in original:
        path = root / "consumequeue" / rel
        units = np.frombuffer(bytearray(path.read_bytes()), dtype=[("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
        after = (units["phy"] >= cut) & (units["size"] > 0)
        units[after] = 0  # the queue ends before the cut, as after a crash
        before = np.flatnonzero((units["phy"] < cut) & (units["size"] > 0))
        if marked is None and len(before):
            units["tags"][before[0]] = 424242  # a unit before the cut that --from-offset must not touch
            marked = (rel, int(before[0]))
        path.write_bytes(units.tobytes())
    assert marked is not None
    r = runner.invoke(app, ["rebuild", "consumequeue", str(root), "--from-offset", str(cut), "-y",
                            "--backup-dir", str(root.parent / "bk")] + geometry(name))
    # the kept, deliberately wrong unit is the one thing verify-after-apply reports
    assert r.exit_code == 1 and "1 errors" in r.output and "CQ_TAGS" in r.output, r.output
    rebuilt = files_under(root, "consumequeue")
    assert set(rebuilt) == set(original)
    for rel, data in original.items():
        if rel != marked[0]:
            assert rebuilt[rel] == data, rel
    got = np.frombuffer(rebuilt[marked[0]], dtype=[("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
    want = np.frombuffer(original[marked[0]], dtype=got.dtype)
    assert int(got["tags"][marked[1]]) == 424242  # kept: it indexes a record before the cut
    diff = np.flatnonzero(got != want)
    assert diff.tolist() == [marked[1]]  # everything else in that file equals the broker's
