"""Segment files of fixed size named by their start offset (the broker's MappedFileQueue).

Read side only: discover, check names and sizes, map files read-only on demand, and find where a file holds data.
"""

from __future__ import annotations

import errno
import mmap
import os
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..findings import Finding
from .openfiles import open_files_error, open_files_limits

NAME_DIGITS = 20
MAPPED_FILES = 4  # files of one directory (or the index files) mapped at once


class MapBudget:
    """At most ``limit`` files of one group mapped at once: mapping another drops the least recently used
    file's mapping. A 4 TB store has thousands of 1 GiB segments and tens of thousands of queue files; the
    broker keeps every MappedFile mapped, a scan needs a few. Dropped, not closed: a caller still holding
    a buffer (or a numpy view of it) keeps it valid, and it is unmapped when the last reference goes."""

    def __init__(self, limit: int | None = None, shared: "MapBudget | None" = None):
        self.limit = MAPPED_FILES if limit is None else limit
        self.mapped: OrderedDict = OrderedDict()  # id(segment) -> segment, least recently used first
        self.shared = shared  # a budget over many groups, also kept (queue files: QUEUE_FILES)

    def mapped_now(self, seg: "Segment") -> None:
        self.mapped[id(seg)] = seg
        self.mapped.move_to_end(id(seg))
        while len(self.mapped) > self.limit:
            _, old = self.mapped.popitem(last=False)
            self._drop(old)
        if self.shared is not None and seg._map is not None:
            self.shared.mapped_now(seg)

    def _drop(self, old: "Segment") -> None:
        old._map = None  # its extents stay (Segment.data_extents): the file has not changed
        if self.shared is not None:
            self.shared.forget(old)
        elif old.budget is not None and old.budget is not self:  # a shared budget drops a file from its group too
            old.budget.mapped.pop(id(old), None)

    def used(self, seg: "Segment") -> None:
        if id(seg) in self.mapped:
            self.mapped.move_to_end(id(seg))
        if self.shared is not None:
            self.shared.used(seg)

    def forget(self, seg: "Segment") -> None:
        self.mapped.pop(id(seg), None)
        if self.shared is not None:
            self.shared.forget(seg)


