"""Verify: index files against the commitlog (§10), the checkpoint and the store root."""

from __future__ import annotations

import os

import numpy as np

from rmqstore_cli.formats.indexchain import chain_block
from rmqstore_cli.formats.records import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE, TRANSACTION_ROLLBACK

from ..findings import Finding
from ..derived.index import last_live_entry as _last_live_entry
from ..log.mappedfile import drop_pages as _drop_pages
from .records import ERROR, INFO, WARNING, _Agg, _Records, _RefClassifier


def check_index_file(store, f, recs: _Records, refs: _RefClassifier) -> tuple[list, int, bool]:
    """The checks of ONE index file (``f`` from ``store.index.files``): (findings, entries, whether its entries
    leave the commitlog order: the index coverage check is skipped then). Independent of the other files, so a
    distributed verify can run one task per file."""
    findings: list = []
    if not f.complete:
        return findings, 0, False
    n, out_of_order = _check_index_file(f, recs, refs, findings)
    return findings, n, out_of_order is not None


def _check_index(store, recs: _Records, refs: _RefClassifier, findings: list, summary: dict,
                 files: list | None = None) -> None:
    svc = store.index
    if files is None:  # the service's own problems once per store, not once per file
        findings += svc.problems
    n_entries = 0
    for f in svc.files if files is None else files:
        if f.complete:
            n_entries += _check_index_file(f, recs, refs, findings)[0]
    summary["index"] = {"files": len(svc.files), "entries": n_entries}


_ENTRY_BLOCK = 1 << 16  # entries checked per step: the per-block columns stay ~5 MB whatever the file's size


class _EntryScan:
    """What one file's entry checks carry from block to block."""

    def __init__(self, slots: int):
        self.last = np.zeros(slots, dtype=np.int32)  # newest entry per hash slot so far (the expected slot table)
        self.prev_phy: int | None = None
        self.first_phy = self.last_phy = 0
        self.out_of_order: tuple | None = None  # (entry, phy, next entry, its phy) of the first offset larger than the next's
        self.pending_lost: list = []  # (entries, phys) past the log's end not yet followed by a found entry
        self.first_ts: int | None = None  # store time of the record entry 1 points at, if found
        self.last_ts: int | None = None  # same for the last entry


def _check_index_file(f, recs: _Records, refs: _RefClassifier, findings: list) -> tuple[int, tuple | None]:
    """The checks of one complete index file, reading its entries in blocks; returns its entry count and the
    first place its entries leave the commitlog order (None: they follow it)."""
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
    if count <= 1:
        findings += agg.findings()
        return 0, None
    table = f.entry_table(count)
    buf = f.segment.buffer()
    scan = _EntryScan(f.slots)
    for a in range(1, count, _ENTRY_BLOCK):
        b = min(a + _ENTRY_BLOCK, count)
        ent = table[a:b]
        # 4-byte fields stay int32
        kh = ent["keyHash"].astype(np.int32)
        phy = ent["phyOffset"].astype(np.int64)
        diff = ent["timeDiff"].astype(np.int32)
        prev = ent["prevIndex"].astype(np.int32)
        del ent
        _drop_pages(buf, base + a * INDEX_ENTRY_SIZE, (b - a) * INDEX_ENTRY_SIZE)  # copied: release the file pages
        _check_entry_block(f, h, a, kh, phy, diff, prev, b == count, scan, recs, refs, agg)
    refs.lost_refs += sum(len(e) for e, _ in scan.pending_lost)
    epos = lambda e: base + int(e) * INDEX_ENTRY_SIZE  # noqa: E731
    # Slot table (§10.4): each slot holds the newest entry of its chain.
    check_slot_table(agg, f, h, buf, scan.last, scan.first_phy, scan.last_phy)
    check_header_times(agg, f, h, epos, scan.first_ts, scan.last_ts, scan.out_of_order)
    findings += agg.findings()
    return count - 1, scan.out_of_order


