"""The compiled index-entry writer (formats.indexbuild) against an independent pure-Python putKey.

Random keys with a handful of slots (long chains, slots pointing past the new entry, negative slot
values left in the table), store times before and after the file's begin, a begin time of zero and
the first entry of a fresh file (timeDiff against the inherited begin): every byte of the slot table
and the entries must be what the broker's one-key-at-a-time rule writes.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from rmqstore_cli.formats.indexbuild import put_entries
from rmqstore_cli.formats.records import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE

from .conftest import seed_params


def _reference(buf: bytearray, slots: int, first: int, hashes, phys, tss, begin_ts: int, first_diff: int) -> int:
    """IndexFile.putKey, key after key, with struct (FORMAT.md §10.4)."""
    fresh = 0
    for j, (h, p, t) in enumerate(zip(hashes, phys, tss)):
        num = first + j
        sp = INDEX_HEADER_SIZE + (h % slots) * INDEX_SLOT_SIZE
        (prev,) = struct.unpack_from(">i", buf, sp)
        if prev <= 0 or prev > num:
            prev = 0
            fresh += 1
        if j == 0 and first_diff >= 0:
            diff = first_diff
        elif begin_ts <= 0:
            diff = 0
        else:
            d = t - begin_ts
            q = abs(d) // 1000 * (1 if d >= 0 else -1)
            diff = min(max(q, 0), 2**31 - 1)
        struct.pack_into(">iqii", buf, INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE + num * INDEX_ENTRY_SIZE, h, p, diff, prev)
        struct.pack_into(">i", buf, sp, num)
    return fresh


@pytest.mark.parametrize("seed", seed_params(3, 7))
def test_put_entries_matches_put_key(seed):
    print("seed", seed)
    rng = random.Random(seed)
    slots = rng.choice([1, 3, 7, 64, 5003])  # 5003: keys spread over a table larger than the prefetch distance
    entries = 400
    size = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE + entries * INDEX_ENTRY_SIZE
    ref = bytearray(size)
    for s in range(slots):  # what a damaged or older table may hold: junk, negatives, numbers past the new entries
        struct.pack_into(">i", ref, INDEX_HEADER_SIZE + s * INDEX_SLOT_SIZE, rng.choice([0, -5, 3, 10**6, -2**31, 1]))
    mine = np.frombuffer(bytearray(ref), dtype=np.uint8).copy()
    first = rng.choice([1, 2, 50])
    begin_ts = rng.choice([0, -1, 1_700_000_000_000])
    num = rng.randint(1, entries - first)
    hashes = [rng.choice([0, rng.randrange(2**31), 2**31 - 1]) for _ in range(num)]
    phys = [rng.randrange(2**62) for _ in range(num)]
    tss = [1_700_000_000_000 + rng.randint(-5000, 2**33) for _ in range(num)]
    first_diff = rng.choice([-1, 0, 123])
    want = _reference(ref, slots, first, hashes, phys, tss, begin_ts, first_diff)
    got = put_entries(mine, slots, first, np.array(hashes, np.int64), np.array(phys, np.int64), np.array(tss, np.int64),
                      begin_ts, first_diff)
    assert got == want
    assert mine.tobytes() == bytes(ref)
