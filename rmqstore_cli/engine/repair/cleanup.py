"""What a running broker's expired-file cleaner deletes, predicted offline (FORMAT.md 13.10).

Mirrors ``DefaultMessageStore.CleanCommitLogService`` (when a round deletes, and whether it deletes
at once: ``isTimeToDelete`` / ``isSpaceToDelete``), ``MappedFileQueue.deleteExpiredFileByTime`` (which
commitlog files go), ``DefaultMessageStore.CleanConsumeQueueService`` with
``MappedFileQueue.deleteExpiredFileByOffset`` and ``ConsumeQueue.correctMinOffset`` /
``ConsumeQueueExt.truncateByMinAddress`` (the consume-queue and ext files behind a new min offset), and
``IndexService.deleteExpiredFile`` (the index files). Both versions: 4.9.3 and 5.3.3 differ in where the
two disk ratios come from, in the order of the space checks and in the batch limit's setting.

Two seams keep the prediction off the real clock and the real disk: ``now_ms`` (the cleaner's "now"; the
``deleteWhen`` hour is read in ``tz``, the broker's local zone by default) and :class:`DiskUsage` (the used
and total bytes of the partitions, from ``statvfs`` unless given). Read-only.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from .derivedcleanup import DerivedCleaner

FIRST_ROUND_DELAY_MS = 60_000  # the cleaner's first run after the store starts
ROUND_INTERVAL_MS = 10_000  # cleanResourceInterval
BATCH_MAX_4 = 10  # MappedFileQueue.DELETE_FILES_BATCH_MAX (4.9.3)
FORCIBLY_PROP = "rocketmq.broker.diskSpaceCleanForciblyRatio"
WARNING_PROP = "rocketmq.broker.diskSpaceWarningLevelRatio"


@dataclass
class CleanupSettings:
    """The cleaner's settings (MessageStoreConfig; 4.9.3 reads the two disk ratios from system properties)."""

    fileReservedTime: int = 72  # hours
    deleteWhen: str = "04"
    diskMaxUsedSpaceRatio: int = 75  # percent
    cleanFileForciblyEnable: bool = True
    diskSpaceCleanForciblyRatio: float = 0.85
    diskSpaceWarningLevelRatio: float = 0.90
    deleteFileBatchMax: int = 10
    dledger_check_ratio: float | None = None  # -Ddledger.disk.ratio.check (DLedger's own cleaner)
    dledger_clean_ratio: float | None = None  # -Ddledger.disk.ratio.clean
    given: dict = field(default_factory=dict)  # setting -> value as written in the broker's settings

    @classmethod
    def from_settings(cls, settings: dict | None, version: int) -> "CleanupSettings":
        """From broker.conf keys (``rocketmq.broker.*`` system properties accepted beside them)."""
        from ..errors import UsageError

        s = cls()
        settings = settings or {}

        def num(key, conv):
            try:
                return conv(str(settings[key]).strip())
            except ValueError:
                raise UsageError(f"setting {key}={settings[key]!r} is not a valid value") from None

        for key, conv in (("fileReservedTime", int), ("diskMaxUsedSpaceRatio", int), ("deleteFileBatchMax", int)):
            if key in settings:
                setattr(s, key, num(key, conv))
                s.given[key] = settings[key]
        if "deleteWhen" in settings:
            s.deleteWhen = str(settings["deleteWhen"]).strip()
            s.given["deleteWhen"] = s.deleteWhen
        if "cleanFileForciblyEnable" in settings:
            s.cleanFileForciblyEnable = str(settings["cleanFileForciblyEnable"]).strip().lower() == "true"
            s.given["cleanFileForciblyEnable"] = settings["cleanFileForciblyEnable"]
        for name, prop in (("diskSpaceCleanForciblyRatio", FORCIBLY_PROP), ("diskSpaceWarningLevelRatio", WARNING_PROP)):
            if prop in settings:  # a fraction, both versions (a -D system property)
                setattr(s, name, num(prop, float))
                s.given[prop] = settings[prop]
            elif name in settings and version >= 5:  # 5.3.3 MessageStoreConfig: percent
                setattr(s, name, num(name, float) / 100.0)
                s.given[name] = settings[name]
        for name, prop in (("dledger_check_ratio", "dledger.disk.ratio.check"),
                           ("dledger_clean_ratio", "dledger.disk.ratio.clean")):
            if prop in settings:  # system properties of DLedgerConfig, a fraction
                setattr(s, name, num(prop, float))
                s.given[prop] = settings[prop]
        if version >= 5:  # 5.3.3 clamps both (getDiskSpaceCleanForciblyRatio / getDiskSpaceWarningLevelRatio)
            s.diskSpaceCleanForciblyRatio = min(max(s.diskSpaceCleanForciblyRatio, 0.30), 0.85)
            s.diskSpaceWarningLevelRatio = min(max(s.diskSpaceWarningLevelRatio, 0.35), 0.90)
        return s

    @property
    def max_used_ratio(self) -> float:
        """getDiskMaxUsedSpaceRatio: clamped to [10, 95] percent."""
        return min(max(self.diskMaxUsedSpaceRatio, 10), 95) / 100.0

    def batch_max(self, version: int) -> int:
        return max(self.deleteFileBatchMax, 1) if version >= 5 else BATCH_MAX_4

    def delete_hours(self) -> set[int]:
        """UtilAll.isItTimeToDo: ``;``-separated hours; one that does not parse is skipped."""
        out = set()
        for w in self.deleteWhen.split(";"):
            try:
                out.add(int(w.strip()))
            except ValueError:
                continue
        return out

    def as_json(self, version: int) -> dict:
        return {"fileReservedTime": self.fileReservedTime, "deleteWhen": self.deleteWhen,
                "diskMaxUsedSpaceRatio": self.diskMaxUsedSpaceRatio, "cleanFileForciblyEnable": self.cleanFileForciblyEnable,
                "diskSpaceCleanForciblyRatio": self.diskSpaceCleanForciblyRatio,
                "diskSpaceWarningLevelRatio": self.diskSpaceWarningLevelRatio, "deleteFileBatchMax": self.batch_max(version),
                "given": dict(self.given)}


