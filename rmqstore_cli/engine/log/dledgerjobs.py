"""The DLedger entry walk of a whole log, in one process or split by data file over ``-j`` workers.

One walk (DLedgerMmapFileStore.recover's header rules) goes from file to file over a blank and carries the last
entry's index and term along: an entry must follow its predecessor's index and not lower its term. Everything
else an entry is checked against lies in its own file, so a file walked from its start *as if no entry came
before* gives the same entries as the walk from the file before, provided the first entry gets the same verdict
with the real predecessor as with none (:func:`first_verdict`: one kernel step each, here). Forked workers each
walk whole files so and turn their chunks into compact results (``file_part``); this process follows the log in
order: it takes a worker's result where the log enters a file at its start and the verdicts agree, and walks the
file itself otherwise (a resumed walk past damage, or an entry that breaks the chain at a file boundary), which
is the walk of one process there. Stops that are not the log's end go to the caller's ``on_stop`` (findings,
resume past damage), in order, as in one process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from rmqstore_cli.formats import fast

from .commitlog import CHUNK_RECORDS
from .dledger import EntryWalk, dledger_kernel, walk_entries

START = (0, 0, -1, -1)  # (file, position, last index, last term) of a walk from the start of the log


@dataclass
class FilePart:
    """One item ``file_part`` made in a worker from the entries of data file ``file`` (items come in log order)."""

    file: int
    item: object


@dataclass
class _FileEnd:
    walk: EntryWalk  # the file's walk from its start, its stop without the segment
    first_index: int | None


@dataclass
class LogWalk:
    """The whole walk: ``walk`` has the last stop and last entry, and the entries and blanks of the whole log."""

    walk: EntryWalk = field(default_factory=EntryWalk)
    first_index: int | None = None


def _final(stop) -> bool:
    return stop is None or stop.kind in (fast.STOP_ZERO, fast.STOP_BLANK)


def walk_log(cl, on_stop: Callable[[EntryWalk], tuple | None], result: LogWalk, *, jobs: int = 1,
             file_part: Callable | None = None, args: tuple = (), captured: "EntryCapture | None" = None) -> Iterator:
    """The entries of the log as :class:`~.dledger.EntryChunk` s (walked here) and :class:`FilePart` s (walked by
    a worker: ``file_part(chunks, *args)`` yields picklable items for one file's chunks), in log order.

    At a stop that does not end the log (not zeros, not the last blank) ``on_stop(walk)`` says where the walk goes
    on, a ``(file, position, last index, last term)`` (None: the log ends). ``result`` gets the whole walk.
    ``captured``: the per-file items were made along an earlier walk of the files (:class:`EntryCapture`), in
    place of the workers'."""
    segs = cl.segments.segments
    if captured is not None:
        yield from _split(segs, captured, on_stop, result)
        return
    if jobs <= 1 or file_part is None or len(segs) <= 1:
        yield from _serial(segs, on_stop, result)
        return
    from rmqstore_cli.formats.warmup import warm_up

    from ..parallel import stream_segments

    warm_up()  # numba imported and every kernel loaded once, before the fork, not in each worker
    stream = _Files(stream_segments(_file_items, len(segs), jobs, segs, file_part, args))
    try:
        yield from _split(segs, stream, on_stop, result)
    finally:
        stream.close()


def _serial(segs: list, on_stop, result: LogWalk) -> Iterator:
    resume = START
    totals = result.walk
    while True:
        walk = EntryWalk()
        for ec in walk_entries(segs, start_index=resume[0], start_position=resume[1], last_index=resume[2],
                               last_term=resume[3], result=walk):
            if result.first_index is None:
                result.first_index = int(ec.cols["index"][0])
            yield ec
        _add(totals, walk)
        if _final(walk.stop):
            return
        resume = on_stop(walk)
        if resume is None:
            return


def _add(totals: EntryWalk, walk: EntryWalk) -> None:
    totals.blanks += walk.blanks
    totals.entries += walk.entries
    totals.stop, totals.last_index, totals.last_term = walk.stop, walk.last_index, walk.last_term


def first_verdict(seg, last_index: int, last_term: int) -> tuple:
    """The kernel's verdict on the first entry of ``seg`` after the entry (``last_index``, ``last_term``)."""
    k = dledger_kernel()
    u8 = fast.kernel_view(seg.buffer() if seg.size else b"")
    cols = tuple(np.empty(1, np.int64) for _ in k.COLUMNS)
    return tuple(int(v) for v in k.walk_entries(u8, 0, int(seg.size), int(seg.start), int(last_index), int(last_term),
                                                1, cols))


def _split(segs: list, stream: "_Files", on_stop, result: LogWalk) -> Iterator:
    totals = result.walk
    f, pos, last, term = START
    while True:
        walk = EntryWalk()
        if f >= stream.next and pos == 0 and first_verdict(segs[f], last, term) == first_verdict(segs[f], -1, -1):
            stream.skip_to(f)
            end = None
            for item in stream.items():
                if isinstance(item, _FileEnd):
                    end = item
                else:
                    yield item
            walk = end.walk
            if walk.stop is not None and walk.stop.segment is None:
                walk.stop = dataclasses.replace(walk.stop, segment=segs[f])
            if walk.entries:
                if result.first_index is None:
                    result.first_index = end.first_index
            else:
                walk.last_index, walk.last_term = last, term
        else:  # the walk of one process, here, to the end of this file
            if f >= stream.next:
                stream.skip_to(f + 1)
            for ec in walk_entries(segs, start_index=f, start_position=pos, last_index=last, last_term=term,
                                   result=walk, end_index=f + 1):
                if result.first_index is None:
                    result.first_index = int(ec.cols["index"][0])
                yield ec
        _add(totals, walk)
        stop = walk.stop
        if stop is not None and stop.kind == fast.STOP_BLANK and f + 1 < len(segs):
            f, pos, last, term = f + 1, 0, walk.last_index, walk.last_term
            continue
        if _final(stop):
            return
        resume = on_stop(walk)
        if resume is None:
            return
        f, pos, last, term = resume


class _Files:
    """The workers' items, file by file in order."""

    def __init__(self, stream):
        self.stream = stream
        self.next = 0  # the file whose items come next

    def items(self) -> Iterator:
        """The next file's items, its :class:`_FileEnd` last."""
        for item in self.stream:
            yield item
            if isinstance(item, _FileEnd):
                self.next += 1
                return

    def skip_to(self, f: int) -> None:
        while self.next < f:
            for _ in self.items():
                pass

    def close(self) -> None:
        self.stream.close()


def _file_items(i: int, segs: list, file_part: Callable, args: tuple):
    """In a worker: file ``i`` walked from its start as if no entry came before, through ``file_part``."""
    walk = EntryWalk()
    first: list = []

    def chunks():
        for ec in walk_entries(segs, start_index=i, end_index=i + 1, result=walk):
            if not first:
                first.append(int(ec.cols["index"][0]))
            yield ec

    it = chunks()
    for item in file_part(it, *args):
        yield FilePart(i, item)
    for _ in it:  # whatever file_part left: the walk's end is wanted
        pass
    if walk.stop is not None:
        walk.stop = dataclasses.replace(walk.stop, segment=None)
    yield _FileEnd(walk, first[0] if first else None)


class EntryCapture:
    """The per-file items of :func:`walk_log` (those a worker makes) taken from another walk of the same files: verify
    -j 1 walks each data file alone from its start (the window walk's ``DLedgerCommitLog.scan``: the entries and the
    messages inside them in one compiled pass), which is the walk a worker makes of that file, so the entry checks
    need no walk of their own. ``part()`` makes an object with ``chunk(entry_chunk)`` and ``take()`` (the file's
    one item). Only a scan that walked one file from its start as if no entry came before, in chunks of the
    worker's size and to its end, gives a file's items; a file no such scan walked (a scan cut short by a damaged
    message, a walk resumed inside it) is walked here when its items are asked for. Read as :func:`_split` reads
    the workers' stream."""

    def __init__(self, segs: list, part: Callable):
        self.segs = segs
        self.part = part
        self.numbers = {id(s): i for i, s in enumerate(segs)}
        self.made: dict[int, list] = {}
        self.next = 0  # the file whose items come next

    def start(self, segments: list, start_index: int, start_position: int, last_index: int, end_index: int | None,
              chunk: int) -> "_FileCapture | None":
        """Called by a scan before it walks: what takes its entry chunks, or None when they are not a file's items."""
        last = len(segments) if end_index is None else min(end_index, len(segments))
        if start_position or last_index != -1 or chunk != CHUNK_RECORDS or last != start_index + 1:
            return None
        f = self.numbers.get(id(segments[start_index]))
        return None if f is None else _FileCapture(self, f)

    def items(self) -> Iterator:
        """The next file's items, its :class:`_FileEnd` last."""
        f = self.next
        made = self.made.pop(f, None)
        self.next += 1
        if made is None:
            made = _file_items(f, self.segs, _parts, (self.part,))
        yield from made

    def skip_to(self, f: int) -> None:
        while self.next < f:
            self.made.pop(self.next, None)
            self.next += 1

    def close(self) -> None:
        self.made.clear()


class _FileCapture:
    """One scan's entry chunks, kept as their file's items when the scan reaches the end of the file's entries."""

    def __init__(self, owner: EntryCapture, f: int):
        self.owner, self.f = owner, f
        self.part = owner.part()
        self.first: int | None = None

    def chunk(self, ec) -> None:
        if self.first is None:
            self.first = int(ec.cols["index"][0])
        self.part.chunk(ec)

    def done(self, walk: EntryWalk) -> None:
        end = dataclasses.replace(walk, blanks=list(walk.blanks))
        self.owner.made[self.f] = [FilePart(self.f, self.part.take()), _FileEnd(end, self.first)]


def _parts(chunks, part: Callable):
    """:func:`_file_items`'s ``file_part`` for an :class:`EntryCapture` ``part``."""
    p = part()
    for ec in chunks:
        p.chunk(ec)
    yield p.take()
