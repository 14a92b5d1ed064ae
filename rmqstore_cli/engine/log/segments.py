"""Segment files of fixed size named by their start offset (the broker's MappedFileQueue).

Read side only: discover, check names and sizes, and map files read-only on demand.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from dataclasses import dataclass, field

from ..findings import Finding

NAME_DIGITS = 20
MAPPED_FILES = 4  # files of one directory (or the index files) mapped at once


class MapBudget:
    """At most ``limit`` files of one group mapped at once: mapping another drops the least recently used
    file's mapping. A 4 TB store has thousands of 1 GiB segments and tens of thousands of queue files; the
    broker keeps every MappedFile mapped, a scan needs a few. Dropped, not closed: a caller still holding
    a buffer (or a numpy view of it) keeps it valid, and it is unmapped when the last reference goes."""

    def __init__(self, limit: int | None = None):
        self.limit = MAPPED_FILES if limit is None else limit
        self.mapped: OrderedDict = OrderedDict()  # id(segment) -> segment, least recently used first

    def mapped_now(self, seg: "Segment") -> None:
        self.mapped[id(seg)] = seg
        self.mapped.move_to_end(id(seg))
        while len(self.mapped) > self.limit:
            _, old = self.mapped.popitem(last=False)
            old._map = None

    def used(self, seg: "Segment") -> None:
        if id(seg) in self.mapped:
            self.mapped.move_to_end(id(seg))

    def forget(self, seg: "Segment") -> None:
        self.mapped.pop(id(seg), None)


def segment_name(offset: int) -> str:
    return "%020d" % offset


@dataclass
class Segment:
    """One mapped file (MappedFile): start offset from its name, actual size on disk."""

    path: str
    name: str
    start: int
    size: int
    _map: mmap.mmap | None = field(default=None, repr=False)
    _empty: bytes = field(default=b"", repr=False)
    budget: MapBudget | None = field(default=None, repr=False, compare=False)

    @property
    def end(self) -> int:
        return self.start + self.size

    def buffer(self):
        """Read-only mapping of the whole file (an empty bytes object for a 0-byte file)."""
        if self.size == 0:
            return self._empty
        m = self._map
        if m is None:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                m = self._map = mmap.mmap(fd, self.size, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            try:
                m.madvise(mmap.MADV_SEQUENTIAL)
            except (AttributeError, OSError):
                pass
            if self.budget is not None:
                self.budget.mapped_now(self)  # may drop this very mapping when the limit is 0: m stays valid
        elif self.budget is not None:
            self.budget.used(self)
        return m

    def close(self) -> None:
        if self.budget is not None:
            self.budget.forget(self)
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a numpy view still references it; the GC will release it
            self._map = None


class SegmentQueue:
    """All segments of one directory, sorted by name, with the problems the broker would hit.

    Mirrors MappedFileQueue.load (§1.3): non-numeric names and wrong sizes stop a broker;
    they are reported as findings here, and such files are left out of ``segments``.
    """

    def __init__(self, directory: str, file_size: int, kind: str, name_digits: int = NAME_DIGITS):
        self.directory = directory
        self.file_size = file_size
        self.kind = kind
        self.segments: list[Segment] = []
        self.problems: list[Finding] = []
        self.strays: list[str] = []
        self.budget = MapBudget()
        if not os.path.isdir(directory):
            return
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if os.path.islink(path):
                self.problems.append(Finding("SEG_SYMLINK", "error", path, None, f"{kind} entry {name} is a symbolic link"))
                self.strays.append(path)
                continue
            if os.path.isdir(path):
                self.problems.append(Finding("SEG_STRAY_DIR", "warning", path, None, f"directory {name} inside the {kind} directory"))
                self.strays.append(path)
                continue
            if not (name.isdigit() and len(name) == name_digits):
                self.problems.append(Finding("SEG_BAD_NAME", "error", path, None,
                                             f"{kind} file name {name!r} is not a {name_digits}-digit offset; the broker would refuse to start"))
                self.strays.append(path)
                continue
            size = os.path.getsize(path)
            seg = Segment(path, name, int(name), size, budget=self.budget)
            if size != file_size:
                what = "zero-length" if size == 0 else f"{size} bytes, not {file_size}"
                self.problems.append(Finding("SEG_WRONG_SIZE", "error", path, 0,
                                             f"{kind} file {name} is {what}; the broker would refuse to start"))
                seg.wrong_size = True  # type: ignore[attr-defined]
            self.segments.append(seg)
        for a, b in zip(self.segments, self.segments[1:]):
            if b.start != a.start + file_size:
                kind_ = "SEG_GAP" if b.start > a.start + file_size else "SEG_OVERLAP"
                self.problems.append(Finding(kind_, "error", b.path, None,
                                             f"{kind} file {b.name} does not follow {a.name} (expected {segment_name(a.start + file_size)})"))
        for seg in self.segments:
            if seg.start % file_size:
                self.problems.append(Finding("SEG_MISALIGNED", "error", seg.path, None,
                                             f"{kind} file {seg.name} does not start at a multiple of the file size {file_size}"))

    def __iter__(self):
        return iter(self.segments)

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else 0

    def find(self, offset: int) -> Segment | None:
        """The segment holding ``offset`` (by name), or None."""
        lo, hi = 0, len(self.segments) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            s = self.segments[mid]
            if offset < s.start:
                hi = mid - 1
            elif offset >= s.start + max(s.size, 1):
                lo = mid + 1
            else:
                return s
        return None

    def close(self) -> None:
        for s in self.segments:
            s.close()
