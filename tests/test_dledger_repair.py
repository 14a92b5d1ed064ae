"""Repairs on DLedger stores (always on copies): recover (the broker's start, --from-replica, --cut-damaged),
rebuild, truncate --index, and the writes that stay refused. Expected bytes are the broker-written clean
sample and its read-back, never our own output."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import shutil
import struct
import subprocess
import sys

import pytest

from tests.conftest import STORES, require_shared, tree_digest

RMQSTORE = [sys.executable, "-m", "rmqstore_cli"]
CLEAN = STORES / "dledger-4.9.3-clean" / "store"
TORN = STORES / "dledger-4.9.3-torn"


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(RMQSTORE + [str(a) for a in args], capture_output=True, text=True, timeout=300)


def copy(src, dest):
    require_shared()
    shutil.copytree(src, dest)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    return dest


def digest(root, sub="dledger-n0") -> dict:
    base = root / sub
    return {str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(base.rglob("*")) if p.is_file() and p.parent.name in ("data", "index")}


def read_back() -> dict:
    out: dict = {}
    with gzip.open(STORES / "dledger-4.9.3-clean" / "broker-read.jsonl.gz", "rt") as f:
        for o in map(json.loads, f):
            out.setdefault(o["type"], []).append(o)
    return out


def units(root) -> set:
    out = set()
    for p in (root / "consumequeue").rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            for k in range(0, len(data), 20):
                phy, size, tags = struct.unpack_from(">qiq", data, k)
                if size > 0:
                    out.add((p.parent.parent.name, int(p.parent.name), phy, size, tags))
    return out


def broker_units(below: int | None = None) -> set:
    return {(u["topic"], u["queueId"], u["phyOffset"], u["size"], u["tagsCode"]) for u in read_back()["cq_unit"]
            if below is None or u["phyOffset"] < below}


@pytest.mark.parametrize("variant", ["store-torn", "store-corrupt"])
def test_from_replica_restores_the_damaged_copy_byte_for_byte(tmp_path, variant):
    s = copy(TORN / variant, tmp_path / "s")
    damaged = digest(s)
    p = run("recover", s, "--dry-run")
    assert p.returncode == 1 and "--from-replica" in p.stderr  # the damage is named, kept, and the repair offered
    assert digest(s) == damaged
    p = run("recover", s, "--from-replica", CLEAN, "--backup-dir", tmp_path / "b")
    assert p.returncode == 0, p.stderr
    assert digest(s) == digest(CLEAN)
    assert run("verify", s).returncode == 0
    assert run("restore", tmp_path / "b").returncode == 0
    assert digest(s) == damaged


def _flip_body_byte(root, rng) -> int:
    es = read_back()["dledger_entry"]
    e = es[rng.randrange(len(es))]
    m = e["message"]
    body_at = e["pos"] + 48 + m["totalSize"] - 2 - len(m["propertiesRaw"].encode()) - 1 - len(m["topic"]) - m["bodyLen"]
    at = body_at + rng.randrange(m["bodyLen"])
    path = root / "dledger-n0" / "data" / f"{at // 1048576 * 1048576:020d}"
    with open(path, "r+b") as f:
        f.seek(at % 1048576)
        b = f.read(1)
        f.seek(at % 1048576)
        f.write(bytes([b[0] ^ 0x20]))
    return e["index"]


def test_flipped_body_byte_from_replica_and_cut(tmp_path):
    seed = random.randrange(1 << 30)
    s = copy(CLEAN, tmp_path / "s")
    k = _flip_body_byte(s, random.Random(seed))
    c = copy(s, tmp_path / "c")
    p = run("recover", s, "--from-replica", CLEAN, "--json")
    assert p.returncode == 0, (seed, p.stderr)
    assert digest(s) == digest(CLEAN), seed
    p = run("recover", c, "--cut-damaged")
    assert p.returncode == 0, (seed, p.stderr)
    assert run("verify", c).returncode == 0, seed
    ends = [json.loads(x) for x in run("dump", "dledger", c, "--json").stdout.splitlines()]
    assert ends[-1]["lastIndex"] == k - 1, seed  # every entry before the damaged one is kept
    cut = read_back()["dledger_entry"][k]["pos"]
    assert units(c) == broker_units(below=cut), seed


def test_torn_last_entry_without_replica_is_kept_unless_cut(tmp_path):
    s = copy(TORN / "store-torn", tmp_path / "s")
    before = tree_digest(s)
    p = run("recover", s)
    assert p.returncode == 0 and "KEPT DL_TORN_ENTRY" in p.stderr
    assert tree_digest(s) == before  # nothing to apply: the broker serves the entry as it is
    p = run("recover", s, "--cut-damaged", "--dry-run")
    assert p.returncode == 1 and "loses 1 entries" in p.stderr
    assert run("recover", s, "--cut-damaged").returncode == 0
    assert run("verify", s).returncode == 0
    last = read_back()["dledger_entry"][-1]
    assert units(s) == broker_units(below=last["pos"])


def test_wrong_index_unit_and_stale_checkpoint(tmp_path):
    seed = random.randrange(1 << 30)
    s = copy(CLEAN, tmp_path / "s")
    i = random.Random(seed).randrange(2000)
    with open(s / "dledger-n0" / "index" / f"{i * 32 // 8192 * 8192:020d}", "r+b") as f:
        f.seek(i * 32 % 8192 + 24)
        f.write(struct.pack(">q", 99))  # term
    (s / "dledger-n0" / "checkpoint").write_text("committedIndex=3\nendIndex=3\n")
    v = run("verify", s, "--json")
    assert {json.loads(x)["code"] for x in v.stdout.splitlines()} == {"DL_INDEX_UNIT", "DL_CHECKPOINT_STALE"}, seed
    assert run("recover", s).returncode == 0, seed
    assert digest(s) == digest(CLEAN), seed
    assert (s / "dledger-n0" / "checkpoint").read_text() == "committedIndex=1999\nendIndex=1999\n"
    assert run("verify", s).returncode == 0


def test_crash_sample_recovers_clean(tmp_path):
    s = copy(STORES / "dledger-4.9.3-crash" / "store", tmp_path / "s")
    assert run("recover", s).returncode == 0
    assert not (s / "abort").exists()
    assert (s / "dledger-n0" / "checkpoint").read_text() == "committedIndex=1499\nendIndex=1499\n"
    assert run("verify", s).returncode == 0


def test_replica_that_disagrees_is_refused(tmp_path):
    s = copy(TORN / "store-corrupt", tmp_path / "s")
    r = copy(CLEAN, tmp_path / "r")
    e = read_back()["dledger_entry"][1000]
    seg = e["pos"] // 1048576 * 1048576
    with open(r / "dledger-n0" / "data" / f"{seg:020d}", "r+b") as f:
        f.seek(e["pos"] - seg + 16)
        f.write(struct.pack(">q", 5))  # another term for that entry in the "replica"
    before = tree_digest(s)
    p = run("recover", s, "--from-replica", r)
    assert p.returncode == 2 and "not the same entry" in p.stderr
    assert tree_digest(s) == before


def test_truncate_at_entry_index(tmp_path):
    s = copy(CLEAN, tmp_path / "s")
    n = random.Random(7).randrange(1, 1999)
    pos = read_back()["dledger_entry"][n]["pos"]
    assert run("truncate", s, "--index", n).returncode == 0
    assert run("verify", s).returncode == 0
    assert units(s) == broker_units(below=pos)
    out = [json.loads(x) for x in run("dump", "dledger", s, "--json").stdout.splitlines()]
    assert out[-1]["lastIndex"] == n - 1 and out[-1]["endPos"] == pos


def test_rebuild_all_equals_the_broker(tmp_path):
    s = copy(CLEAN, tmp_path / "s")
    shutil.rmtree(s / "consumequeue")
    assert run("rebuild", "all", s, "--cq-file-size", 6000).returncode == 0  # no queue file left to infer it from
    for p in (CLEAN / "consumequeue").rglob("*"):
        if p.is_file():
            assert (s / p.relative_to(CLEAN)).read_bytes() == p.read_bytes(), p
    q = read_back()["index_query"][5]
    hits = [json.loads(x) for x in run("index", "query", s, "--topic", q["topic"], "--key", q["key"], "--json").stdout.splitlines()]
    assert sorted(h["offset"] for h in hits) == q["commitLogOffsets"]


@pytest.mark.parametrize("args", [["append", "{s}", "--topic", "TopicA", "--body", "x"],
                                  ["spark", "rebuild", "{s}", "--what", "index", "--out", "{t}/x"]])
def test_writes_not_made_right_stay_refused(tmp_path, args):
    s = copy(CLEAN, tmp_path / "s")
    before = tree_digest(s)
    p = run(*[a.format(s=s, t=tmp_path) for a in args])
    assert p.returncode == 3 and "Traceback" not in p.stderr, p.stderr
    if args[0] == "append":
        assert "behind its group's back" in p.stderr
    assert tree_digest(s) == before


def test_recover_on_a_clean_replica_changes_nothing(tmp_path):
    s = copy(CLEAN, tmp_path / "s")
    before = tree_digest(s)
    assert run("recover", s, "--dry-run").returncode == 0
    assert run("recover", s).returncode == 0
    assert tree_digest(s) == before


def test_salvage_past_a_damaged_entry_and_a_broken_header(tmp_path):
    """Every message the broker's CRC-checked parse accepts is rescued, past a corrupted body and past a broken
    entry header (the walk resumes at the next entry its index unit finds)."""
    es = read_back()["dledger_entry"]
    offsets = [e["message"]["commitLogOffset"] for e in es]
    p = run("salvage", TORN / "store-corrupt", "--jsonl", tmp_path / "a.jsonl")
    assert p.returncode == 1  # something was skipped
    got = [json.loads(x)["offset"] for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert got == offsets[:1000] + offsets[1001:]
    s = copy(CLEAN, tmp_path / "s")
    seed = random.randrange(1 << 30)
    k = random.Random(seed).randrange(1, 1999)
    seg = es[k]["pos"] // 1048576 * 1048576
    with open(s / "dledger-n0" / "data" / f"{seg:020d}", "r+b") as f:
        f.seek(es[k]["pos"] - seg + 8)
        f.write(struct.pack(">q", 10 ** 9))  # the index field
    run("salvage", s, "--jsonl", tmp_path / "b.jsonl")
    got = [json.loads(x)["offset"] for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert got == offsets[:k] + offsets[k + 1:], seed


def test_offsets_set_writes_only_config(tmp_path):
    s = copy(CLEAN, tmp_path / "s")
    before = tree_digest(s)
    p = run("offsets", "set", s, "--group", "g1", "--topic", "TopicA", "--queue", 0, "--to-offset", 5)
    assert p.returncode == 0, p.stderr
    after = tree_digest(s)
    assert {k for k in after if after[k] != before.get(k)} == {"config/consumerOffset.json"}
    assert '"TopicA@g1":{0:5' in (s / "config" / "consumerOffset.json").read_text().replace("\n", "").replace("\t", "")


def test_broken_headers_restored_from_replica(tmp_path):
    """Two entries whose header is broken (DLedger's recovery would end the log at the first): the replica's
    entries there are copied when our index units confirm them, and the store equals the clean sample."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    es = read_back()["dledger_entry"]
    # in files DLedger's recovery reads (it starts at the third-last of the sample's 4 files: file 1)
    seen = [e["index"] for e in es if 1048576 <= e["pos"] and e["index"] < 1999]
    ks = sorted(rng.sample(seen, 2))
    s = copy(CLEAN, tmp_path / "s")
    for k in ks:
        seg = es[k]["pos"] // 1048576 * 1048576
        with open(s / "dledger-n0" / "data" / f"{seg:020d}", "r+b") as f:
            f.seek(es[k]["pos"] - seg + 8)
            f.write(struct.pack(">q", 10 ** 9))  # the index field
    before = tree_digest(s)
    p = run("recover", s, "--dry-run")
    assert p.returncode == 2 and "DATA LOSS" in p.stderr, seed  # a cut there would lose every later entry
    assert run("recover", s).returncode == 2 and tree_digest(s) == before, seed
    p = run("recover", s, "--from-replica", CLEAN)
    assert p.returncode == 0, (seed, p.stderr)
    assert tree_digest(s).keys() == tree_digest(CLEAN).keys()
    assert digest(s) == digest(CLEAN), seed
    assert units(s) == broker_units()


def test_broken_header_in_a_file_recovery_never_reads(tmp_path):
    """DLedger's recovery starts at the third-last data file: a broken header before it does not end the log, the
    broker keeps serving it; verify says so, recover keeps it (changing nothing), --from-replica repairs it."""
    seed = random.randrange(1 << 30)
    es = read_back()["dledger_entry"]
    k = random.Random(seed).choice([e["index"] for e in es if e["pos"] + e["size"] < 1048576 and e["index"] > 0])
    s = copy(CLEAN, tmp_path / "s")
    with open(s / "dledger-n0" / "data" / f"{0:020d}", "r+b") as f:
        f.seek(es[k]["pos"] + 8)
        f.write(struct.pack(">q", 10 ** 9))
    found = [json.loads(x) for x in run("verify", s, "--json").stdout.splitlines()]
    dl = [f for f in found if f["code"].startswith("DL_")]
    assert [(f["code"], f["pos"], f["seenByRecovery"]) for f in dl] == [("DL_ENTRY_INDEX", es[k]["pos"], False)], seed
    before = tree_digest(s)
    p = run("recover", s)
    assert p.returncode == 0 and "KEPT DL_ENTRY_INDEX" in p.stderr, (seed, p.stderr)
    assert tree_digest(s) == before
    assert run("recover", s, "--from-replica", CLEAN).returncode == 0, seed
    assert tree_digest(s).keys() == tree_digest(CLEAN).keys()
    assert digest(s) == digest(CLEAN) and units(s) == broker_units(), seed
