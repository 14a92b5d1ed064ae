"""What a DLedger store's own cleaner deletes, predicted offline.

On a DLedger store the broker's ``CleanCommitLogService`` deletes nothing (``DLedgerCommitLog.deleteExpiredFile``
only hands the broker's settings to DLedger while the old ``commitlog/`` folder is empty). The data files are
deleted by DLedger itself, ``DLedgerMmapFileStore.CleanSpaceService``, which the broker starts with the store and
which runs about every 100 ms:

* a round deletes when it is the hour ``deleteWhen`` or the store root's or the data folder's partition is over
  ``diskSpaceRatioToCheckExpired``: [4.9.3, DLedger 0.2.3] 0.70 (system property ``dledger.disk.ratio.check``);
  [5.3.3, DLedger 0.3.1.2] the broker's ``diskMaxUsedSpaceRatio`` / 100;
* ``MmapFileList.deleteExpiredFileByTime``: oldest first, never the last file, a file goes when
  ``now >= mtime + fileReservedHours`` (the broker sets ``fileReservedTime + 1`` hours, at least one hour) or at
  once when either partition is over ``diskSpaceRatioToForceClean`` (0.85, system property
  ``dledger.disk.ratio.clean``, at least 0.50) and ``enableDiskForceClean`` (the broker's
  ``cleanFileForciblyEnable``); the first file that stays ends the walk, and so do 10 files;
* after a round that deleted, ``reviseLedgerBeginIndex``: the ledger's begin index is the index of the first
  entry of the first data file left, and ``MmapFileList.resetOffset(begin x 32)`` deletes every index file that
  ends at or before that unit.

The broker's ``CleanConsumeQueueService`` (60 s after the start, then every 10 s) then removes the consume-queue,
ext and index files behind the commitlog's new min offset, which on a DLedger store is the first data file's start
(``DLedgerCommitLog.getMinOffset``). Partition usage: DLedger 0.2.3 reads (total - free) / total; 0.3.1.2 rounds
used / (used + usable) up to a whole percent. Read-only.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from rmqstore_cli.formats import dledger as dl

from .cleanup import (FIRST_ROUND_DELAY_MS, ROUND_INTERVAL_MS, CleanupPrediction, CleanupSettings, DiskUsage, LogFile,
                      Partition, Round, expired_files, local_hour)
from .derivedcleanup import DerivedCleaner, DerivedFile

DLEDGER_ROUND_MS = 100  # CleanSpaceService: waitForRunning(100) between rounds
DLEDGER_BATCH_MAX = 10  # MmapFileList.DELETE_FILES_BATCH_MAX, both DLedger versions
CHECK_PROP = "dledger.disk.ratio.check"
CLEAN_PROP = "dledger.disk.ratio.clean"
HOUR_MS = 3600 * 1000


@dataclass
class DLedgerCleanupSettings:
    """DLedgerConfig as DLedgerCommitLog sets it from the broker's settings."""

    reserved_hours: int
    delete_when: str
    check_ratio: float
    force_ratio: float
    force_enable: bool

    @classmethod
    def from_broker(cls, s: CleanupSettings, version: int) -> "DLedgerCleanupSettings":
        check = s.dledger_check_ratio if s.dledger_check_ratio is not None else \
            (s.max_used_ratio if version >= 5 else 0.70)
        force = s.dledger_clean_ratio if s.dledger_clean_ratio is not None else 0.85
        return cls(s.fileReservedTime + 1, s.deleteWhen, check, max(force, 0.50), s.cleanFileForciblyEnable)

    @property
    def reserved_ms(self) -> int:
        return max(self.reserved_hours * HOUR_MS, HOUR_MS)  # fileReservedTimeMs below an hour is raised to one

    def as_json(self) -> dict:
        return {"cleaner": "DLedger CleanSpaceService", "fileReservedHours": self.reserved_hours,
                "deleteWhen": self.delete_when, "diskSpaceRatioToCheckExpired": round(self.check_ratio, 6),
                "diskSpaceRatioToForceClean": round(self.force_ratio, 6), "enableDiskForceClean": self.force_enable,
                "deleteFilesBatchMax": DLEDGER_BATCH_MAX}


def time_up(when: str, hour: int) -> bool | None:
    """DLedgerUtils.isItTimeToDo: the hours in order; an hour that does not parse (Integer.parseInt: no blanks)
    before a match throws, which ends the round with an error (None)."""
    for w in when.split(";"):
        if not (w.isascii() and w.lstrip("+-").isdigit()):
            return None
        if int(w) == hour:
            return True
    return False


