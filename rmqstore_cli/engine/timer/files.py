"""The timer store's files, read-only: ``timerlog/`` (TimerLog), ``timerwheel`` (TimerWheel),
``config/timercheck`` (TimerCheckpoint) and ``config/timermetrics`` (TimerMetrics).

The timerlog is walked file by file, in bounded chunks of unit columns (compiled walk,
:mod:`formats.timerkernel`), so memory stays flat whatever its size; the wheel is read in slices.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from rmqstore_cli.formats.timer import (TIMER_CHECKPOINT_DTYPE, TIMER_CHECKPOINT_FIELDS, TIMER_SLOT_DTYPE, TIMER_UNIT_FIELDS,
                           TIMER_UNIT_SIZE, TIMER_UNIT_STRUCT, WHEEL_FILE_SIZE, WHEEL_SLOTS)

from ..log.segments import SegmentQueue
from .presence import CHECKPOINT_FILE, TIMERLOG_DIR, WHEEL_FILE

_UNIT_NAMES = tuple(name for name, _ in TIMER_UNIT_FIELDS)
TIMERLOG_MAPPED_FILES = 64
CHUNK_UNITS = 1 << 16  # units per walked chunk (~4 MB of columns)
WHEEL_SLICE = 1 << 16  # slots read at a time

END_NAMES = {0: "limit", 1: "blank", 2: "zero", 3: "bad_size", 4: "bad_magic", 5: "eof"}


@dataclass
class UnitChunk:
    """Consecutive units of one timerlog file, as columns (absolute positions in ``pos``)."""

    pos: np.ndarray
    prevPos: np.ndarray
    magic: np.ndarray
    currWriteTime: np.ndarray
    delay: np.ndarray
    offsetPy: np.ndarray
    sizePy: np.ndarray
    realTopicHash: np.ndarray
    reserved: np.ndarray

    def __len__(self) -> int:
        return len(self.pos)

    @cached_property
    def slot_time(self) -> np.ndarray:
        """The unit's wheel time in ms: currWriteTime + delay."""
        return self.currWriteTime + self.delay

    def select(self, mask) -> "UnitChunk":
        return UnitChunk(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))


@dataclass
class FileEnd:
    """How the walk of one timerlog file ended."""

    path: str
    start: int  # the file's offset
    end: int  # absolute position after its last unit
    kind: str  # END_NAMES
    blank_size: int | None = None  # the blank's size field, when it ends with one
    blank_zero: int | None = None  # its long that must be 0


@dataclass
class TimerLogWalk:
    """What a walk of the timerlog found: each file's end, the units, where the data ends and what stopped it."""

    ends: list = field(default_factory=list)  # FileEnd per file walked
    units: int = 0
    data_end: int = 0  # absolute position after the last unit (where the broker's recovery truncates)
    stop: FileEnd | None = None  # the file whose walk ended the timerlog (zeros or a bad unit)


class TimerLog:
    """``timerlog/``: mirrors the broker's TimerLog (a MappedFileQueue of 52-byte units)."""

    def __init__(self, root: str, file_size: int):
        self.directory = os.path.join(root, TIMERLOG_DIR)
        self.file_size = file_size
        self.segments = SegmentQueue(self.directory, file_size, "timerlog")
        # slot chains jump between files (a unit's previous one can be days of files back): keep more of
        # them mapped than a sequential scan needs (mappings cost address space, not memory)
        self.segments.budget.limit = TIMERLOG_MAPPED_FILES
        self.patches: dict[int, bytes] = {}  # what a repair plans to write (see _patched)

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset

    def walk(self, walk: TimerLogWalk | None = None):
        """Yield UnitChunks in timerlog order, as TimerMessageStore.recoverAndRevise reads them: every
        file from its start, the rest of a file skipped after its blank, and the walk over at zeros or
        at a unit whose size or magic is wrong (the broker truncates the timerlog there)."""
        from rmqstore_cli.formats import timerkernel as k

        walk = walk if walk is not None else TimerLogWalk()
        walk.data_end = self.min_offset
        for seg in self.segments:
            if seg.size == 0:
                break
            u8 = np.frombuffer(self._patched(seg), dtype=np.uint8)
            p = 0
            while True:
                cols = [np.empty(CHUNK_UNITS, np.int64) for _ in range(8)]
                n, p_next, kind = k.walk_units(u8, p, CHUNK_UNITS, *cols)
                if n:
                    pos = seg.start + p + TIMER_UNIT_SIZE * np.arange(n, dtype=np.int64)
                    prev, magic, cwt, delay, offpy, sizepy, thash, reserved = (c[:n] for c in cols)
                    walk.units += n
                    walk.data_end = seg.start + p_next
                    yield UnitChunk(pos, prev, magic, cwt, delay, offpy, sizepy, thash, reserved)
                p = p_next
                if kind != k.END_LIMIT:
                    break
            end = FileEnd(seg.path, seg.start, seg.start + p, END_NAMES[kind])
            if kind == k.END_BLANK:
                end.blank_size = int.from_bytes(u8[p:p + 4].tobytes(), "big", signed=True)
                end.blank_zero = int.from_bytes(u8[p + 4:p + 12].tobytes(), "big", signed=True)
            walk.ends.append(end)
            if kind in (k.END_ZERO, k.END_BAD_SIZE, k.END_BAD_MAGIC):
                walk.stop = end
                walk.data_end = seg.start + p
                break
            walk.data_end = max(walk.data_end, seg.start + p)

    def _patched(self, seg):
        """The file's bytes as a repair plans them: ``patches`` (absolute position -> bytes) applied to a
        copy of a file they fall in (only a repair sets them; reads map the file)."""
        mine = [(p, b) for p, b in self.patches.items() if seg.start <= p < seg.start + seg.size]
        if not mine:
            return seg.buffer()
        buf = bytearray(seg.buffer())
        for p, b in mine:
            buf[p - seg.start:p - seg.start + len(b)] = b
        return bytes(buf)

    def read_unit(self, pos: int) -> dict | None:
        """The unit at absolute ``pos`` (decoded with the struct derived from the declaration), None
        outside the files."""
        seg = self.segments.find(pos)
        if seg is None or pos < seg.start or pos - seg.start + TIMER_UNIT_SIZE > seg.size:
            return None
        return dict(zip(_UNIT_NAMES, TIMER_UNIT_STRUCT.unpack_from(seg.buffer(), pos - seg.start)))

    def close(self) -> None:
        self.segments.close()


