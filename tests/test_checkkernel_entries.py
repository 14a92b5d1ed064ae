"""formats.entrykernel's passes over index entries and checkkernel's over consume-queue files, on random bytes, against plain Python.

``index_entries`` (slot chains, negative key hashes, commitlog order, windows, before the walk), ``index_range``
(entries against one window's records) and ``queue_file_valid`` (where a queue file's valid units end, fillers,
windows, ext references) read the files' big-endian bytes; here the expected results are computed entry by entry
/ unit by unit with ``struct`` and the rules as FORMAT.md §10.3-10.4 and §7.3-7.4 state them. Small slot tables
make chains collide; blocks are cut at random places (the state carried between blocks must not matter).
Reproduce with RMQSTORE_ENTRIES_SEED=<seed>.
"""

from __future__ import annotations

import bisect
import os
import random
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from rmqstore_cli.formats import checkkernel, entrykernel
from rmqstore_cli.formats.records import CQ_FILLER, TRANSACTION_ROLLBACK

SEED = int(os.environ.get("RMQSTORE_ENTRIES_SEED", random.randrange(1 << 30)))


def _window_of(starts: list, p: int) -> int:
    return bisect.bisect_right(starts, p) - 1


def _entries(rng: random.Random, n: int, phys: list) -> tuple[bytes, list]:
    """Entry 0 unused, then ``n`` entries (keyHash, phyOffset, timeDiff, prevIndex), big-endian, mostly sane."""
    rows = [(0, 0, 0, 0)]
    for e in range(1, n + 1):
        kh = rng.choice([rng.randrange(1 << 31), rng.randrange(1 << 31), -rng.randrange(1, 1 << 31)]
                        if rng.random() < 0.05 else [rng.randrange(1 << 31)])
        phy = phys[min(len(phys) - 1, e // 2)] if rng.random() < 0.9 else rng.choice([rng.randrange(-5, 1 << 40), 0, -1])
        rows.append((kh, phy, rng.choice([0, 1, 2, rng.randrange(-10, 1 << 20)]), rng.randrange(0, e + 1)))
    return b"".join(struct.pack(">iqii", *r) for r in rows), rows


def test_index_entries_match_a_plain_walk():
    print(f"seed {SEED} (RMQSTORE_ENTRIES_SEED)")
    rng = random.Random(SEED)
    for case in range(40):
        n = rng.randrange(1, 400)
        slots = rng.choice([1, 3, 7, 64])
        starts = sorted(rng.sample(range(0, 1 << 20), rng.randrange(1, 6)))
        phys = sorted(set(rng.sample(range(0, 1 << 20), 300)) | set(starts))  # some entries at a window's start
        raw, rows = _entries(rng, n, phys)
        if rng.random() < 0.5:  # mostly right links, so that both kinds of entry are common
            newest = [0] * slots
            for e in range(1, n + 1):
                kh, phy, diff, _ = rows[e]
                if kh >= 0 and rng.random() < 0.8:
                    rows[e] = (kh, phy, diff, newest[kh % slots])
                if kh >= 0:
                    newest[kh % slots] = e
            raw = b"".join(struct.pack(">iqii", *r) for r in rows)
        # plain Python: the rules entry by entry
        newest, bad, neg, before, ooo = [0] * slots, [], [], [], None
        lo = hi = None
        for e in range(1, n + 1):
            kh, phy, _, prev = rows[e]
            if e > 1 and ooo is None and rows[e - 1][1] > phy:
                ooo = (e - 1, rows[e - 1][1], e, phy)
            if kh < 0:
                neg.append((e, kh))
            else:
                if prev != newest[kh % slots]:
                    bad.append((e, newest[kh % slots], prev))
                newest[kh % slots] = e
            w = _window_of(starts, phy)
            if w < 0:
                before.append((e, phy))
            else:
                lo, hi = min(w, lo if lo is not None else w), max(w, hi if hi is not None else w)
        # the kernel, in blocks cut at random places
        u8 = np.frombuffer(raw, np.uint8)
        cuts = sorted({1, n + 1, *rng.sample(range(1, n + 2), min(3, n))})
        last = np.zeros(slots, np.int32)
        got_bad, got_neg, got_before, got_ooo, prev_phy, reach = [], [], [], None, None, []
        for a, b in zip(cuts, cuts[1:]):
            blk = entrykernel.index_entries(u8, a, b, slots, np.asarray(starts, np.int64), last, prev_phy)
            assert (blk.first_phy, blk.last_phy) == (rows[a][1], rows[b - 1][1]), (case, a, b)
            prev_phy = blk.last_phy
            got_bad += list(zip(blk.bad_pos.tolist(), blk.bad_exp.tolist(), blk.bad_prev.tolist()))
            got_neg += list(zip(blk.neg_pos.tolist(), blk.neg_kh.tolist()))
            got_before += list(zip(blk.before_pos.tolist(), blk.before_phy.tolist()))
            got_ooo = got_ooo or blk.out_of_order
            if blk.windows is not None:
                reach.append(blk.windows)
        assert got_bad == bad, (case, got_bad[:5], bad[:5])
        assert got_neg == neg and got_before == before and got_ooo == ooo, case
        assert last.tolist() == newest, case
        if reach:
            assert (min(r[0] for r in reach), max(r[1] for r in reach)) == (lo, hi), case
        else:
            assert lo is None


def _records(rng: random.Random, phys: list):
    n = len(phys)
    counts = [rng.randrange(0, 3) for _ in range(n)]
    keys = [rng.randrange(1 << 31) for _ in range(sum(counts))]
    key_start = np.zeros(n, np.int32)
    key_start[1:] = np.cumsum(counts)[:-1]
    cols = {"sysFlag": np.asarray([rng.choice([0, 0, 0, TRANSACTION_ROLLBACK, 8]) for _ in range(n)], np.int32),
            "storeTimestamp": np.asarray([1_700_000_000_000 + rng.randrange(-5000, 10 ** 7) for _ in range(n)], np.int64),
            "keyCount": np.asarray(counts, np.int16)}
    return SimpleNamespace(phy=np.asarray(phys, np.int64), c=cols, keys=np.asarray(keys, np.int32), key_start=key_start)


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_index_range_matches_a_plain_walk(chunk, monkeypatch):
    """Also with the range passed in chunks far shorter than it (results joined across chunk boundaries)."""
    if chunk is not None:
        monkeypatch.setattr(entrykernel, "RANGE_CHUNK", chunk)
    print(f"seed {SEED} (RMQSTORE_ENTRIES_SEED)")
    rng = random.Random(SEED + 1)
    for case in range(40):
        phys = sorted(rng.sample(range(0, 1 << 16), 200))
        recs = _records(rng, phys)
        n = rng.randrange(1, 400)
        raw, rows = _entries(rng, n, phys)
        rows = list(rows)
        for e in range(1, n + 1):  # most entries carry a key of their record, some the right time difference
            kh, phy, diff, prev = rows[e]
            if phy in phys and rng.random() < 0.7:
                r = phys.index(phy)
                s, c = int(recs.key_start[r]), int(recs.c["keyCount"][r])
                if c:
                    kh = int(recs.keys[s + rng.randrange(c)])
                if rng.random() < 0.7:
                    diff = max(0, (int(recs.c["storeTimestamp"][r]) - 1_700_000_000_000) // 1000)
            rows[e] = (kh, phy, diff, prev)
        raw = b"".join(struct.pack(">iqii", *r) for r in rows)
        u8 = np.frombuffer(raw, np.uint8)
        ws = rng.choice([0, phys[50]])
        we = rng.choice([phys[150], 1 << 20, (1 << 63) - 1])
        begin = rng.choice([0, 1_700_000_000_000])
        a = rng.randrange(1, n + 1)
        b = rng.randrange(a, n + 1) + 1
        last_in = we if we >= (1 << 63) - 1 else we - 1
        nf, flagged, found = [], [], []
        for e in range(a, b):
            kh, phy, diff, _ = rows[e]
            if phy < ws or phy > last_in:
                continue
            if phy not in phys:
                nf.append((e, phy))
                continue
            r = phys.index(phy)
            found.append((e, r))
            if kh < 0:
                continue
            s, c = int(recs.key_start[r]), int(recs.c["keyCount"][r])
            bad = (int(recs.c["sysFlag"][r]) & 0xC) == TRANSACTION_ROLLBACK or kh not in recs.keys[s:s + c].tolist()
            if not bad and begin > 0 and e >= 2:
                d = int(recs.c["storeTimestamp"][r]) - begin
                bad = diff != min(int(d / 1000) if d >= 0 else 0, 2**31 - 1)
            if bad:
                flagged.append((e, r, kh, phy, diff))
        held = np.full(len(phys), 3, np.int32) if case % 2 else None  # counted onto what is there
        (got_nf, got_nf_phy), fl, first, last = entrykernel.index_range(u8, a, b, ws, we, recs, begin, held)
        if held is not None:
            want_held = [3] * len(phys)
            for _, r in found:
                want_held[r] += 1
            assert held.tolist() == want_held, case
        assert list(zip(got_nf.tolist(), got_nf_phy.tolist())) == nf, case
        assert list(zip(*(v.tolist() for v in fl))) == flagged, case
        assert (first, last) == ((found[0], found[-1]) if found else (None, None)), case


def test_queue_file_valid_matches_a_plain_walk():
    print(f"seed {SEED} (RMQSTORE_ENTRIES_SEED)")
    rng = random.Random(SEED + 2)
    max_addr = -(1 << 40)  # tagsCode at most this: an ext address
    for case in range(60):
        n = rng.randrange(0, 300)
        starts = sorted(rng.sample(range(0, 1 << 20), rng.randrange(1, 5)))
        units = []
        phy = rng.randrange(0, 1 << 19)
        for _ in range(n):
            roll = rng.random()
            if roll < 0.05:
                units.append(CQ_FILLER)
            elif roll < 0.08:
                units.append((rng.choice([-1, 5]), rng.choice([0, -3, 10]), 0))  # invalid (or valid by chance)
            else:  # now and then exactly at a window's start: the first offset it owns
                phy = rng.choice(starts) if roll > 0.9 else phy + rng.randrange(-50, 4000)
                units.append((phy, rng.randrange(1, 5000), rng.choice([rng.randrange(1 << 40), max_addr - rng.randrange(9)])))
        raw = b"".join(struct.pack(">qiq", *u) for u in units)
        step = rng.choice([1, 2, 16])
        valid = next((i for i, (p, s, _) in enumerate(units) if p < 0 or s <= 0), n)
        fillers = [i for i in range(valid) if units[i] == CQ_FILLER]
        real = [i for i in range(valid) if units[i] != CQ_FILLER]
        ws = [_window_of(starts, units[i][0]) for i in real]
        low = [units[i][2] for i in range(valid) if units[i][2] <= max_addr]
        inside = [w for w in ws if w >= 0]
        want = (len(fillers), fillers[0] if fillers else -1, len(real), max(units[i][0] for i in real) if real else None,
                (min(inside), max(ws)) if inside else (None, None), [i for i, w in zip(real, ws) if w < 0])
        samples = ([ws[j] for j in range(0, len(real), step)], [real[j] for j in range(0, len(real), step)])
        got_n, got, got_low = checkkernel.queue_file_valid(np.frombuffer(raw, np.uint8), n, np.asarray(starts, np.int64), step,
                                                           max_addr)
        assert got_n == valid and got_low == (max(low) if low else None), case
        assert got[:5] + (got[5].tolist(),) == want, case
        ordered = all(x <= y for x, y in zip(ws, ws[1:]))
        assert (None if got[6] is None else (got[6][0].tolist(), got[6][1].tolist())) == (samples if ordered else None), case


def test_index_range_scratch_does_not_grow_with_the_range():
    """A window's run of entries is hundreds of thousands long: the pass's scratch columns (7 int64 per entry of
    one call) must stay bounded, not grow with the run (they did: ~30 MB spikes per window on a 100 B store)."""
    import tracemalloc

    n = 600_000
    u8 = np.zeros((n + 1) * 20, np.uint8)  # every entry points at offset 0, before the window: nothing to report
    recs = _records(random.Random(SEED + 3), [10, 20])
    entrykernel.index_range(u8, 1, 3, 5, 30, recs, 0)  # compiled before measuring
    tracemalloc.start()
    try:
        got = entrykernel.index_range(u8, 1, n + 1, 5, 30, recs, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got[0][0].size == 0 and got[1][0].size == 0 and got[2:] == (None, None)
    assert peak < 4 << 20, peak  # the whole run's columns would be 7 * 8 * n = 33.6 MB