def _check_entry_block(f, h, a: int, kh, phy, diff, prev, final: bool, scan: _EntryScan, recs: _Records,
                       refs: _RefClassifier, agg: _Agg) -> None:
    """Entries ``a ..`` of ``f``: slot chains, key hashes, the records they point at, time differences.
    Findings that later blocks may precede are added with their entry number as rank."""
    base = INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE
    epos = lambda e: base + int(e) * INDEX_ENTRY_SIZE  # noqa: E731
    if a == 1:
        scan.first_phy = int(phy[0])
    scan.last_phy = int(phy[-1])
    # Entries are appended in dispatch (= commitlog) order: an offset larger than the next one's is damage
    # (reported at the end, only if nothing else in this file explains it).
    if scan.out_of_order is None:
        if scan.prev_phy is not None and scan.prev_phy > int(phy[0]):
            scan.out_of_order = (a - 1, scan.prev_phy, a, int(phy[0]))
        else:
            k = np.flatnonzero(phy[:-1] > phy[1:])[:1].tolist()
            if k:
                scan.out_of_order = (a + k[0], int(phy[k[0]]), a + k[0] + 1, int(phy[k[0] + 1]))
    scan.prev_phy = int(phy[-1])
    # Slot chains (§10.4): each entry links to the previous entry of its slot.
    bad_pos, bad_exp = chain_block(kh, prev, a, f.slots, scan.last)
    for k, want in zip(bad_pos.tolist(), bad_exp.tolist()):
        e = a + k
        agg.add(f.path, "IDX_CHAIN", ERROR, f.path, epos(e), f"entry {e} links to {int(prev[k])}, expected "
                f"{want} (the previous entry with the same hash slot)", entry=e)
    for k in np.flatnonzero(kh < 0).tolist():
        e = a + k
        agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(e), f"entry {e} has a negative key hash {int(kh[k])}", entry=e,
                rank=(0, e))
    idx, status = refs.classify_raw(phy)
    found_at = np.flatnonzero(status == refs.FOUND)
    if len(found_at):
        # a reference past the end followed by a found one is corrupt, not the lost tail (:meth:`_RefClassifier.classify`)
        status[np.flatnonzero(status[: found_at[-1]] == refs.LOST)] = refs.MISSING
        for ents, phys in scan.pending_lost:
            for e, p in zip(ents.tolist(), phys.tolist()):
                _no_record(agg, f, epos(e), e, p)
        scan.pending_lost = []
    lost = np.flatnonzero(status == refs.LOST)
    if len(lost):
        scan.pending_lost.append((lost + a, phy[lost]))
    for k in np.flatnonzero(status == refs.MISSING).tolist():
        _no_record(agg, f, epos(a + k), a + k, int(phy[k]))
    ts = recs.c["storeTimestamp"]
    if a == 1 and status[0] == refs.FOUND:
        scan.first_ts = int(ts[idx[0]])
    if final and status[-1] == refs.FOUND:
        scan.last_ts = int(ts[idx[-1]])
    sel = np.flatnonzero((status == refs.FOUND) & (kh >= 0))
    check_found_entries(agg, f, h, epos, recs, sel + a, idx[sel], kh[sel], phy[sel], diff[sel])


