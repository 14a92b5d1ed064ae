"""The slot-chain rule (formats.indexchain, and the entry pass of formats.entrykernel that applies it) against a
plain Python walk of the entries. The compiled passes find an entry's hash slot (keyHash % slots) by three
multiplies instead of a division; the Python side here uses ``%``. Key hashes span 0 .. 2**31-1 (and negative
ones, which have no slot), slot counts from 1 to 2**31-1. The seed is printed; any seed must pass."""

from __future__ import annotations

import random
import struct

import numpy as np

from rmqstore_cli.formats import entrykernel
from rmqstore_cli.formats.checkkernel import IX_DIFF, IX_HASH, IX_PHY, IX_PREV
from rmqstore_cli.formats.indexchain import chain_block
from rmqstore_cli.formats.records import INDEX_ENTRY_SIZE

SLOT_COUNTS = (1, 2, 3, 7, 4096, 500_000, 5_000_000, 2**31 - 1)


def _keys(rng: random.Random, n: int, slots: int) -> list[int]:
    edge = [k for k in (0, 1, 2**31 - 1, 2**31 - 2, slots - 1, slots, slots + 1, 2 * slots - 1, -1, -(2**31))
            if -(2**31) <= k < 2**31]
    return [rng.choice(edge) if rng.random() < 0.1 else rng.randrange(-(2**31) if rng.random() < 0.02 else 0, 2**31)
            for _ in range(n)] + edge


def _plain_chain(keys: list[int], prevs: list[int], first_entry: int, slots: int, last: dict):
    """(positions whose prevIndex is wrong, the entry each should link to); ``last`` (slot -> newest entry) updated."""
    bad, want = [], []
    for i, (k, p) in enumerate(zip(keys, prevs)):
        if k < 0:
            continue
        s = k % slots
        expected = last.get(s, 0)
        if p != expected:
            bad.append(i)
            want.append(expected)
        last[s] = first_entry + i
    return bad, want


def _prevs(rng: random.Random, keys: list[int], first_entry: int, slots: int) -> list[int]:
    """Mostly the right links (computed by the plain walk), some wrong."""
    table: dict = {}
    out = []
    for i, k in enumerate(keys):
        right = table.get(k % slots, 0) if k >= 0 else 0
        out.append(right if rng.random() < 0.8 else rng.randrange(0, first_entry + i + 1))
        if k >= 0:
            table[k % slots] = first_entry + i
    return out


def test_chain_block_equals_a_plain_walk():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    for slots in SLOT_COUNTS:
        keys = _keys(rng, 3000, slots)
        prevs = _prevs(rng, keys, 1, slots)
        plain_last: dict = {}
        want_bad, want_exp = _plain_chain(keys, prevs, 1, slots, plain_last)
        if slots > 5_000_000:
            continue  # a table of 2**31 slots would take 8 GiB; the entry pass below covers that count
        table = np.zeros(slots, np.int32)
        bad, exp = chain_block(np.asarray(keys, np.int32), np.asarray(prevs, np.int32), 1, slots, table)
        assert bad.tolist() == want_bad, slots
        assert exp.tolist() == want_exp, slots
        assert {int(s): int(table[s]) for s in np.flatnonzero(table)} == plain_last, slots


def _entry_table(keys: list[int], prevs: list[int], phys: list[int]) -> np.ndarray:
    raw = bytearray(INDEX_ENTRY_SIZE * (len(keys) + 1))  # entry 0 is never used
    for e, (k, p, phy) in enumerate(zip(keys, prevs, phys), start=1):
        x = e * INDEX_ENTRY_SIZE
        struct.pack_into(">i", raw, x + IX_HASH, k)
        struct.pack_into(">q", raw, x + IX_PHY, phy)
        struct.pack_into(">i", raw, x + IX_DIFF, 0)
        struct.pack_into(">i", raw, x + IX_PREV, p)
    return np.frombuffer(bytes(raw), np.uint8)


def test_entry_pass_chains_equal_a_plain_walk():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    for slots in SLOT_COUNTS:
        keys = _keys(rng, 2000, slots)
        prevs = _prevs(rng, keys, 1, slots)
        u8 = _entry_table(keys, prevs, [1000 * e for e in range(len(keys))])
        used = sorted({k % slots for k in keys if k >= 0})
        # the pass indexes ``last`` by slot: a table of every slot (2**31 slots: only when the keys' slots fit below)
        size = slots if slots <= 5_000_000 else max(used) + 1
        if size > 5_000_000:
            continue
        last = np.zeros(size, np.int32)
        plain_last: dict = {}
        starts = np.array([0], np.int64)
        got_bad, got_exp, got_prev = [], [], []
        prev_phy = None
        for a in range(1, len(keys) + 1, 700):  # in blocks, the chain state carried between them
            b = min(a + 700, len(keys) + 1)
            blk = entrykernel.index_entries(u8, a, b, slots, starts, last, prev_phy)
            prev_phy = blk.last_phy
            got_bad += blk.bad_pos.tolist()
            got_exp += blk.bad_exp.tolist()
            got_prev += blk.bad_prev.tolist()
            assert blk.neg_pos.tolist() == [e for e in range(a, b) if keys[e - 1] < 0]
        want_bad, want_exp = _plain_chain(keys, prevs, 1, slots, plain_last)
        assert got_bad == [1 + i for i in want_bad], slots
        assert got_exp == want_exp, slots
        assert got_prev == [prevs[i] for i in want_bad], slots
        assert {int(s): int(last[s]) for s in np.flatnonzero(last)} == plain_last, slots


def test_slot_of_equals_the_remainder_for_any_slot_count():
    from rmqstore_cli.formats.indexchain import slot_kernels

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    slot_magic, slot_of = slot_kernels()
    counts = [1, 2, 3, 5, 7, 10, 4096, 5_000_000, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 7]
    counts += [rng.randrange(1, 2**32) for _ in range(30)]
    for slots in counts:
        magic = np.uint64(slot_magic(slots))
        for k in [0, 1, slots - 1 if slots <= 2**31 else 5, 2**31 - 1, 2**31 - 2] + [rng.randrange(0, 2**31) for _ in range(200)]:
            assert slot_of(k, slots, magic) == k % slots, (k, slots)
