"""truncate / recover / verify on a broker-written ext store (4.9.3-ext, enableConsumeQueueExt=true).

The expected ext ends come from the broker's read-back: each consume-queue entry (`cqe`) carries the
ext address the broker stored in its tagsCode and the ext unit it read there; after a cut at commitlog
offset C a queue keeps the entries whose record starts before C (§13.7), and its ext log must end right
behind the unit the last kept entry references (what the broker's next start leaves, §8.5/§8.6).
"""

from __future__ import annotations

import json
import os
import struct
from collections import defaultdict

from typer.testing import CliRunner

from rmqstore_cli.app import app

from .conftest import broker_read

runner = CliRunner()
LONG_MIN = -(1 << 63)


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def ext_files(root) -> dict:
    """{(topic, qid): [(start, path), ...]} of every ext file."""
    out = defaultdict(list)
    base = os.path.join(root, "consumequeue_ext")
    for topic in os.listdir(base):
        for q in os.listdir(os.path.join(base, topic)):
            d = os.path.join(base, topic, q)
            for name in sorted(os.listdir(d)):
                out[(topic, int(q))].append((int(name), os.path.join(d, name)))
    return out


def expected_ext_ends(cut: int) -> dict:
    """{(topic, qid): ext end} from the broker's consume-queue entries kept by a cut at ``cut``."""
    ends: dict = {}
    for e in broker_read("4.9.3-ext")["cqe"]:
        key = (e["topic"], e["queueId"])
        ends.setdefault(key, 0)
        if e["phyOffset"] < cut and e["tagsCode"] < -2147483648:
            ends[key] = max(ends[key], e["tagsCode"] - LONG_MIN + e["ext"]["size"])
    return ends


def ext_ends_on_disk(root, cut: int) -> dict:
    """{(topic, qid): ext end} read from the files: the last consume-queue unit before ``cut`` that holds an ext
    address, and the size of the ext unit there."""
    exts = ext_files(root)
    ends = {}
    for key, files in exts.items():
        d = os.path.join(root, "consumequeue", key[0], str(key[1]))
        last = None
        for name in sorted(os.listdir(d)):
            data = open(os.path.join(d, name), "rb").read()
            for k in range(0, len(data), 20):
                phy, size, tags = struct.unpack_from(">qiq", data, k)
                if phy < 0 or size <= 0:
                    break
                if phy < cut and tags < -2147483648:
                    last = tags - LONG_MIN
        if last is None:
            ends[key] = 0
            continue
        start, path = next((s, p) for s, p in files if s <= last < s + os.path.getsize(p))
        with open(path, "rb") as f:
            f.seek(last - start)
            ends[key] = last + struct.unpack(">h", f.read(2))[0]
    return ends


def nonzero_past(files: list, end: int) -> list:
    """(file start, first non-zero position) of every ext file holding a non-zero byte at or after ``end``."""
    out = []
    for start, path in files:
        data = open(path, "rb").read()
        lo = max(0, end - start)
        tail = data[lo:]
        if tail.strip(b"\0"):
            out.append((start, lo + len(tail) - len(tail.lstrip(b"\0"))))
    return out


def dry_run_plan(root, expect: int = 0) -> dict:
    r = run("recover", root, "--dry-run", "--json")
    assert r.exit_code == expect, r.output
    return next(o for o in map(json.loads, r.stdout.splitlines()) if o.get("type") == "recover-plan")


def middle_record() -> int:
    recs = broker_read("4.9.3-ext")["clmsg"]
    return recs[len(recs) // 2]["offset"]


def test_truncate_cuts_ext_like_the_broker_start(store_copy):
    root = store_copy("4.9.3-ext")
    cut = middle_record()
    ends = expected_ext_ends(cut)
    before = ext_files(root)
    assert any(nonzero_past(before[k], ends[k]) for k in ends)  # the cut does leave ext units behind
    r = run("truncate", root, "--offset", cut, "--yes")
    assert r.exit_code == 0, r.output
    after = ext_files(root)
    for key, end in ends.items():
        assert not nonzero_past(after[key], end), (key, end)
        # every unit the kept entries reference is still there, byte for byte
        for e in broker_read("4.9.3-ext")["cqe"]:
            if (e["topic"], e["queueId"]) == key and e["phyOffset"] < cut:
                off = e["tagsCode"] - LONG_MIN
                start, path = next((s, p) for s, p in after[key] if s <= off < s + os.path.getsize(p))
                with open(path, "rb") as f:
                    f.seek(off - start)
                    size, tags, store_time, bm = struct.unpack(">hqqh", f.read(20))
                assert (size, tags, store_time, bm) == (e["ext"]["size"], e["ext"]["tagsCode"], e["ext"]["msgStoreTime"], 0)
    plan = dry_run_plan(root)
    assert plan["actions"] == [], plan["actions"]
    assert run("verify", root).exit_code == 0


def test_truncate_removes_ext_files_past_the_last_referenced_unit(store_copy):
    """Ext files of 2 KiB (rebuilt from the broker's log): a cut leaves whole files past the last unit."""
    root = store_copy("4.9.3-ext")
    r = run("rebuild", "cqext", root, "--ext-file-size", 2048, "--yes")
    assert r.exit_code == 0, r.output
    cut = middle_record()
    ends = ext_ends_on_disk(root, cut)
    before = ext_files(root)
    assert any(s >= ends[k] + 2048 for k in ends for s, _ in before[k])
    r = run("truncate", root, "--offset", cut, "--yes")
    assert r.exit_code == 0, r.output
    for key, files in ext_files(root).items():
        end = ends[key]
        # the file holding the end stays (or file 0 when nothing is referenced); every later one is gone
        assert [s for s, _ in files] == [s for s, _ in before[key] if s < end or s == 0], key
        assert not nonzero_past(files, end), key
    assert dry_run_plan(root)["actions"] == []
    assert run("verify", root).exit_code == 0


def test_verify_finds_ext_units_no_unit_references(store_copy):
    """An ext unit after the last referenced one (a crash between the ext put and the consume-queue put):
    verify warns, recover zeroes it, verify is clean after."""
    root = store_copy("4.9.3-ext")
    ends = expected_ext_ends(1 << 62)
    key = ("OracleTopicA", 1)
    (start, path), = ext_files(root)[key]
    pos = ends[key] - start
    with open(path, "r+b") as f:
        f.seek(pos)
        assert f.read(2) == b"\0\0"
        f.seek(pos)
        f.write(struct.pack(">hqqh", 20, 12345, 1795313618999, 0))
    r = run("verify", root, "--json")
    assert r.exit_code == 1
    found = [json.loads(x) for x in r.stdout.splitlines() if '"EXT_UNREFERENCED"' in x]
    assert len(found) == 1 and found[0]["offset"] == pos and found[0]["severity"] == "warning"
    assert os.path.samefile(found[0]["path"], path)
    plan = dry_run_plan(root, expect=1)  # findings to repair
    assert [(a["action"], a["offset"]) for a in plan["actions"]] == [("zero_tail", pos)]
    assert os.path.samefile(plan["actions"][0]["path"], path)
    r = run("recover", root, "--yes")
    assert r.exit_code == 0, r.output
    assert run("verify", root).exit_code == 0