def partition_ratio(p: Partition, version: int) -> float:
    """DLedgerUtils.getDiskPartitionSpaceUsedPercent of the DLedger version the broker pins."""
    if p.total <= 0:
        return -1.0
    if version < 5:
        return p.used / p.total
    entire = p.used + p.usable
    if entire <= 0:
        return -1.0
    return (p.used * 100 // entire + (1 if (p.used * 100) % entire else 0)) / 100.0


def begin_index(seg) -> int:
    """reviseLedgerBeginIndex: the index field of the entry at the start of the first data file."""
    b = bytes(seg.buffer()[8:16]) if seg.size >= 16 else b""
    return struct.unpack(">q", b)[0] if len(b) == 8 else 0


def index_files_behind(files, begin: int) -> list[DerivedFile]:
    """MmapFileList.resetOffset(begin x 32) on the index files: every file that ends at or before the unit."""
    offset = begin * dl.INDEX_UNIT_SIZE
    out = []
    for seg in files.index.segments:
        if seg.start + files.index.file_size <= offset:
            st = os.stat(seg.path)
            out.append(DerivedFile("dledger_index", seg.path, seg.name, st.st_size, st.st_blocks * 512,
                                   f"ends before entry {begin}'s index unit (the ledger's new begin index)"))
    return out


def dledger_behind(store, first_kept: int) -> list[DerivedFile]:
    """The DLedger index files and the broker's derived files removed once the data files start at the file of
    position ``first_kept`` (``len(files)``: none kept)."""
    segs = store.commitlog.segments.segments
    if first_kept >= len(segs):
        return []
    seg = segs[first_kept]
    out = index_files_behind(store.commitlog.files, begin_index(seg))
    return out + DerivedCleaner(store).behind(seg.start)


def predict_dledger_cleanup(store, settings: CleanupSettings, now_ms: int, disk: DiskUsage, *,
                            tz: str | None = None) -> CleanupPrediction:
    """DLedger's cleaner rounds from the broker's start at ``now_ms`` (every 100 ms until one deletes nothing),
    interleaved with the broker's consume-queue cleaner (60 s after the start, then every 10 s)."""
    version = store.config.version
    ds = DLedgerCleanupSettings.from_broker(settings, version)
    files = [LogFile.of(s) for s in store.commitlog.segments.segments]
    pred = CleanupPrediction(version, settings, now_ms, disk.as_json(), dledger=ds.as_json())
    pred.min_before = pred.min_after = files[0].start if files else 0
    kept = list(files)
    index_files = store.commitlog.files
    index_gone = 0
    dl_rounds = []  # (time, min offset after) of the DLedger rounds that deleted
    t = now_ms
    for _ in range(len(files) + 2):
        base, data = partition_ratio(disk.consumequeue, version), partition_ratio(disk.commitlog, version)
        up = time_up(ds.delete_when, local_hour(t, tz))
        check = base > ds.check_ratio or data > ds.check_ratio
        force = base > ds.force_ratio or data > ds.force_ratio
        at_once = force and ds.force_enable
        trigger = (["deleteWhen hour"] if up else []) + (["disk usage"] if check else [])
        why = ("deleteWhen does not parse: DLedger's cleaner stops with an error" if up is None else
               f"disk {max(base, data) * 100:.1f} % > diskSpaceRatioTo{'ForceClean' if at_once else 'CheckExpired'} "
               f"{(ds.force_ratio if at_once else ds.check_ratio) * 100:.1f} %" if check else "deleteWhen hour" if up else "")
        disk_before = disk.as_json()
        deleted, derived = [], []
        if up is not None and trigger:
            for f in expired_files(kept, t, ds.reserved_ms, at_once, DLEDGER_BATCH_MAX):
                deleted.append((f, "expired" if t >= f.mtime_ms + ds.reserved_ms else "forced (disk full)"))
        if deleted:
            kept = kept[len(deleted):]
            for f, _ in deleted:
                disk.free("commitlog", f.allocated)
            seg = store.commitlog.segments.segments[len(files) - len(kept)]
            behind = index_files_behind(index_files, begin_index(seg))
            derived = behind[index_gone:]
            index_gone = len(behind)
            for d in derived:
                disk.free("consumequeue", d.allocated)
            pred.min_after = kept[0].start
            dl_rounds.append((t, pred.min_after))
        pred.rounds.append(Round(len(pred.rounds) + 1, t, trigger, at_once, why, disk_before, deleted, derived,
                                 pred.min_after, cleaner="DLedger"))
        if not deleted:
            break
        t += DLEDGER_ROUND_MS * len(deleted)  # 100 ms between deletions and between rounds
    # the broker's CleanConsumeQueueService on its own clock, behind the min offset DLedger has left by then
    cleaner, last_min = DerivedCleaner(store), 0
    final_t = dl_rounds[-1][0] if dl_rounds else now_ms
    k = 0
    while True:
        tc = now_ms + FIRST_ROUND_DELAY_MS + k * ROUND_INTERVAL_MS
        mins = [m for tt, m in dl_rounds if tt <= tc]
        cur = mins[-1] if mins else pred.min_before
        if cur > last_min:
            last_min = cur
            derived = cleaner.behind(cur)
            for d in derived:
                disk.free("consumequeue", d.allocated)
            if derived:
                pred.rounds.append(Round(len(pred.rounds) + 1, tc, ["min offset moved"], False, "", disk.as_json(),
                                         [], derived, cur, cleaner="broker consume queue"))
        if tc >= final_t:
            break
        k += 1
    pred.rounds.sort(key=lambda r: (r.time_ms, r.number))
    for i, r in enumerate(pred.rounds):
        r.number = i + 1
    pred.disk_after = disk.as_json()
    return pred
