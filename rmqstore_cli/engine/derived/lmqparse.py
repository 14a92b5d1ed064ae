"""The multi-dispatch properties of many records parsed in array operations (:mod:`.lmq`'s rules).

An LMQ broker (MQTT, IM) multi-dispatches most of its records, each to a few of thousands of LMQ queues. Taken
record by record in Python (:meth:`.lmq.MultiDispatchRule.targets`), that cost ~20 us a record wherever a command
checks or writes the LMQ units. Here the two values (``INNER_MULTI_DISPATCH``, ``INNER_MULTI_QUEUE_OFFSET``) of
many records in ASCII are cut on ``,`` together (Java's ``String.split``: trailing empty pieces dropped) and the
offsets read as numbers in one pass. A record the arrays do not take (a blank value, an offset of more than 18
digits, which ``Long.parseLong`` may reject as out of range) is left to the rule in Python, as every record was
before; ``tests/test_lmq_parse.py`` compares both on seeded random values.
"""

from __future__ import annotations

import numpy as np

_COMMA, _SLASH, _PLUS, _MINUS, _ZERO = (ord(c) for c in ",/+-0")
_LMQ_PREFIX = b"%LMQ%"
_MAX_DIGITS = 18  # 10**18 - 1 and its negative fit a long: no range check needed
_BLANK = np.zeros(256, bool)
_BLANK[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True  # what Python's str.strip() removes from ASCII text
_POW10 = 10 ** np.arange(_MAX_DIGITS + 1, dtype=np.int64)


class _Pieces:
    """One value of each record split on ``,``: the values' bytes joined, each followed by a ``,``; per piece its
    [start, end) in the joined bytes, its record and its place in the record; per record the pieces Java keeps
    (trailing empty ones dropped) and whether the value is blank."""

    def __init__(self, u8: np.ndarray, start: np.ndarray, end: np.ndarray):
        records = len(start)
        n = (end - start) + 1
        first = np.zeros(records, np.int64)
        np.cumsum(n[:-1], out=first[1:])
        total = int(n.sum())
        src = np.arange(total, dtype=np.int64) + np.repeat(start - first, n)
        g = u8[np.minimum(src, len(u8) - 1)].copy()
        g[first + n - 1] = _COMMA
        rec_of_byte = np.repeat(np.arange(records, dtype=np.int64), n)
        self.bytes = g
        # blank for str.strip(): nothing but whitespace (a ',' is not; the one added after each value is not counted)
        self.blank = np.bincount(rec_of_byte, weights=~_BLANK[g], minlength=records) <= 1
        commas = np.flatnonzero(g == _COMMA)
        self.end = commas
        self.start = np.empty(len(commas), np.int64)
        self.start[:1] = 0
        self.start[1:] = commas[:-1] + 1
        self.record = rec_of_byte[commas]
        self.first = np.searchsorted(self.record, np.arange(records))
        self.place = np.arange(len(commas), dtype=np.int64) - self.first[self.record]
        last_full = np.full(records, -1, np.int64)
        full = np.flatnonzero(self.end > self.start)
        np.maximum.at(last_full, self.record[full], self.place[full])
        self.kept = last_full + 1
        self.in_kept = self.place < self.kept[self.record]

    def count_in(self, mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """How many bytes of ``mask`` lie in each [a, b) of the joined bytes."""
        cum = np.zeros(len(mask) + 1, np.int64)
        np.cumsum(mask, out=cum[1:])
        return cum[b] - cum[a]


def parse(u8: np.ndarray, names: tuple, offsets: tuple, queue_ids: np.ndarray, lmq_queue_zero: bool):
    """Records whose two values are the byte spans ``names`` and ``offsets`` ((start, end) arrays of ``u8``
    positions; records in ASCII, on a topic that takes part, the rule on). Returns the targets as columns, in
    record order and property order: (record, name id, queue id, queue offset), the names (in the order they first
    appear), and the records left to the rule (sorted)."""
    records = len(queue_ids)
    none = np.zeros(0, np.int64)
    if not records:
        return (none, none, none, none), [], none
    pn, po = _Pieces(u8, *names), _Pieces(u8, *offsets)
    go = po.bytes
    # offsets: [+-]?[0-9]+ as Long.parseLong reads ASCII; more than 18 digits: left to the rule (range check)
    lead = go[np.minimum(po.start, len(go) - 1)]
    signed = ((lead == _PLUS) | (lead == _MINUS)) & (po.end > po.start)
    digits_from = po.start + signed
    ndig = po.end - digits_from
    is_digit = (go >= _ZERO) & (go <= _ZERO + 9)
    ok_offset = (ndig >= 1) & (po.count_in(is_digit, digits_from, po.end) == ndig)
    slow = pn.blank | po.blank
    slow[po.record[ok_offset & po.in_kept & (ndig > _MAX_DIGITS)]] = True
    # the value of each offset piece: its digits weighed by their place from the piece's end
    piece_of_byte = np.repeat(np.arange(len(po.end), dtype=np.int64), np.diff(np.concatenate(([-1], po.end))))
    from_end = po.end[piece_of_byte] - 1 - np.arange(len(go), dtype=np.int64)
    weigh = is_digit & (ndig[piece_of_byte] <= _MAX_DIGITS)  # then the place from the end is 0..17
    contrib = np.where(weigh, (go.astype(np.int64) - _ZERO) * _POW10[np.clip(from_end, 0, _MAX_DIGITS - 1)], 0)
    csum = np.zeros(len(go) + 1, np.int64)
    np.cumsum(contrib, out=csum[1:])
    value = csum[po.end] - csum[po.start]
    value = np.where(lead == _MINUS, -value, value)
    # the k-th name with the k-th offset, in records whose two lists are as long; a name with the path separator
    # is skipped (its offset not read); Long.parseLong throws at the first bad offset of another name: that name
    # and the ones after it get nothing
    same = (pn.kept == po.kept) & ~slow
    ni = np.flatnonzero(pn.in_kept & same[pn.record])
    gn = pn.bytes
    oi = po.first[pn.record[ni]] + pn.place[ni]
    slash = pn.count_in(gn == _SLASH, pn.start[ni], pn.end[ni]) > 0
    bad = np.flatnonzero(~slash & ~ok_offset[oi])
    bad_place = np.full(records, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(bad_place, pn.record[ni[bad]], pn.place[ni[bad]])
    take = ~slash & (pn.place[ni] < bad_place[pn.record[ni]])
    ni, oi = ni[take], oi[take]
    rec = pn.record[ni]
    s, e = pn.start[ni], pn.end[ni]
    ids, names_out, lmq = _names(gn, s, e)
    qid = queue_ids[rec].astype(np.int64)
    if lmq_queue_zero:
        qid = np.where(lmq, 0, qid)
    return (rec, ids, qid, value[oi]), names_out, np.flatnonzero(slow)


def _names(g: np.ndarray, s: np.ndarray, e: np.ndarray):
    """Ids of the names g[s:e] (numbered in the order they first appear), the names, and which are LMQ queues."""
    if not len(s):
        return np.zeros(0, np.int64), [], np.zeros(0, bool)
    lens = e - s
    width = int(lens.max()) + 2
    mat = np.zeros((len(s), width), np.uint8)
    cols = np.arange(width - 2)
    inside = cols[None, :] < lens[:, None]
    mat[:, :-2][inside] = g[(s[:, None] + cols[None, :])[inside]]
    mat[:, -2] = lens & 0xFF  # the length too: "a" and "a\0" differ
    mat[:, -1] = (lens >> 8) & 0xFF
    keys = np.ascontiguousarray(mat).view(np.dtype((np.void, width))).ravel()
    _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    names = [bytes(mat[first[j], : lens[first[j]]]).decode("ascii") for j in order.tolist()]
    p = len(_LMQ_PREFIX)
    lmq = (lens >= p) & np.all(mat[:, :p] == np.frombuffer(_LMQ_PREFIX, np.uint8)[None, :], axis=1) if width - 2 >= p \
        else np.zeros(len(s), bool)
    return rank[inv.reshape(-1)], names, lmq
