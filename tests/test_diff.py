"""``rmqstore diff`` on broker-written stores and copies of them cut or changed by the test."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from .conftest import broker_read, copy_store, shared_store, tree_digest

SEED = int(os.environ.get("RMQSTORE_DIFF_SEED", "4242"))


def run(*args):
    return subprocess.run([sys.executable, "-m", "rmqstore_cli", *args], capture_output=True, text=True)


def _diff(a, b):
    p = run("diff", str(a), str(b), "--json")
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, json.loads(p.stdout)


def _cut_at(root, offset):
    """A slave that has not received anything from ``offset`` on: the rest of that commitlog file
    is zeros (pre-allocated, never written) and later files do not exist yet."""
    cl = root / "commitlog"
    for name in sorted(os.listdir(cl)):
        start = int(name)
        path = cl / name
        if start > offset:
            path.unlink()
        elif start + os.path.getsize(path) > offset:
            with open(path, "r+b") as f:
                f.seek(offset - start)
                f.write(b"\0" * (start + os.path.getsize(path) - offset))


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean", "5.3.3-v2topic"])
def test_copy_is_identical(name, tmp_path):
    b = copy_store(name, tmp_path / "b")
    rc, d = _diff(shared_store(name), b)
    assert rc == 0 and d["relation"] == "identical" and d["firstDivergentOffset"] is None
    end = max(o["offset"] + o["size"] for o in broker_read(name)["clmsg"])
    assert d["commitlog"]["a"]["maxOffset"] == d["commitlog"]["b"]["maxOffset"] == end
    assert all(q["same"] for q in d["queues"]) and all(f["state"] == "same" for f in d["indexFiles"])


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_truncated_copy_is_a_prefix_at_the_cut(name, tmp_path):
    print(f"seed {SEED}")
    recs = broker_read(name)["clmsg"]
    cut = random.Random(f"{SEED}-{name}").choice(recs[len(recs) // 4 : -len(recs) // 4])["offset"]
    b = copy_store(name, tmp_path / "b")
    _cut_at(b, cut)
    before = tree_digest(shared_store(name)), tree_digest(b)
    rc, d = _diff(shared_store(name), b)
    assert rc == 0, d
    assert d["relation"] == "prefix" and d["longer"] == "a"
    assert d["commitlog"]["b"]["maxOffset"] == cut
    assert d["commitlog"]["a"]["maxOffset"] == max(o["offset"] + o["size"] for o in recs)
    # either order: still a prefix, now the first store is the shorter one
    rc2, d2 = _diff(b, shared_store(name))
    assert rc2 == 0 and d2["relation"] == "prefix" and d2["longer"] == "b"
    assert (tree_digest(shared_store(name)), tree_digest(b)) == before  # diff never writes


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-v2topic"])
def test_one_changed_body_byte_names_its_record(name, tmp_path):
    print(f"seed {SEED}")
    recs = [o for o in broker_read(name)["clmsg"] if o["msg"]["bodyLen"] > 4]
    rec = random.Random(f"{SEED}-{name}-byte").choice(recs)
    # the body is the record's last bytes before topic and properties: find it in the raw record
    b = copy_store(name, tmp_path / "b")
    seg_start = max(int(n) for n in os.listdir(b / "commitlog") if int(n) <= rec["offset"])
    path = b / "commitlog" / ("%020d" % seg_start)
    body = bytes.fromhex(rec["msg"]["bodyHex"])
    with open(path, "r+b") as f:
        f.seek(rec["offset"] - seg_start)
        raw = f.read(rec["size"])
        at = raw.index(body) + len(body) // 2
        f.seek(rec["offset"] - seg_start + at)
        f.write(bytes([raw[at] ^ 0xFF]))
    rc, d = _diff(shared_store(name), b)
    assert rc == 1 and d["relation"] == "divergent"
    assert d["firstDivergentOffset"] == rec["offset"] + at
    for side in ("a", "b"):
        r = d["records"][side]
        assert r["offset"] == rec["offset"] and r["storeSize"] == rec["size"] and r["byteInRecord"] == at
        assert r["topic"] == rec["msg"]["topic"] and r["queueOffset"] == rec["msg"]["queueOffset"]
    p = run("diff", str(shared_store(name)), str(b))  # the table names the record too
    assert p.returncode == 1 and str(rec["offset"]) in p.stdout and "divergent" in p.stdout


def test_missing_store_is_a_usage_error(tmp_path):
    p = run("diff", str(shared_store("4.9.3-clean")), str(tmp_path / "nope"))
    assert p.returncode == 3 and "does not exist" in p.stderr and "Traceback" not in p.stderr
