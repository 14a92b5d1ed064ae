"""Speculative lane walk: commitlog record boundaries in numpy lock-step (NOTES-performance).

The sequential walk reads TOTALSIZE/MAGIC of one record per Python iteration (~250 ns).
Here the byte range is cut into K lanes; every lane but the first starts at the first
magic-code hit inside it and all lanes advance together, one numpy step per record. A
lane's records are kept only if the chain from the range start enters the lane exactly
where the lane started (bodies may contain the magic bytes, so a hit is only a guess);
lanes that disagree are walked again from the position their predecessor ended at, until
every lane agrees. The result is therefore exactly the sequential chain.
"""

from __future__ import annotations

import struct

import numpy as np

_MAX_ROUNDS = 6  # re-walk rounds before finishing sequentially (never reached on real data)


def windows8(u8: np.ndarray) -> np.ndarray:
    """(len-7, 8) read-only view: row p is bytes p..p+7 (gathers 8 bytes per index, no index matrix)."""
    n = max(len(u8) - 7, 0)
    return np.lib.stride_tricks.as_strided(u8, shape=(n, 8), strides=(1, 1), writeable=False)


def _first_hits(buf, a: np.ndarray, b: np.ndarray, end: int, fourth: bytes, prefix: bytes) -> np.ndarray:
    """For each lane [a, b): first c with a <= c < b, c + 8 <= end and a magic at c + 4; else -1."""
    find = buf.find
    out = []
    append = out.append
    for lo, hi in zip(a.tolist(), b.tolist()):
        stop = min(hi + 4, end - 4) + 3  # the 3-byte prefix must start before hi + 4
        h = find(prefix, lo + 4, stop)
        while h >= 0 and buf[h + 3] not in fourth:
            h = find(prefix, h + 1, stop)
        append(h - 4 if h >= 0 else -1)
    return np.array(out, dtype=np.int64)


def _lockstep(win8, cur, lane_end, end, v1, v2, min_size):
    """Walk every lane from ``cur`` until it leaves its range (exit) or meets a non-record (stop).

    Returns (exits, stopped, counts, lanes, steps, positions): the records as three flat
    arrays (local lane index, step within the lane, position).
    """
    k = len(cur)
    p = cur.copy()
    exits = cur.copy()
    stopped = np.zeros(k, dtype=bool)
    counts = np.zeros(k, dtype=np.int64)
    act = np.arange(k)
    rl, rt, rp = [], [], []
    step = 0
    while len(act):
        pa = p[act]
        inside = pa < lane_end[act]
        if not inside.all():
            gone = act[~inside]
            exits[gone] = p[gone]
            act = act[inside]
            pa = pa[inside]
            if not len(act):
                break
        fits = pa + 8 <= end
        if not fits.all():
            gone = act[~fits]
            exits[gone] = p[gone]
            stopped[gone] = True
            act = act[fits]
            pa = pa[fits]
            if not len(act):
                break
        sm = win8[pa].view(">i4")
        size = sm[:, 0].astype(np.int64)
        magic = sm[:, 1]
        good = ((magic == v1) | (magic == v2)) & (size >= min_size) & (pa + size <= end)
        if not good.all():
            gone = act[~good]
            exits[gone] = pa[~good]
            stopped[gone] = True
            act = act[good]
            pa = pa[good]
            size = size[good]
        rl.append(act)
        rt.append(np.full(len(act), step, dtype=np.int64))
        rp.append(pa)
        p[act] = pa + size
        counts[act] += 1
        step += 1
    if rl:
        return exits, stopped, counts, np.concatenate(rl), np.concatenate(rt), np.concatenate(rp)
    z = np.zeros(0, dtype=np.int64)
    return exits, stopped, counts, z, z, z


