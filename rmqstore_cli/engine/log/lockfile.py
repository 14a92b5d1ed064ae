"""The store's ``lock`` and ``abort`` files for a write session (the broker's start/shutdown, §12).

``StoreLock`` takes the same lock the broker takes: an exclusive POSIX record lock on byte 0
of ``lock`` (``fcntl.lockf``, never ``flock``: Linux keeps the two apart, so a broker would not
see a flock).  POSIX record locks belong to the process and are dropped when *any* descriptor
of the file is closed, so the session keeps its one descriptor open and nothing else in the
process may open ``lock`` while it is held.

``abort`` marks a store that is open for writing: created after the lock is taken, removed
only by a clean close, so a crashed session leaves it behind and the next opener knows to
recover (§12.1).
"""

from __future__ import annotations

import errno
import fcntl
import os

from ..errors import StoreInUseError, UsageError
from .mappedfile import fsync_path

LOCK_CONTENT = b"lock"


def refuse_symlinks(root: str) -> None:
    """Writers never follow a symbolic link inside the store: it could point anywhere (another store,
    a system file). Every write session starts here, so one walk covers append and every repair."""
    if not os.path.isdir(root):
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                raise UsageError(f"{p} is a symbolic link; rmqstore does not write through links inside a store "
                                 "(replace it with the real file or directory, or give the real path)")


class StoreLock:
    """Exclusive, non-blocking record lock on byte 0 of ``<root>/lock`` (FileChannel.tryLock(0, 1))."""

    def __init__(self, root: str):
        self.root = root
        self.path = os.path.join(root, "lock")
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def acquire(self) -> "StoreLock":
        if self.fd is not None:
            return self
        refuse_symlinks(self.root)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UsageError(f"cannot open {self.path}: {e.strerror}") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EACCES, errno.EAGAIN):
                raise StoreInUseError(f"store {self.root} is in use: its lock file is held by another process "
                                      "(a running broker?)") from None
            raise UsageError(f"cannot lock {self.path}: {e.strerror}") from None
        # The broker writes "lock" at offset 0; rewrite only if different so an unchanged
        # store keeps its file times.
        if os.pread(fd, len(LOCK_CONTENT), 0) != LOCK_CONTENT:
            os.pwrite(fd, LOCK_CONTENT, 0)
            os.fsync(fd)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)
        finally:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def abort_path(root: str) -> str:
    return os.path.join(root, "abort")


def abort_exists(root: str) -> bool:
    return os.path.exists(abort_path(root))


def create_abort(root: str) -> None:
    """Mark the store as open for writing (the broker creates ``abort`` in ``start()``)."""
    fd = os.open(abort_path(root), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_path(root, directory=True)


def remove_abort(root: str) -> None:
    """Clean shutdown: everything is written and dispatched, so ``abort`` goes."""
    try:
        os.unlink(abort_path(root))
    except FileNotFoundError:
        return
    fsync_path(root, directory=True)


class WriteSession:
    """Lock + abort for the duration of a write: refuses a store that a broker holds (exit 4)
    or that was not shut down cleanly (``abort`` present: recovery must run first)."""

    def __init__(self, root: str, *, allow_abort: bool = False):
        self.root = root
        self.lock = StoreLock(root)
        self.allow_abort = allow_abort
        self.found_abort = False
        self.active = False

    def begin(self) -> "WriteSession":
        self.lock.acquire()
        try:
            self.found_abort = abort_exists(self.root)
            if self.found_abort and not self.allow_abort:
                from ..errors import StoreCorruptError

                raise StoreCorruptError(f"store {self.root} was not shut down cleanly (abort file present); "
                                        "run recovery before appending")
            create_abort(self.root)
        except BaseException:
            self.lock.release()
            raise
        self.active = True
        return self

    def end(self, clean: bool = True) -> None:
        """Release the lock; ``abort`` is removed only when ``clean`` (everything flushed and dispatched)."""
        if not self.active:
            return
        try:
            if clean:
                remove_abort(self.root)
        finally:
            self.active = False
            self.lock.release()
