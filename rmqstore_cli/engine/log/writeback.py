"""Early write-back of what a write session has finished writing (Linux ``sync_file_range``).

A session that writes hundreds of MB through the page cache and syncs them at its end waits, in that
final ``fsync``/``msync``, for the disk to take every dirty page at once. Handing each finished range to
the kernel's write-back as soon as it is written (``SYNC_FILE_RANGE_WRITE``: the writes are started and
the call returns) lets the disk work while the session goes on, so the final sync finds little left.

Durability is unchanged: nothing here replaces the final flush, which still runs (and must succeed)
before success is reported. A failed or missing ``sync_file_range`` only leaves the work to that flush.
"""

from __future__ import annotations

import mmap

_START_WRITE = 2  # SYNC_FILE_RANGE_WRITE
_PAGE = mmap.PAGESIZE


def _sync_file_range():
    """libc's ``sync_file_range(int, off64_t, off64_t, unsigned)``, or None where there is none."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


class EarlyWriteback:
    """Starts the write-back of byte ranges that will not change again.

    ``written(fd, start, end)``: the bytes ``[start, end)`` of ``fd`` are final; the whole pages among them are
    handed over at once (a page the next write completes stays dirty until then: written once, not twice).
    ``every(nbytes, ranges)``: after about ``period`` bytes of such writes, also the ranges ``ranges()`` returns
    (``(fd, start, end)``, e.g. :meth:`Dispatcher.written_ranges`: queue units and index entries)."""

    def __init__(self, period: int = 16 << 20, call=None):
        self.call = _sync_file_range() if call is None else call
        self.period = period
        self.since = 0

    @property
    def enabled(self) -> bool:
        return bool(self.call)

    def written(self, fd: int, start: int, end: int) -> None:
        if not self.call:
            return
        lo = start // _PAGE * _PAGE
        hi = end // _PAGE * _PAGE
        if hi > lo:
            self.call(fd, lo, hi - lo, _START_WRITE)  # a failure only leaves it to the final flush
        self.since += end - start

    def every(self, ranges) -> None:
        if not self.call or self.since < self.period:
            return
        self.since = 0
        for fd, start, end in ranges():
            lo, hi = start // _PAGE * _PAGE, end // _PAGE * _PAGE
            if hi > lo:
                self.call(fd, lo, hi - lo, _START_WRITE)


_MADV_POPULATE_WRITE = 23  # Linux 5.14+ (mmap.MADV_POPULATE_WRITE where Python defines it)
POPULATE_MIN = 64 << 10  # below this, the page faults of the writes themselves cost less than a call
_populate = [True]  # False once the kernel has refused the advice (an older kernel): not asked again


def populate_write(mm, start: int, n: int) -> None:
    """Fault in, writable, the pages of ``mm[start:start + n]`` that are about to be written, in one call
    (``MADV_POPULATE_WRITE``), instead of one page fault per page during the writes. In a fresh file (an
    index file's entries, 280 MB for 7 M messages with two keys each) the faults' kernel time was as much as
    the compiled pass itself. The bytes written are unchanged; a kernel without the advice, or one that
    refuses it, leaves the faults to the writes."""
    if n < POPULATE_MIN or not _populate[0]:
        return
    lo = start // _PAGE * _PAGE
    try:
        mm.madvise(getattr(mmap, "MADV_POPULATE_WRITE", _MADV_POPULATE_WRITE), lo, min(start + n, len(mm)) - lo)
    except (OSError, ValueError, AttributeError):
        _populate[0] = False


class PopulateAhead:
    """``populate_write`` run by a thread ahead of the writes, on a core the command leaves idle (``recover -j``'s
    re-dispatch from the plan's columns: no worker runs then). The writer asks for each range it is about to write
    (:meth:`before_write`); the thread has usually faulted it in already and goes on with the next ``window``
    bytes while the writer's compiled pass runs. Timing never changes the bytes: a page the thread has not reached
    is faulted in by the write itself, and the advice does not change a byte of the file (pages past the last
    write, up to ``window`` bytes, are faulted in and so written back unchanged).

    The thread calls libc's ``madvise`` through ctypes, which lets go of the interpreter lock (``mmap.madvise``
    holds it). :meth:`stop` before the mapping is closed."""

    def __init__(self, address: int, size: int, window: int = 16 << 20):
        import ctypes
        import queue
        import threading

        fn = ctypes.CDLL(None, use_errno=True).madvise
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        fn.restype = ctypes.c_int
        self._madvise = fn
        self.address, self.size, self.window = address, size, window
        self.asked = 0  # the thread has been asked for [.., asked)
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="rmqstore-populate", daemon=True)
        self._thread.start()

    def before_write(self, start: int, n: int) -> None:
        """[start, start + n) is written next: the part the thread was not asked for is populated here, and the
        thread is asked for the next window past it."""
        end = min(start + n, self.size)
        if end > self.asked:
            populate_from = max(start, self.asked)
            self._advise(populate_from, end - populate_from)
            self.asked = end
        ahead = min(self.size, end + self.window)
        if ahead > self.asked and ahead - self.asked >= self.window // 2:
            self._todo.put((self.asked, ahead))
            self.asked = ahead

    def _advise(self, start: int, n: int) -> None:
        if n < POPULATE_MIN or not _populate[0]:
            return
        lo = start // _PAGE * _PAGE
        if self._madvise(self.address + lo, start + n - lo, _MADV_POPULATE_WRITE) != 0:
            _populate[0] = False  # an older kernel: the writes fault their pages in themselves

    def _run(self) -> None:
        while True:
            job = self._todo.get()
            if job is None:
                return
            try:
                self._advise(job[0], job[1] - job[0])
            except Exception:  # noqa: BLE001 - an aid only: the writes fault their pages in themselves
                _populate[0] = False

    def stop(self) -> None:
        """Wait for the thread to finish what it was asked (the mapping must stay until then)."""
        self._todo.put(None)
        self._thread.join()
