"""Compiled property kernels (numba, nopython): the properties dispatch reads, found and hashed one
record per loop step.

``MessageDecoder.string2messageProperties`` (FORMAT.md §3.2) splits the property string at
``\\x02``, each entry at its first ``\\x01``, and a later entry overwrites an earlier one; for the
names dispatch wants (``TAGS``, ``KEYS``, ``UNIQ_KEY``, ``DELAY``) that is "the last entry that
starts with ``NAME\\x01`` and has a non-empty value". The hashes are Java's ``String.hashCode``:
over bytes, eight a step, for ASCII (where it equals the UTF-16 one), and over the UTF-16 code units
of well-formed UTF-8 otherwise (``_java_hash_utf8``, a byte a step). The kernels say which records
are left to the one-at-a-time rules (:mod:`formats.properties`): a property string that is not
well-formed UTF-8 (Java's decoder puts U+FFFD there), a non-ASCII topic, and a delay-level record whose
DELAY is not a plain int.

Imported only through :mod:`formats.propscan` (lazily, like :mod:`formats.kernel`); compiled once
per environment and cached.
"""

from __future__ import annotations

import numba
import numpy as np

from .javatext import NOT_PLAIN, _delay_code, _delay_level, _java_hash_utf8, _valid_utf8
from .kernel import _jit
from .wordops import ONES, _byte_masks32, _bytes_equal_mask, _load, _low_bit_index, _low_byte_index, _low_bytes, _prefetch, \
    _same_bytes, _word

SEPARATOR = 2  # between entries (\x02)
SPACE = 0x20  # between KEYS tokens
INT32_MIN = -(1 << 31)
SPACES = SPACE * ONES
AHEAD = 8  # records whose property lines are prefetched ahead of the one being scanned


LANES16 = 0x00FF00FF00FF00FF  # the low byte of each 16-bit lane
LANES32 = 0x0000FFFF0000FFFF  # the low half of each 32-bit lane
POW31 = (1, 31, 961, 29791, 923521, 28629151, 887503681, 27512614111, 852891037441)  # 31**r, r = 0..8


@numba.njit(inline="always")
def _poly(w):
    """``b0*31^7 + b1*31^6 + ... + b7`` of the word's bytes (b0 lowest): Java's hash step over 8 bytes,
    without the ``h*31^8`` of what came before. Three multiplies instead of eight: neighbouring bytes
    are paired in 16-bit lanes (``b0*31 + b1`` < 2^13), pairs in 32-bit lanes (``p0*31^2 + p1`` < 2^23),
    then the two halves; no lane ever carries into the next."""
    pairs = (w & np.uint64(LANES16)) * np.uint64(31) + ((w >> np.uint64(8)) & np.uint64(LANES16))
    quads = (pairs & np.uint64(LANES32)) * np.uint64(961) + ((pairs >> np.uint64(16)) & np.uint64(LANES32))
    return (quads & np.uint64(0xFFFFFFFF)) * np.uint64(923521) + (quads >> np.uint64(32))


@numba.njit(inline="always")
def _java_hash(h, u8, s, e):
    """Java ``String.hashCode`` continued from ``h`` over the ASCII bytes ``u8[s:e]`` (as uint32).

    Eight bytes per step (``h*31^8 + b0*31^7 + ... + b7``), the last 1-7 bytes as one more step of
    their own width; in uint64, whose low 32 bits are those of the uint32 arithmetic."""
    x = np.uint64(h)
    j = s
    while j + 8 <= e:
        x = x * np.uint64(852891037441) + _poly(_word(u8, j))
        j += 8
    if j < e:
        r = e - j
        x = x * np.uint64(POW31[r]) + _poly(_low_bytes(_load(u8, j, r), r))
    return np.uint32(x & np.uint64(0xFFFFFFFF))


@numba.njit(inline="always")
def _shortest(pat_off):
    """The length of the shortest pattern (an entry no longer than it matches none)."""
    shortest = 1 << 30
    for k in range(pat_off.shape[0] - 1):
        shortest = min(shortest, pat_off[k + 1] - pat_off[k])
    return shortest


