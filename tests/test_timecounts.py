"""stats' per-time-key counts (engine/query/timecounts.py) against a plain dict, on seeded chunk sequences:
rising times (the usual log), steps back, repeats across chunks, coarsening and merging partials."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from rmqstore_cli.engine.query.timecounts import TimeCounts


def _chunks(rng: random.Random, n: int):
    t = rng.randrange(1 << 40)
    for _ in range(n):
        m = rng.randrange(0, 300)
        step = rng.choice([0, 1, 3, 50])
        back = rng.random() < 0.15  # a clock step back, or a chunk that starts on the last key
        start = t - rng.randrange(0, 2000) if back else t
        ts = start + np.cumsum(np.asarray([rng.randrange(0, step + 1) for _ in range(m)], np.int64))
        if len(ts):
            t = max(t, int(ts[-1]))
        yield ts


def _add(ref: dict, keys, counts) -> None:
    for k, c in zip(np.asarray(keys).tolist(), np.asarray(counts).tolist()):
        ref[k] = ref.get(k, 0) + c


@pytest.mark.parametrize("round_", range(4))
def test_equals_a_dict(round_):
    seed = random.SystemRandom().randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    tc, ref, unit = TimeCounts(), {}, 1
    for ts in _chunks(rng, 200):
        keys, counts = np.unique(ts // unit, return_counts=True)
        tc.add(keys, counts)
        _add(ref, keys, counts)
        f = rng.choice([10, 1000])
        # as stats does past its key limit: every key folded into a coarser unit; stats' units (ms up to days)
        # stay far below the times, so the unit is kept within int64 as the times are (< 2**41)
        if rng.random() < 0.03 and unit * f <= 1 << 42:
            tc.coarsen(f)
            unit *= f
            folded = {}
            _add(folded, [k // f for k in ref], list(ref.values()))
            ref = folded
        assert len(tc) == len(ref)
    assert tc.as_dict() == ref
    assert list(tc.keys) == sorted(ref) and int(tc.counts.sum()) == sum(ref.values())


def test_coarsen_and_merge_equal_a_dict():
    seed = random.SystemRandom().randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    parts = []
    for _ in range(3):
        tc, ref = TimeCounts(), {}
        for ts in _chunks(rng, 60):
            keys, counts = np.unique(ts, return_counts=True)
            tc.add(keys, counts)
            _add(ref, keys, counts)
        parts.append((tc, ref))
    f = rng.choice([7, 1000])
    tc, ref = parts[0]
    tc.coarsen(f)
    want = {}
    _add(want, [k // f for k in ref], list(ref.values()))
    assert tc.as_dict() == want
    other, oref = parts[1]
    tc.merge(pickle.loads(pickle.dumps(other)), f)  # partials travel pickled between processes
    _add(want, [k // f for k in oref], list(oref.values()))
    assert tc.as_dict() == want
    assert list(tc.keys) == sorted(want)
