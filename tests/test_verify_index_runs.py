"""verify's per-window index pass over an index file whose entries follow the commitlog takes, for each window,
the one run of entries pointing into it (two binary searches in the file's offsets); a file out of commitlog
order keeps the entry-block ranges. Both must give the whole-log formulation's findings, with many windows per
segment and seeded damage that keeps the order (key hashes, links, time differences, offsets moved between
their neighbours) or breaks it."""

from __future__ import annotations

import os
import random
import struct

import pytest

from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify import commitlog as verify_commitlog
from rmqstore_cli.engine.verify import windows as verify_windows
from rmqstore_cli.engine.verify.pipeline import _verify_whole_log, verify_store, verify_store_jobs
from rmqstore_cli.formats.records import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE
from tests.conftest import copy_store

SEED = int(os.environ.get("RMQSTORE_IDXRUN_SEED", random.randrange(1 << 30)))


def _damage(root, rng: random.Random, keep_order: bool) -> bool:
    """Seeded lies in the entries of the index files; with ``keep_order`` only ones that leave the entries'
    offsets non-decreasing. Returns whether anything was changed."""
    idx_dir = root / "index"
    changed = False
    for name in sorted(os.listdir(idx_dir)):
        p = idx_dir / name
        data = bytearray(p.read_bytes())
        before = bytes(data)
        with Store.open(str(root)) as st:
            slots = st.index.files[0].slots
        count = struct.unpack_from(">i", data, 36)[0]
        if count <= 3:
            continue
        base = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE
        pos = lambda e: base + e * INDEX_ENTRY_SIZE  # noqa: E731
        phy = lambda e: struct.unpack_from(">q", data, pos(e) + 4)[0]  # noqa: E731
        for _ in range(rng.randint(1, 5)):
            e = rng.randint(1, count - 1)
            what = rng.choice(["hash", "hash-neg", "prev", "diff", "phy-between"] + ([] if keep_order else ["phy-swap"]))
            if what == "hash":
                struct.pack_into(">i", data, pos(e), rng.randint(0, 2**31 - 1))
            elif what == "hash-neg":
                struct.pack_into(">i", data, pos(e), -rng.randint(1, 2**31))
            elif what == "prev":
                struct.pack_into(">i", data, pos(e) + 16, rng.randint(0, count))
            elif what == "diff":
                struct.pack_into(">i", data, pos(e) + 12, rng.randint(0, 2**31 - 1))
            elif what == "phy-between":  # an offset between its neighbours' (no record starts there, mostly)
                lo, hi = phy(e - 1) if e > 1 else phy(e), phy(e + 1) if e + 1 < count else phy(e) + 50
                struct.pack_into(">q", data, pos(e) + 4, rng.randint(min(lo, hi), max(lo, hi)))
            else:  # two entries' offsets exchanged
                o = rng.randint(1, count - 1)
                a, b = phy(e), phy(o)
                if a == b:
                    continue
                struct.pack_into(">q", data, pos(e) + 4, b)
                struct.pack_into(">q", data, pos(o) + 4, a)
        changed |= bytes(data) != before
        p.write_bytes(bytes(data))
    return changed


def _findings_both_ways(root) -> tuple[list, bool]:
    """(findings, whether every complete index file is in commitlog order), asserting the windowed verify (in this
    process and with ``-j 2``) equals the whole-log one."""
    with Store.open(str(root)) as st:
        windowed = verify_store(st)
    with Store.open(str(root)) as st:
        whole = _verify_whole_log(st)
    with Store.open(str(root)) as st:
        two = verify_store_jobs(st, 2)  # the window checks in two worker processes
    got, want = [f.as_json() for f in windowed.findings], [f.as_json() for f in whole.findings]
    assert got == want
    assert [f.as_json() for f in two.findings] == want
    assert windowed.summary == whole.summary
    with Store.open(str(root)) as st:
        ordered = all(verify_windows.IndexWindows(f, verify_windows.Windows(st.commitlog)).out_of_order is None
                      for f in st.index.files if f.complete)
    return want, ordered


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_index_runs_per_window_equal_whole_log(tmp_path, monkeypatch, name):
    print(f"seed {SEED} (RMQSTORE_IDXRUN_SEED)")
    rng = random.Random(SEED)
    seen = {True: 0, False: 0}
    for case in range(6):
        monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", (4096, 3000)[case % 2])
        root = copy_store(name, tmp_path / f"{name}-{case}")
        keep_order = case < 4
        changed = case > 0 and _damage(root, rng, keep_order)
        findings, ordered = _findings_both_ways(root)
        if keep_order:
            assert ordered  # the one-run route was taken
        seen[ordered] += 1
        if changed and keep_order:
            assert any(f["code"].startswith("IDX_") for f in findings), case
    assert seen[True] >= 4  # the clean copy and the order-keeping damage