_separator_masks32 = _byte_masks32(SEPARATOR)  # 32 property bytes at once: their separators and non-ASCII bytes


@numba.njit(inline="always")
def _entry_name(u8, entry, sep, shortest, pat_word, pat_mask, pats, pat_off, first, chain, out_s, out_e, i):
    """The entry ``u8[entry:sep]``: when it starts with a wanted ``NAME\\x01`` (:func:`_find_props`), its value
    span into column ``i`` of ``out_s``/``out_e``."""
    n = sep - entry
    if n <= shortest:
        return
    head = _load(u8, entry, min(n, 8))
    z = _bytes_equal_mask(head, np.uint64(ONES))
    k = first[(_low_byte_index(z) + 1 if z else 9) * 256 + np.int64(head & np.uint64(0xFF))]
    while k >= 0:
        a = pat_off[k]
        L = pat_off[k + 1] - a
        if n > L and (head & pat_mask[k]) == pat_word[k] and (L <= 8 or _same_bytes(u8, entry + 8, pats, a + 8, L - 8)):
            out_s[k, i] = entry + L
            out_e[k, i] = sep
            return
        k = chain[k]


@numba.njit(inline="always")
def _record_props(u8, s, ln, shortest, pat_word, pat_mask, pats, pat_off, first, chain, out_s, out_e, i):
    """One record's property string ``u8[s:s+ln]`` (``ln`` > 0) scanned as :func:`_find_props` describes, into
    column ``i`` of ``out_s``/``out_e``; returns whether every byte is < 0x80. 32 bytes per step: one vector
    compare gives every separator of the step and every byte >= 0x80 as bit masks, and the entries are taken
    separator after separator from the mask (the last 31 bytes of the buffer one by one)."""
    end = s + ln
    size = u8.shape[0]
    high = np.uint64(0)  # bytes >= 0x80 seen
    entry = s
    pos = s
    while pos < end:
        r = end - pos
        if pos + 32 <= size:
            m = _separator_masks32(u8, pos)
        else:
            m = np.uint64(0)
            for t in range(min(r, 32)):
                b = u8[pos + t]
                if b == SEPARATOR:
                    m |= np.uint64(1) << np.uint64(t)
                if b >= 0x80:
                    m |= np.uint64(1) << np.uint64(32 + t)
        if r < 32:  # bytes past the string do not count
            keep = (np.uint64(1) << np.uint64(r)) - np.uint64(1)
            m &= keep | (keep << np.uint64(32))
        high |= m >> np.uint64(32)
        seps = m & np.uint64(0xFFFFFFFF)
        while seps:
            sep = pos + _low_bit_index(seps)
            _entry_name(u8, entry, sep, shortest, pat_word, pat_mask, pats, pat_off, first, chain, out_s, out_e, i)
            entry = sep + 1
            seps &= seps - np.uint64(1)
        pos += 32
    _entry_name(u8, entry, end, shortest, pat_word, pat_mask, pats, pat_off, first, chain, out_s, out_e, i)
    return high == 0


def _find_props(u8, starts, lengths, pat_word, pat_mask, pats, pat_off, first, chain, out_s, out_e, ascii_ok):
    """For record i (property string ``u8[starts[i]:starts[i]+lengths[i]]``) and wanted name k
    (``pats[pat_off[k]:pat_off[k+1]]`` = ``NAME\\x01``, no two alike): the value span of the last matching
    entry into ``out_s[k, i]``/``out_e[k, i]`` (left at -1 when absent); ``ascii_ok[i]`` = no byte >= 0x80.

    Finds the separators 32 bytes at a time (one vector compare gives a step's ``\\x02`` bytes and its bytes
    >= 0x80 as bit masks; :func:`_record_props`), the entries then separator after separator. Each entry's name is
    compared at the entry's start only: a pattern ends at the name's first ``\\x01``, so only the names
    of that length (1-8; 9 = longer) and that first byte can match (``first[length * 256 + byte]``,
    then ``chain[k]``: -1 ends the list); each is compared by one masked word (``pat_word[k]``: its first
    up to 8 bytes, little-endian; ``pat_mask[k]``: their mask), a longer one then word by word."""
    shortest = _shortest(pat_off)
    count = starts.shape[0]
    for i in range(count):
        if i + AHEAD < count:
            _prefetch(u8, starts[i + AHEAD])
            _prefetch(u8, starts[i + AHEAD] + 64)
        s = starts[i]
        ln = min(lengths[i], u8.shape[0] - s)  # never past the buffer (a record's properties always fit)
        if ln <= 0:
            continue
        ascii_ok[i] = _record_props(u8, s, ln, shortest, pat_word, pat_mask, pats, pat_off, first, chain, out_s, out_e, i)