class SharedQueueFiles(MapBudget):
    """Every queue file (consume queue, ext, batch consume queue) this process has mapped for reading, at most
    half the descriptors it may hold (each mapping keeps one: openfiles.py), one let go past that
    (:meth:`_victim`). The broker keeps every queue file mapped and needs a limit on open files to match (RocketMQ's
    bin/os.sh sets 655350); a copy of its store read where that limit cannot be raised (a container's hard
    limit) then still reads, a file being mapped again when it is next needed. The limit is taken at the first
    mapping, after the command line raised its soft limit."""

    def __init__(self):
        super().__init__(limit=0)
        self.limit = None
        self.let_go = False  # a file was let go: readers then keep no view of a queue file longer than they use it

    def _drop(self, old: "Segment") -> None:
        self.let_go = True
        super()._drop(old)

    def mapped_now(self, seg: "Segment") -> None:
        # held weakly: a store left unclosed is collected as before, its files with it (a long-lived process, a
        # library user, would otherwise keep every store it ever read mapped here)
        if self.limit is None:
            soft = open_files_limits()[0]
            self.limit = max(8, soft // 2) if soft is not None else 1 << 30
        key, mapped = id(seg), self.mapped
        self.mapped[key] = weakref.ref(seg, lambda ref: mapped.pop(key, None) if mapped.get(key) is ref else None)
        self.mapped.move_to_end(id(seg))
        while len(self.mapped) > self.limit:
            ref = self.mapped.pop(self._victim())
            old = ref()
            if old is not None:
                self._drop(old)

    RECENT = 8  # files last used that are never let go for another (a queue's files, a step's few)

    def _victim(self):
        """The file to let go: the most recently used but the last :attr:`RECENT` ones. A command's passes go
        through the queue files in the same order, each pass after the last; letting the least recently used go
        would let go, at every mapping, the file the next pass needs first (every file mapped again in every pass:
        140,000 mappings for 20,000 files past a budget of 10,000 in recover's plan), where this keeps the budget's
        first files of a pass mapped for the next. The last few stay, as least-recently-used would keep them."""
        skip = min(self.RECENT, len(self.mapped) - 1)
        for k, key in enumerate(reversed(self.mapped)):
            if k == skip:
                return key
        raise AssertionError("a budget over its limit holds more than one file")


QUEUE_FILES = SharedQueueFiles()


class KeptMappings:
    """Read-only mappings of commitlog files kept for the length of one command that walks the same log
    several times (recover: the broker's walk, verify before, the re-dispatch, verify after), each pass
    through its own Store. A file mapped afresh in every pass pays its page faults again and its unmapping
    (together ~0.1 s of CPU per GiB and pass); a kept mapping has its pages in place after the first pass.
    The pages are the page cache's (resident file pages, never anonymous memory) and the kernel may still
    reclaim them. Files are kept first come, up to ``max_bytes`` in all; later files are mapped per pass as
    without this. A mapping is reused only for the same file (path, device, inode) and length, and only
    while the file is at least that long (so it never reaches past the end of the file)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.maps: dict[tuple, mmap.mmap] = {}
        self.kept_ids: set[int] = set()

    def open(self, seg: "Segment") -> mmap.mmap | None:
        """The kept mapping of ``seg`` (made now if the budget allows), or None: map it the usual way."""
        try:
            st = os.stat(seg.path)
        except OSError:
            return None
        if st.st_size < seg.size:
            return None
        key = (seg.path, st.st_dev, st.st_ino, seg.size)
        m = self.maps.get(key)
        if m is not None or self.bytes + seg.size > self.max_bytes:
            return m
        m = _map_read_only(seg.path, seg.size)
        self.maps[key] = m
        self.kept_ids.add(id(m))
        self.bytes += seg.size
        return m

    def holds(self, buf) -> bool:
        return id(buf) in self.kept_ids

    def close(self) -> None:
        for m in self.maps.values():
            try:
                m.close()
            except BufferError:
                pass  # a numpy view still references it; unmapped when the last reference goes
        self.maps.clear()
        self.kept_ids.clear()
        self.bytes = 0


_KEPT: list = [None]  # the KeptMappings of the command running in this process, if it asked for them


@contextmanager
def kept_mappings(max_bytes: int | None = None):
    """Keep commitlog mappings for the block (:class:`KeptMappings`); ``max_bytes`` defaults to a quarter of
    the machine's memory (the pages stay reclaimable; the page tables of a mapped GiB take ~2 MB)."""
    if _KEPT[0] is not None:  # nested: the outer block's mappings serve
        yield _KEPT[0]
        return
    if max_bytes is None:
        try:
            max_bytes = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
        except (ValueError, OSError):
            max_bytes = 1 << 30
    kept = _KEPT[0] = KeptMappings(max_bytes)
    try:
        yield kept
    finally:
        _KEPT[0] = None
        kept.close()


def is_kept(buf) -> bool:
    """True when ``buf`` is a kept mapping (its pages are not to be dropped after a pass)."""
    kept = _KEPT[0]
    return kept is not None and kept.holds(buf)


# Files mostly unwritten past their data (queue files: the broker pre-allocates 6 MB, a queue may hold a few KB)
DATA_AHEAD_KINDS = ("consume queue", "consume queue ext", "batch consume queue")


def _map_read_only(path: str, size: int, data_ahead: bool = False, extents: list | None = None) -> mmap.mmap:
    """``data_ahead``: read ahead only the file's data extents (``extents`` when the caller has them, else
    :func:`data_extents`). A fault in a mapping otherwise reads the device's read-ahead window around it (8 MB
    on this machine's disk): a cold queue file of a few KB was read whole, its hole zero-filled into the page
    cache (~2 ms of kernel time a file; 8 s for 2048 queues)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise open_files_error(path, e) from None
    try:
        m = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except OSError as e:
        raise mapping_error(path, e) from None
    finally:
        os.close(fd)
    try:
        if not data_ahead:
            m.madvise(mmap.MADV_SEQUENTIAL)
        else:
            m.madvise(mmap.MADV_RANDOM)
            page = mmap.PAGESIZE
            for lo, hi in (extents if extents is not None else data_extents(path, 0, size)):
                lo -= lo % page
                m.madvise(mmap.MADV_WILLNEED, lo, min(hi, size) - lo)
    except (AttributeError, OSError, ValueError):
        pass
    return m


def mapping_error(path: str, e: OSError) -> OSError:
    """What to raise when mapping ``path`` failed with ``e``. ENOMEM with the process near the kernel's limit on
    mappings (``vm.max_map_count``, 65530 by default) is that limit, not memory: a command keeps each queue file it
    is reading mapped, as the broker keeps every file mapped, so a store with tens of thousands of queue files
    needs it raised (RocketMQ's ``bin/os.sh`` sets 655360). Said so, with the numbers; still an OSError, so a
    repair that meets it undoes its steps as on a full disk."""
    if e.errno == errno.EMFILE:
        return open_files_error(path, e)
    if e.errno != errno.ENOMEM:
        return e
    counts = mapping_counts()
    if counts is None:
        return e
    used, limit = counts
    if used < limit * 9 // 10:
        return e  # far from the limit: memory really is short
    return OSError(errno.ENOMEM, f"cannot map it: this process holds {used} memory mappings and the kernel allows "
                                 f"{limit} (vm.max_map_count). A store with many queue files needs one mapping per "
                                 "file in use, as the broker does: raise the limit, e.g. `sysctl -w "
                                 "vm.max_map_count=655360` (the value RocketMQ's bin/os.sh sets), and run the command "
                                 "again", path)


def mapping_counts() -> tuple[int, int] | None:
    """(memory mappings this process holds, the kernel's limit ``vm.max_map_count``), None where Linux's /proc
    cannot tell."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f), limit
    except (OSError, ValueError):
        return None


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
    keepable: bool = field(default=False, repr=False, compare=False)  # a commitlog file (KeptMappings)
    data_ahead: bool = field(default=False, repr=False, compare=False)  # read ahead only its data (_map_read_only)
    _kept: bool = field(default=False, repr=False, compare=False)
    _extents: list | None = field(default=None, repr=False, compare=False)  # data_extents, asked once

    @property
    def end(self) -> int:
        return self.start + self.size

    def buffer(self):
        """Read-only mapping of the whole file (an empty bytes object for a 0-byte file)."""
        if self.size == 0:
            return self._empty
        m = self._map
        if m is None:
            kept = _KEPT[0] if self.keepable else None
            m = kept.open(self) if kept is not None else None
            self._kept = m is not None
            if m is None:
                m = _map_read_only(self.path, self.size, self.data_ahead, self.data_extents() if self.data_ahead else None)
            self._map = m
            if self.budget is not None:
                self.budget.mapped_now(self)  # may drop this very mapping when the limit is 0: m stays valid
        elif self.budget is not None:
            self.budget.used(self)
        return m

    def data_extents(self, start: int = 0, end: int | None = None) -> list:
        """[lo, hi) ranges inside [start, end) of the file that may hold non-zero bytes (:func:`data_extents`). The
        whole file's are asked once and kept until :meth:`close`: a queue file is mapped (its data read ahead),
        checked for units past its queue's end and, past the queue-file budget, let go and mapped again by each
        pass, and each asked the file system (FIEMAP and its open, ~50 µs a file: seconds on a broker with tens of
        thousands of queue files). A segment is a reader's: the file does not change while it is open (a repair
        closes the store it planned on before it writes)."""
        if self._extents is None:
            self._extents = list(data_extents(self.path, 0, self.size))
        end = self.size if end is None else end
        return [(max(lo, start), min(hi, end)) for lo, hi in self._extents if lo < end and hi > start]

    def close(self) -> None:
        self._extents = None
        if self.budget is not None:
            self.budget.forget(self)
        if self._map is not None and not self._kept:  # a kept mapping is closed when its command ends
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
        self.budget = MapBudget(shared=QUEUE_FILES if kind in DATA_AHEAD_KINDS else None)
        try:
            # one directory read: a DirEntry knows its type without a stat (thousands of queue folders)
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            name, path = entry.name, entry.path
            if entry.is_symlink():
                self.problems.append(Finding("SEG_SYMLINK", "error", path, None, f"{kind} entry {name} is a symbolic link"))
                self.strays.append(path)
                continue
            if entry.is_dir(follow_symlinks=False):
                self.problems.append(Finding("SEG_STRAY_DIR", "warning", path, None, f"directory {name} inside the {kind} directory"))
                self.strays.append(path)
                continue
            if not (name.isdigit() and len(name) == name_digits):
                self.problems.append(Finding("SEG_BAD_NAME", "error", path, None,
                                             f"{kind} file name {name!r} is not a {name_digits}-digit offset; the broker would refuse to start"))
                self.strays.append(path)
                continue
            size = entry.stat(follow_symlinks=False).st_size
            seg = Segment(path, name, int(name), size, budget=self.budget, keepable=kind == "commitlog",
                          data_ahead=kind in DATA_AHEAD_KINDS)
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


# --- where a file holds data ------------------------------------------------------------------------------

_FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap)
_FIEMAP_FLAG_SYNC = 0x1
_FIEMAP_EXTENT_LAST, _FIEMAP_EXTENT_UNWRITTEN = 0x1, 0x800
_FIEMAP_BATCH = 256


def _fiemap_written(path: str, start: int, end: int):
    """[lo, hi) ranges of ``path`` inside [start, end) backed by written blocks (FIEMAP), merged; None where
    the file system has no FIEMAP. Extents flagged unwritten (``posix_fallocate``, our ``reserve``) read as
    zeros, yet SEEK_DATA on ext4 reports them as data: a fresh 400 MB index file would be read whole.
    FIEMAP_FLAG_SYNC writes dirty pages back first, so bytes written through a mapping and not yet synced
    are in written extents when the map is taken."""
    import fcntl
    import struct

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    out: list[tuple[int, int]] = []
    try:
        pos, flags = start, _FIEMAP_FLAG_SYNC
        while pos < end:
            req = bytearray(32 + 56 * _FIEMAP_BATCH)
            struct.pack_into("=QQIIII", req, 0, pos, end - pos, flags, 0, _FIEMAP_BATCH, 0)
            try:
                fcntl.ioctl(fd, _FS_IOC_FIEMAP, req, True)
            except OSError:
                return None
            flags = 0  # synced once is enough
            (mapped,) = struct.unpack_from("=I", req, 20)
            if not mapped:
                break
            last = False
            for k in range(mapped):
                logical, _phys, length = struct.unpack_from("=QQQ", req, 32 + 56 * k)
                (eflags,) = struct.unpack_from("=I", req, 32 + 56 * k + 40)
                last = bool(eflags & _FIEMAP_EXTENT_LAST)
                pos = max(pos, logical + length)
                if eflags & _FIEMAP_EXTENT_UNWRITTEN:
                    continue
                lo, hi = max(logical, start), min(logical + length, end)
                if lo >= hi:
                    continue
                if out and out[-1][1] >= lo:
                    out[-1] = (out[-1][0], max(out[-1][1], hi))
                else:
                    out.append((lo, hi))
            if last:
                break
    finally:
        os.close(fd)
    return out


def data_extents(path: str, start: int, end: int):
    """[lo, hi) ranges of ``path`` inside [start, end) that may hold non-zero bytes: written extents (FIEMAP,
    see :func:`_fiemap_written`), else SEEK_DATA/SEEK_HOLE; the whole range where the file system cannot tell."""
    if start >= end:
        return
    written = _fiemap_written(path, start, end)
    if written is not None:
        yield from written
        return
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None:
        yield start, end
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        while pos < end:
            try:
                lo = os.lseek(fd, pos, seek_data)
            except OSError as e:
                if e.errno == errno.ENXIO:  # nothing but holes from pos to the end of the file
                    return
                yield pos, end  # not supported here: read it all
                return
            if lo >= end:
                return
            hi = min(os.lseek(fd, lo, seek_hole), end)
            yield lo, hi
            pos = hi
    finally:
        os.close(fd)
