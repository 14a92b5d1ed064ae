"""The few properties dispatch reads (TAGS, KEYS, UNIQ_KEY, DELAY), found for many records at once.

``MessageDecoder.string2messageProperties`` (FORMAT.md §3.2) splits at ``\\x02``, skips entries
shorter than 3 characters, splits each at its first ``\\x01`` (non-empty name and value), and a
later entry overwrites an earlier one. For a name like ``TAGS`` that means: the value of the last
entry that starts with ``TAGS\\x01`` and has a non-empty value. Splitting the bytes before decoding
gives the same pieces as decoding first (a malformed UTF-8 sequence never swallows an ASCII
separator); records whose properties hold any non-ASCII byte are flagged so callers decode those
with :func:`formats.properties.parse_properties` (hashes are over UTF-16 units there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WANTED = ("TAGS", "KEYS", "UNIQ_KEY", "DELAY")
_INV31 = pow(31, -1, 1 << 32)


@dataclass
class PropValues:
    """Per record: where the value of each wanted name is (absolute buffer positions), -1 if absent."""

    start: dict  # name -> int64 array
    end: dict  # name -> int64 array
    ascii: np.ndarray  # bool: every property byte < 0x80


def scan(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray, names=WANTED) -> PropValues:
    """Locate the wanted properties of the records whose property strings are ``u8[starts:starts+lengths]``."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 0)
    n = len(starts)
    out_s = {k: np.full(n, -1, dtype=np.int64) for k in names}
    out_e = {k: np.full(n, -1, dtype=np.int64) for k in names}
    ascii_ok = np.ones(n, dtype=bool)
    has = np.flatnonzero(lengths > 0)
    if not len(has):
        return PropValues(out_s, out_e, ascii_ok)
    ps, pe = starts[has], starts[has] + lengths[has]
    order_ok = len(ps) < 2 or bool(np.all(ps[1:] >= pe[:-1]))
    if not order_ok:  # overlapping ranges never come from a walk; keep the contract anyway
        return _scan_each(u8, starts, lengths, names)
    # One zero-copy pass over the span holding the chunk's property strings: separators (only those
    # inside a property string count), and the largest byte of each property string (ASCII check).
    lo, hi = int(ps[0]), int(pe[-1])
    region = u8[lo:hi]
    bounds = np.empty(2 * len(ps), dtype=np.int64)
    bounds[0::2], bounds[1::2] = ps - lo, pe - lo
    top = np.maximum.reduceat(region, bounds[:-1])[0::2]
    high = top >= 0x80
    if high.any():
        ascii_ok[has[high]] = False
    cand = np.flatnonzero(region == 2) + lo
    rec = np.searchsorted(ps, cand, side="right") - 1
    inside = (rec >= 0) & (cand < pe[np.maximum(rec, 0)])
    cand, rec = cand[inside], rec[inside]
    # Entries: one starts at each property string start and after each separator.
    e_start = np.concatenate([ps, cand + 1])
    e_rec = np.concatenate([np.arange(len(ps), dtype=np.int64), rec])
    order = np.argsort(e_start, kind="stable")
    e_start, e_rec = e_start[order], e_rec[order]
    nxt_same = np.r_[e_rec[1:] == e_rec[:-1], False]
    e_end = np.where(nxt_same, np.r_[e_start[1:] - 1, 0], pe[e_rec])
    e_len = e_end - e_start
    width = max(len(k) for k in names) + 1
    near_end = e_start > len(u8) - width  # the fixed-width head would leave the buffer: compare these one by one
    safe = np.where(near_end, 0, e_start)
    view = np.lib.stride_tricks.as_strided(u8, shape=(max(len(u8) - width + 1, 0), width), strides=(1, 1), writeable=False)
    heads = view[safe] if len(u8) >= width else np.zeros((len(safe), width), dtype=np.uint8)
    tails = np.flatnonzero(near_end).tolist()
    for k in names:
        raw = k.encode("ascii") + b"\x01"
        pat = np.frombuffer(raw, dtype=np.uint8)
        L = len(pat)
        ok = (e_len > L) & ~near_end & np.all(heads[:, :L] == pat, axis=1)
        for t in tails:
            s0 = int(e_start[t])
            ok[t] = int(e_len[t]) > L and bytes(u8[s0:s0 + L]) == raw
        idx = np.flatnonzero(ok)
        if not len(idx):
            continue
        r = e_rec[idx]
        last = np.r_[r[1:] != r[:-1], True]  # entries are in order: the last one per record wins
        idx, r = idx[last], r[last]
        out_s[k][has[r]] = e_start[idx] + L
        out_e[k][has[r]] = e_end[idx]
    return PropValues(out_s, out_e, ascii_ok)


