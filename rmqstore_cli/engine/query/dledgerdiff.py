"""Two replicas of one DLedger group compared entry by entry (Raft's log matching: entries with the same
index and term hold the same bytes, and so do all entries before them).

Both logs are walked in step, a chunk of entries at a time (memory stays flat): the relation is
``identical``, ``prefix`` (one log ends where the other goes on: how many entries behind), or ``divergent``
from the first index whose terms differ (Raft: the replica whose log is less up to date, by last term and
then length, has its entries from there truncated by a leader from the other side). Entries with the same
index and term whose bytes differ are counted and listed (``damaged``): that is damage, not Raft; the
repair is ``recover --from-replica``. Read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..log.dledger import EntryWalk, walk_entries

LISTED = 20  # damaged entries listed by index (all are counted)


@dataclass
class DLedgerDiff:
    a: str
    b: str
    relation: str = "identical"  # identical | prefix | divergent | disjoint
    logs: dict = field(default_factory=dict)  # side -> firstIndex, lastIndex, lastTerm, entries, endPos
    compared: int = 0  # entries present on both sides and compared
    behind: str | None = None  # the side that is a prefix of the other
    behind_by: int = 0
    diverge_at: int | None = None
    terms_at: dict = field(default_factory=dict)  # side -> term of entry diverge_at
    truncated: str | None = None  # the side a leader from the other side would truncate
    damaged: list = field(default_factory=list)  # (index, why) for same (index, term) but other bytes
    damaged_count: int = 0

    @property
    def differs(self) -> bool:
        return self.relation in ("divergent", "disjoint") or bool(self.damaged_count)

    def as_json(self) -> dict:
        return {"kind": "dledger", "a": self.a, "b": self.b, "relation": self.relation, "logs": self.logs,
                "comparedEntries": self.compared, "behind": self.behind, "behindBy": self.behind_by,
                "divergeAt": self.diverge_at, "termsAt": self.terms_at, "truncated": self.truncated,
                "damagedEntries": self.damaged_count, "damaged": [{"index": i, "why": w} for i, w in self.damaged]}


class _Side:
    """One replica's entries as a stream of column blocks, consumed from the front."""

    def __init__(self, store):
        self.store = store
        self.walk = EntryWalk()
        self.chunks: Iterator = walk_entries(store.commitlog.segments.segments, result=self.walk)
        self.cols: dict | None = None
        self.seg = None
        self.at = 0
        self.first_index: int | None = None
        self.done = False

    def fill(self) -> bool:
        while self.cols is None or self.at >= len(self.cols["index"]):
            ec = next(self.chunks, None)
            if ec is None:
                self.done = True
                self.cols = None
                return False
            self.cols, self.seg, self.at = ec.cols, ec.segment, 0
            if self.first_index is None:
                self.first_index = int(ec.cols["index"][0])
        return True

    def take(self, n: int) -> tuple[dict, object]:
        c = {k: v[self.at:self.at + n] for k, v in self.cols.items()}
        self.at += n
        return c, self.seg

    def left(self) -> int:
        return len(self.cols["index"]) - self.at

    def skip_to(self, index: int) -> None:
        while self.fill():
            k = int(np.searchsorted(self.cols["index"][self.at:], index))
            self.at += k
            if self.at < len(self.cols["index"]):
                return

    def drain(self) -> int:
        n = 0
        while self.fill():
            n += self.left()
            self.at = len(self.cols["index"])
        return n

    def summary(self) -> dict:
        s = self.walk.stop
        return {"firstIndex": self.first_index, "lastIndex": self.walk.last_index, "lastTerm": self.walk.last_term,
                "entries": self.walk.entries, "endPos": s.offset if s else 0, "endKind": s.kind if s else None}


def _same_bytes(ca: dict, sa, cb: dict, sb) -> np.ndarray:
    """Per entry of two aligned blocks (same index and term): are the entry bytes identical?"""
    n = len(ca["index"])
    ok = np.ones(n, bool)
    same_place = (ca["pos"] == cb["pos"]) & (ca["size"] == cb["size"])
    ua = np.frombuffer(sa.buffer(), np.uint8)
    ub = np.frombuffer(sb.buffer(), np.uint8)
    if same_place.all() and sa.start == sb.start and n:
        lo, hi = int(ca["at"][0]), int(ca["at"][-1] + ca["size"][-1])
        if np.array_equal(ua[lo:hi], ub[lo:hi]):
            return ok
    for j in range(n):
        if not same_place[j]:
            ok[j] = False
            continue
        a0, b0, size = int(ca["at"][j]), int(cb["at"][j]), int(ca["size"][j])
        ok[j] = np.array_equal(ua[a0:a0 + size], ub[b0:b0 + size])
    return ok


def diff_replicas(a_store, b_store) -> DLedgerDiff:
    d = DLedgerDiff(a_store.root, b_store.root)
    sa, sb = _Side(a_store), _Side(b_store)
    sa.fill()
    sb.fill()
    if sa.cols is not None and sb.cols is not None:
        start = max(sa.first_index, sb.first_index)
        sa.skip_to(start)
        sb.skip_to(start)
    while d.diverge_at is None and d.relation != "disjoint" and sa.fill() and sb.fill():
        n = min(sa.left(), sb.left())
        ca, segA = sa.take(n)
        cb, segB = sb.take(n)
        if not np.array_equal(ca["index"], cb["index"]):
            d.relation = "disjoint"
            break
        other = np.flatnonzero(ca["term"] != cb["term"])
        m = int(other[0]) if len(other) else n
        if m < n:
            d.relation, d.diverge_at = "divergent", int(ca["index"][m])
            d.terms_at = {"a": int(ca["term"][m]), "b": int(cb["term"][m])}
        if m:
            ca_m = {k: v[:m] for k, v in ca.items()}
            cb_m = {k: v[:m] for k, v in cb.items()}
            ok = _same_bytes(ca_m, segA, cb_m, segB)
            for j in np.flatnonzero(~ok).tolist():
                d.damaged_count += 1
                if len(d.damaged) < LISTED:
                    why = "pos/size differ" if (ca["pos"][j] != cb["pos"][j] or ca["size"][j] != cb["size"][j]) \
                        else "bytes differ"
                    d.damaged.append((int(ca["index"][j]), why))
            d.compared += m
    rest_a, rest_b = sa.drain(), sb.drain()
    d.logs = {"a": sa.summary(), "b": sb.summary()}
    if d.relation == "divergent":
        la, lb = d.logs["a"], d.logs["b"]
        a_up = (la["lastTerm"], la["lastIndex"]) >= (lb["lastTerm"], lb["lastIndex"])
        d.truncated = "b" if a_up else "a"
    elif d.relation == "identical" and (rest_a or rest_b):
        d.relation = "prefix"
        d.behind = "b" if rest_a else "a"
        d.behind_by = rest_a or rest_b
    if d.logs["a"]["entries"] == 0 and d.logs["b"]["entries"] == 0:
        d.relation = "identical"
    return d
