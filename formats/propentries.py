"""Compiled kernel (numba, nopython): every entry of many records' property strings, as byte spans, for the export's
property columns (formats/arrow.py: the map of all properties, TAGS, UNIQ_KEY and the KEYS tokens).

The rules are ``MessageDecoder.string2messageProperties``' as :mod:`formats.properties` writes them (FORMAT.md §3.2):
entries split at ``\\x02``, each at its first ``\\x01`` into a name and a value, kept only when both are non-empty;
KEYS' value split at spaces into its non-empty tokens. Splitting the bytes gives the pieces the decoded text gives
(the separators are ASCII); the caller hands over only well-formed UTF-8. A record that names a key twice (Java's map
keeps the last value) is reported, not resolved: the caller then takes the record-by-record rules.

Imported only through :mod:`formats.propscan` (lazily, like :mod:`formats.propkernel`).
"""

from __future__ import annotations

import numba

from .kernel import _jit

ENTRY, NAME = 2, 1  # the separators: between entries, between a name and its value
SPACE = 0x20  # between KEYS tokens
PICK_TAGS, PICK_UNIQ_KEY, PICK_KEYS = 0, 1, 2  # the rows of ``picks`` (the names' order in ``names``)


@numba.njit(inline="always")
def _same(u8, a, b, names, c, d):
    """``u8[a:b]`` equals ``names[c:d]``."""
    if b - a != d - c:
        return False
    for j in range(b - a):
        if u8[a + j] != names[c + j]:
            return False
    return True


def _property_entries(u8, starts, lengths, fill, names, name_off, name_s, name_e, value_s, value_e, counts,
                      picks, tok_s, tok_e, tok_counts):
    """The entries of the property strings ``u8[starts[i]:starts[i]+lengths[i]]``, record after record.

    Returns (entries, KEYS tokens, whether a record names a key twice). With ``fill``, also writes each entry's
    name span (``name_s``/``name_e``) and value span (``value_s``/``value_e``), how many entries
    each record has (``counts``), per record the entry of the last of each name ``names[name_off[k]:name_off[k+1]]``
    (``picks[k, i]``, -1 if none: TAGS, UNIQ_KEY, KEYS) and the non-empty space-separated tokens of the last KEYS
    value (``tok_s``/``tok_e``, how many in ``tok_counts``). Without ``fill`` only the two counts are made (the
    arrays' sizes); the repeated name is found when filling."""
    t = 0
    k = 0
    dup = False
    for i in range(starts.shape[0]):
        s = starts[i]
        e = s + max(lengths[i], 0)
        first = t
        keys_s = -1
        keys_e = -1
        j = s
        while j <= e:
            sep = j
            while sep < e and u8[sep] != ENTRY:
                sep += 1
            a = j
            while a < sep and u8[a] != NAME:
                a += 1
            if j < a < sep - 1:  # a separator, a non-empty name before it and a non-empty value after it
                if fill:
                    for q in range(first, t):
                        if _same(u8, name_s[q], name_e[q], u8, j, a):
                            dup = True
                    name_s[t] = j
                    name_e[t] = a
                    value_s[t] = a + 1
                    value_e[t] = sep
                    for p in range(picks.shape[0]):
                        if _same(u8, j, a, names, name_off[p], name_off[p + 1]):
                            picks[p, i] = t
                if _same(u8, j, a, names, name_off[PICK_KEYS], name_off[PICK_KEYS + 1]):
                    keys_s = a + 1
                    keys_e = sep
                t += 1
            j = sep + 1
        if fill:
            counts[i] = t - first
        first_tok = k
        x = keys_s
        while 0 <= x < keys_e:
            while x < keys_e and u8[x] == SPACE:
                x += 1
            if x >= keys_e:
                break
            y = x
            while y < keys_e and u8[y] != SPACE:
                y += 1
            if fill:
                tok_s[k] = x
                tok_e[k] = y
            k += 1
            x = y
        if fill:
            tok_counts[i] = k - first_tok
    return t, k, dup


def _copy_spans(u8, starts, ends, out, offsets):
    """The bytes ``u8[starts[i]:ends[i]]`` back to back into ``out`` and where each ends into ``offsets[i + 1]``
    (``offsets[0]`` = 0): the data and offsets of an Arrow string array, without Arrow's take over every other value
    of a two-values-per-row array (twice the rows, and a copy either way)."""
    p = 0
    offsets[0] = 0
    for i in range(starts.shape[0]):
        for j in range(starts[i], ends[i]):
            out[p] = u8[j]
            p += 1
        offsets[i + 1] = p


property_entries = _jit(_property_entries, refcounts=False)
copy_spans = _jit(_copy_spans, refcounts=False)
