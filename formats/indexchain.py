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

        # the rules first: the passes (this module's and checkkernel's entry pass) call them compiled
        g = globals()
        for name in ("_slot_magic", "_slot_of", "_link"):  # they make no array: no reference counting (kernel._jit)
            g[name] = _COMPILED[name] = _jit(g[name], refcounts=False)
        _COMPILED["block"] = _jit(_chain_block, refcounts=False)
    return _COMPILED["block"]


def link_kernel():
    """The compiled :func:`_link`, for other compiled passes that check chains while reading entries."""
    _kernel()
    return _COMPILED["_link"]


def slot_kernels():
    """The compiled (:func:`_slot_magic`, :func:`_slot_of`), for other compiled passes."""
    _kernel()
    return _COMPILED["_slot_magic"], _COMPILED["_slot_of"]


def _slot_magic(slots):
    """What :func:`_slot_of` multiplies by for ``slots`` slots: ``2**64 // slots + 1`` (as uint64; 0 when
    ``slots`` is not in [2, 2**32): :func:`_slot_of` divides then)."""
    if slots < 2 or slots >= 4294967296:
        return np.uint64(0)
    return np.uint64(0xFFFFFFFFFFFFFFFF) // np.uint64(slots) + np.uint64(1)


def _slot_of(k, slots, magic):
    """``k % slots`` (the hash slot of keyHash ``k``, 0 <= k < 2**32) by three multiplies instead of a division
    (Lemire, Kaser and Kurz, "Faster remainder by direct computation", 2019: the high 64 bits of
    ``(magic * k mod 2**64) * slots``); a division takes ~4 ns of the ~10 ns an entry's checks cost."""
    if magic == 0:
        return np.int64(k % slots)
    low = magic * np.uint64(k)
    hi = (low >> np.uint64(32)) * np.uint64(slots)
    lo = (low & np.uint64(0xFFFFFFFF)) * np.uint64(slots)
    return np.int64((hi + (lo >> np.uint64(32))) >> np.uint64(32))


def _link(k, prev, e, slots, magic, last):
    """The chain rule for entry ``e`` (keyHash ``k`` >= 0, prevIndex ``prev``; ``magic``: :func:`_slot_magic` of
    ``slots``): the entry it should link to when ``prev`` differs, else -1; ``e`` becomes its slot's newest entry."""
    s = _slot_of(k, slots, magic)
    want = last[s]
    last[s] = e
    return want if prev != want else -1


def _chain_block(kh, prev, first_entry, slots, last, bad_pos, bad_exp):
    nbad = 0
    magic = _slot_magic(slots)
    for i in range(len(kh)):
        k = kh[i]
        if k < 0:  # no slot: verify reports the negative hash itself
            continue
        want = _link(k, prev[i], first_entry + i, slots, magic, last)
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
