"""verify on DLedger stores: the broker-written damaged samples name their damaged entries, and seeded damage
on copies of the clean sample (a torn last entry, a flipped body byte, a wrong index unit, a stale or ahead
DLedger checkpoint, a broken entry header) is found with its DL_* code. Expected entries come from the
broker's read-back and damage.json, never from our own walk."""

from __future__ import annotations

import gzip
import json
import random
import struct
import subprocess
import sys

import pytest

from tests.conftest import STORES, require_shared, tree_digest
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify.pipeline import verify_store

RMQSTORE = [sys.executable, "-m", "rmqstore_cli"]
CLEAN = "dledger-4.9.3-clean"


def entries(sample: str = CLEAN, name: str = "broker-read.jsonl.gz") -> list[dict]:
    require_shared()
    with gzip.open(STORES / sample / name, "rt") as f:
        return [o for o in map(json.loads, f) if o["type"] == "dledger_entry"]


def findings(root) -> list:
    with Store.open(str(root)) as st:
        return verify_store(st).findings


def codes(fs) -> set:
    return {f.code for f in fs if f.severity in ("error", "warning")}


@pytest.fixture
def clean_copy(tmp_path):
    return copy_store_of(CLEAN, "store", tmp_path / "s")


def copy_store_of(sample: str, folder: str, dest):
    import shutil

    shutil.copytree(STORES / sample / folder, dest)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    return dest


def data_file(root, pos: int, size: int = 1048576):
    start = pos // size * size
    return root / "dledger-n0" / "data" / f"{start:020d}", pos - start


def patch(path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def test_broker_damaged_samples_name_their_entries():
    damage = {d["variant"]: d for d in json.loads((STORES / "dledger-4.9.3-torn" / "damage.json").read_text())}
    root = STORES / "dledger-4.9.3-torn"
    before = tree_digest(root)
    torn = [f for f in findings(root / "store-torn") if f.code.startswith("DL_")]
    assert [(f.code, f.extra["entryIndex"], f.extra["entryPos"]) for f in torn] == \
        [("DL_TORN_ENTRY", damage["torn"]["entryIndex"], damage["torn"]["entryPos"])]
    bad = [f for f in findings(root / "store-corrupt") if f.severity == "error"]
    assert [(f.code, f.extra["entryIndex"], f.extra["entryPos"]) for f in bad] == \
        [("DL_MESSAGE_CRC", damage["corrupt"]["entryIndex"], damage["corrupt"]["entryPos"])]
    assert tree_digest(root) == before


def test_crash_sample_has_a_stale_dledger_checkpoint():
    fs = findings(STORES / "dledger-4.9.3-crash" / "store")
    assert codes(fs) == {"DL_CHECKPOINT_STALE"}


@pytest.mark.parametrize("sample,folder", [(CLEAN, "store"), ("dledger-5.3.3-clean", "store"),
                                           ("dledger-4.9.3-group", "store-n0"), ("dledger-4.9.3-group", "store-n1")])
def test_clean_samples_verify_clean(sample, folder):
    root = STORES / sample / folder
    before = tree_digest(root)
    p = subprocess.run(RMQSTORE + ["verify", str(root)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    if sample == CLEAN:  # the segments walked in two processes
        p = subprocess.run(RMQSTORE + ["verify", str(root), "-j", "2", "--json"], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
    assert tree_digest(root) == before


def test_flipped_body_byte(clean_copy):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    es = entries()
    e = es[rng.randrange(len(es))]
    m = e["message"]
    body_at = e["pos"] + 48 + m["totalSize"] - 2 - len(m["propertiesRaw"].encode()) - 1 - len(m["topic"]) - m["bodyLen"]
    path, off = data_file(clean_copy, body_at + rng.randrange(m["bodyLen"]))
    b = path.read_bytes()[off]
    patch(path, off, bytes([b ^ 0x5A]))
    fs = [f for f in findings(clean_copy) if f.severity == "error"]
    assert [(f.code, f.extra["entryIndex"]) for f in fs] == [("DL_MESSAGE_CRC", e["index"])], seed


def test_torn_last_entry(clean_copy):
    e = entries()[-1]
    path, off = data_file(clean_copy, e["pos"])
    patch(path, off + e["size"] // 2, bytes(e["size"] - e["size"] // 2))
    fs = [f for f in findings(clean_copy) if f.code.startswith("DL_")]
    assert [(f.code, f.extra["entryIndex"]) for f in fs] == [("DL_TORN_ENTRY", e["index"])]


def test_wrong_index_unit(clean_copy):
    seed = random.randrange(1 << 30)
    i = random.Random(seed).randrange(2000)
    unit_at = i * 32
    path = clean_copy / "dledger-n0" / "index" / f"{unit_at // 8192 * 8192:020d}"
    patch(path, unit_at % 8192 + 12, struct.pack(">i", 1))  # the size field
    fs = [f for f in findings(clean_copy) if f.severity == "error"]
    assert [(f.code, f.extra["entryIndex"]) for f in fs] == [("DL_INDEX_UNIT", i)], seed


@pytest.mark.parametrize("text,code", [("committedIndex=10\nendIndex=10\n", "DL_CHECKPOINT_STALE"),
                                       ("committedIndex=2500\nendIndex=2500\n", "DL_CHECKPOINT_AHEAD")])
def test_dledger_checkpoint(clean_copy, text, code):
    (clean_copy / "dledger-n0" / "checkpoint").write_text(text)
    assert codes(findings(clean_copy)) == {code}


def test_broken_entry_header_ends_the_log(clean_copy):
    e = entries()[1500]
    path, off = data_file(clean_copy, e["pos"])
    patch(path, off + 8, struct.pack(">q", 7))  # index field
    fs = findings(clean_copy)
    head = [f for f in fs if f.code == "DL_ENTRY_INDEX"]
    assert len(head) == 1 and head[0].extra["pos"] == e["pos"] and head[0].extra["afterIndex"] == 1499
    assert {"DL_UNREACHABLE", "DL_CHECKPOINT_AHEAD", "DL_INDEX_STALE"} <= codes(fs)
