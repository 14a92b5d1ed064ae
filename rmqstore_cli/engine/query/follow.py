"""Following a live commitlog (``dump commitlog --follow``): ``tail -f`` for a store.

Read-only and lock-free: the broker (or ``rmqstore append``) keeps writing while this reads the
same files through read-only shared mappings, so new bytes appear in place. A record is passed on
only once it is whole and valid (TOTALSIZE, lengths, body CRC, as the broker's own check); a
record still being copied in fails that check and is read again at the next poll. A BLANK marker
moves to the next segment as soon as that file exists (the broker creates it before writing its
first record), so segment rolls are followed.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterator


import numpy as np

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.message import decode_message

from ..log.commitlog import Chunk, CommitLog, RecordFilter
from ..log.segments import Segment, segment_name

POLL_SECONDS = 0.1
# Records decoded per step: following from an early offset of a broker's 1 GiB segment of small
# messages would otherwise decode millions of records at once.
FOLLOW_CHUNK = 8192


class Follower:
    """Mirrors the broker's reput loop from the reader's side: one position, advanced record by
    record as data is confirmed, across segment rolls."""

    def __init__(self, commitlog: CommitLog, start: int | None = None, poll: float = POLL_SECONDS):
        self.commitlog = commitlog
        self.file_size = commitlog.segments.file_size
        self.poll = poll
        if start is None:
            res = commitlog.find_end(check_crc=False)
            start = res.stop.offset if res.stop else commitlog.min_offset
            if res.stop is not None and res.stop.kind == fast.STOP_BLANK:
                start = res.stop.segment.start + self.file_size  # the log goes on in the next file
        self.offset = start
        self._seg: Segment | None = None

    def _segment(self) -> Segment | None:
        base = self.offset - self.offset % self.file_size
        seg = self._seg
        if seg is not None and seg.start == base:
            size = _size(seg.path)
            if size == seg.size:
                return seg
            seg.close()  # the file grew (a writer that does not pre-allocate): map it again
        path = os.path.join(self.commitlog.directory, segment_name(base))
        size = _size(path)
        if size is None:
            self._seg = None
            return None
        self._seg = Segment(path, segment_name(base), base, size)
        return self._seg

    def chunks(self, stop: Callable[[], bool] = lambda: False) -> Iterator[Chunk]:
        """Chunks of new valid records, forever (until ``stop()`` is true or the caller stops)."""
        magics = self.commitlog.magics(False)
        while not stop():
            seg = self._segment()
            if seg is None or seg.size == 0:
                time.sleep(self.poll)
                continue
            buf = seg.buffer()
            pos = self.offset - seg.start
            w = fast.walk(buf, pos, seg.size, magics, max_records=FOLLOW_CHUNK)
            if len(w.offsets):
                u8 = fast.as_u8(buf)
                h = fast.decode_headers(buf, w.offsets, u8)
                self.commitlog.validate(buf, u8, h, True)
                n = fast.first_invalid(h)
                if n:
                    good = h.take(n) if n < len(h) else h
                    self.offset = seg.start + int(good.offsets[-1]) + int(good.totalSize[-1])
                    yield Chunk(seg, buf, good, True)
                    continue
            if w.kind == fast.STOP_BLANK and w.stop == pos and not len(w.offsets):
                nxt = os.path.join(self.commitlog.directory, segment_name(seg.start + self.file_size))
                if os.path.exists(nxt):
                    self.offset = seg.start + self.file_size
                    seg.close()
                    self._seg = None
                    continue
            time.sleep(self.poll)  # nothing new, or a record still being written

    def selected(self, sel: RecordFilter) -> Iterator[tuple[Chunk, np.ndarray]]:
        """New chunks with the indexes of the records ``sel`` keeps; ends when its limit is reached."""
        for chunk in self.chunks():
            idx, done = sel.pick(chunk)  # done: the limit is reached (--follow takes no end offset)
            if len(idx):
                yield chunk, idx
            if done:
                return

    def records_json(self, sel: RecordFilter, body: str) -> Iterator[bytes]:
        """JSON Lines of new records, exactly as ``dump commitlog --json`` renders them."""
        from rmqstore_cli.formats.jsonl import encode_records

        for chunk, idx in self.selected(sel):
            h = chunk.headers
            yield encode_records(chunk.buf, h, chunk.segment.start, body, None if len(idx) == len(h) else idx)

    def records(self, sel: RecordFilter, with_body: bool) -> Iterator[list[dict]]:
        """Decoded new records, a list per chunk."""
        for chunk, idx in self.selected(sel):
            out = []
            for off in chunk.headers.offsets[idx].tolist():
                m = decode_message(chunk.buf, off, with_body=with_body)
                m["offset"] = chunk.segment.start + off
                out.append(m)
            yield out

    def close(self) -> None:
        if self._seg is not None:
            self._seg.close()


def _size(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


__all__ = ["Follower"]
