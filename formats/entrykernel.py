"""Compiled passes of verify over index entries (FORMAT.md §10.3-10.4), beside :mod:`.checkkernel`'s over
consume-queue units, with its helpers (big-endian reads, window and record lookup) and the same rules for what
reaches Python: :func:`index_entries` reads a block of an index file's entries once before the walk (slot chains,
negative key hashes, the entries' commitlog order, the windows they point into), :func:`index_range` a run of
entries against one window's records (those that found no record, and the few flagged for the Python rules of
``engine/verify/index.check_found_entries``). Both read the file's own bytes: no decoded column of it is made.
"""

from __future__ import annotations

import numpy as np

from . import aot, checkkernel
from .checkkernel import IX_DIFF, IX_HASH, IX_PHY, IX_PREV, TRAN_MASK, _last_offset
from .records import INDEX_ENTRY_SIZE, TRANSACTION_ROLLBACK

AHEAD = 32  # entries between a slot's prefetch and its use

_COMPILED: dict = {}


@aot.first(__name__)  # the ahead-of-time extension's kernel when built and current (formats/aot.py)
def _compiled(name: str):
    """The compiled pass ``name`` (checkkernel's helpers, the chain rule and the prefetch made on the first call)."""
    fn = _COMPILED.get(name)
    if fn is None:
        from . import kernel, wordops
        from .indexchain import link_kernel, slot_kernels

        g = globals()
        if not _COMPILED:
            checkkernel._compiled("_queue_runs")  # compiles checkkernel's helpers (replaced in its globals)
            for helper in ("_be64", "_be32", "_window_of", "_find"):
                g[helper] = getattr(checkkernel, helper)
            g["_link"] = link_kernel()  # the slot-chain rule, one implementation (formats.indexchain)
            g["_slot_magic"], g["_slot_of"] = slot_kernels()
            g["_prefetch"] = wordops._prefetch
        fn = _COMPILED[name] = kernel._jit(g[name], refcounts=False)  # makes no array: no reference counting (kernel._jit)
    return fn


# Replaced by their compiled forms before the passes compile (see _compiled).
_be64 = _be32 = _window_of = _find = _link = _slot_magic = _slot_of = None


def _prefetch(arr, i):
    """Replaced by :func:`formats.wordops._prefetch` before the passes compile. The slot-chain check reads one
    random slot per entry (a 20 MB table at the default geometry): asked for some entries ahead, those reads
    overlap instead of waiting one after the other."""
    raise NotImplementedError


def _index_entries(u8, a, b, slots, starts, last, prev_phy, bad_pos, bad_exp, bad_prev, neg_pos, neg_kh, before_pos,
                   before_phy, state):
    """Index entries ``a .. b-1`` (``u8``: the entry table's bytes from entry 0, 20 per entry) before the walk, in one
    pass: slot chains (``last``: the newest entry per slot so far, updated), negative key hashes, the entries'
    commitlog order (``prev_phy``: the previous entry's offset, or -2**62 for none) and the windows they point
    into. ``state`` = [wrong links, negative hashes, entries before the first window, lowest window, highest
    window, first entry out of order (-1), its offset, the previous entry's offset, first entry's offset, last
    entry's offset]."""
    nbad = 0
    nneg = 0
    nb = 0
    lo = len(starts)
    hi = -1
    ooo = -1
    ooo_phy = np.int64(0)
    ooo_prev = np.int64(0)
    none = np.int64(-1) << 62
    cur = -1  # window of the previous entry: consecutive entries mostly point into the same one
    cur_lo = np.int64(1)
    cur_hi = np.int64(0)
    first_phy = np.int64(0)
    p = np.int64(0)
    magic = _slot_magic(slots)
    for e in range(a, b):
        x = e * INDEX_ENTRY_SIZE
        if e + AHEAD < b:
            ka = _be32(u8, x + AHEAD * INDEX_ENTRY_SIZE + IX_HASH)
            if ka >= 0:
                _prefetch(last, _slot_of(ka, slots, magic))
        k = _be32(u8, x + IX_HASH)
        p = _be64(u8, x + IX_PHY)
        if e == a:
            first_phy = p
        if ooo < 0 and prev_phy != none and prev_phy > p:
            ooo = e
            ooo_phy = p
            ooo_prev = prev_phy
        prev_phy = p
        if k < 0:
            neg_pos[nneg] = e
            neg_kh[nneg] = k
            nneg += 1
        else:
            pv = _be32(u8, x + IX_PREV)
            want = _link(k, pv, e, slots, magic, last)
            if want >= 0:
                bad_pos[nbad] = e
                bad_exp[nbad] = want
                bad_prev[nbad] = pv
                nbad += 1
        if cur_lo <= p < cur_hi:
            w = cur
        else:
            w = _window_of(starts, p)
            if w >= 0:
                cur = w
                cur_lo = starts[w]
                cur_hi = starts[w + 1] if w + 1 < len(starts) else np.int64(9223372036854775807)
        if w < 0:
            before_pos[nb] = e
            before_phy[nb] = p
            nb += 1
        else:
            if w < lo:
                lo = w
            if w > hi:
                hi = w
    state[0] = nbad
    state[1] = nneg
    state[2] = nb
    state[3] = lo
    state[4] = hi
    state[5] = ooo
    state[6] = ooo_phy
    state[7] = ooo_prev
    state[8] = first_phy
    state[9] = p