def lane_walk(buf, u8, pos: int, wend: int, end: int, magics, min_size: int, lanes: int, seq_walk):
    """Record starts of the chain from ``pos`` that begin before ``wend``.

    Returns (offsets, position, stopped): ``position`` is where the chain left the window
    (>= wend) or, if ``stopped``, the position of the first non-record.
    ``seq_walk(pos)`` -> (offsets, stop position) finishes sequentially (to the end of the
    data) when the lanes do not settle.
    """
    v1 = magics[0]
    v2 = magics[1] if len(magics) > 1 else magics[0]
    prefix = struct.pack(">i", v1)[:3]
    fourth = bytes({struct.pack(">i", m)[3] for m in magics})
    width = (wend - pos) // lanes
    a = pos + np.arange(lanes, dtype=np.int64) * width
    lane_end = np.empty(lanes, dtype=np.int64)
    lane_end[:-1] = a[1:]
    lane_end[-1] = wend
    starts = np.empty(lanes, dtype=np.int64)
    starts[0] = pos
    starts[1:] = _first_hits(buf, a[1:], lane_end[1:], end, fourth, prefix)
    win8 = windows8(u8)

    # Lanes without a hit hold no record start of their own: they wait (exit unknown, -1).
    known = starts >= 0
    idx = np.flatnonzero(known)
    exits = np.full(lanes, -1, dtype=np.int64)
    stopped = np.zeros(lanes, dtype=bool)
    counts = np.zeros(lanes, dtype=np.int64)
    batch_of = np.full(lanes, -1, dtype=np.int64)
    batches = []

    def run(sel: np.ndarray, begin: np.ndarray) -> None:
        e, s, c, rl, rt, rp = _lockstep(win8, begin, lane_end[sel], end, v1, v2, min_size)
        exits[sel] = e
        stopped[sel] = s
        counts[sel] = c
        starts[sel] = begin
        batch_of[sel] = len(batches)
        batches.append((sel[rl], rt, rp))

    run(idx, starts[idx])
    entry = np.empty(lanes, dtype=np.int64)
    prev_stopped = np.zeros(lanes, dtype=bool)
    for _ in range(_MAX_ROUNDS + 1):
        entry[0] = pos
        entry[1:] = exits[:-1]
        prev_stopped[1:] = stopped[:-1]
        # A lane is settled when it was walked from exactly where the chain enters it.
        unsettled = (entry != starts) | (exits < 0)
        unsettled[0] = False
        cut = np.flatnonzero(prev_stopped | unsettled)
        if not len(cut):
            return _assemble(batches, batch_of, counts, lanes - 1), int(exits[-1]), bool(stopped[-1])
        first = int(cut[0])
        if prev_stopped[first]:  # lanes < first are settled and the chain stops in lane first - 1
            return _assemble(batches, batch_of, counts, first - 1), int(exits[first - 1]), True
        redo = cut[unsettled[cut] & ~prev_stopped[cut] & (entry[cut] >= 0)]
        if _ == _MAX_ROUNDS:
            break
        run(redo, entry[redo].copy())
    # Did not settle: lanes before ``first`` are exact; walk on sequentially from its entry.
    head = _assemble(batches, batch_of, counts, first - 1)
    tail, position = seq_walk(int(entry[first]))
    return np.concatenate((head, tail)), position, True


def _assemble(batches, batch_of, counts, last: int) -> np.ndarray:
    """Positions of lanes 0..last in chain order (lane-major, step-minor), no sort needed."""
    if last < 0:
        return np.zeros(0, dtype=np.int64)
    cnt = counts[: last + 1]
    base = np.zeros(last + 1, dtype=np.int64)
    np.cumsum(cnt[:-1], out=base[1:])
    out = np.empty(int(cnt.sum()), dtype=np.int64)
    for b, (rl, rt, rp) in enumerate(batches):
        keep = rl <= last
        keep &= batch_of[rl] == b
        if keep.all():
            out[base[rl] + rt] = rp
        elif keep.any():
            out[base[rl[keep]] + rt[keep]] = rp[keep]
    return out