class TimerWheel:
    """``timerwheel``: mirrors the broker's TimerWheel (2 x 604800 slots of 32 bytes, one file)."""

    def __init__(self, root: str):
        self.path = os.path.join(root, WHEEL_FILE)
        self.exists = os.path.isfile(self.path)
        self.size = os.path.getsize(self.path) if self.exists else 0
        self._map = None

    def slots(self) -> np.ndarray:
        if self._map is None:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                self._map = mmap.mmap(fd, self.size, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
        return np.frombuffer(self._map, dtype=TIMER_SLOT_DTYPE, count=min(self.size, WHEEL_FILE_SIZE) // TIMER_SLOT_DTYPE.itemsize)

    def nonempty(self):
        """Yield (slot index array, slot records) of the non-zero slots, a slice of the file at a time."""
        if not self.exists or self.size == 0:
            return
        slots = self.slots()
        for lo in range(0, len(slots), WHEEL_SLICE):
            part = slots[lo:lo + WHEEL_SLICE]
            used = np.flatnonzero((part["timeUnits"] != 0) | (part["firstPos"] != 0) | (part["lastPos"] != 0)
                                  | (part["num"] != 0) | (part["magic"] != 0))
            if len(used):
                yield lo + used, part[used]

    def slot(self, index: int) -> dict:
        rec = self.slots()[index]
        return {name: int(rec[name]) for name in TIMER_SLOT_DTYPE.names}

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a slot view a caller still holds: the mapping goes with the last one
                pass
            self._map = None


def slot_json(index: int, rec, precision_ms: int) -> dict:
    d = {"slotIndex": int(index), **{name: int(rec[name]) for name in TIMER_SLOT_DTYPE.names}}
    d["timeMs"] = d["timeUnits"] * precision_ms
    return d


@dataclass
class TimerCheckpoint:
    """``config/timercheck``: mirrors the broker's TimerCheckpoint."""

    path: str
    exists: bool
    size: int = 0
    lastReadTimeMs: int = 0
    lastTimerLogFlushPos: int = 0
    lastTimerQueueOffset: int = 0
    masterTimerQueueOffset: int = 0
    stateVersion: int = 0
    timestamp: int = 0
    counter: int = 0

    @classmethod
    def read(cls, root: str) -> "TimerCheckpoint":
        path = os.path.join(root, CHECKPOINT_FILE)
        try:
            with open(path, "rb") as f:
                data = f.read(4096)
        except OSError:
            return cls(path, False)
        cp = cls(path, True, len(data))
        if len(data) >= TIMER_CHECKPOINT_DTYPE.itemsize:
            rec = np.frombuffer(data, dtype=TIMER_CHECKPOINT_DTYPE, count=1)[0]
            for name, _ in TIMER_CHECKPOINT_FIELDS:
                setattr(cp, name, int(rec[name]))
        return cp

    def as_json(self) -> dict:
        return {"path": self.path, "exists": self.exists, "lastReadTimeMs": self.lastReadTimeMs,
                "lastTimerLogFlushPos": self.lastTimerLogFlushPos, "lastTimerQueueOffset": self.lastTimerQueueOffset,
                "masterTimerQueueOffset": self.masterTimerQueueOffset,
                "dataVersion": {"stateVersion": self.stateVersion, "timestamp": self.timestamp, "counter": self.counter}}


@dataclass
class TimerMetrics:
    """``config/timermetrics`` (fastjson; ``.bak`` when the file is unreadable): mirrors TimerMetrics."""

    path: str
    exists: bool
    counts: dict = field(default_factory=dict)  # real topic -> pending count
    timestamps: dict = field(default_factory=dict)
    dataVersion: dict = field(default_factory=dict)
    error: str | None = None
    source: str | None = None

    @classmethod
    def read(cls, root: str) -> "TimerMetrics":
        path = os.path.join(root, "config", "timermetrics")
        seen = False
        err = None
        for candidate in (path, path + ".bak"):
            try:
                with open(candidate, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                continue
            seen = True
            try:
                obj = json.loads(text)
                counts = {str(t): int(v.get("count", 0)) for t, v in (obj.get("timingCount") or {}).items()}
                stamps = {str(t): int(v.get("timeStamp", 0)) for t, v in (obj.get("timingCount") or {}).items()}
            except (ValueError, AttributeError, TypeError) as e:
                err = f"{candidate}: not TimerMetrics JSON ({e})"
                continue
            return cls(path, True, counts, stamps, obj.get("dataVersion") or {}, None, candidate)
        return cls(path, seen, error=err)

    def as_json(self) -> dict:
        return {"path": self.path, "exists": self.exists, "source": self.source, "error": self.error,
                "dataVersion": self.dataVersion,
                "timingCount": {t: {"count": c, "timeStamp": self.timestamps.get(t)} for t, c in sorted(self.counts.items())}}


WHEEL_SLOT_COUNT = WHEEL_SLOTS
