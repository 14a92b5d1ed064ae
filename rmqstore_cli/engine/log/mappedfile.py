"""Writer side of a queue of fixed-size segment files (the broker's MappedFile/MappedFileQueue).

New segments are created the way the broker pre-allocates them: full size at once, sparse and
zero-filled (``ftruncate``), named by their 20-digit start offset.  Bytes are written through a
shared ``mmap`` of the current segment, so appending costs no system call per record; only the
segment being written is kept mapped.  ``flush`` makes everything written so far durable
(``msync`` of the mapped segment, ``fsync`` of segments already left behind, and of the
directory when files were created).

An :class:`UndoJournal` (optional, one per write session) keeps what a failed session needs to
put every file back: the pre-image of each byte range before its first write (only its place
when it was all zeros, the usual case past a file's data end), snapshots of small files, and
the files and directories the session created.
"""

from __future__ import annotations

import errno
import mmap
import os

import numpy as np

from ..errors import UsageError
from .segments import mapping_error, segment_name


_NO_RESERVE = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def reserve(fd: int, size: int, path: str) -> None:
    """Give every byte of the file disk blocks before it is mapped for writing.

    A store write through ``mmap`` into a hole (a sparse, pre-allocated segment, as the broker and
    ``ftruncate`` leave them) allocates the block only when the page is faulted in or written back;
    on a full filesystem the kernel then answers with SIGBUS, which kills the process in the middle
    of a write. ``posix_fallocate`` reserves the blocks up front, so a full disk is an ENOSPC error
    here, before any byte is written, and the undo journal can put the store back. Blocks that are
    already allocated are left as they are (contents never change)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in _NO_RESERVE:
            return  # a filesystem without fallocate (glibc emulates it where it can)
        raise OSError(e.errno, f"{os.strerror(e.errno)} ({errno.errorcode.get(e.errno, e.errno)}) while reserving "
                               f"{size} bytes before writing", path) from None


class WritableSegment:
    """One segment mapped read-write."""

    __slots__ = ("path", "start", "size", "fd", "mm", "dirty", "journal", "lo", "hi", "created", "modified", "times")

    def __init__(self, path: str, start: int, size: int, *, create: bool, journal: "UndoJournal | None" = None,
                 fresh: bool = False):
        """``fresh``: a file this write created, opened again (its pre-image is nothing: no byte is saved)."""
        self.path = path
        self.start = start
        self.size = size
        self.journal = journal
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            self.fd = os.open(path, flags, 0o644)
        except OSError as e:
            raise UsageError(f"cannot {'create' if create else 'open'} {path}: {e.strerror}") from None
        self.created, self.modified = create, False
        st = os.fstat(self.fd)
        # reserving blocks (posix_fallocate) updates the modification time of a file nothing is written to
        # in the end (a queue's last file, the last index file): it is put back when the file is closed
        self.times = (st.st_atime_ns, st.st_mtime_ns)
        # [lo, hi): bytes whose pre-image is saved (or need none); a write outside goes through touch()
        if journal is None or create or fresh:
            self.lo, self.hi = 0, size
            if journal is not None and create:
                journal.created(path)
        else:
            self.lo, self.hi = size, 0
        try:
            if create:
                os.ftruncate(self.fd, size)  # sparse, reads as zeros: the broker's pre-allocation
            elif os.fstat(self.fd).st_size != size:
                raise UsageError(f"{path} is {os.fstat(self.fd).st_size} bytes, not {size}")
            reserve(self.fd, size, path)
            try:
                self.mm = mmap.mmap(self.fd, size, access=mmap.ACCESS_WRITE)
            except OSError as e:
                raise mapping_error(path, e) from None
        except BaseException:
            os.close(self.fd)
            raise
        self.dirty = create

    @property
    def end(self) -> int:
        return self.start + self.size

    def touch(self, pos: int, n: int) -> None:
        """Call before writing ``n`` bytes at ``pos``: saves their pre-image on the first write."""
        if pos < self.lo or pos + n > self.hi:
            self.journal.extend(self, pos, n)

    def write(self, pos: int, data) -> None:
        n = len(data)
        if pos < self.lo or pos + n > self.hi:
            self.journal.extend(self, pos, n)
        self.mm[pos : pos + n] = data
        self.dirty = True

    def flush(self) -> None:
        if self.dirty:
            # msync(MS_SYNC) syncs the file range (vfs_fsync_range), so it also covers pages
            # dirtied through pwrite/pwritev (the appender writes records that way).
            self.mm.flush()
            self.dirty = False
            self.modified = True

    def close(self, flush: bool = False) -> None:
        if self.mm is None:
            return
        if flush:
            self.flush()
        try:
            self.mm.close()
        except BufferError:  # an exported view is still alive; the GC unmaps it later
            pass
        if not (self.created or self.modified or self.dirty):
            try:
                os.utime(self.fd, ns=self.times)
            except OSError:
                pass  # only a time stamp
        os.close(self.fd)
        self.mm = None


class SegmentQueueWriter:
    """The segment files of one directory, for appending.

    ``open(start)`` maps the segment starting at ``start`` (creating it, and the directory,
    if absent) and makes it the current one; the previous current segment is unmapped and
    remembered for the next ``flush``.
    """

    def __init__(self, directory: str, file_size: int, journal: "UndoJournal | None" = None,
                 budget: "OpenWriters | None" = None):
        """``budget``: writers of many small folders (consume queues) share one; a writer whose segment is handed
        out for later writes (the commitlog's, written with ``pwrite`` on its descriptor) must have none."""
        self.directory = directory
        self.file_size = file_size
        self.journal = journal
        self.budget = budget
        self.current: WritableSegment | None = None
        self._to_sync: set[str] = set()
        self._dir_dirty = False
        self.created: list[str] = []  # paths of segments created by this writer

    def existing_starts(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(n) for n in names if n.isdigit() and len(n) == 20)

    def path_of(self, start: int) -> str:
        return os.path.join(self.directory, segment_name(start))

    def open(self, start: int) -> WritableSegment:
        if self.current is not None and self.current.start == start:
            return self.current
        path = self.path_of(start)
        exists = os.path.exists(path)
        if not exists:
            makedirs(self.directory, self.journal)
        try:
            seg = WritableSegment(path, start, self.file_size, create=not exists, journal=self.journal,
                                  fresh=exists and self.budget is not None and path in self.created)
        except UsageError:
            if exists or not os.path.exists(path):
                raise
            # made meanwhile by a rebuild -j worker (engine/derived/cqdirect.py: it appears full size)
            exists = True
            seg = WritableSegment(path, start, self.file_size, create=False, journal=self.journal)
        if not exists:
            self._dir_dirty = True
            self.created.append(path)
        self._retire()
        self.current = seg
        if self.budget is not None:
            self.budget.opened(self)
        return seg

    def _retire(self) -> None:
        cur = self.current
        if cur is not None:
            if cur.dirty:
                self._to_sync.add(cur.path)
            cur.close(flush=False)
            self.current = None
            if self.budget is not None:
                self.budget.let_go(self)

    def flush(self) -> None:
        if self.current is not None:
            self.current.flush()
        for path in sorted(self._to_sync):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._to_sync.clear()
        if self._dir_dirty:
            fsync_dir(self.directory)
            self._dir_dirty = False

    def close(self, flush: bool = True) -> None:
        if flush:
            self.flush()
        if self.current is not None:
            self.current.close(flush=False)
            self.current = None
        if self.budget is not None:
            self.budget.let_go(self)


class OpenWriters:
    """The consume-queue writers holding their current file open, at most as many as the limit on open files
    leaves room for. Each holds two descriptors (its own, for write-back and fsync, and the copy Python's mmap
    keeps), where the broker's MappedFile holds one: a rebuild of 8192 queues stopped with "Too many open files"
    under a limit of 12,000 that the broker runs under. Past the budget, the writer opened longest ago lets its
    file go (unmapped and closed; fsynced at its next flush, as a file it left behind) and maps it again when it
    next writes. The budget is set at the first file opened past the count of files already open then (the
    reading side's mappings), so writers and readers together stay under the limit."""

    HEADROOM = 256  # descriptors left for everything else (config files, the index, backups, pipes)

    def __init__(self, limit: int | None = None):
        self.limit = limit  # None: worked out from the process's limit when first needed
        self.writers: dict[int, SegmentQueueWriter] = {}  # id -> writer, in the order they opened their file

    def opened(self, writer: "SegmentQueueWriter") -> None:
        self.writers.pop(id(writer), None)
        self.writers[id(writer)] = writer
        if self.limit is None:
            self.limit = self._room()
        while len(self.writers) > self.limit:
            oldest = self.writers.pop(next(iter(self.writers)))
            oldest._retire()

    def let_go(self, writer: "SegmentQueueWriter") -> None:
        self.writers.pop(id(writer), None)

    def _room(self) -> int:
        from .openfiles import open_files_limits

        soft, _ = open_files_limits()
        if soft is None:
            return 1 << 62
        try:
            in_use = len(os.listdir("/proc/self/fd"))
        except OSError:
            in_use = 64
        return max(16, (soft - in_use - self.HEADROOM) // 2)


OPEN_WRITERS = OpenWriters()


def drop_pages(buf, start: int, length: int) -> None:
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


def fsync_path(path: str, directory: bool = False) -> None:
    """fsync one file or directory, quietly: what cannot be opened or synced (gone, a device) is left as is."""
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make file creations in ``path`` (and of ``path`` itself in its parent) durable."""
    for p in (path, os.path.dirname(path.rstrip(os.sep))):
        fsync_path(p, directory=True)


def makedirs(path: str, journal: "UndoJournal | None" = None) -> None:
    """``os.makedirs``; the journal learns which directories it created."""
    if journal is None:
        os.makedirs(path, exist_ok=True)
        return
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        os.makedirs(d, exist_ok=True)
        journal.created_dir(d)


AHEAD = 1 << 20  # pre-image saved past a write, so sequential small writes rarely leave the fast path
_ZERO_CHUNK = 1 << 20


def _all_zero(mm, off: int, n: int) -> bool:
    a = np.frombuffer(mm, np.uint8, n, off)
    z = not a.any()
    del a  # release the export so the mapping can be closed
    return z


class UndoJournal:
    """What a write session changed, so that a failed one (disk full, file too large, I/O error)
    leaves the store as it was: the broker has no such thing; a tool must not half-write a store.

    Records are undone in reverse order, so a range saved twice ends with its first (true) pre-image.
    Restoring writes through ``mmap``, which neither grows a file nor meets RLIMIT_FSIZE."""

    def __init__(self) -> None:
        self.ranges: list[tuple[str, int, int, bytes | None]] = []  # (path, offset, length, bytes or None=zeros)
        self.files: list[tuple[str, bytes | None]] = []  # whole-file snapshots (None: did not exist)
        self.new_files: list[str] = []
        self.new_dirs: list[str] = []

    def created(self, path: str) -> None:
        self.new_files.append(path)

    def created_dir(self, path: str) -> None:
        self.new_dirs.append(path)

    def snapshot_file(self, path: str) -> None:
        """Small files rewritten as a whole (the checkpoint)."""
        try:
            with open(path, "rb") as f:
                self.files.append((path, f.read()))
        except FileNotFoundError:
            self.files.append((path, None))

    def save(self, seg: WritableSegment, off: int, n: int) -> None:
        if n <= 0:
            return
        mm = seg.mm
        self.ranges.append((seg.path, off, n, None if _all_zero(mm, off, n) else mm[off : off + n]))

    def extend(self, seg: WritableSegment, pos: int, n: int) -> None:
        end = pos + n
        if seg.hi <= seg.lo:
            hi = min(seg.size, max(end, pos + AHEAD))
            self.save(seg, pos, hi - pos)
            seg.lo, seg.hi = pos, hi
            return
        if pos < seg.lo:
            self.save(seg, pos, seg.lo - pos)
            seg.lo = pos
        if end > seg.hi:
            hi = min(seg.size, max(end, seg.hi + AHEAD))
            self.save(seg, seg.hi, hi - seg.hi)  # a gap before ``pos`` is saved too: one interval per file
            seg.hi = hi

    def undo(self) -> None:
        """Put every file back; raises OSError if that is impossible (the caller says so)."""
        by_path: dict[str, list] = {}
        for r in self.ranges:
            by_path.setdefault(r[0], []).append(r)
        new = set(self.new_files)
        for path, recs in by_path.items():
            if path not in new:
                _restore_ranges(path, recs)
        for path, data in reversed(self.files):
            if data is None:
                new.add(path)
            elif path not in new:
                _restore_file(path, data)
        dirs = set()
        for path in new:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            dirs.add(os.path.dirname(path))
        for d in sorted(self.new_dirs, key=len, reverse=True):
            try:
                os.rmdir(d)
            except OSError:
                pass
            dirs.add(os.path.dirname(d))
        for d in dirs:
            if os.path.isdir(d):
                fsync_dir(d)


def _restore_ranges(path: str, recs: list) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
        try:
            for _, off, n, data in reversed(recs):
                if data is not None:
                    mm[off : off + n] = data
                    continue
                # zero only what was written: untouched holes stay unallocated
                end = min(off + n, size)
                for p in range(off, end, _ZERO_CHUNK):
                    k = min(_ZERO_CHUNK, end - p)
                    if not _all_zero(mm, p, k):
                        mm[p : p + k] = bytes(k)
            mm.flush()
        finally:
            mm.close()
    finally:
        os.close(fd)


def _restore_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != len(data):
            os.ftruncate(fd, len(data))
        if data:
            mm = mmap.mmap(fd, len(data), access=mmap.ACCESS_WRITE)
            try:
                if mm[:] != data:
                    mm[:] = data
                mm.flush()
            finally:
                mm.close()
        os.fsync(fd)
    finally:
        os.close(fd)
