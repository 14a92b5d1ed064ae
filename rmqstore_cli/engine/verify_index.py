"""Verify: index files against the commitlog (§10), the checkpoint and the store root."""

from __future__ import annotations

import mmap
import os

import numpy as np

from formats.records import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE, TRANSACTION_ROLLBACK

from .findings import Finding
from .verify_records import ERROR, INFO, WARNING, _Agg, _Records, _RefClassifier


def check_index_file(store, f, recs: _Records, refs: _RefClassifier) -> tuple[list, int]:
    """The checks of ONE index file (``f`` from ``store.index.files``): (findings, entries).
    Independent of the other files, so a distributed verify can run one task per file."""
    findings: list = []
    summary: dict = {}
    _check_index(store, recs, refs, findings, summary, files=[f])
    return findings, summary["index"]["entries"]


def _check_index(store, recs: _Records, refs: _RefClassifier, findings: list, summary: dict,
                 files: list | None = None) -> None:
    svc = store.index
    if files is None:  # the service's own problems once per store, not once per file
        findings += svc.problems
    n_entries = 0
    for f in svc.files if files is None else files:
        if not f.complete:
            continue
        agg = _Agg()
        h = f.header()
        count = h.indexCount if h.indexCount > 0 else 1
        base = INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE
        if count > f.entries:
            agg.add(f.path, "IDX_HEADER", ERROR, f.path, 36, f"indexCount {h.indexCount} exceeds maxIndexNum {f.entries}")
            count = f.entries
        last_live = _last_live_entry(f, max(count, 1))
        if last_live is not None:
            # entries the header does not count: the broker's queries never reach them
            agg.add(f.path, "IDX_HEADER", ERROR, f.path, 36, f"indexCount {h.indexCount}, but entry "
                    f"{last_live} is written: the broker does not see entries past the count")
        ent = f.entry_table(count)[1:]
        n = np.arange(1, count, dtype=np.int32)
        n_entries += len(n)
        if not len(n):
            findings += agg.findings()
            continue
        # 4-byte fields stay int32 (millions of entries per file)
        kh = ent["keyHash"].astype(np.int32)
        phy = ent["phyOffset"].astype(np.int64)
        diff = ent["timeDiff"].astype(np.int32)
        prev = ent["prevIndex"].astype(np.int32)
        del ent
        _drop_pages(f.segment.buffer(), base, count * INDEX_ENTRY_SIZE)  # copied into columns: release the file pages
        epos = lambda e: base + int(e) * INDEX_ENTRY_SIZE  # noqa: E731
        # Entries are appended in dispatch (= commitlog) order: an offset larger than the next one's is damage
        # (reported below, only if nothing else in this file explains it).
        out_of_order = np.flatnonzero(phy[:-1] > phy[1:])[:1].tolist()
        # Slot chains (§10.4): each entry links to the previous entry of its slot; the slot holds the newest.
        slot = np.where(kh >= 0, kh % f.slots, -1)
        order = np.argsort(slot, kind="stable")  # by slot, then entry number (n is ascending)
        s_sorted, n_sorted = slot[order], n[order]
        exp_prev_sorted = np.where(np.r_[False, s_sorted[1:] == s_sorted[:-1]], np.r_[0, n_sorted[:-1]], 0)
        exp_prev = np.empty_like(prev)
        exp_prev[order] = exp_prev_sorted
        del order, exp_prev_sorted
        for k in np.flatnonzero((prev != exp_prev) & (slot >= 0)).tolist():
            agg.add(f.path, "IDX_CHAIN", ERROR, f.path, epos(n[k]), f"entry {int(n[k])} links to {int(prev[k])}, expected "
                    f"{int(exp_prev[k])} (the previous entry with the same hash slot)", entry=int(n[k]))
        del exp_prev
        table = f.slot_table().astype(np.int32)
        _drop_pages(f.segment.buffer(), INDEX_HEADER_SIZE, f.slots * INDEX_SLOT_SIZE)
        exp_table = np.zeros(f.slots, dtype=np.int32)
        last = np.r_[s_sorted[1:] != s_sorted[:-1], True]
        ok_slots = s_sorted[last] >= 0
        exp_table[s_sorted[last][ok_slots]] = n_sorted[last][ok_slots]
        for s in np.flatnonzero(table != exp_table).tolist()[:1]:
            cnt = int((table != exp_table).sum())
            agg.add(f.path, "IDX_SLOT", ERROR, f.path, INDEX_HEADER_SIZE + s * INDEX_SLOT_SIZE, f"hash slot {s} holds entry "
                    f"{int(table[s])}, expected {int(exp_table[s])}" + (f" ({cnt} slots differ)" if cnt > 1 else ""), slot=s)
        del table, exp_table, s_sorted, n_sorted, last, ok_slots
        used = int(np.count_nonzero(np.bincount(slot[slot >= 0], minlength=1)))
        del slot
        if h.hashSlotCount != used:
            agg.add(f.path, "IDX_HEADER", ERROR, f.path, 32, f"hashSlotCount {h.hashSlotCount}, the entries use {used} slots")
        if h.beginPhyOffset != int(phy[0]) or h.endPhyOffset != int(phy[-1]):
            agg.add(f.path, "IDX_HEADER", ERROR, f.path, 16, f"header offsets {h.beginPhyOffset}..{h.endPhyOffset} differ from the "
                    f"entries' {int(phy[0])}..{int(phy[-1])}")
        for k in np.flatnonzero(kh < 0).tolist():
            agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(n[k]), f"entry {int(n[k])} has a negative key hash {int(kh[k])}", entry=int(n[k]))
        idx, status = refs.classify(phy)
        for k in np.flatnonzero(status == refs.MISSING).tolist():
            agg.add(f.path, "IDX_NO_RECORD", ERROR, f.path, epos(n[k]), f"entry {int(n[k])} points at {int(phy[k])}, where no commitlog "
                    "record starts", entry=int(n[k]), phyOffset=int(phy[k]))
        ts = recs.c["storeTimestamp"]
        sel = np.flatnonzero((status == refs.FOUND) & (kh >= 0))
        r_sel = idx[sel]
        rollback = (recs.c["sysFlag"][r_sel] & 0xC) == TRANSACTION_ROLLBACK
        no_key = ~rollback & ~recs.has_key_hash(r_sel, kh[sel])
        wrong = np.flatnonzero(rollback | no_key)
        for m in wrong[:1].tolist():
            k, e = int(sel[m]), int(n[sel[m]])
            if rollback[m]:
                agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(e), f"entry {e} points at a rollback record, which is never indexed",
                        entry=e, phyOffset=int(phy[k]))
            else:
                agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(e), f"entry {e} points at {int(phy[k])}, a record with no key of "
                        f"hash {int(kh[k])}", entry=e, phyOffset=int(phy[k]))
            agg.count[(f.path, "IDX_KEY_HASH")] += len(wrong) - 1
        if h.beginTimestamp > 0:
            t = np.flatnonzero(~rollback & ~no_key & (n[sel] >= 2))
            d = ts[r_sel[t]] - h.beginTimestamp
            # int(d / 1000) with Python's float division; exact in float64 while |d| < 2**53
            big = np.abs(d) >= (1 << 53)
            want = np.where(d >= 0, np.trunc(d / 1000.0), 0).astype(np.int64)
            for q in np.flatnonzero(big).tolist():
                dq = int(d[q])
                want[q] = int(dq / 1000) if dq >= 0 else 0
            want = np.minimum(np.maximum(want, 0), 2**31 - 1)
            for q in np.flatnonzero(diff[sel[t]] != want).tolist():
                k = int(sel[t[q]])
                e = int(n[k])
                agg.add(f.path, "IDX_TIME_DIFF", WARNING, f.path, epos(e), f"entry {e} timeDiff {int(diff[k])} s, the record's store "
                        f"time gives {int(want[q])} s", entry=e)
        first_found = status[0] == refs.FOUND
        last_found = status[-1] == refs.FOUND
        if first_found and h.beginTimestamp != int(ts[idx[0]]):
            agg.add(f.path, "IDX_HEADER", WARNING, f.path, 0, f"beginTimestamp {h.beginTimestamp} differs from the first entry's record "
                    f"({int(ts[idx[0]])})")
        if last_found and h.endTimestamp != int(ts[idx[-1]]):
            agg.add(f.path, "IDX_HEADER", WARNING, f.path, 8, f"endTimestamp {h.endTimestamp} differs from the last entry's record "
                    f"({int(ts[idx[-1]])})")
        for k in out_of_order if not agg.first else []:
            # e.g. an offset changed to another record with the same key hash: only the order shows it
            agg.add(f.path, "IDX_ORDER", ERROR, f.path, epos(n[k]), f"entry {int(n[k])} points at {int(phy[k])}, after "
                    f"entry {int(n[k + 1])}'s {int(phy[k + 1])}: entries follow the commitlog order", entry=int(n[k]))
        findings += agg.findings()
    summary["index"] = {"files": len(svc.files), "entries": n_entries}