def check_found_entries(agg: _Agg, f, h, epos, recs: _Records, entries: np.ndarray, r: np.ndarray, kh: np.ndarray,
                        phy: np.ndarray, diff: np.ndarray) -> None:
    """The entry -> record rules (§10.3) for entries that found their record: entry numbers ``entries``, their
    records ``r`` in ``recs`` and their keyHash ``kh``, phyOffset ``phy`` and timeDiff ``diff`` (one row each).
    Shared by the whole-file check and the windowed one."""
    ts = recs.c["storeTimestamp"]
    rollback = (recs.c["sysFlag"][r] & 0xC) == TRANSACTION_ROLLBACK
    no_key = ~rollback & ~recs.has_key_hash(r, kh)
    wrong = np.flatnonzero(rollback | no_key)
    for q in wrong[:1].tolist():
        e = int(entries[q])
        p = int(phy[q])
        if rollback[q]:
            agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(e), f"entry {e} points at a rollback record, which is never indexed",
                    entry=e, phyOffset=p, rank=(1, e))
        else:
            agg.add(f.path, "IDX_KEY_HASH", ERROR, f.path, epos(e), f"entry {e} points at {p}, a record with no key of "
                    f"hash {int(kh[q])}", entry=e, phyOffset=p, rank=(1, e))
        agg.count[(f.path, "IDX_KEY_HASH")] += len(wrong) - 1
    if h.beginTimestamp > 0:
        t = np.flatnonzero(~rollback & ~no_key & (entries >= 2))
        d = ts[r[t]] - h.beginTimestamp
        # int(d / 1000) with Python's float division; exact in float64 while |d| < 2**53
        big = np.abs(d) >= (1 << 53)
        want = np.where(d >= 0, np.trunc(d / 1000.0), 0).astype(np.int64)
        for q in np.flatnonzero(big).tolist():
            dq = int(d[q])
            want[q] = int(dq / 1000) if dq >= 0 else 0
        want = np.minimum(np.maximum(want, 0), 2**31 - 1)
        for q in np.flatnonzero(diff[t] != want).tolist():
            e = int(entries[t[q]])
            agg.add(f.path, "IDX_TIME_DIFF", WARNING, f.path, epos(e), f"entry {e} timeDiff {int(diff[t[q]])} s, the record's "
                    f"store time gives {int(want[q])} s", entry=e, rank=e)


def _no_record(agg: _Agg, f, pos: int, e: int, phy: int) -> None:
    agg.add(f.path, "IDX_NO_RECORD", ERROR, f.path, pos, f"entry {e} points at {phy}, where no commitlog record starts",
            entry=e, phyOffset=phy, rank=e)


def check_slot_table(agg, f, h, buf, last: np.ndarray, first_phy: int, last_phy: int) -> None:
    """The slot table and header counts against the entries (§10.4): each slot holds the newest entry of its
    chain (``last``, as the chain check rebuilt it), hashSlotCount the slots used, begin/endPhyOffset the
    first and last entry's offsets."""
    table_slots = f.slot_table()
    differ = table_slots != last
    _drop_pages(buf, INDEX_HEADER_SIZE, f.slots * INDEX_SLOT_SIZE)
    cnt = int(np.count_nonzero(differ))
    if cnt:
        s = int(np.argmax(differ))
        agg.add(f.path, "IDX_SLOT", ERROR, f.path, INDEX_HEADER_SIZE + s * INDEX_SLOT_SIZE, f"hash slot {s} holds entry "
                f"{int(table_slots[s])}, expected {int(last[s])}" + (f" ({cnt} slots differ)" if cnt > 1 else ""), slot=s)
    del differ, table_slots
    used = int(np.count_nonzero(last))
    if h.hashSlotCount != used:
        agg.add(f.path, "IDX_HEADER", ERROR, f.path, 32, f"hashSlotCount {h.hashSlotCount}, the entries use {used} slots")
    if h.beginPhyOffset != first_phy or h.endPhyOffset != last_phy:
        agg.add(f.path, "IDX_HEADER", ERROR, f.path, 16, f"header offsets {h.beginPhyOffset}..{h.endPhyOffset} differ from the "
                f"entries' {first_phy}..{last_phy}")


def check_header_times(agg, f, h, epos, first_ts, last_ts, out_of_order) -> None:
    """begin/endTimestamp against the first and last entry's records, and the entries' commitlog order."""
    if first_ts is not None and h.beginTimestamp != first_ts:
        agg.add(f.path, "IDX_HEADER", WARNING, f.path, 0, f"beginTimestamp {h.beginTimestamp} differs from the first entry's record "
                f"({first_ts})")
    if last_ts is not None and h.endTimestamp != last_ts:
        agg.add(f.path, "IDX_HEADER", WARNING, f.path, 8, f"endTimestamp {h.endTimestamp} differs from the last entry's record "
                f"({last_ts})")
    if out_of_order is not None and not agg.first:
        # e.g. an offset changed to another record with the same key hash: only the order shows it
        e, p, e2, p2 = out_of_order
        agg.add(f.path, "IDX_ORDER", ERROR, f.path, epos(e), f"entry {e} points at {p}, after "
                f"entry {e2}'s {p2}: entries follow the commitlog order", entry=e)


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
