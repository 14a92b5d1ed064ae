"""Index entries appended to an index file in one compiled pass (IndexFile.putKey for many keys, FORMAT.md §10.4).

For each key in order: its slot (``keyHash % slots``) gives the previous entry of the chain (the slot's
value, 0 when it is not a valid entry number below the new one), the 20-byte entry is written
big-endian (keyHash, phyOffset, timeDiff, prevIndex) and the slot then points at it. Done key after
key, exactly as the broker does, straight into the mapped file: no sort by slot, no temporary entry
array, no copy. The caller (engine/derived/indexwriter) handles files, headers and the journal.
"""

from __future__ import annotations

import numpy as np

from . import aot
from .records import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE

INT_MAX = (1 << 31) - 1
AHEAD = 16  # keys between the prefetch of a key's slot and its use
_COMPILED = None


def _kernel():
    """The pass, on first use: the ahead-of-time extension's when built and current, else compiled by numba then
    (importing numba must not slow the start of commands that never write an index)."""
    return _compiled("_put_entries")


@aot.first(__name__)  # the ahead-of-time extension's kernel when built and current (formats/aot.py)
def _compiled(name: str):
    """numba's compiled pass (the prefetch intrinsic put in place first)."""
    global _COMPILED, _prefetch
    if _COMPILED is None:
        from .kernel import _jit
        from .wordops import _prefetch as intrinsic

        _prefetch = intrinsic
        _COMPILED = _jit(_put_entries)
    return _COMPILED


def _prefetch(arr, i):
    """Replaced by :func:`formats.wordops._prefetch` before the pass compiles. Each key reads and writes one
    random slot (a 20 MB table at the default geometry): asked for some keys ahead, those reads overlap
    instead of waiting one after the other."""
    raise NotImplementedError


def _put_entries(u8, slots, first_num, hashes, phys, tss, begin_ts, first_diff):
    # bytes stored most significant first (big-endian), as Java's MappedByteBuffer puts them
    entry = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE + first_num * INDEX_ENTRY_SIZE
    fresh = 0
    n = len(hashes)
    for j in range(n):
        if j + AHEAD < n:
            _prefetch(u8, INDEX_HEADER_SIZE + (hashes[j + AHEAD] % slots) * INDEX_SLOT_SIZE)
        h = hashes[j]
        num = first_num + j
        sp = INDEX_HEADER_SIZE + (h % slots) * INDEX_SLOT_SIZE
        prev = (np.int64(u8[sp]) << 24) | (np.int64(u8[sp + 1]) << 16) | (np.int64(u8[sp + 2]) << 8) | np.int64(u8[sp + 3])
        if prev >= 1 << 31:
            prev -= 1 << 32
        if prev <= 0 or prev > num:
            prev = 0
            fresh += 1
        if j == 0 and first_diff >= 0:
            diff = first_diff
        elif begin_ts <= 0:
            diff = 0
        else:
            d = tss[j] - begin_ts
            diff = d // 1000 if d >= 0 else -((-d) // 1000)  # Java's division truncates toward zero
            diff = 0 if diff < 0 else (INT_MAX if diff > INT_MAX else diff)
        p = entry + j * INDEX_ENTRY_SIZE
        for b in range(4):
            u8[p + b] = (h >> (24 - 8 * b)) & 0xFF
        ph = phys[j]
        for b in range(8):
            u8[p + 4 + b] = (ph >> (56 - 8 * b)) & 0xFF
        for b in range(4):
            u8[p + 12 + b] = (diff >> (24 - 8 * b)) & 0xFF
        for b in range(4):
            u8[p + 16 + b] = (prev >> (24 - 8 * b)) & 0xFF
        for b in range(4):
            u8[sp + b] = (num >> (24 - 8 * b)) & 0xFF
    return fresh


def put_entries(u8: np.ndarray, slots: int, first_num: int, hashes: np.ndarray, phys: np.ndarray, tss: np.ndarray,
                begin_ts: int, first_diff: int = -1) -> int:
    """Append entries ``first_num ..`` for ``hashes`` (keyHash >= 0), ``phys``, ``tss`` to the index file mapped
    as ``u8`` (uint8, writable, the whole file), linking each into its slot's chain and pointing the slot at it.
    timeDiff is against ``begin_ts`` (0 when it is <= 0), except the first entry's when ``first_diff`` >= 0.
    Returns how many entries found their slot empty (the header's hashSlotCount grows by that)."""
    if not len(hashes):
        return 0
    return int(_kernel()(u8, np.int64(slots), np.int64(first_num), np.ascontiguousarray(hashes, dtype=np.int64),
                         np.ascontiguousarray(phys, dtype=np.int64), np.ascontiguousarray(tss, dtype=np.int64),
                         np.int64(begin_ts), np.int64(first_diff)))
