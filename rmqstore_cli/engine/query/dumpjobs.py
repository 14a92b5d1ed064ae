"""``dump commitlog -j``: the records of a listing rendered by worker processes, segment by segment.

Records never cross a commitlog segment, so forked workers each walk whole segments and render the records
the listing keeps (its offsets, topic, queue and store-time bounds) into pieces: JSON Lines text, or the
record batches of a file export. Each worker hands its pieces over a bounded queue
(:func:`..parallel.stream_segments`: a few pieces per worker, never a whole segment's text); this process
takes them in log order and only writes them out. What needs the whole walk stays here: ``--limit`` (the
piece where it is reached is cut at a record boundary) and where the log ends, decided as one walk decides
it (a BLANK marker moves on to the next segment; anything else ends the log, and the segments after it are
not listed). The output is the bytes ``-j 1`` writes; only the time changes.

Text does not cross processes through the queue: each worker owns :data:`SLOTS_PER_WORKER` shared-memory slots
(anonymous shared mappings made before the fork); it copies a piece into a free slot of its own and sends the
slot's number, this process writes the slot out and hands the slot back. A piece larger than a slot (one huge
record) goes through the queue as bytes.
"""

from __future__ import annotations

import dataclasses
import mmap
from typing import Callable, Iterator

import numpy as np

from rmqstore_cli.formats import fast

from ..log.commitlog import RecordFilter, ScanResult


def splits(cl) -> bool:
    """Whether the listing can be cut at segment boundaries (not a DLedger log: its entries carry state across
    files, and its listing goes on past a damaged message)."""
    return not getattr(cl, "is_dledger", False) and len(cl.segments.segments) > 1


SLOT_BYTES = 8 << 20  # text of one piece in shared memory (JSON pieces are cut to this: encode_blocks' block_bytes)
SLOTS_PER_WORKER = 2  # a worker waits for one of its slots when this process has not written them out yet