# --- the disk --------------------------------------------------------------------------------------


@dataclass
class Partition:
    total: int
    used: int
    avail: int | None = None  # File.getUsableSpace (f_bavail); None: total - used (no reserved blocks)

    @property
    def ratio(self) -> float:
        return self.used / self.total if self.total > 0 else -1.0

    @property
    def usable(self) -> int:
        return self.avail if self.avail is not None else self.total - self.used


@dataclass
class DiskUsage:
    """The partitions under the commitlog and the consume-queue folders (one shared object when both are on
    the same device), as ``File.getTotalSpace`` / ``getFreeSpace`` see them: total = f_blocks, free = f_bfree."""

    commitlog: Partition
    consumequeue: Partition
    source: str = "statvfs"

    def free(self, part: str, nbytes: int) -> None:
        p = self.commitlog if part == "commitlog" else self.consumequeue
        p.used = max(p.used - nbytes, 0)
        if p.avail is not None:
            p.avail += nbytes

    def as_json(self) -> dict:
        return {"source": self.source, "commitlogUsed": self.commitlog.used, "commitlogTotal": self.commitlog.total,
                "commitlogRatio": round(self.commitlog.ratio, 6), "consumeQueueUsed": self.consumequeue.used,
                "consumeQueueTotal": self.consumequeue.total, "consumeQueueRatio": round(self.consumequeue.ratio, 6)}


def _statvfs_partition(path: str) -> Partition:
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    return Partition(total, total - st.f_bfree * st.f_frsize, st.f_bavail * st.f_frsize)


def measure_disk(commitlog_dir: str, cq_dir: str) -> DiskUsage:
    """The partitions now (``statvfs``); a missing consume-queue folder is measured at the store root."""
    if not os.path.isdir(cq_dir):
        cq_dir = os.path.dirname(cq_dir)
    cl = _statvfs_partition(commitlog_dir)
    try:
        same = os.stat(commitlog_dir).st_dev == os.stat(cq_dir).st_dev
    except OSError:
        same = False
    return DiskUsage(cl, cl if same else _statvfs_partition(cq_dir))