_BLOCK = 1 << 20  # entries per step: the unused part of an index file is most of its 400 MB


def _last_live_entry(f, first: int) -> int | None:
    """Number of the last entry at or after ``first`` with a non-zero keyHash, phyOffset or prevIndex
    (None if none), reading the file in blocks and dropping each block's pages afterwards."""
    table = f.entry_table()
    buf = f.segment.buffer()
    found = None
    for a in range(first, len(table), _BLOCK):
        blk = table[a:a + _BLOCK]
        if np.frombuffer(blk.tobytes() if not blk.flags.c_contiguous else blk, dtype=np.uint8).any():
            live = np.flatnonzero((blk["keyHash"] != 0) | (blk["phyOffset"] != 0) | (blk["prevIndex"] != 0))
            if len(live):
                found = a + int(live[-1])
        _drop_pages(buf, INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE + a * INDEX_ENTRY_SIZE, len(blk) * INDEX_ENTRY_SIZE)
    return found


def _drop_pages(buf, start: int, length: int) -> None:
    """Release read pages of a mapping from this process (they stay in the page cache)."""
    madvise = getattr(buf, "madvise", None)
    page = mmap.PAGESIZE
    a = (start + page - 1) // page * page
    b = (start + length) // page * page
    if madvise is None or b <= a:
        return
    try:
        madvise(mmap.MADV_DONTNEED, a, b - a)
    except (OSError, ValueError):
        pass


