"""Index-file slot chains (FORMAT.md §10.4) checked in one sequential pass, block by block.

Each entry links (``prevIndex``) to the previous entry of its hash slot, and the slot table holds
the newest entry of each slot. Walking the entries in order with the newest entry seen so far per
slot gives both expectations without sorting the file's entries by slot (a full default-geometry
index file has 20 M entries: an argsort of them costs hundreds of MB). The per-slot array is the
only state kept between blocks, so verify reads a file in blocks of entries.

:func:`chain_block_reference` is the same rule in vectorised numpy (argsort by slot) for tests.
"""

from __future__ import annotations

import numpy as np

_COMPILED: dict = {}


def _kernel():
    """The compiled chain pass, made on first use: importing numba (~0.3 s) must not slow the start
    of commands that never check an index file."""
    if not _COMPILED:
        from .kernel import _jit

        # the rule first: the passes (this module's and checkkernel's entry pass) call it compiled
        _COMPILED["link"] = _jit(_link, refcounts=False)  # they make no array: no reference counting (kernel._jit)
        globals()["_link"] = _COMPILED["link"]
        _COMPILED["block"] = _jit(_chain_block, refcounts=False)
    return _COMPILED["block"]


def link_kernel():
    """The compiled :func:`_link`, for other compiled passes that check chains while reading entries."""
    _kernel()
    return _COMPILED["link"]


def _link(k, prev, e, slots, last):
    """The chain rule for entry ``e`` (keyHash ``k`` >= 0, prevIndex ``prev``): the entry it should link to when
    ``prev`` differs, else -1; ``e`` becomes its slot's newest entry."""
    s = k % slots
    want = last[s]
    last[s] = e
    return want if prev != want else -1


def _chain_block(kh, prev, first_entry, slots, last, bad_pos, bad_exp):
    nbad = 0
    for i in range(len(kh)):
        k = kh[i]
        if k < 0:  # no slot: verify reports the negative hash itself
            continue
        want = _link(k, prev[i], first_entry + i, slots, last)
        if want >= 0:
            bad_pos[nbad] = i
            bad_exp[nbad] = want
            nbad += 1
    return nbad


def chain_block(kh: np.ndarray, prev: np.ndarray, first_entry: int, slots: int, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Check entries ``first_entry ..`` (their keyHash ``kh`` and ``prevIndex`` ``prev``, int32)
    against ``last`` (int32 per slot: the newest entry seen so far, 0 for none; updated in place).
    Returns (positions in the block whose prevIndex is wrong, the entry each should link to)."""
    kh = np.ascontiguousarray(kh, dtype=np.int32)
    prev = np.ascontiguousarray(prev, dtype=np.int32)
    bad_pos = np.empty(len(kh), np.int64)
    bad_exp = np.empty(len(kh), np.int32)
    n = _kernel()(kh, prev, np.int32(first_entry), np.int32(slots), last, bad_pos, bad_exp)
    return bad_pos[:n].copy(), bad_exp[:n].copy()


def chain_block_reference(kh: np.ndarray, prev: np.ndarray, first_entry: int, slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The whole-file vectorised formulation (sort entries by slot): (bad positions, expected
    prevIndex at them, expected slot table). Memory grows with the file; tests only."""
    n = np.arange(first_entry, first_entry + len(kh), dtype=np.int64)
    slot = np.where(kh >= 0, kh.astype(np.int64) % slots, -1)
    order = np.argsort(slot, kind="stable")
    s_sorted, n_sorted = slot[order], n[order]
    exp_sorted = np.where(np.r_[False, s_sorted[1:] == s_sorted[:-1]], np.r_[0, n_sorted[:-1]], 0)
    exp = np.empty(len(kh), np.int64)
    exp[order] = exp_sorted
    bad = np.flatnonzero((prev != exp) & (slot >= 0))
    table = np.zeros(slots, np.int64)
    last = np.r_[s_sorted[1:] != s_sorted[:-1], True] if len(s_sorted) else np.zeros(0, bool)
    ok = s_sorted[last] >= 0
    table[s_sorted[last][ok]] = n_sorted[last][ok]
    return bad, exp[bad], table
