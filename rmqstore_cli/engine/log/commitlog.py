"""The commitlog read side (the broker's CommitLog + checkMessageAndReturnSize, §13.3).

A scan walks segments in order, validates records in compiled chunks, and stops exactly
where the broker's recovery walk would: at the first record that fails, or at the end
of data (zeros / torn tail / garbage). BLANK markers move the walk to the next segment.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.fast import Headers
from rmqstore_cli.formats.message import RecordError, decode_message
from rmqstore_cli.formats.records import MAGIC_V1, MAGIC_V2, MIN_MESSAGE_SIZE

from ..config.storeconfig import StoreConfig
from .segments import Segment, SegmentQueue, is_kept
from .storetime import commitlog_offset_at

CHUNK_RECORDS = 8192  # bounded memory per step; ~4K-16K records was fastest in NOTES-performance


@dataclass
class Chunk:
    """Consecutive valid records of one segment, as header columns."""

    segment: Segment
    buf: object
    headers: Headers
    crc_checked: bool

    @property
    def phy(self) -> np.ndarray:
        """Absolute commitlog offsets of the records (from their position, not the field)."""
        return self.headers.offsets + self.segment.start


@dataclass
class Stop:
    """Where and why the walk ended."""

    offset: int  # absolute commitlog offset where valid data ends
    segment: Segment | None
    position: int  # position inside that segment
    kind: str  # fast.STOP_* ("zero", "torn", "bad_magic", "bad_size", "eof", "invalid", "blank" at log end)
    reason: int = fast.R_OK  # for kind "invalid": fast.R_* code
    size: int = 0  # TOTALSIZE read at the stop position
    magic: int = 0
    entry_level: bool = False  # DLedger: the entries end here (not a message inside one)
    text: str | None = None  # DLedger: why the entries end here

    @property
    def clean(self) -> bool:
        """True when the log simply ends: zeros after the last record, or a final BLANK."""
        return self.kind in (fast.STOP_ZERO, fast.STOP_BLANK) or (self.kind == fast.STOP_EOF and self.segment is None)


@dataclass
class RecordFilter:
    """Which records of a walk a listing keeps: offsets [start, end), a topic, a queue id, store
    times [since, until] (epoch ms, inclusive) and at most ``limit`` records in all. One place for
    ``dump``, ``--follow``, the file exports and the JSON encoder, vectorised per chunk."""

    start: int | None = None
    end: int | None = None
    topic: str | None = None
    queue: int | None = None
    since: int | None = None
    until: int | None = None
    limit: int | None = None

    def __post_init__(self):
        self.left = self.limit

    def pick(self, chunk: "Chunk") -> tuple[np.ndarray, bool]:
        """Indexes of the chunk's kept records, and True when nothing after them can be kept."""
        h = chunk.headers
        phy = chunk.phy
        keep = np.ones(len(h), dtype=bool)
        done = False
        if self.start is not None:
            keep &= phy >= self.start
        if self.end is not None:
            cut = int(np.searchsorted(phy, self.end))  # offsets grow along a chunk
            if cut < len(h):
                keep[cut:] = False
                done = True
        if self.queue is not None:
            keep &= h.queueId == self.queue
        if self.since is not None:
            keep &= h.storeTimestamp >= self.since
        if self.until is not None:
            keep &= h.storeTimestamp <= self.until
        if self.topic is not None and keep.any():
            from rmqstore_cli.formats.jsonl import topic_mask

            keep &= topic_mask(chunk.buf, h, self.topic)
        idx = np.flatnonzero(keep)
        if self.left is not None:
            idx = idx[: self.left]
            self.left -= len(idx)
            done = done or self.left == 0
        return idx, done


@dataclass
class ScanResult:
    """How a walk of the log ended: its stop, the BLANK markers passed, the records and bytes read."""

    stop: Stop | None = None
    blanks: list = field(default_factory=list)  # (absolute offset, totalSize)
    records: int = 0
    bytes: int = 0
    entry_stop: object = None  # DLedger: where the entries end (log.dledger.EntryStop)
    entry_walk: object = None  # DLedger: the entry walk that ended there (log.dledger.EntryWalk)
    skipped: list = field(default_factory=list)  # DLedger, stop_at_invalid=False: (offset, reason) left out


