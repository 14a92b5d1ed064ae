"""diff of DLedger replicas (dledger-4.9.3-group): identical, prefix (entries behind, from the broker's
read-back), a divergence seeded on a copy (other terms from entry N) reported at N, damaged entries."""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import sys

import pytest

from tests.conftest import STORES, require_shared, tree_digest
from tests.test_dledger_read import read_back

RMQSTORE = [sys.executable, "-m", "rmqstore_cli"]
GROUP = STORES / "dledger-4.9.3-group"


def diff(a, b, ok=(0, 1)) -> tuple[int, dict]:
    p = subprocess.run(RMQSTORE + ["diff", str(a), str(b), "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode in ok, p.stderr
    return p.returncode, json.loads(p.stdout)


def last_index(node: str) -> int:
    return read_back("dledger-4.9.3-group", f"broker-read-{node}.jsonl.gz")["recovery"][0]["ledgerEndIndex"]


def copy(src, dest):
    shutil.copytree(src, dest)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    return dest


def test_identical_and_prefix():
    require_shared()
    before = tree_digest(GROUP)
    rc, d = diff(GROUP / "store-n0", GROUP / "store-n2")
    assert (rc, d["relation"], d["comparedEntries"]) == (0, "identical", last_index("n0") + 1)
    rc, d = diff(GROUP / "store-n0", GROUP / "store-n1")
    assert (rc, d["relation"], d["behind"], d["behindBy"]) == (0, "prefix", "b", last_index("n0") - last_index("n1"))
    rc, d = diff(GROUP / "store-n1", GROUP / "store-n2")
    assert (d["relation"], d["behind"], d["behindBy"]) == ("prefix", "a", last_index("n2") - last_index("n1"))
    assert tree_digest(GROUP) == before


def _set_terms(root, node: str, first: int, term: int) -> None:
    """Entries ``first``.. of a copy get ``term`` (header and index unit), as if another leader wrote them."""
    entries = [e for e in read_back("dledger-4.9.3-group", f"broker-read-{node}.jsonl.gz")["dledger_entry"]
               if e["index"] >= first]
    data = root / f"dledger-{node}" / "data"
    index = root / f"dledger-{node}" / "index"
    isize = (index / "00000000000000000000").stat().st_size
    for e in entries:
        seg = e["pos"] // 1048576 * 1048576
        with open(data / f"{seg:020d}", "r+b") as f:
            f.seek(e["pos"] - seg + 16)
            f.write(struct.pack(">q", term))
        u = e["index"] * 32
        with open(index / f"{u // isize * isize:020d}", "r+b") as f:
            f.seek(u % isize + 24)
            f.write(struct.pack(">q", term))


def test_divergence_seeded_at_entry_n(tmp_path):
    seed = random.randrange(1 << 30)
    n = random.Random(seed).randrange(1, last_index("n0"))
    a = copy(GROUP / "store-n0", tmp_path / "a")
    _set_terms(a, "n0", n, 7)
    rc, d = diff(a, GROUP / "store-n2")
    assert (rc, d["relation"], d["divergeAt"]) == (1, "divergent", n), seed
    want_b = 1 if n < 900 else 2  # the group's term changes at entry 900 (README)
    assert d["termsAt"] == {"a": 7, "b": want_b} and d["truncated"] == "b", seed
    rc, d = diff(GROUP / "store-n1", a)
    if n <= last_index("n1"):
        assert (d["relation"], d["divergeAt"], d["truncated"]) == ("divergent", n, "a"), seed
    else:
        assert (d["relation"], d["behind"]) == ("prefix", "a"), seed


def test_damaged_entries_are_counted():
    damage = json.loads((STORES / "dledger-4.9.3-torn" / "damage.json").read_text())
    rc, d = diff(STORES / "dledger-4.9.3-clean" / "store", STORES / "dledger-4.9.3-torn" / "store-corrupt")
    corrupt = next(x for x in damage if x["variant"] == "corrupt")
    assert (rc, d["relation"], d["damaged"]) == (1, "identical", [{"index": corrupt["entryIndex"], "why": "bytes differ"}])


@pytest.mark.parametrize("other", [STORES / "4.9.3-clean" / "store"])
def test_dledger_and_classic_are_not_compared(other):
    p = subprocess.run(RMQSTORE + ["diff", str(GROUP / "store-n0"), str(other)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3 and "DLedger" in p.stderr and "Traceback" not in p.stderr