def _java_hash_spans(u8, starts, ends, out):
    """Java ``String.hashCode`` (as uint32) of each ASCII byte span ``u8[starts[i]:ends[i]]``."""
    count = starts.shape[0]
    for i in range(count):
        if i + AHEAD < count:
            _prefetch(u8, starts[i + AHEAD])
        out[i] = _java_hash(np.uint32(0), u8, starts[i], ends[i])


@numba.njit(inline="always")
def _span_length(u8, starts, lengths, i):
    """Span i's length, clipped to the buffer (callers pass spans of valid records, which always fit)."""
    return min(max(lengths[i], 0), max(u8.shape[0] - starts[i], 0))


@numba.njit(inline="always")
def _group_step(u8, starts, lengths, i, group, firsts, slots, groups, last, last_s, last_ln):
    """Span i's group into ``group[i]`` (:func:`_group_spans`' rule, one span): (groups so far, span i's group, where
    its group's first span starts, its length, its Java hash (uint32; 0 when it took the group of the span before it),
    whether it opened a new group). ``last``/``last_s``/``last_ln``: the same of the span before it (-1, 0, -1 for none)."""
    s = starts[i]
    ln = _span_length(u8, starts, lengths, i)
    if ln == last_ln and _same_bytes(u8, last_s, u8, s, ln):
        group[i] = last
        return groups, last, last_s, last_ln, np.uint32(0), False
    mask = slots.shape[0] - 1
    h = _java_hash(np.uint32(0), u8, s, s + ln)
    k = np.int64((np.uint64(h) * np.uint64(0x9E3779B1) + np.uint64(ln)) & np.uint64(mask))
    new = False
    while True:
        g = slots[k]
        if g < 0:
            slots[k] = groups
            firsts[groups] = i
            group[i] = groups
            groups += 1
            new = True
            break
        f = firsts[g]
        if _span_length(u8, starts, lengths, f) == ln and _same_bytes(u8, starts[f], u8, s, ln):
            group[i] = g
            break
        k = (k + 1) & mask
    last = group[i]
    return groups, last, starts[firsts[last]], ln, h, new


def _group_spans(u8, starts, lengths, group, firsts, slots):
    """Equal byte spans ``u8[starts[i]:starts[i]+lengths[i]]`` (lengths clipped to the buffer) grouped:
    ``group[i]`` is the span's group, numbered in first-occurrence order, ``firsts[g]`` the first span of
    group g; returns the number of groups. A span equal to the one before it (records of one topic come
    in runs) takes its group at once; the others go through one open-addressing table keyed by (Java hash,
    length) whose hits are confirmed byte by byte, so different spans never share a group, whatever their
    hashes (:func:`_group_step`). ``slots``: the table, all -1, a power of two of at least 2n entries (made by
    the caller: an array made in a kernel makes loading it from the cache import numba's array module, ~30 ms
    of a command's start)."""
    n = starts.shape[0]
    groups = 0
    last = -1
    last_s = 0
    last_ln = -1
    for i in range(n):
        if i + AHEAD < n:
            _prefetch(u8, starts[i + AHEAD])
        groups, last, last_s, last_ln, _, _ = _group_step(u8, starts, lengths, i, group, firsts, slots, groups, last, last_s,
                                                           last_ln)
    return groups


