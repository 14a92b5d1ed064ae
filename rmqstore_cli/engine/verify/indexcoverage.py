"""Verify: every record the broker would index has its index entries (FORMAT.md §10.3, §10.6).

The entry checks (:mod:`.index`, :class:`.windows.IndexWindows`) look at the entries that exist; this
check looks for the ones that do not. It mirrors ``IndexService.buildIndex``: a record of transaction
type NOT, PREPARED or COMMIT gets one entry per key (UNIQ_KEY, then each non-empty KEYS token, the
same key hashes verify computes for its entry check), in the last index file that is not full; a
record below the last file's endPhyOffset is never indexed again. So every such record from the first
indexed one up to (not including) the last file's endPhyOffset must hold all its entries: nothing
will add them. The record AT endPhyOffset may hold only part of its keys (a broker stopped while it
put them) and is indexed again, whole, at the next start; records after it are what that start
re-dispatches (the other checks report an index behind the log as they always have). With an ``abort``
file, "the last file" is the last one the broker's abnormal start keeps (it deletes the newer ones).

Cheap by construction: the window's entry pass (:class:`.windows.IndexWindows`), which finds each entry's
record anyway, counts the entries each record holds; here they are compared with its keys. Counting record
by record (not comparing a window's totals) is what makes the answer independent of the window size: an
entry moved to another record, or to no record, leaves the totals as they were. Without the window pass (the
whole-log formulation) the entries of one index file that point into the range are one run (entries follow
the commitlog; IDX_ORDER otherwise), found by two binary searches in the file, and counted here.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from rmqstore_cli.formats.records import (INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE, SYSFLAG_TRANSACTION_MASK,
                                          TRANSACTION_ROLLBACK)

from .records import ERROR, Finding, _Records


class IndexCoverage:
    """The records below the index's end that lack index entries (``IndexService.buildIndex``'s rule), window
    by window. ``index_files``: the :class:`.windows.IndexWindows` of the complete index files, in name order
    (their record-independent checks done)."""

    def __init__(self, store, index_files: list):
        self.store = store
        self.first: tuple | None = None  # (phyOffset, entries held, entries wanted, topic, index file, position)
        self.records = 0  # records short of entries
        self.missing = 0  # entries they lack
        self.files: list = []  # (phyOffset column, entry count, first entry's phyOffset, last entry's, the file)
        self.begin = self.end = 0
        files = store.index.files
        if not store.config.messageIndexEnable or not files or any(not f.complete for f in files):
            return  # no index kept, or a file whose entries the entry checks could not read (reported there)
        if index_files is None:  # the whole-log formulation: no window checks were built
            index_files = [FileEntries(f) for f in files]
        if any(ix.out_of_order is not None for ix in index_files):
            return  # IDX_ORDER: entries out of commitlog order are found in no run (rebuild the index)
        begins = []
        for ix in index_files:
            if ix.count > 1:
                col = ix.f.entry_table(ix.count)["phyOffset"]
                self.files.append((col, ix.count, int(col[1]), int(col[ix.count - 1]), ix.f))
                begins += [ix.h.beginPhyOffset, int(col[1])]
        if not self.files:
            return
        # What the broker counts as indexed: from the first indexed record up to the last file's endPhyOffset
        # (a file created after a full one inherits its predecessor's end, so an empty last file still says it).
        self.begin = min(begins)
        last = files[-1]
        if store.abort_exists:
            # the next start is abnormal: it deletes every file newer than indexMsgTimestamp and indexes again from
            # the end of the last one it keeps (§10.6 Load); entries of the doomed files are not needed
            cp_ts = store.checkpoint().indexMsgTimestamp
            kept = [f for f in files if f.header().endTimestamp <= cp_ts]
            if not kept:
                self.files = []
                return
            last = kept[-1]
        self.end = last.header().endPhyOffset

    def window(self, recs: _Records, ws: int, we: int, held: np.ndarray | None = None) -> None:
        """The records of ``recs`` in ``[ws, we)`` (a window's, or the whole log's). ``held``: the entries of the
        index files each record of ``recs`` holds, as the window's entry pass counted them (None: counted here)."""
        lo, hi = max(ws, self.begin), min(we, self.end)
        if not self.files or lo >= hi or not len(recs):
            return
        phy = recs.phy
        a, b = int(np.searchsorted(phy, lo)), int(np.searchsorted(phy, hi))
        if a >= b:
            return
        kc = recs.c["keyCount"][a:b]
        indexed = (recs.c["sysFlag"][a:b] & SYSFLAG_TRANSACTION_MASK) != TRANSACTION_ROLLBACK
        mine = phy[a:b]
        if held is not None:
            held = held[a:b]
        else:  # record by record from the files' runs (a sum of run lengths equal to the keys' could hide a
            # shortfall: an entry moved to another record, or to no record, counts in the run all the same)
            held = np.zeros(b - a, np.int64)
            for col, count, first, last, _ in self.files:
                if last < lo or first >= hi:
                    continue
                e0 = bisect_left(col, lo, 1, count)
                e1 = bisect_left(col, hi, e0, count)
                if e1 > e0:
                    p = col[e0:e1].astype(np.int64)
                    k = np.searchsorted(mine, p)
                    ok = k < len(mine)
                    ok[ok] = mine[k[ok]] == p[ok]
                    held += np.bincount(k[ok], minlength=b - a)
        short = np.flatnonzero(indexed & (held < kc))
        if not len(short):
            return
        self.records += len(short)
        self.missing += int((kc[short] - held[short]).sum())
        i = int(short[0])
        if self.first is None or int(mine[i]) < self.first[0]:
            self.first = (int(mine[i]), int(held[i]), int(kc[i]), recs.topic(a + i), *self._where(int(mine[i])))

    def _where(self, phy: int) -> tuple[str, int]:
        """(index file, position) where the entries of the record at ``phy`` are or belong: the file whose entries
        reach it (else the first one after it, else the last), at its first entry not below ``phy``."""
        for col, count, first, last, f in self.files:
            if phy <= last:
                break
        e = bisect_left(col, phy, 1, count)
        return f.path, INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE + e * INDEX_ENTRY_SIZE

    def take_partial(self):
        """What the windows since the last call found (None if nothing); starts afresh (a ``-j`` worker sends it)."""
        got = (self.first, self.records, self.missing)
        self.first, self.records, self.missing = None, 0, 0
        return got if got[1] else None

    def merge_partial(self, got) -> None:
        first, records, missing = got
        if self.first is None or first[0] < self.first[0]:
            self.first = first
        self.records += records
        self.missing += missing

    def merge_counted(self, records: int, missing: int, phy: int, held: int, want: int, topic: str) -> None:
        """Records short of entries counted elsewhere (a distributed verify joins entries and records): how many,
        the entries they lack, and the first of them (its offset, entries held and wanted, topic)."""
        self.merge_partial(((phy, held, want, topic, *self._where(phy)), records, missing))

    def finish(self, findings: list) -> None:
        if not self.records:
            return
        phy, held, want, topic, path, pos = self.first
        more = f" (and {self.records - 1} more like it)" if self.records > 1 else ""
        findings.append(Finding("IDX_MISSING", ERROR, path, pos,
                                f"the record at {phy} (topic {topic}) has {held} of its {want} index entries: "
                                f"{self.missing} {'entry' if self.missing == 1 else 'entries'} missing below the "
                                f"index's end {self.end}, and the broker never indexes a record there again{more}",
                                {"phyOffset": phy, "missingEntries": self.missing, "count": self.records}))


class FileEntries:
    """What the coverage reads of an index file's window checks (:class:`.windows.IndexWindows`), for a verify
    that built none: its header, entry count and whether its entries follow the commitlog (``unordered``: as
    the file's entry check found it; None: looked at here)."""

    def __init__(self, f, unordered: bool | None = None):
        self.f, self.h = f, f.header()
        self.count = min(self.h.indexCount if self.h.indexCount > 0 else 1, f.entries)
        self.out_of_order = True if unordered else None
        if unordered is None and self.count > 2:
            phy = f.entry_table(self.count)["phyOffset"][1:].astype(np.int64)
            if np.any(phy[1:] < phy[:-1]):
                self.out_of_order = True