def _check_checkpoint(store, recs: _Records, findings: list) -> None:
    path = os.path.join(store.root, "checkpoint")
    cp = store.checkpoint()
    if not cp.exists:
        if len(recs):
            findings.append(Finding("CP_MISSING", WARNING, path, None, "no checkpoint file; the broker creates an empty one and "
                                    "treats every record as unflushed"))
        return
    if cp.fileSize != 4096:
        findings.append(Finding("CP_SIZE", WARNING, path, 0, f"checkpoint is {cp.fileSize} bytes, the broker maps 4096"))
    if not len(recs):
        return
    newest = int(recs.c["storeTimestamp"].max())
    if cp.physicMsgTimestamp > newest:
        findings.append(Finding("CP_PHYSIC_AHEAD", WARNING, path, 0, f"physicMsgTimestamp {cp.physicMsgTimestamp} is after the newest "
                                f"record ({newest}): records the broker had flushed are missing"))
    if cp.logicsMsgTimestamp > newest:
        findings.append(Finding("CP_LOGICS_AHEAD", WARNING, path, 8, f"logicsMsgTimestamp {cp.logicsMsgTimestamp} is after the newest "
                                f"record ({newest}): dispatched records are missing from the commitlog"))
    ends = [f.header().endTimestamp for f in store.index.files if f.complete]
    if cp.indexMsgTimestamp > max(ends, default=0):
        findings.append(Finding("CP_INDEX_AHEAD", WARNING, path, 16, f"indexMsgTimestamp {cp.indexMsgTimestamp} is after every index "
                                "file's endTimestamp: index files are missing"))


def _check_root(store, findings: list) -> None:
    findings += store.stray_entries()
    if store.abort_exists:
        cp = store.checkpoint()
        doomed = [f.name for f in store.index.files if f.complete and f.header().endTimestamp > cp.indexMsgTimestamp]
        findings.append(Finding("STORE_ABORT", INFO, os.path.join(store.root, "abort"), None,
                                "the last broker run did not shut down cleanly: its next start runs abnormal recovery (re-checks "
                                f"the log from the checkpoint, re-dispatches, and deletes {len(doomed)} index file(s) newer than "
                                "indexMsgTimestamp)", {"indexFilesDeletedOnRecovery": doomed}))
    lock = store.lock_state()
    if lock.held:
        findings.append(Finding("STORE_LOCKED", WARNING, os.path.join(store.root, "lock"), None,
                                f"a broker holds the store lock ({lock.detail}): files may change while they are verified"))