class _Slots:
    """Shared-memory slots, :data:`SLOTS_PER_WORKER` per worker, and per worker a queue of its free ones."""

    def __init__(self, workers: int):
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.workers = workers
        self.maps = [mmap.mmap(-1, SLOT_BYTES) for _ in range(workers * SLOTS_PER_WORKER)]
        self.free = [ctx.SimpleQueue() for _ in range(workers)]
        for k in range(workers):
            for s in range(SLOTS_PER_WORKER):
                self.free[k].put(k * SLOTS_PER_WORKER + s)

    def put(self, k: int, piece) -> int | None:
        """In worker ``k``: copy ``piece`` into one of its free slots; its number, or None when it does not fit."""
        size = len(piece) if not hasattr(piece, "nbytes") else piece.nbytes
        if size > SLOT_BYTES:
            return None
        slot = self.free[k].get()
        self.maps[slot][:size] = piece
        return slot

    def view(self, slot: int, size: int) -> memoryview:
        return memoryview(self.maps[slot])[:size]

    def release(self, slot: int) -> None:
        self.free[slot // SLOTS_PER_WORKER].put(slot)

    def close(self) -> None:
        for q in self.free:
            q.close()


def selected_pieces(cl, sel: RecordFilter, render: Callable, cut: Callable, jobs: int, *, check_crc: bool = False,
                    result: ScanResult | None = None, text: bool = False) -> Iterator[tuple[object, int, int]]:
    """What ``render(chunk, idx)`` yields (pieces and their record counts) for every chunk of
    ``cl.selected(sel, check_crc=check_crc, result=result)``, in log order, computed by ``jobs`` workers: yields
    (piece, records in it, log bytes walked for it). ``cut(piece, k)`` keeps a piece's first ``k`` records
    (``--limit``). ``result`` ends as the one-process walk leaves it where the output depends on it: its stop
    (None when the selection ended first), and the records and BLANKs walked up to a stop. With ``text`` the
    pieces are bytes-like and travel through shared memory: one yielded is valid until the next is asked for."""
    from rmqstore_cli.formats.warmup import warm_up

    from ..parallel import stream_segments

    result = result if result is not None else ScanResult()
    if sel.since is not None or sel.until is not None:
        sel.start, sel.end, any_ = cl.time_window(sel.since, sel.until, sel.start, sel.end)
        if not any_:
            return
    left = sel.limit
    if left == 0:
        return
    segs = cl.segments.segments
    first = cl.start_index(sel.start)
    bounds = dict(start=sel.start, end=sel.end, topic=sel.topic, queue=sel.queue, since=sel.since, until=sel.until)
    warm_up()  # numba imported and every kernel loaded once, before the fork, not in each worker
    n_segs = len(segs) - first
    slots = _Slots(min(jobs, n_segs)) if text and jobs > 1 and n_segs > 1 else None
    parts = stream_segments(_segment_pieces, n_segs, jobs, first, cl, bounds, render, check_crc, slots)
    try:
        i = first
        for item in parts:
            if item[0] == _END:
                _, done, stop, blanks, records, nbytes = item
                result.blanks += blanks
                result.records += records
                result.bytes += nbytes
                if done:
                    return  # --to (or --until) reached in this segment
                if stop.kind != fast.STOP_BLANK or i + 1 == len(segs):  # the log ends in this segment
                    result.stop = dataclasses.replace(stop, segment=segs[i])
                    return
                i += 1
                continue
            slot = None
            if item[0] == _SLOT:
                _, slot, size, n, walked = item
                piece = slots.view(slot, size)
            else:
                _, piece, n, walked = item
            if left is not None and n >= left:
                yield cut(piece, left) if n > left else piece, left, walked
                return  # --limit reached: the walk ends here, as one walk's does (no stop)
            if left is not None:
                left -= n
            yield piece, n, walked
            if slot is not None:
                del piece
                slots.release(slot)  # written out: the worker may fill it again
    finally:
        parts.close()
        if slots is not None:
            slots.close()


_PIECE, _END, _SLOT = 0, 1, 2


def _segment_pieces(k: int, first: int, cl, bounds: dict, render: Callable, check_crc: bool, slots: _Slots | None):
    """In a worker: segment ``first + k``'s pieces, then (_END, selection done, where its walk stopped, BLANKs,
    records and bytes walked). With ``slots``, a piece goes as (_SLOT, slot, size, records, walked): stream_segments
    gives worker ``w`` the segments w, w + workers, ..., so this is worker ``k % workers``."""

    def send(piece, n, walked):
        slot = None if slots is None or piece is None else slots.put(k % slots.workers, piece)
        if slot is None:
            return _PIECE, (bytes(piece) if slots is not None and piece is not None else piece), n, walked
        return _SLOT, slot, len(piece) if not hasattr(piece, "nbytes") else piece.nbytes, n, walked

    res = ScanResult()
    sel = RecordFilter(**bounds)  # --limit is counted by the consumer, across segments
    done = False
    i = first + k
    for chunk in cl.scan(start_index=i, end_index=i + 1, check_crc=check_crc, result=res,
                         stop_at_invalid=cl.LISTING_STOPS_AT_INVALID):
        idx, done = sel.pick(chunk)
        h = chunk.headers
        walked = int(h.totalSize[: int(idx[-1]) + 1].sum()) if len(idx) else int(h.totalSize.sum())
        pending = None
        if len(idx):
            for piece, n in render(chunk, idx):
                if pending is not None:
                    yield send(pending[0], pending[1], 0)
                pending = piece, n
        if pending is not None:
            yield send(pending[0], pending[1], walked)
        elif walked:
            yield _PIECE, None, 0, walked  # progress only
        if done:
            break
    stop = None if done or res.stop is None else dataclasses.replace(res.stop, segment=None)
    yield _END, done, stop, res.blanks, res.records, res.bytes


def json_render(body: str) -> Callable:
    """Chunk -> JSON Lines pieces, as ``CommitLog.records_json`` renders them (``--body`` mode ``body``)."""
    from rmqstore_cli.formats.jsonl import encode_blocks

    def render(chunk, idx):
        whole = None if len(idx) == len(chunk.headers) else idx
        yield from encode_blocks(chunk.buf, chunk.headers, chunk.segment.start, body, whole, block_bytes=SLOT_BYTES,
                                 as_array=True)

    return render


def cut_lines(text, k: int):
    """The first ``k`` lines of JSON Lines text (a raw newline only ends a line: JSON escapes the others)."""
    ends = np.flatnonzero(np.frombuffer(text, np.uint8) == 10)
    return text[: int(ends[k - 1]) + 1]


def json_pieces(cl, sel: RecordFilter, body: str, jobs: int, result: ScanResult) -> Iterator[tuple[object, int, int]]:
    """``CommitLog.records_json`` (the same selection, text and stop), by ``jobs`` workers, or walked here when
    ``jobs`` is 1 or the log does not split: (text, records in it, log bytes walked for it). The text is bytes-like
    (bytes, a memoryview or a uint8 array), valid until the next piece is asked for."""
    render = json_render(body)
    if jobs > 1 and splits(cl):
        pieces = selected_pieces(cl, sel, render, cut_lines, jobs, result=result, text=True)
    else:
        pieces = _serial_pieces(cl, sel, render, result)
    for text, n, walked in pieces:
        yield (b"" if text is None else text), n, walked


def _serial_pieces(cl, sel: RecordFilter, render: Callable, result: ScanResult):
    """:func:`selected_pieces` in this process: one walk (``CommitLog.selected``)."""
    for chunk, idx, _ in cl.selected(sel, result=result):
        h = chunk.headers
        walked = int(h.totalSize[: int(idx[-1]) + 1].sum()) if len(idx) else int(h.totalSize.sum())
        if not len(idx):
            yield None, 0, walked
            continue
        pending = None
        for piece in render(chunk, idx):
            if pending is not None:
                yield pending[0], pending[1], 0
            pending = piece
        yield pending[0], pending[1], walked