def assumed_disk(used: int, total: int, cq: tuple[int, int] | None = None) -> DiskUsage:
    """A disk given instead of measured: one partition for both folders, or the consume queue's own
    (``cq`` = (used, total))."""
    p = Partition(total, used)
    return DiskUsage(p, Partition(cq[1], cq[0]) if cq else p, source="given")


def space_check(version: int, s: CleanupSettings, disk: DiskUsage) -> tuple[bool, bool, str]:
    """isSpaceToDelete: (the usage calls for cleaning, cleanImmediately, why) in the version's order."""
    cl, cq = disk.commitlog.ratio, disk.consumequeue.ratio
    forcibly, warning, ratio = s.diskSpaceCleanForciblyRatio, s.diskSpaceWarningLevelRatio, s.max_used_ratio
    pct = lambda x: f"{x * 100:.1f} %"  # noqa: E731
    if version >= 5:
        for name, r in (("commitlog", cl), ("consume-queue", cq)):
            if r > warning:
                return True, True, f"{name} disk {pct(r)} > diskSpaceWarningLevelRatio {pct(warning)}"
            if r > forcibly:
                return True, True, f"{name} disk {pct(r)} > diskSpaceCleanForciblyRatio {pct(forcibly)}"
        for name, r in (("commitlog", cl), ("consume-queue", cq)):
            if r < 0 or r > ratio:
                return True, False, f"{name} disk {pct(r)} > diskMaxUsedSpaceRatio {pct(ratio)}"
        return False, False, ""
    # 4.9.3: the commitlog check returns before the consume-queue one when it calls for cleaning
    clean_now, why_now = False, ""
    for name, r in (("commitlog", cl), ("consume-queue", cq)):
        if r > warning or r > forcibly:
            clean_now = True
            why_now = why_now or (f"{name} disk {pct(r)} > " + (f"diskSpaceWarningLevelRatio {pct(warning)}" if r > warning
                                                                 else f"diskSpaceCleanForciblyRatio {pct(forcibly)}"))
        if r < 0 or r > ratio:
            return True, clean_now, why_now or f"{name} disk {pct(r)} > diskMaxUsedSpaceRatio {pct(ratio)}"
    return False, clean_now, why_now


def local_hour(ms: int, tz: str | None = None) -> int:
    if tz is None:
        return time.localtime(ms / 1000).tm_hour
    from zoneinfo import ZoneInfo
    import datetime as _dt

    return _dt.datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).hour


# --- commitlog files ---------------------------------------------------------------------------------