class EntryBlock:
    """What :func:`index_entries` found in one block of index entries (entry numbers are absolute)."""

    __slots__ = ("bad_pos", "bad_exp", "bad_prev", "neg_pos", "neg_kh", "before_pos", "before_phy", "windows",
                 "out_of_order", "first_phy", "last_phy")


def index_entries(u8, a: int, b: int, slots: int, starts, last, prev_phy: int | None) -> EntryBlock:
    """Entries ``a .. b-1`` read once before the walk (:func:`_index_entries`): the entries whose prevIndex is wrong
    (``bad_pos``, the entry each should link to ``bad_exp``, its prevIndex ``bad_prev``), those with a negative key
    hash (``neg_pos``, ``neg_kh``), those pointing before the first window (``before_pos``, ``before_phy``), the
    (lowest, highest) window the others point into (None when none does), the first entry whose offset is below
    the previous one's as (previous entry, its offset, entry, offset) or None, the first and last entry's offsets.
    ``prev_phy`` is entry ``a - 1``'s offset (None for the file's first block)."""
    n = max(b - a, 0)
    i64 = lambda: np.empty(n, np.int64)  # noqa: E731
    bad_pos, bad_exp, bad_prev, neg_pos, neg_kh, before_pos, before_phy = (i64() for _ in range(7))
    state = np.zeros(10, np.int64)
    _compiled("_index_entries")(u8, np.int64(a), np.int64(b), np.int64(slots), starts, last,
                                np.int64(-(1 << 62) if prev_phy is None else prev_phy), bad_pos, bad_exp, bad_prev, neg_pos,
                                neg_kh, before_pos, before_phy, state)
    nbad, nneg, nb, lo, hi, ooo, ooo_phy, ooo_prev, first_phy, last_phy = (int(v) for v in state)
    out = EntryBlock()
    out.bad_pos, out.bad_exp, out.bad_prev = bad_pos[:nbad].copy(), bad_exp[:nbad].copy(), bad_prev[:nbad].copy()
    out.neg_pos, out.neg_kh = neg_pos[:nneg].copy(), neg_kh[:nneg].copy()
    out.before_pos, out.before_phy = before_pos[:nb].copy(), before_phy[:nb].copy()
    out.windows = (lo, hi) if hi >= 0 else None
    out.out_of_order = (ooo - 1, ooo_prev, ooo, ooo_phy) if ooo >= 0 else None
    out.first_phy, out.last_phy = first_phy, last_phy
    return out