class CommitLog:
    """Mirrors the broker's CommitLog: the segment queue plus record validation rules."""

    # Listings end at the first invalid record, where the broker's recovery ends the log (a DLedger log
    # goes on past a damaged message: the broker keeps serving the entries after it).
    LISTING_STOPS_AT_INVALID = True

    def __init__(self, directory: str, config: StoreConfig):
        self.config = config
        self.directory = directory
        self.segments = SegmentQueue(directory, config.mappedFileSizeCommitLog, "commitlog")

    def magics(self, strict_version: bool) -> tuple[int, ...]:
        return (MAGIC_V1,) if (strict_version and self.config.version < 5) else (MAGIC_V1, MAGIC_V2)

    def prop_crc_policy(self, check_crc: bool) -> int:
        """Which records need a ``__CRC32#`` property check (§4.2): none before 5.x; on 5.x those
        that carry the property, or every record when forceVerifyPropCRC is set and CRCs are checked."""
        if self.config.version < 5:
            return fast.PROP_NONE
        return fast.PROP_REQUIRED if (check_crc and self.config.forceVerifyPropCRC) else fast.PROP_IF_PRESENT

    def validate(self, buf, u8, h: Headers, check_crc: bool, strict_version: bool = False) -> None:
        """Fill ``h.reason`` with the first rule each record breaks (§13.3 order)."""
        fast.validate(buf, h, check_crc, self.prop_crc_policy(check_crc), u8)

    def scan(self, *, start_index: int = 0, start_position: int = 0, check_crc: bool = True,
             strict_version: bool = False, result: ScanResult | None = None,
             chunk_records: int = CHUNK_RECORDS, stop_at_invalid: bool = True,
             end_index: int | None = None) -> Iterator[Chunk]:
        """Yield chunks of valid records from segment ``start_index`` on; fill ``result``.

        The walk follows the broker: BLANK -> next segment; anything else that is not a
        valid record ends the log (``result.stop`` says where and why). With ``end_index``
        the walk also ends after segment ``end_index - 1`` (a stop of kind "blank" there means
        the log goes on in the next range: how ``-j`` splits a scan, see :mod:`.parallel`).
        Each chunk is one call of the compiled walk+decode+CRC kernel (:func:`formats.fast.scan_records`).
        """
        result = result if result is not None else ScanResult()
        segs = self.segments.segments
        magics = self.magics(strict_version)
        prop_crc = self.prop_crc_policy(check_crc)
        i = start_index
        pos = start_position
        if not segs:
            result.stop = Stop(0, None, 0, fast.STOP_EOF)
            return
        while i < len(segs):
            seg = segs[i]
            buf = seg.buffer()
            u8 = fast.kernel_view(buf) if seg.size else np.zeros(0, np.uint8)
            limit = min(seg.size, self.segments.file_size) if seg.size else 0
            while True:
                step = fast.scan_records(buf, pos, limit, magics, chunk_records, check_crc, prop_crc, u8)
                h = step.headers
                if len(h):
                    result.records += len(h)
                    result.bytes += int(h.totalSize.sum())
                    yield Chunk(seg, buf, h, check_crc)
                pos = step.stop
                if step.kind != fast.STOP_CHUNK:
                    break
            if step.kind == fast.STOP_INVALID:
                result.stop = Stop(seg.start + pos, seg, pos, fast.STOP_INVALID, step.reason, step.size, step.magic)
                return
            del u8
            _release(buf)
            if step.kind == fast.STOP_BLANK:
                result.blanks.append((seg.start + pos, step.size))
                if i + 1 == len(segs) or (end_index is not None and i + 1 >= end_index):
                    result.stop = Stop(seg.start + pos, seg, pos, fast.STOP_BLANK, size=step.size, magic=step.magic)
                    return
                i += 1
                pos = 0
                continue
            result.stop = Stop(seg.start + pos, seg, pos, step.kind, size=step.size, magic=step.magic)
            return

    def find_end(self, check_crc: bool = True, strict_version: bool = False) -> ScanResult:
        res = ScanResult()
        for _ in self.scan(check_crc=check_crc, strict_version=strict_version, result=res):
            pass
        return res

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset

    def read(self, phy: int, with_body: bool = True) -> dict:
        """Decode the record starting at absolute offset ``phy`` (no chain check)."""
        seg = self.segments.find(phy)
        if seg is None:
            raise RecordError(f"offset {phy} is outside every commitlog file")
        buf = seg.buffer()
        msg = decode_message(buf, phy - seg.start, with_body=with_body)
        return msg

    def raw(self, phy: int, size: int) -> memoryview:
        seg = self.segments.find(phy)
        if seg is None:
            raise RecordError(f"offset {phy} is outside every commitlog file")
        pos = phy - seg.start
        if pos + size > seg.size:
            raise RecordError(f"{size} bytes at {phy} run past the end of {seg.name}")
        return memoryview(seg.buffer())[pos : pos + size]

    def time_window(self, since: int | None, until: int | None, start: int | None = None,
                    end: int | None = None) -> tuple[int | None, int | None, bool]:
        """Narrow [start, end) to the records stored in [since, until] (epoch ms, both inclusive),
        found by binary search (:mod:`.storetime`). The third value is False when nothing can match."""
        if since is not None:
            first = commitlog_offset_at(self, since)
            if first is None:
                return start, end, False
            start = first if start is None else max(start, first)
        if until is not None and until < (1 << 63) - 1:
            past = commitlog_offset_at(self, until + 1)
            if past is not None:
                end = past if end is None else min(end, past)
        return start, end, start is None or end is None or start < end

    def start_index(self, start: int | None) -> int:
        """Index of the segment holding ``start`` (the first segment when None)."""
        k = 0
        for i, s in enumerate(self.segments.segments):
            if start is not None and s.start <= start:
                k = i
        return k

    def selected(self, sel: "RecordFilter", *, check_crc: bool = False,
                 result: ScanResult | None = None) -> Iterator[tuple[Chunk, np.ndarray, bool]]:
        """The walk restricted to ``sel``: (chunk, indexes of its kept records, done). Time bounds are
        turned into offsets first (binary search), so the walk starts in the right segment."""
        if sel.since is not None or sel.until is not None:
            sel.start, sel.end, any_ = self.time_window(sel.since, sel.until, sel.start, sel.end)
            if not any_:
                return
        if sel.left == 0:
            return
        for chunk in self.scan(start_index=self.start_index(sel.start), check_crc=check_crc, result=result,
                               stop_at_invalid=self.LISTING_STOPS_AT_INVALID):
            idx, done = sel.pick(chunk)
            yield chunk, idx, done
            if done:
                return

    def records(self, *, start: int | None = None, end: int | None = None, check_crc: bool = False,
                with_body: bool = True, result: ScanResult | None = None, since: int | None = None,
                until: int | None = None) -> Iterator[dict]:
        """Decoded records in order, from the segment holding ``start`` up to ``end`` (exclusive);
        with ``since``/``until`` only records stored in that time range (epoch ms, inclusive)."""
        sel = RecordFilter(start=start, end=end, since=since, until=until)
        for chunk, idx, _ in self.selected(sel, check_crc=check_crc, result=result):
            base = chunk.segment.start
            for off in chunk.headers.offsets[idx].tolist():
                msg = decode_message(chunk.buf, off, with_body=with_body)
                msg["offset"] = base + off
                yield msg

    def records_json(self, *, start: int | None = None, end: int | None = None, body: str = "none",
                     topic: str | None = None, queue: int | None = None, limit: int | None = None,
                     result: ScanResult | None = None, since: int | None = None,
                     until: int | None = None) -> Iterator[tuple[bytes, int, int]]:
        """The records :meth:`records` yields (same selection, same stop), already rendered as
        JSON Lines (UTF-8 bytes, ``--body`` mode ``body``) by :mod:`formats.jsonl`, a block at a
        time: yields (text, records in it, log bytes walked for it)."""
        from rmqstore_cli.formats.jsonl import encode_blocks

        sel = RecordFilter(start=start, end=end, topic=topic, queue=queue, since=since, until=until, limit=limit)
        for chunk, idx, _ in self.selected(sel, result=result):
            h = chunk.headers
            walked = int(h.totalSize[: int(idx[-1]) + 1].sum()) if len(idx) else int(h.totalSize.sum())
            if not len(idx):
                yield b"", 0, walked
                continue
            whole = None if len(idx) == len(h) else idx  # no copy of the columns when nothing is left out
            # large bodies: a chunk's text comes in pieces of bounded size (the walked bytes with the last)
            pending = None
            for piece in encode_blocks(chunk.buf, h, chunk.segment.start, body, whole):
                if pending is not None:
                    yield pending[0], pending[1], 0
                pending = piece
            yield pending[0], pending[1], walked

    def boundaries_near(self, phy: int) -> tuple[int | None, int | None]:
        """Record boundaries just before and after ``phy`` (for error messages)."""
        seg = self.segments.find(phy)
        if seg is None:
            return None, None
        # piecewise: a 1 GiB segment of small messages holds millions of records
        n = fast.neighbours(seg.buffer(), phy - seg.start, seg.size)
        before = None if n.before is None else seg.start + n.before
        after = None if n.after is None else seg.start + n.after
        if after is None and n.walk.kind == fast.STOP_BLANK and seg.start + n.walk.stop > phy:
            after = seg.start + seg.size
        return before, after

    def close(self) -> None:
        self.segments.close()


def _release(buf) -> None:
    """Drop a finished segment's pages from this process (RSS stays ~one segment whatever the
    store size). The mapping stays valid: later reads fault the pages in again from the cache.
    A mapping kept for the command (segments.kept_mappings) keeps its pages for the next pass."""
    madvise = getattr(buf, "madvise", None)
    if madvise is not None and not is_kept(buf):
        try:
            madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass


def minimum_record_size() -> int:
    return MIN_MESSAGE_SIZE


__all__ = ["CommitLog", "Chunk", "Stop", "ScanResult", "RecordFilter", "MAGIC_V2"]
