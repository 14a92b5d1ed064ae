"""Writer side of a queue of fixed-size segment files (the broker's MappedFile/MappedFileQueue).

New segments are created the way the broker pre-allocates them: full size at once, sparse and
zero-filled (``ftruncate``), named by their 20-digit start offset.  Bytes are written through a
shared ``mmap`` of the current segment, so appending costs no system call per record; only the
segment being written is kept mapped.  ``flush`` makes everything written so far durable
(``msync`` of the mapped segment, ``fsync`` of segments already left behind, and of the
directory when files were created).
"""

from __future__ import annotations

import mmap
import os

from .errors import UsageError
from .segments import segment_name


class WritableSegment:
    """One segment mapped read-write."""

    __slots__ = ("path", "start", "size", "fd", "mm", "dirty")

    def __init__(self, path: str, start: int, size: int, *, create: bool):
        self.path = path
        self.start = start
        self.size = size
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            self.fd = os.open(path, flags, 0o644)
        except OSError as e:
            raise UsageError(f"cannot {'create' if create else 'open'} {path}: {e.strerror}") from None
        try:
            if create:
                os.ftruncate(self.fd, size)  # sparse, reads as zeros: the broker's pre-allocation
            elif os.fstat(self.fd).st_size != size:
                raise UsageError(f"{path} is {os.fstat(self.fd).st_size} bytes, not {size}")
            self.mm = mmap.mmap(self.fd, size, access=mmap.ACCESS_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self.dirty = create

    @property
    def end(self) -> int:
        return self.start + self.size

    def write(self, pos: int, data) -> None:
        self.mm[pos : pos + len(data)] = data
        self.dirty = True

    def flush(self) -> None:
        if self.dirty:
            # msync(MS_SYNC) syncs the file range (vfs_fsync_range), so it also covers pages
            # dirtied through pwrite/pwritev (the appender writes records that way).
            self.mm.flush()
            self.dirty = False

    def close(self, flush: bool = False) -> None:
        if self.mm is None:
            return
        if flush:
            self.flush()
        try:
            self.mm.close()
        except BufferError:  # an exported view is still alive; the GC unmaps it later
            pass
        os.close(self.fd)
        self.mm = None


class SegmentQueueWriter:
    """The segment files of one directory, for appending.

    ``open(start)`` maps the segment starting at ``start`` (creating it, and the directory,
    if absent) and makes it the current one; the previous current segment is unmapped and
    remembered for the next ``flush``.
    """

    def __init__(self, directory: str, file_size: int):
        self.directory = directory
        self.file_size = file_size
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
            os.makedirs(self.directory, exist_ok=True)
        seg = WritableSegment(path, start, self.file_size, create=not exists)
        if not exists:
            self._dir_dirty = True
            self.created.append(path)
        self._retire()
        self.current = seg
        return seg

    def _retire(self) -> None:
        cur = self.current
        if cur is not None:
            if cur.dirty:
                self._to_sync.add(cur.path)
            cur.close(flush=False)
            self.current = None

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


def fsync_dir(path: str) -> None:
    """Make file creations in ``path`` (and of ``path`` itself in its parent) durable."""
    for p in (path, os.path.dirname(path.rstrip(os.sep))):
        try:
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