@dataclass
class LogFile:
    """One commitlog file as the cleaner sees it: start offset, size, modification time, allocated bytes."""

    path: str
    name: str
    start: int
    size: int
    mtime_ms: int
    allocated: int

    @classmethod
    def of(cls, seg) -> "LogFile":
        st = os.stat(seg.path)
        return cls(seg.path, seg.name, seg.start, seg.size, st.st_mtime_ns // 1_000_000, st.st_blocks * 512)


def expired_files(files: list[LogFile], now_ms: int, reserved_ms: int, clean_at_once: bool, batch: int) -> list[LogFile]:
    """deleteExpiredFileByTime: oldest first, never the last file; a file goes when ``now >= mtime + reserved``
    or at once; the first file that stays ends the walk (no hole), and so does the batch limit."""
    out = []
    for f in files[:-1]:
        if not (now_ms >= f.mtime_ms + reserved_ms or clean_at_once):
            break
        out.append(f)
        if len(out) >= batch:
            break
    return out


# --- the rounds ------------------------------------------------------------------------------------------


@dataclass
class Round:
    number: int
    time_ms: int
    trigger: list  # "deleteWhen hour", "disk usage"
    clean_immediately: bool
    why: str
    disk_before: dict
    commitlog: list  # [(LogFile, reason)]
    derived: list  # [DerivedFile]
    min_offset: int
    cleaner: str = "broker"  # "broker", or on a DLedger store "DLedger" / "broker consume queue"

    def as_json(self) -> dict:
        return {"round": self.number, "cleaner": self.cleaner, "time": self.time_ms, "trigger": self.trigger,
                "cleanImmediately": self.clean_immediately, "why": self.why, "diskBefore": self.disk_before,
                "commitlogFiles": [{"name": f.name, "start": f.start, "size": f.size, "mtime": f.mtime_ms, "reason": r}
                                   for f, r in self.commitlog],
                "derivedFiles": [d.as_json() for d in self.derived], "minPhyOffsetAfter": self.min_offset}


@dataclass
class CleanupPrediction:
    version: int
    settings: CleanupSettings
    start_ms: int
    disk: dict  # usage before the first round
    rounds: list = field(default_factory=list)
    min_before: int = 0
    min_after: int = 0
    disk_after: dict = field(default_factory=dict)  # usage once every round is done
    dledger: dict | None = None  # DLedger's own cleaner's settings, on a DLedger store

    @property
    def commitlog(self) -> list:
        return [(f, r) for rd in self.rounds for f, r in rd.commitlog]

    @property
    def derived(self) -> list:
        return [d for rd in self.rounds for d in rd.derived]

    @property
    def freed(self) -> int:
        return sum(f.allocated for f, _ in self.commitlog) + sum(d.allocated for d in self.derived)

    def as_json(self) -> dict:
        return {"type": "cleanup-prediction", "version": self.version, "settings": self.settings.as_json(self.version),
                "dledger": self.dledger,
                "brokerStart": self.start_ms, "disk": self.disk, "diskAfter": self.disk_after, "rounds": [r.as_json() for r in self.rounds if r.commitlog or r.derived],
                "minPhyOffsetBefore": self.min_before, "minPhyOffsetAfter": self.min_after,
                "commitlogFilesDeleted": len(self.commitlog), "derivedFilesDeleted": len(self.derived),
                "freedBytes": self.freed}


def predict_cleanup(store, settings: CleanupSettings, now_ms: int, disk: DiskUsage, *, tz: str | None = None,
                    max_rounds: int | None = None) -> CleanupPrediction:
    """The cleaner's rounds after a broker starts on this store at ``now_ms``: the first 60 s after the
    start, then every 10 s, until a round deletes nothing (each round: CleanCommitLogService, then
    CleanConsumeQueueService with the commitlog's new min offset). Disk usage drops by the allocated bytes of
    what each round deletes."""
    version = store.config.version
    files = [LogFile.of(s) for s in store.commitlog.segments.segments]
    pred = CleanupPrediction(version, settings, now_ms, disk.as_json())
    pred.min_before = pred.min_after = files[0].start if files else 0
    reserved_ms = settings.fileReservedTime * 3600 * 1000
    batch = settings.batch_max(version)
    hours = settings.delete_hours()
    cleaner = DerivedCleaner(store)
    last_min = 0  # CleanConsumeQueueService.lastPhysicalMinOffset starts at 0
    limit = max_rounds if max_rounds is not None else len(files) + 2
    for k in range(limit):
        t = now_ms + FIRST_ROUND_DELAY_MS + k * ROUND_INTERVAL_MS
        timeup = local_hour(t, tz) in hours
        spacefull, clean_now, why = space_check(version, settings, disk)
        trigger = (["deleteWhen hour"] if timeup else []) + (["disk usage"] if spacefull else [])
        at_once = settings.cleanFileForciblyEnable and clean_now
        disk_before = disk.as_json()
        deleted = []
        if trigger:
            for f in expired_files(files, t, reserved_ms, at_once, batch):
                expired = t >= f.mtime_ms + reserved_ms
                deleted.append((f, "expired" if expired else "forced (disk full)"))
        for f, _ in deleted:
            disk.free("commitlog", f.allocated)
        files = files[len(deleted):]
        new_min = files[0].start if files else pred.min_after
        derived = []
        if new_min > last_min:
            last_min = new_min
            derived = cleaner.behind(new_min)
            for d in derived:
                disk.free("consumequeue", d.allocated)  # consumequeue/, consumequeue_ext/ and index/ are under the root
        pred.min_after = new_min
        pred.rounds.append(Round(k + 1, t, trigger, at_once, why or ("deleteWhen hour" if timeup else ""),
                                 disk_before, deleted, derived, new_min))
        if not deleted and not derived:
            break
    pred.disk_after = disk.as_json()
    return pred
