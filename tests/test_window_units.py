"""Recovery's derived check takes a window's consume-queue units from windowunits.WindowUnits: samples, cursors
and rounds instead of a table of queues x windows. Every kept real unit pointing into a window must be handed out
in that window, with its file and queue offset right, whatever the order the windows come in (a -j worker takes
segments out of order), the rounds' sizes, the samples' spacing and the parts' size."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from rmqstore_cli.engine.repair import windowunits
from rmqstore_cli.engine.repair.windowunits import WindowUnits
from rmqstore_cli.formats.records import CQ_FILLER

SEED = int(os.environ.get("RMQSTORE_WINDOW_UNITS_SEED", random.randrange(1 << 30)))
UNIT = np.dtype([("phyOffset", ">i8"), ("size", ">i4"), ("tagsCode", ">i8")])


def _files(rng: random.Random, wbounds: np.ndarray, end: int) -> list:
    """(key, queue offset of unit 0, units, first real unit or None) of a few queues' files: units in log order
    (dense in some windows, a few or none in others), some files out of order, pre-blank fillers in some."""
    out = []
    for q in range(rng.randint(1, 12)):
        key = (f"T{q % 3}", q)
        n_files = rng.randint(1, 3)
        per_file = rng.randint(1, 300)
        total = n_files * per_file
        fillers = rng.choice([0, 0, rng.randint(1, min(total, 40))])
        kind = rng.choice(["uniform", "bursty", "behind"])
        if kind == "uniform":
            phy = sorted(rng.randrange(int(wbounds[0]), end) for _ in range(total - fillers))
        elif kind == "bursty":  # most units in a few windows
            hot = [rng.randrange(len(wbounds)) for _ in range(3)]
            phy = sorted(int(wbounds[w]) + rng.randrange(int(wbounds[w + 1] - wbounds[w]) if w + 1 < len(wbounds)
                                                         else end - int(wbounds[w])) for w in rng.choices(hot, k=total - fillers))
        else:  # the first units behind the log's first file (deleted by the cleaner)
            phy = sorted(rng.randrange(0, int(wbounds[0])) if i < 5 else rng.randrange(int(wbounds[0]), end)
                         for i in range(total - fillers))
        if rng.random() < 0.2 and len(phy) > 2:  # a file whose units do not rise
            a = rng.randrange(len(phy) - 1)
            phy[a], phy[a + 1] = phy[a + 1] + 1, phy[a]
        units = np.zeros(total, UNIT)
        units["phyOffset"][:fillers] = CQ_FILLER[0]
        units["size"][:fillers] = CQ_FILLER[1]
        units["tagsCode"][:fillers] = CQ_FILLER[2]
        units["phyOffset"][fillers:] = phy
        units["size"][fillers:] = 100
        units["tagsCode"][fillers:] = np.arange(total - fillers)
        base = rng.randrange(0, 1000)
        first_real = base + fillers if fillers < total else None
        for f in range(n_files):
            out.append((key, base + f * per_file, units[f * per_file:(f + 1) * per_file], first_real))
    return out


def _windows_of(phy: np.ndarray, wbounds: np.ndarray) -> np.ndarray:
    return np.searchsorted(wbounds, phy, side="right") - 1


@pytest.mark.parametrize("variant", range(8))
def test_every_unit_of_a_window_is_handed_out(monkeypatch, variant):
    print(f"seed {SEED} (RMQSTORE_WINDOW_UNITS_SEED), variant {variant}")
    rng = random.Random(SEED * 8 + variant)
    guess, margin, step = [(1, 0, 1), (2, 0, 3), (64, 16, 1024), (1, 0, 1024)][variant % 4]
    monkeypatch.setattr(windowunits, "_GUESS", guess)
    monkeypatch.setattr(windowunits, "_MARGIN", margin)
    monkeypatch.setattr(windowunits, "SAMPLE_STEP", step)
    chunk = rng.choice([1, 7, 1 << 16])
    n_windows = rng.randint(1, 40)
    wbounds = np.cumsum([rng.randint(1, 5000) for _ in range(n_windows)]).astype(np.int64) + rng.randrange(10000)
    end = int(wbounds[-1]) + rng.randint(1, 5000)
    files = _files(rng, wbounds, end)
    kept = WindowUnits(wbounds)
    added = []
    for key, first, units, first_real in files:
        phy = units["phyOffset"].astype(np.int64)
        real = phy[first + np.arange(len(phy)) >= (first_real if first_real is not None else 1 << 62)]
        real = real[real >= wbounds[0]]
        windows = sorted(set(_windows_of(real, wbounds).tolist()))
        kept.add(key, first, units, phy, first_real, (windows[0], windows[-1]) if windows else ())
        if windows:
            added.append((first, units, first_real))
    kept.done()
    # the windows in log order, or segment by segment out of order as -j workers take them
    order = list(range(n_windows))
    if variant >= 4:
        cut = sorted(rng.sample(range(n_windows + 1), min(3, n_windows + 1)))
        parts = [order[a:b] for a, b in zip([0, *cut], [*cut, n_windows])]
        rng.shuffle(parts)
        order = [k for p in parts for k in p]
    for k in order:
        lo = int(wbounds[k])
        hi = int(wbounds[k + 1]) if k + 1 < n_windows else end
        got = set()
        for units, which, pos in kept.runs(k, chunk):
            for j in range(len(units)):  # each unit handed out is the file's unit at that queue offset
                first, file_units, _ = added[int(which[j])]
                assert units[j].tobytes() == file_units[int(pos[j]) - first].tobytes(), (k, j)
            got.update(zip(which.tolist(), pos.tolist()))
        want = set()
        for e, (first, units, first_real) in enumerate(added):
            phy = units["phyOffset"].astype(np.int64)
            qo = first + np.arange(len(phy))
            mine = (phy >= lo) & (phy < hi) & (qo >= (first_real if first_real is not None else 1 << 62))
            want.update((e, int(p)) for p in qo[mine])
        assert want <= got, (k, sorted(want - got)[:5])
