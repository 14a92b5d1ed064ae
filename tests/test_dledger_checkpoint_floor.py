"""The DLedger checkpoint's committedIndex may lie below the log's last entry (a follower's uncommitted tail), but
not below the newest entry a consume queue points at: verify reads the queues' last files for that floor only when
committedIndex is below the last entry. On a copy of the broker-written clean sample whose queues lost their units
past a seeded point, committedIndex at the newest dispatched entry is fine and one below it is stale; the entries
(index at pos) come from the broker's read-back, the queue units are read here with struct."""

from __future__ import annotations

import os
import random
import struct

from tests.test_dledger_verify import CLEAN, copy_store_of, entries, findings

SEED = int(os.environ.get("RMQSTORE_DLEDGER_FLOOR_SEED", random.randrange(1 << 30)))
UNIT = 20  # consume-queue unit: phy (8), size (4), tags code (8)


def _cut_queues(root, cut_phy: int) -> int:
    """Zero every consume-queue unit pointing at or past ``cut_phy``; returns the largest phy left."""
    newest = -1
    for path in sorted(p for p in (root / "consumequeue").rglob("*") if p.is_file() and len(p.name) == 20):
        data = bytearray(path.read_bytes())
        for at in range(0, len(data) - UNIT + 1, UNIT):
            phy, size, _ = struct.unpack_from(">qiq", data, at)
            if size <= 0:
                continue
            if phy >= cut_phy:
                data[at:at + UNIT] = bytes(UNIT)
            else:
                newest = max(newest, phy)
        path.write_bytes(bytes(data))
    return newest


def _state_codes(root) -> list:
    return sorted(f.code for f in findings(root) if f.code.startswith("DL_CHECKPOINT"))


def test_committed_index_floor_is_the_newest_dispatched_entry(tmp_path):
    print(f"seed {SEED} (RMQSTORE_DLEDGER_FLOOR_SEED)")
    rng = random.Random(SEED)
    ents = entries(CLEAN)
    last = ents[-1]["index"]
    cut = rng.choice(ents[len(ents) // 2:-1])  # the queues lose the units of this entry and every later one
    root = copy_store_of(CLEAN, "store", tmp_path / "s")
    newest_phy = _cut_queues(root, cut["pos"] + 48)
    (dispatched,) = [e["index"] for e in ents if e["pos"] + 48 == newest_phy]
    assert dispatched < cut["index"] <= last
    cp = root / "dledger-n0" / "checkpoint"
    for committed, want in [(last, []), (dispatched, []), (dispatched - 1, ["DL_CHECKPOINT_STALE"]),
                            (last + 1, ["DL_CHECKPOINT_AHEAD"])]:
        cp.write_text(f"committedIndex={committed}\nendIndex={last}\n")
        assert _state_codes(root) == want, (committed, dispatched, last)
