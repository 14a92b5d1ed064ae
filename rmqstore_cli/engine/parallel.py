"""``-j``: run per-segment work in forked worker processes, results merged in segment order.

Records never cross a commitlog segment (§2.6), so a contiguous range of segments is an
independent unit of work; two processes on two files scale ~1.9x on these machines
(NOTES-performance), while sharing one file's work scales much less. Workers are forked, so
they inherit the opened store (read-only mappings) and nothing has to be re-opened.
"""

from __future__ import annotations

import os
import weakref
from typing import Callable, Iterator, Sequence

_TASK: tuple | None = None  # (fn, args) for the forked workers


def split(n: int, parts: int) -> list[range]:
    """``range(n)`` cut into at most ``parts`` contiguous, near-equal ranges (in order)."""
    parts = max(1, min(parts, n))
    bounds = [n * k // parts for k in range(parts + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _fork_context():
    """multiprocessing's fork context, imported when a command first forks (a -j 1 start does not load it)."""
    import multiprocessing

    return multiprocessing.get_context("fork")


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def die_with_parent() -> None:
    """Called first in every forked worker: the worker gets SIGTERM when the process that forked it ends, even
    by a signal that runs no clean-up (kill, an OOM kill), instead of running on orphaned (Linux prctl
    PR_SET_PDEATHSIG; elsewhere nothing is done)."""
    import signal

    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request was in place
        os._exit(1)


def _call(part: range):
    fn, args = _TASK
    return fn(part, *args)


def map_ranges(fn: Callable, ranges: Sequence[range], jobs: int, *args, on_result: Callable | None = None,
               keep: bool = True) -> list:
    """[fn(r, *args) for r in ranges], computed by ``jobs`` forked processes, in order.

    ``on_result(range, result)`` is called in this process as each result arrives (in order);
    with ``keep=False`` results are not collected (streaming: memory stays ~``jobs`` results).
    """
    global _TASK
    if jobs <= 1 or len(ranges) <= 1:
        out = []
        for r in ranges:
            res = fn(r, *args)
            if keep:
                out.append(res)
            if on_result:
                on_result(r, res)
        return out
    _TASK = (fn, args)
    try:
        ctx = _fork_context()
        with ctx.Pool(min(jobs, len(ranges)), initializer=die_with_parent) as pool:
            out = []
            for r, res in zip(ranges, pool.imap(_call, ranges)):
                if keep:
                    out.append(res)
                if on_result:
                    on_result(r, res)
            return out
    finally:
        _TASK = None


AHEAD = 2  # items a worker of stream_segments may have made that the consumer has not taken yet
SPILL_AHEAD = 256  # the same with ``spill``: items wait in a file, the queue holds only where


def stream_segments(items: Callable, n: int, jobs: int, *args, done: Callable[[int], None] | None = None,
                    exchange=None, spill: str | None = None, balance: bool = False) -> Iterator:
    """Everything ``items(i, *args)`` yields for segments ``i = 0 .. n-1``, in that order, computed by ``jobs``
    forked processes: worker *k* takes segments k, k+jobs, ... and hands each item over a queue that holds at
    most :data:`AHEAD` of them, so a 1 GiB segment's results never sit in memory whole, here or in a worker.
    ``done(i)`` is called after segment *i*'s last item. Closing the generator early stops the workers.

    The workers start at once, before the first item is asked for: the caller can prepare what consumes
    the items (e.g. verify's per-file checks that need no record) while they walk.

    ``exchange`` (at least two workers): work the workers share out before their segments, in the same
    processes (one fork each, not a round of its own). Worker *k* first sends ``exchange.part(k, workers)``
    (picklable); this process gets every worker's part, in worker order, as ``exchange.combine(parts)``
    before this call returns, and sends what that returns to every worker, where
    ``exchange.accept_later(receive)`` gets a callable that returns it (``receive(False)`` raises queue.Empty
    while it has not come): a worker may start its first segment before the other parts are done.

    ``spill`` (a directory): the items are pickled into one file per segment there and only their place goes
    through the queue, which then holds up to :data:`SPILL_AHEAD` of them. With a queue of :data:`AHEAD` items,
    worker *k* + 1 stops two items into its segment until this process has taken all of segment *k*: the workers
    take turns instead of walking at the same time whenever this process is slower than one worker. Spilled,
    each runs up to SPILL_AHEAD items ahead, their bytes in the page cache, not in any process's memory; a
    segment's file is removed once its items are taken.

    ``balance``: instead of k, k+jobs, ..., a worker that is through its segment takes the next segment nobody has
    taken yet, so that a worker whose segments went faster (or whose core ran faster: on a shared host two vCPUs
    differ by a quarter from minute to minute) does not wait idle while the other walks its last ones alone. For
    ``items`` that keep nothing from one segment to the next. With an ``exchange`` a worker sends its part first,
    then takes segments."""
    if jobs <= 1 or n <= 1:
        if exchange is not None:
            raise ValueError("an exchange needs at least two workers")
        return _serial(items, n, args, done)
    ctx = _fork_context()
    workers = min(jobs, n)
    queues = [ctx.Queue(maxsize=SPILL_AHEAD if spill else AHEAD) for _ in range(workers)]
    inboxes = [ctx.Queue(maxsize=1) for _ in range(workers)] if exchange is not None else [None] * workers
    owners = None
    if balance:
        owners = _Owners(ctx, n)
    procs = [ctx.Process(target=_stream_worker, args=(items, owners.taker(k) if owners else range(k, n, workers), args,
                                                      queues[k], exchange, k, workers, inboxes[k], spill), daemon=True)
             for k in range(workers)]
    for p in procs:
        p.start()
    if exchange is not None:
        try:
            parts = []
            for q, proc in zip(queues, procs):
                got = _next_item(q, proc)
                if isinstance(got, _WorkerError):
                    raise got.error
                parts.append(got.value)
            shared = exchange.combine(parts)
            for box in inboxes:
                box.put(shared)
        except BaseException:
            _stop(procs)
            raise
    gen = _consume(queues, procs, n, done, spill, owners)
    weakref.finalize(gen, _stop, procs)  # a stream dropped without being read stops its workers too
    return gen


def spill_dir(workers: int, segment_bytes: int, near: str | None = None, prefix: str = ".rmqstore-spill-") -> str | None:
    """A new directory for ``stream_segments(spill=...)``, on a disk with room for what ``workers`` may spill at
    once (each up to two segments' files in flight: at most ``2 * segment_bytes`` each, a bound the items of a
    segment stay under), tried in the system's temporary folder and then beside ``near``; None when neither has
    that much free: the items then go through the queue (correct, but the workers take turns). An incident disk
    that is full must not fail a command that only wanted to go faster."""
    import tempfile

    need = workers * 2 * segment_bytes
    for place in (tempfile.gettempdir(), near):
        if not place:
            continue
        try:
            st = os.statvfs(place)
            if st.f_bavail * st.f_frsize < need:
                continue
            return tempfile.mkdtemp(prefix=prefix, dir=place)
        except OSError:
            continue
    return None


def _serial(items: Callable, n: int, args: tuple, done) -> Iterator:
    for i in range(n):
        yield from items(i, *args)
        if done:
            done(i)


class _Owners:
    """Which worker took each segment (``balance`` in :func:`stream_segments`): the next segment to take and, per
    segment, the worker that took it (-1 until then), in memory shared with the forked workers."""

    def __init__(self, ctx, n: int):
        self.n = n
        self.next = ctx.Value("q", 0)  # with its lock: two workers never take the same segment
        self.owner = ctx.RawArray("i", [-1] * n)

    def taker(self, k: int) -> Iterator[int]:
        """The segments worker ``k`` takes, in increasing order, one when it asks for it."""
        return _Taker(self, k)

    def of(self, i: int, procs: list) -> int:
        """The worker that took segment ``i``, once one has (at once, but for the moment it takes to take it)."""
        import time

        while True:
            k = self.owner[i]
            if k >= 0:
                return k
            if not any(p.is_alive() for p in procs):
                raise RuntimeError("the worker processes ended before every segment was taken")
            time.sleep(0.0005)


class _Taker:
    """Iterates the segments one worker takes from :class:`_Owners` (picklable with it, inherited by the fork)."""

    def __init__(self, owners: _Owners, k: int):
        self.owners, self.k = owners, k

    def __iter__(self):
        o = self.owners
        while True:
            with o.next.get_lock():
                i = o.next.value
                if i >= o.n:
                    return
                o.next.value = i + 1
                o.owner[i] = self.k
            yield i


def _consume(queues: list, procs: list, n: int, done, spill: str | None = None, owners: _Owners | None = None) -> Iterator:
    workers = len(procs)
    try:
        for i in range(n):
            fd = None
            k = owners.of(i, procs) if owners is not None else i % workers
            try:
                while True:
                    item = _next_item(queues[k], procs[k])
                    if isinstance(item, _SegmentDone):
                        break
                    if isinstance(item, _WorkerError):
                        raise item.error
                    if isinstance(item, _Spilled):
                        if fd is None:
                            fd = os.open(_spill_path(spill, i), os.O_RDONLY)
                        item = item.load(fd)
                    yield item
                    del item
            finally:
                if fd is not None:
                    os.close(fd)
                if spill:
                    _unlink(_spill_path(spill, i))
            if done:
                done(i)
    finally:
        _stop(procs)
        if spill:
            for i in range(n):
                _unlink(_spill_path(spill, i))


def _spill_path(spill: str, i: int) -> str:
    return os.path.join(spill, f"segment-{i}.items")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Spilled:
    """Where a spilled item is in its segment's file (see ``spill`` in :func:`stream_segments`)."""

    __slots__ = ("offset", "size")

    def __init__(self, offset: int, size: int):
        self.offset, self.size = offset, size

    def __getstate__(self):
        return (self.offset, self.size)

    def __setstate__(self, state) -> None:
        self.offset, self.size = state

    def load(self, fd: int):
        import pickle

        data = os.pread(fd, self.size, self.offset)
        if len(data) != self.size:
            raise RuntimeError("a spilled item was cut short")
        return pickle.loads(data)


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
        p.join()


class _SegmentDone:
    """What a worker sends after a segment's last item (a class of its own: a task may yield None)."""


_SEGMENT_DONE = _SegmentDone()


class _WorkerError:
    """An exception raised in a worker, sent to the consumer (as its text when it does not pickle)."""

    def __init__(self, error: BaseException):
        import pickle

        try:
            pickle.dumps(error)
        except Exception:  # noqa: BLE001 - anything unpicklable is sent as its text
            error = RuntimeError(f"{type(error).__name__}: {error}")
        self.error = error


class _Part:
    """A worker's share of an exchange (see :func:`stream_segments`), as it travels to the consumer."""

    def __init__(self, value):
        self.value = value


def _stream_worker(items: Callable, segments: range, args: tuple, out, exchange=None, k: int = 0, workers: int = 1,
                   inbox=None, spill: str | None = None) -> None:
    die_with_parent()
    try:
        if exchange is not None:
            out.put(_Part(exchange.part(k, workers)))
            exchange.accept_later(inbox.get)  # get(block); the consumer stops this worker if it cannot send
        for i in segments:
            if spill:
                _spill_segment(items(i, *args), _spill_path(spill, i), out)
            else:
                for item in items(i, *args):
                    out.put(item)
                    del item
            out.put(_SEGMENT_DONE)
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
        out.put(_WorkerError(e))
    out.close()
    out.join_thread()


def _spill_segment(made: Iterator, path: str, out) -> None:
    import pickle

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        at = 0
        for item in made:
            data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
            del item
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            out.put(_Spilled(at, len(data)))
            at += len(data)
    finally:
        os.close(fd)


def _next_item(q, proc):
    import queue

    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            if not proc.is_alive():
                try:
                    return q.get(timeout=1.0)
                except queue.Empty:
                    raise RuntimeError(f"worker process ended (exit code {proc.exitcode})") from None


class Background:
    """``fn(*args)`` computed in one forked process while this one goes on; :meth:`result` waits for it (and raises
    what it raised). For work that needs nothing this process computes meanwhile, so a core left idle takes it."""

    def __init__(self, fn: Callable, *args):
        ctx = _fork_context()
        self._queue = ctx.Queue(maxsize=1)
        self._proc = ctx.Process(target=_background, args=(fn, args, self._queue), daemon=True)
        self._proc.start()
        weakref.finalize(self, _stop, [self._proc])

    def result(self):
        try:
            got = _next_item(self._queue, self._proc)
            self._proc.join(timeout=5)  # it has sent its result: let it leave on its own rather than kill it mid-exit
        finally:
            _stop([self._proc])
        if isinstance(got, _WorkerError):
            raise got.error
        return got


def _background(fn: Callable, args: tuple, out) -> None:
    die_with_parent()
    try:
        out.put(fn(*args))
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
        out.put(_WorkerError(e))
    out.close()
    out.join_thread()