@numba.njit(inline="always")
def _key_hash_of(h):
    """Index keyHash (§10.3): abs of the int32 hash, Integer.MIN_VALUE -> 0."""
    v = np.int64(np.int32(h))
    if v == INT32_MIN:
        return np.int32(0)
    return np.int32(-v if v < 0 else v)


@numba.njit(inline="always")
def _hash_token(h, u8, j, e):
    """Java hash continued from ``h`` over the bytes from ``u8[j]`` up to the first space or ``e``, and
    where it stopped: the space is looked for and the bytes hashed in the same 8-byte steps."""
    x = np.uint64(h)
    while j < e:
        r = min(e - j, 8)
        w = _load(u8, j, r)
        z = _bytes_equal_mask(w, np.uint64(SPACES))
        if z:
            r = min(r, _low_byte_index(z))  # a space past ``e`` is not one
        if r == 8:
            x = x * np.uint64(852891037441) + _poly(w)
        elif r > 0:
            x = x * np.uint64(POW31[r]) + _poly(_low_bytes(w, r))
        j += r
        if r < 8:
            break
    return np.uint32(x & np.uint64(0xFFFFFFFF)), j


@numba.njit(inline="always")
def _record_key_hashes(u8, prefix, uniq_s, uniq_e, keys_s, keys_e, out, t, utf8):
    """One record's index key hashes (UNIQ_KEY's value ``u8[uniq_s:uniq_e]`` first, then each non-empty
    space-separated token of KEYS' ``u8[keys_s:keys_e]``; a start of -1: absent) written from ``out[t]`` on;
    returns where the next record's hashes start, or -1 when ``out`` has no room for them. ASCII values are hashed
    8 bytes a step; with ``utf8``, well-formed UTF-8 values over their UTF-16 code units (:func:`_java_hash_utf8`)."""
    if uniq_s >= 0:
        if t >= out.shape[0]:
            return -1
        if utf8:
            h0 = _java_hash_utf8(prefix, u8, uniq_s, uniq_e, -1)[0]
        else:
            h0 = _java_hash(prefix, u8, uniq_s, uniq_e)
        out[t] = _key_hash_of(h0)
        t += 1
    if keys_s >= 0:
        j = keys_s
        e = keys_e
        while j < e:
            while j < e and u8[j] == SPACE:
                j += 1
            if j >= e:
                break
            if t >= out.shape[0]:
                return -1
            if utf8:
                h, j = _java_hash_utf8(prefix, u8, j, e, SPACE)
            else:
                h, j = _hash_token(prefix, u8, j, e)
            out[t] = _key_hash_of(h)
            t += 1
    return t


def _key_hashes(u8, use, ascii_ok, prefix, uniq_s, uniq_e, keys_s, keys_e, counts, out):
    """Index key hashes of ``topic#key`` for the records with ``use[i]``: UNIQ_KEY first, then every
    non-empty space-separated token of KEYS, in order (duplicates kept); ``prefix[i]`` is the uint32
    hash of ``topic#``. A record without ``ascii_ok[i]`` is hashed over the UTF-16 code units of its values
    (they must be well-formed UTF-8: :func:`_utf8_tags`). Writes ``counts[i]`` and appends to ``out``; returns
    how many were written, or -1 when ``out`` has no room for them all."""
    t = 0
    count = use.shape[0]
    for i in range(count):
        if i + AHEAD < count:  # the values sit one record apart: start loading the next ones' early
            if uniq_s[i + AHEAD] >= 0:
                _prefetch(u8, uniq_s[i + AHEAD])
            if keys_s[i + AHEAD] >= 0:
                _prefetch(u8, keys_s[i + AHEAD])
        if not use[i]:
            continue
        u = _record_key_hashes(u8, np.uint32(prefix[i]), uniq_s[i], uniq_e[i], keys_s[i], keys_e[i], out, t,
                               not ascii_ok[i])
        if u < 0:
            return -1
        counts[i] = u - t
        t = u
    return t