def _index_range(u8, a, b, ws, we, rphy, rsys, rts, keys, key_start, key_count, begin_ts, held, nf_pos, nf_phy, fl_pos,
                 fl_rec, fl_kh, fl_phy, fl_diff, state):
    """Index entries ``a .. b-1`` (read from ``u8``, the entry table's bytes from entry 0) pointing into
    ``[ws, we]`` (inclusive). ``state`` = [not found, flagged, last found entry (-1), first found entry, its
    record, last found entry's record]. An entry is flagged when it points at a rollback record, at a record
    without a key of its hash, or (``begin_ts`` > 0, from entry 2) when its timeDiff is not the record's store
    time - ``begin_ts`` in whole seconds (clamped to int32; offsets of 2**53 ms or more are flagged for the exact
    rule). Entries with a negative key hash are not checked against their record (reported before the walk).
    ``held`` (one per record, or empty): each found entry adds one to its record's (the index coverage's count)."""
    count_held = len(held) > 0
    nnf = 0
    nfl = 0
    hint = 0
    first = -1
    first_rec = -1
    last = -1
    last_rec = -1
    for e in range(a, b):
        x = e * INDEX_ENTRY_SIZE
        p = _be64(u8, x + IX_PHY)
        if p < ws or p > we:
            continue
        r = _find(rphy, p, hint)
        if r < 0:
            nf_pos[nnf] = e
            nf_phy[nnf] = p
            nnf += 1
            continue
        hint = r
        if count_held:
            held[r] += 1
        if first < 0:
            first = e
            first_rec = r
        last = e
        last_rec = r
        k = _be32(u8, x + IX_HASH)
        if k < 0:  # IDX_KEY_HASH for the hash itself, reported before the walk
            continue
        bad = (rsys[r] & TRAN_MASK) == TRANSACTION_ROLLBACK
        if not bad:
            has = False
            s = key_start[r]
            for j in range(key_count[r]):
                if keys[s + j] == k:
                    has = True
                    break
            bad = not has
        diff = _be32(u8, x + IX_DIFF)
        if not bad and begin_ts > 0 and e >= 2:
            d = rts[r] - begin_ts
            if d >= 9007199254740992 or d <= -9007199254740992:
                bad = True
            else:
                # trunc(d / 1000.0) for 0 <= d < 2**53: the float quotient never rounds up to the next integer
                # (its distance to it, >= 0.001, exceeds half an ulp below 2**43), so it is the integer one
                want = d // 1000 if d >= 0 else np.int64(0)
                if want > 2147483647:
                    want = 2147483647
                bad = diff != want
        if bad:
            fl_pos[nfl] = e
            fl_rec[nfl] = r
            fl_kh[nfl] = k
            fl_phy[nfl] = p
            fl_diff[nfl] = diff
            nfl += 1
    state[0] = nnf
    state[1] = nfl
    state[2] = last
    state[3] = first
    state[4] = first_rec
    state[5] = last_rec


_NO_HELD = np.zeros(0, np.int32)  # no counting
RANGE_CHUNK = 1 << 15  # entries per call of the range pass: its scratch columns stay ~2 MB whatever the range's length


def index_range(u8, a: int, b: int, ws: int, we: int, recs, begin_ts: int, held: np.ndarray | None = None) -> tuple:
    """Entries ``a .. b-1`` against the window ``[ws, we)`` of records ``recs``: ((entries that found no record,
    their offsets), (flagged entries, their records, keyHash, phyOffset, timeDiff), (first found entry, its
    record) or None, (last found entry, its record) or None). ``held`` (int32, one per record of ``recs``), if
    given, gets one added per entry that found the record. The range (a window's entries: hundreds of
    thousands) is passed in chunks of :data:`RANGE_CHUNK` entries, so the scratch columns, which must hold every
    entry of a call in the worst case, do not grow with it."""
    n = min(max(b - a, 0), RANGE_CHUNK)
    scratch = tuple(np.empty(n, np.int64) for _ in range(7))
    state = np.zeros(6, np.int64)
    c = recs.c
    held = _NO_HELD if held is None else held
    kernel = _compiled("_index_range")
    not_found: list = []
    flagged: list = []
    first = last = None
    for lo in range(a, b, RANGE_CHUNK):
        hi = min(lo + RANGE_CHUNK, b)
        kernel(u8, np.int64(lo), np.int64(hi), np.int64(ws), _last_offset(we), recs.phy, c["sysFlag"], c["storeTimestamp"],
               recs.keys, recs.key_start, c["keyCount"], np.int64(begin_ts), held, *scratch, state)
        nnf, nfl = int(state[0]), int(state[1])
        if nnf:
            not_found.append(tuple(v[:nnf].copy() for v in scratch[:2]))
        if nfl:
            flagged.append(tuple(v[:nfl].copy() for v in scratch[2:]))
        if state[2] >= 0:
            if first is None:
                first = (int(state[3]), int(state[4]))
            last = (int(state[2]), int(state[5]))
    return (_joined(not_found, 2), _joined(flagged, 5), first, last)


def _joined(parts: list, width: int) -> tuple:
    """The chunks' columns end to end (``width`` empty columns when no chunk had any row)."""
    if not parts:
        return tuple(np.zeros(0, np.int64) for _ in range(width))
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(col) for col in zip(*parts))


def warm_up() -> None:
    """Compile (or load from the cache) both passes with the argument types verify uses (and checkkernel's)."""
    recs = checkkernel.warm_up()
    z = np.zeros(2, np.int64)
    for writable in (True, False):  # files are mapped read-only; tests and copies hand over writable bytes
        u8 = np.zeros(60, np.uint8)
        u8.flags.writeable = writable
        index_entries(u8, 1, 3, 4, z, np.zeros(4, np.int32), None)
        index_range(u8, 1, 3, 0, 1, recs, 0)  # held: int32, empty or one per record (one signature)
