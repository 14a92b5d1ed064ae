"""Which commitlog records no index file covers (index gaps), found by walking only those ranges.

The broker indexes a record when dispatch reaches it (§10.4); an index file's header names the first
and last record offsets it indexed. Records between those spans are unindexed: a file deleted, cut or
never written. Walking just those ranges with the engine's commitlog walk both measures the gaps
and finds the records carrying a key there, which is what :mod:`..query.explain` needs when the index
cannot prove a key is absent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rmqstore_cli.formats import propscan
from rmqstore_cli.formats.message import RecordError
from rmqstore_cli.formats.records import SYSFLAG_TRANSACTION_MASK, TRANSACTION_ROLLBACK

from ..store import Store


@dataclass
class Gap:
    """Commitlog records that would be indexed but that no (complete) index file covers."""

    kind: str  # no-index | before-first | between | after-last
    first_offset: int
    last_offset: int
    records: int
    first_timestamp: int
    last_timestamp: int
    previous_file: str | None
    next_file: str | None
    why: str

    def as_json(self) -> dict:
        return {"kind": self.kind, "firstOffset": self.first_offset, "lastOffset": self.last_offset,
                "records": self.records, "firstStoreTimestamp": self.first_timestamp,
                "lastStoreTimestamp": self.last_timestamp, "previousIndexFile": self.previous_file,
                "nextIndexFile": self.next_file, "why": self.why}


def _covered_intervals(store: Store) -> tuple[list, list]:
    """[beginPhyOffset, endPhyOffset] of each complete, non-empty index file (the records it indexed)."""
    out = []
    for f in store.index.files:
        h = f.header()
        if f.complete and 1 < h.indexCount <= f.entries and h.beginPhyOffset <= h.endPhyOffset:
            out.append((h.beginPhyOffset, h.endPhyOffset, f))
    out.sort(key=lambda x: (x[0], x[1]))
    return out, [f for f in store.index.files if not f.complete]


def gaps_and_scan(store: Store, ex, topics, key, uniq_only, found: dict, progress, carries, found_row) -> None:
    """Walk the commitlog where no index file vouches for its records: find gaps (indexable
    records nobody indexed) and the records carrying the key there."""
    cfg = store.config
    cl = store.commitlog
    segs = cl.segments.segments
    if not segs:
        ex.scan = {"ranges": [], "bytes": 0, "why": "no commitlog files"}
        return
    intervals, broken = _covered_intervals(store)
    if not cfg.messageIndexEnable or not intervals:
        why = "messageIndexEnable is false" if not cfg.messageIndexEnable else "no usable index file"
        ranges = [(cl.min_offset, None, None, None, "no-index", why)]
    else:
        ranges = []
        first = intervals[0]
        if first[0] > cl.min_offset:
            ranges.append((cl.min_offset, first[0], None, first[2], "before-first",
                           f"records older than the first index file {first[2].name}: its predecessors were deleted "
                           f"(the broker deletes index files only with the commitlog they point into), cut, or never "
                           f"written"))
        reach, f0 = first[1], first[2]  # the furthest offset indexed so far, and the file that reached it
        for b1, e1, f1 in intervals[1:]:
            if b1 > reach:
                ranges.append((reach, b1, f0, f1, "between",
                               f"no index file between {f0.name} (ends {f0.header().endTimestamp}) and {f1.name} "
                               f"(begins {f1.header().beginTimestamp}): a file was deleted or lost"))
            if e1 >= reach:
                reach, f0 = e1, f1
        ranges.append((reach, None, f0, None, "after-last",
                       f"records newer than the last index file {f0.name}: never indexed (dispatch had not reached "
                       f"them, or the newer index files were deleted: crash recovery deletes index files newer than "
                       f"the checkpoint and re-indexes at the next start)"))
    covered_b = np.array([i[0] for i in intervals], dtype=np.int64)
    covered_e = np.array([i[1] for i in intervals], dtype=np.int64)
    total = sum(((hi if hi is not None else segs[-1].start + segs[-1].size) - lo) for lo, hi, *_ in ranges)
    if progress is not None:
        progress(0, total=total)
    needle = key.encode("utf-8")
    walked = 0
    scanned = []
    for lo, hi, prev_f, next_f, kind, why in ranges:
        stats = {"n": 0, "first": None, "last": None, "t0": None, "t1": None}
        for chunk in _walk_from(cl, lo):
            h = chunk.headers
            phy = chunk.phy
            stop = len(h) if hi is None else int(np.searchsorted(phy, hi))
            size = int(h.totalSize[:stop].sum())
            walked += size
            if progress is not None:
                progress(size)
            if stop:
                _visit(chunk, stop, covered_b, covered_e, stats, cl, topics, key, needle, uniq_only, found, carries, found_row)
            if stop < len(h):
                break
        scanned.append([lo, hi])
        if stats["n"]:
            ex.gaps.append(Gap(kind, stats["first"], stats["last"], stats["n"], stats["t0"], stats["t1"],
                               prev_f.name if prev_f else None, next_f.name if next_f else None, why))
    for f in broken:
        ex.problems.append(f"index file {f.name} is {f.size} bytes, not {f.expected_size} (truncated): the broker's "
                           f"query skips it, so its records count as unindexed")
    ex.scan = {"ranges": scanned, "bytes": walked, "estimatedBytes": total,
               "why": "the commitlog ranges no index file covers (walked record by record, CRC not checked)"}


def _walk_from(cl, lo: int):
    """Chunks of records from the record boundary ``lo`` on (from its segment start if ``lo`` is not one)."""
    segs = cl.segments.segments
    k = 0
    for j, s in enumerate(segs):
        if s.start <= lo:
            k = j
    pos = max(0, lo - segs[k].start)
    from ..log.commitlog import ScanResult

    res = ScanResult()
    any_chunk = False
    for chunk in cl.scan(start_index=k, start_position=pos, check_crc=False, result=res):
        any_chunk = True
        yield chunk
    if not any_chunk and pos and res.stop is not None and res.stop.offset == lo and not res.stop.clean:
        yield from cl.scan(start_index=k, start_position=0, check_crc=False)


def _visit(chunk, stop, covered_b, covered_e, stats, cl, topics, key, needle, uniq_only, found, carries, found_row) -> None:
    h = chunk.headers
    phy = chunk.phy[:stop]
    if len(covered_b):
        k = np.searchsorted(covered_b, phy, side="right") - 1
        inside = (k >= 0) & (phy <= covered_e[np.maximum(k, 0)])
    else:
        inside = np.zeros(len(phy), dtype=bool)
    u8 = np.frombuffer(chunk.buf, dtype=np.uint8)
    pv = propscan.scan(u8, h.propsStart[:stop], h.propsLength[:stop], names=("KEYS", "UNIQ_KEY"))
    has_key = ((pv.start["KEYS"] >= 0) & (pv.end["KEYS"] > pv.start["KEYS"])) | (pv.start["UNIQ_KEY"] >= 0)
    indexable = has_key & ((h.sysFlag[:stop] & SYSFLAG_TRANSACTION_MASK) != TRANSACTION_ROLLBACK) & ~inside
    idx = np.flatnonzero(indexable)
    if len(idx):
        ts = h.storeTimestamp[:stop]
        stats["n"] += len(idx)
        if stats["first"] is None:
            stats["first"], stats["t0"] = int(phy[idx[0]]), int(ts[idx[0]])
        stats["last"], stats["t1"] = int(phy[idx[-1]]), int(ts[idx[-1]])
    buf = chunk.buf
    for i in np.flatnonzero(has_key & ~inside).tolist():
        ps, pl = int(h.propsStart[i]), int(h.propsLength[i])
        if bytes(buf[ps:ps + pl]).find(needle) < 0:
            continue
        p = int(phy[i])
        if p in found:
            continue
        try:
            msg = cl.read(p, with_body=False)
        except (RecordError, ValueError):
            continue
        if carries(msg, topics, key, uniq_only):
            found[p] = found_row(msg, "scan", None, None)