def _utf8_tags(u8, rows, starts, lengths, tags_s, tags_e, ok, codes):
    """For each record ``rows[k]`` (property string ``u8[starts[r]:starts[r]+lengths[r]]`` with a non-ASCII byte):
    ``ok[k]`` = the string is well-formed UTF-8, and then its tagsCode (the Java hash of TAGS' value over its UTF-16
    code units, as an int32; left as is without TAGS) into ``codes[r]``."""
    for k in range(rows.shape[0]):
        r = rows[k]
        s = starts[r]
        e = s + min(lengths[r], u8.shape[0] - s)
        ok[k] = _valid_utf8(u8, s, e)
        if ok[k] and tags_s[r] >= 0:
            codes[r] = np.int64(np.int32(_java_hash_utf8(np.uint32(0), u8, tags_s[r], tags_e[r], -1)[0]))


# the rows of the wanted names in :func:`_dispatch_props`' scratch (formats.propscan.WANTED's order)
ROW_TAGS, ROW_KEYS, ROW_UNIQ_KEY, ROW_DELAY, ROW_MULTI, ROW_MULTI_OFFSET = 0, 1, 2, 3, 4, 5





def _delay_codes(u8, rows, delay_s, delay_e, store_ts, delay_ms, codes, ok):
    """For each SCHEDULE_TOPIC_XXXX record ``rows[k]``: ``ok[k]`` = its DELAY is absent or a plain int
    (:func:`_delay_level`), and then its tagsCode (:func:`_delay_code` over the TAGS hash already in ``codes``)."""
    for k in range(rows.shape[0]):
        r = rows[k]
        if delay_s[r] < 0:
            ok[k] = True
            continue
        level = _delay_level(u8, delay_s[r], delay_e[r])
        ok[k] = level != NOT_PLAIN
        if ok[k]:
            codes[r] = _delay_code(codes[r], level, store_ts[r], delay_ms)


@numba.njit(inline="always")
def _all_ascii(u8, s, n):
    """Every byte of ``u8[s:s+n]`` is < 0x80."""
    for j in range(s, s + n):
        if u8[j] >= 0x80:
            return False
    return True