def _scan_each(u8, starts, lengths, names) -> PropValues:
    n = len(starts)
    out_s = {k: np.full(n, -1, dtype=np.int64) for k in names}
    out_e = {k: np.full(n, -1, dtype=np.int64) for k in names}
    ascii_ok = np.ones(n, dtype=bool)
    for i in range(n):
        s, ln = int(starts[i]), int(lengths[i])
        if ln <= 0:
            continue
        one = scan(u8, np.asarray([s]), np.asarray([ln]), names)
        ascii_ok[i] = one.ascii[0]
        for k in names:
            out_s[k][i], out_e[k][i] = one.start[k][0], one.end[k][0]
    return PropValues(out_s, out_e, ascii_ok)


_POW = np.ones(1, dtype=np.uint64)


def _pow31(n: int) -> np.ndarray:
    global _POW
    if len(_POW) < n:
        p = np.full(max(n, 2 * len(_POW)), 31, dtype=np.uint64)
        p[0] = 1
        _POW = np.cumprod(p) & np.uint64(0xFFFFFFFF)  # wraps mod 2**64, exact mod 2**32
    return _POW[:n]


def java_hash_spans(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Java ``String.hashCode`` (uint32) of the ASCII byte spans ``u8[start:end]``."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    out = np.zeros(len(starts), dtype=np.uint64)
    if not len(starts):
        return out.astype(np.uint32)
    lens = ends - starts
    width = int(lens.max())
    if width <= 0:
        return out.astype(np.uint32)
    # Right-aligned rows ending at each span's end; bytes before the span count as 0 (Horner).
    row0 = ends - width
    if int(row0.min()) >= 0:
        view = np.lib.stride_tricks.as_strided(u8, shape=(len(u8) - width + 1, width), strides=(1, 1), writeable=False)
        rows = view[row0].astype(np.uint32)
    else:
        idx = row0[:, None] + np.arange(width, dtype=np.int64)
        rows = u8[np.maximum(idx, 0)].astype(np.uint32)
    rows[np.arange(width, dtype=np.int64)[None, :] < (width - lens)[:, None]] = 0
    pw = _pow31(width)[::-1].astype(np.uint32)
    rows *= pw  # uint32 arithmetic wraps mod 2**32, as Java's int does
    return rows.sum(axis=1, dtype=np.uint32)


def combine(prefix_hash: np.ndarray, suffix_hash: np.ndarray, suffix_len: np.ndarray) -> np.ndarray:
    """Hash of a concatenation from the hashes of its parts (uint32)."""
    p = _pow31(int(suffix_len.max()) + 1 if len(suffix_len) else 1)
    h = prefix_hash.astype(np.uint64) * p[suffix_len] + suffix_hash.astype(np.uint64)
    return (h & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def key_hash(h32: np.ndarray) -> np.ndarray:
    """Index keyHash of §10.3 from uint32 Java hashes: abs, Integer.MIN_VALUE -> 0 (int64)."""
    s = h32.view(np.int32).astype(np.int64)
    out = np.abs(s)
    out[s == -(1 << 31)] = 0
    return out
