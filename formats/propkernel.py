"""Compiled property kernels (numba, nopython): the properties dispatch reads, found and hashed one
record per loop step.

``MessageDecoder.string2messageProperties`` (FORMAT.md §3.2) splits the property string at
``\\x02``, each entry at its first ``\\x01``, and a later entry overwrites an earlier one; for the
names dispatch wants (``TAGS``, ``KEYS``, ``UNIQ_KEY``, ``DELAY``) that is "the last entry that
starts with ``NAME\\x01`` and has a non-empty value". The hashes are Java's ``String.hashCode``
over bytes, which equals the UTF-16 one for ASCII; callers send records with any non-ASCII
property byte to the one-at-a-time rules (:mod:`formats.properties`), and the kernels say which.

Imported only through :mod:`formats.propscan` (lazily, like :mod:`formats.kernel`); compiled once
per environment and cached.
"""

from __future__ import annotations

import numba
import numpy as np

from .kernel import _jit

SEPARATOR = 2  # between entries (\x02)
SPACE = 0x20  # between KEYS tokens
INT32_MIN = -(1 << 31)


@numba.njit(inline="always")
def _java_hash(h, u8, s, e):
    """Java ``String.hashCode`` continued from ``h`` over the ASCII bytes ``u8[s:e]`` (as uint32)."""
    for j in range(s, e):
        h = np.uint32(h * np.uint32(31) + np.uint32(u8[j]))
    return h


@numba.njit(inline="always")
def _same_bytes(a, ai, b, bi, n):
    """``a[ai:ai+n] == b[bi:bi+n]``."""
    for t in range(n):
        if a[ai + t] != b[bi + t]:
            return False
    return True


def _find_props(u8, starts, lengths, pats, pat_off, out_s, out_e, ascii_ok):
    """For record i (property string ``u8[starts[i]:starts[i]+lengths[i]]``) and wanted name k
    (``pats[pat_off[k]:pat_off[k+1]]`` = ``NAME\\x01``): the value span of the last matching entry
    into ``out_s[k, i]``/``out_e[k, i]`` (left at -1 when absent); ``ascii_ok[i]`` = no byte >= 0x80."""
    names = pat_off.shape[0] - 1
    for i in range(starts.shape[0]):
        s = starts[i]
        end = s + lengths[i]
        if lengths[i] <= 0:
            continue
        entry = s
        j = s
        while j <= end:
            if j < end:
                b = u8[j]
                if b >= 0x80:
                    ascii_ok[i] = False
                if b != SEPARATOR:
                    j += 1
                    continue
            # entry [entry, j)
            n = j - entry
            first = u8[entry] if n > 0 else 0
            for k in range(names):
                a = pat_off[k]
                L = pat_off[k + 1] - a
                if n <= L or first != pats[a]:
                    continue
                if _same_bytes(u8, entry, pats, a, L):
                    out_s[k, i] = entry + L
                    out_e[k, i] = j
            entry = j + 1
            j += 1


def _java_hash_spans(u8, starts, ends, out):
    """Java ``String.hashCode`` (as uint32) of each ASCII byte span ``u8[starts[i]:ends[i]]``."""
    for i in range(starts.shape[0]):
        out[i] = _java_hash(np.uint32(0), u8, starts[i], ends[i])


def _group_spans(u8, starts, lengths, group, firsts, slots):
    """Equal byte spans ``u8[starts[i]:starts[i]+lengths[i]]`` grouped: ``group[i]`` is the span's group,
    numbered in first-occurrence order, ``firsts[g]`` the first span of group g; returns the number of
    groups. One open-addressing table keyed by (Java hash, length) whose hits are confirmed byte by byte,
    so different spans never share a group, whatever their hashes. ``slots``: the table, all -1, a power
    of two of at least 2n entries (made by the caller: an array made in a kernel makes loading it from the
    cache import numba's array module, ~30 ms of a command's start)."""
    n = starts.shape[0]
    mask = slots.shape[0] - 1
    groups = 0
    for i in range(n):
        s, ln = starts[i], lengths[i]
        h = _java_hash(np.uint32(0), u8, s, s + ln)
        k = np.int64((np.uint64(h) * np.uint64(0x9E3779B1) + np.uint64(ln)) & np.uint64(mask))
        while True:
            g = slots[k]
            if g < 0:
                slots[k] = groups
                firsts[groups] = i
                group[i] = groups
                groups += 1
                break
            f = firsts[g]
            if lengths[f] == ln and _same_bytes(u8, starts[f], u8, s, ln):
                group[i] = g
                break
            k = (k + 1) & mask
    return groups


@numba.njit(inline="always")
def _key_hash_of(h):
    """Index keyHash (§10.3): abs of the int32 hash, Integer.MIN_VALUE -> 0."""
    v = np.int64(np.int32(h))
    if v == INT32_MIN:
        return np.int32(0)
    return np.int32(-v if v < 0 else v)


def _key_hashes(u8, use, prefix, uniq_s, uniq_e, keys_s, keys_e, counts, out):
    """Index key hashes of ``topic#key`` for the records with ``use[i]``: UNIQ_KEY first, then every
    non-empty space-separated token of KEYS, in order (duplicates kept); ``prefix[i]`` is the uint32
    hash of ``topic#``. Writes ``counts[i]`` and appends to ``out``; returns how many were written."""
    t = 0
    for i in range(use.shape[0]):
        if not use[i]:
            continue
        c = 0
        if uniq_s[i] >= 0:
            out[t] = _key_hash_of(_java_hash(np.uint32(prefix[i]), u8, uniq_s[i], uniq_e[i]))
            t += 1
            c += 1
        if keys_s[i] >= 0:
            j = keys_s[i]
            e = keys_e[i]
            while j < e:
                while j < e and u8[j] == SPACE:
                    j += 1
                if j >= e:
                    break
                h = np.uint32(prefix[i])
                while j < e and u8[j] != SPACE:
                    h = np.uint32(h * np.uint32(31) + np.uint32(u8[j]))
                    j += 1
                out[t] = _key_hash_of(h)
                t += 1
                c += 1
        counts[i] = c
    return t


find_props = _jit(_find_props)
java_hash_spans = _jit(_java_hash_spans)
key_hashes = _jit(_key_hashes)
group_spans = _jit(_group_spans)