def _dispatch_props(u8, starts, lengths, tstarts, tlengths, sched_topic, pat_word, pat_mask, pats, pat_off, first, chain, vs,
                    ve, group, firsts, slots, group_hash, group_prefix, group_slow, group_sched, store_ts, delay_ms, codes,
                    slow, multi, counts, out):
    """What dispatch computes from a record's topic and properties, one record per step (the topic and the property
    string, side by side in the record, are read while in cache). The topic ``u8[tstarts[i]:+tlengths[i]]`` is
    grouped (:func:`_group_step`: ``group``, ``firsts``, ``slots`` as :func:`_group_spans` takes them); a new group
    gets its topic's Java hash (``group_hash``), the hash of ``topic#`` (``group_prefix``), whether its records take
    the one-at-a-time rules (``group_slow``: a topic byte >= 0x80) and whether it is the delay-level topic
    (``group_sched``: ``sched_topic``'s bytes). Then :func:`_find_props` for the wanted names (``vs``/``ve``: one column
    of scratch, a row per name, in the rows ROW_*); then, unless the record's property string is not well-formed
    UTF-8, its topic's group is slow, or it is a delay-level record whose DELAY is not a plain int (:func:`_delay_level`)
    (all: ``slow[i]``, left for the one-at-a-time rules): its tagsCode into ``codes[i]`` (the Java hash of TAGS as an
    int32, over the UTF-16 code units of a non-ASCII value, 0 without TAGS; a delay-level record's delivery time from
    ``store_ts[i]`` and ``delay_ms``, :func:`_delay_code`) and its index key hashes (:func:`_key_hashes`, from its
    topic's ``group_prefix``) appended to ``out``, how many into ``counts[i]``; ``multi[i]``: the record carries both
    multi-dispatch properties (rows ROW_MULTI, ROW_MULTI_OFFSET), slow or not. Returns (how many hashes were written,
    or -1 when ``out`` has no room for them all; the number of groups)."""
    shortest = _shortest(pat_off)
    rows = vs.shape[0]
    count = starts.shape[0]
    t = 0
    groups = 0
    last = -1
    last_s = 0
    last_ln = -1
    for i in range(count):
        if i + AHEAD < count:
            _prefetch(u8, starts[i + AHEAD])
            _prefetch(u8, starts[i + AHEAD] + 64)
        groups, last, last_s, last_ln, th, new = _group_step(u8, tstarts, tlengths, i, group, firsts, slots, groups, last,
                                                             last_s, last_ln)
        g = last
        if new:
            ts = tstarts[i]
            tl = last_ln
            group_hash[g] = th
            group_prefix[g] = np.uint32((np.uint64(th) * np.uint64(31) + np.uint64(35)) & np.uint64(0xFFFFFFFF))  # "#"
            group_slow[g] = not _all_ascii(u8, ts, tl)
            group_sched[g] = tl == sched_topic.shape[0] and _same_bytes(u8, ts, sched_topic, 0, tl)
        for k in range(rows):
            vs[k, 0] = -1
            ve[k, 0] = -1
        s = starts[i]
        ln = min(lengths[i], u8.shape[0] - s)  # never past the buffer (a record's properties always fit)
        ascii_ok = True
        if ln > 0:
            ascii_ok = _record_props(u8, s, ln, shortest, pat_word, pat_mask, pats, pat_off, first, chain, vs, ve, 0)
        multi[i] = vs[ROW_MULTI, 0] >= 0 and vs[ROW_MULTI_OFFSET, 0] >= 0
        if group_slow[g] or not (ascii_ok or _valid_utf8(u8, s, s + ln)):
            slow[i] = True
            continue
        level = np.int64(0)  # a delay-level record (SCHEDULE_TOPIC_XXXX with DELAY): its tagsCode is its delivery time
        sched = group_sched[g] and vs[ROW_DELAY, 0] >= 0
        if sched:
            level = _delay_level(u8, vs[ROW_DELAY, 0], ve[ROW_DELAY, 0])
            if level == NOT_PLAIN:
                slow[i] = True
                continue
        if ascii_ok:
            if vs[ROW_TAGS, 0] >= 0:
                codes[i] = np.int64(np.int32(_java_hash(np.uint32(0), u8, vs[ROW_TAGS, 0], ve[ROW_TAGS, 0])))
            u = _record_key_hashes(u8, group_prefix[g], vs[ROW_UNIQ_KEY, 0], ve[ROW_UNIQ_KEY, 0],
                                   vs[ROW_KEYS, 0], ve[ROW_KEYS, 0], out, t, False)
        else:  # non-ASCII, well-formed: hashed over its UTF-16 code units, as Java decodes it
            if vs[ROW_TAGS, 0] >= 0:
                codes[i] = np.int64(np.int32(_java_hash_utf8(np.uint32(0), u8, vs[ROW_TAGS, 0], ve[ROW_TAGS, 0], -1)[0]))
            u = _record_key_hashes(u8, group_prefix[g], vs[ROW_UNIQ_KEY, 0], ve[ROW_UNIQ_KEY, 0],
                                   vs[ROW_KEYS, 0], ve[ROW_KEYS, 0], out, t, True)
        if sched:
            codes[i] = _delay_code(codes[i], level, store_ts[i], delay_ms)
        if u < 0:
            return -1, groups
        counts[i] = u - t
        t = u
    return t, groups


# without numba's reference counting (none of them makes an array): the helpers inlined into the per-record loops
# otherwise take and drop a reference to every array they are handed, an atomic add each (~10 ns per record)
find_props = _jit(_find_props, refcounts=False)
java_hash_spans = _jit(_java_hash_spans, refcounts=False)
key_hashes = _jit(_key_hashes, refcounts=False)
utf8_tags = _jit(_utf8_tags, refcounts=False)
dispatch_props = _jit(_dispatch_props, refcounts=False)
delay_codes = _jit(_delay_codes, refcounts=False)
group_spans = _jit(_group_spans, refcounts=False)
