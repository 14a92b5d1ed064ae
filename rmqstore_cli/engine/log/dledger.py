"""A DLedger commitlog read offline (the broker's DLedgerCommitLog over DLedger's DLedgerMmapFileStore).

``<root>/dledger-<selfId>/`` holds ``data/`` (entry files named by start offset, the commitlog's file
size), ``index/`` (32-byte units, entry i at byte i x 32), ``checkpoint`` and ``currterm``
(FORMAT.md appendix D). :class:`DLedgerFiles` finds them; :func:`walk_entries` follows the entries
with the header rules of DLedger's recovery (compiled: :mod:`formats.dledgerkernel`), and
:class:`DLedgerCommitLog` is the commitlog every reader already uses, presenting the message inside
each entry at the broker's physical offset (entry pos + 48): the walk, ``read``, ``raw`` and the
record listings work on it unchanged.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from rmqstore_cli.formats import dledger as dl
from rmqstore_cli.formats import fast
from rmqstore_cli.formats.message import RecordError
from rmqstore_cli.formats.records import MIN_MESSAGE_SIZE

from ..config.storeconfig import StoreConfig
from ..errors import UsageError
from .commitlog import CHUNK_RECORDS, Chunk, CommitLog, ScanResult, Stop, _release
from .segments import Segment, SegmentQueue

HEADER = dl.ENTRY_HEADER_SIZE
R_NOT_A_MESSAGE = fast.R_NOT_A_MESSAGE
R_SIZE_MISMATCH = fast.R_ENTRY_SIZE


def dledger_dirs(root: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(root) if n.startswith("dledger-") and os.path.isdir(os.path.join(root, n)))
    except OSError:
        return []


def choose_dir(root: str, self_id: str | None) -> str:
    """The ``dledger-<selfId>`` folder to read: the one given, else the only one there is."""
    names = dledger_dirs(root)
    if self_id:
        name = self_id if self_id.startswith("dledger-") else f"dledger-{self_id}"
        if name not in names:
            raise UsageError(f"{root} has no {name}/ (DLedger folders: {', '.join(names) or 'none'})")
        return os.path.join(root, name)
    if len(names) > 1:
        raise UsageError(f"{root} holds several DLedger folders ({', '.join(names)}): say which with --self-id "
                         "(or dLegerSelfId in --config)")
    if not names:
        raise UsageError(f"{root} has no dledger-<selfId>/ folder")
    return os.path.join(root, names[0])


def common_size(directory: str, default: int) -> int:
    """The most common size of the 20-digit files of ``directory`` (a wrong-size stray is reported)."""
    try:
        sizes = Counter(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
                        if n.isdigit() and len(n) == 20)
    except OSError:
        return default
    sizes.pop(0, None)
    return max(sizes, key=lambda s: (sizes[s], s)) if sizes else default


def read_properties(path: str) -> dict | None:
    try:
        with open(path, encoding="latin-1") as f:
            return dl.parse_properties(f.read())
    except OSError:
        return None


class DLedgerFiles:
    """The files of one DLedger store (DLedgerMmapFileStore): data and index file lists, checkpoint, currterm."""

    def __init__(self, directory: str, data_file_size: int):
        self.directory = directory
        self.self_id = os.path.basename(directory)[len("dledger-"):]
        self.data = SegmentQueue(os.path.join(directory, dl.DATA_DIR), data_file_size, "DLedger data")
        index_dir = os.path.join(directory, dl.INDEX_DIR)
        self.index = SegmentQueue(index_dir, common_size(index_dir, dl.DEFAULT_INDEX_FILE_SIZE), "DLedger index")

    def checkpoint(self) -> dict | None:
        for name in (dl.CHECKPOINT_FILE, dl.CHECKPOINT_FILE + ".bak"):
            p = read_properties(os.path.join(self.directory, name))
            if p is not None and p:
                out = {}
                for k in dl.CHECKPOINT_KEYS:
                    try:
                        out[k] = int(p[k])
                    except (KeyError, ValueError):
                        out[k] = None
                out["file"] = name
                return out
        return None

    def currterm(self) -> dict | None:
        p = read_properties(os.path.join(self.directory, dl.CURRTERM_FILE))
        if p is None:
            return None
        try:
            term = int(p.get("currTerm", ""))
        except ValueError:
            term = None
        return {"currTerm": term, "voteLeader": p.get("voteLeader")}

    def index_units(self, first: int = 0, count: int | None = None, copy: bool = True) -> np.ndarray:
        """Index units [first, first + count) as a structured array (formats.dledger.INDEX_UNIT_DTYPE); units
        past the index files are left out. ``copy=False``: units that lie in one index file are a read-only view
        of its mapping (for a caller that reads them at once and lets them go)."""
        size = dl.INDEX_UNIT_SIZE
        out = []
        want = count
        at = first * size
        while want is None or want > 0:
            seg = self.index.find(at)
            if seg is None:
                break
            rel = at - seg.start
            n = (seg.size - rel) // size
            if want is not None:
                n = min(n, want)
            if n <= 0:
                break
            units = np.frombuffer(seg.buffer(), dtype=dl.INDEX_UNIT_DTYPE, count=n, offset=rel)
            out.append(units.copy() if copy else units)
            at += n * size
            if want is not None:
                want -= n
        if len(out) == 1:
            return out[0]
        return np.concatenate(out) if out else np.zeros(0, dl.INDEX_UNIT_DTYPE)

    def close(self) -> None:
        self.data.close()
        self.index.close()


@dataclass
class EntryChunk:
    """Consecutive entries of one data file, as columns (formats.dledgerkernel.COLUMNS; ``at`` relative)."""

    segment: Segment
    buf: object
    cols: dict
    headers: object = None  # the messages inside the entries (fast.Headers), when the walk decoded them

    def __len__(self) -> int:
        return len(self.cols["at"])


@dataclass
class EntryStop:
    offset: int  # absolute offset where the entries end
    segment: Segment | None
    position: int
    kind: str  # fast.STOP_*; STOP_INVALID: a header rule broken (``rule``)
    rule: int = 0  # formats.dledger.E_*
    size: int = 0
    magic: int = 0

    def text(self) -> str:
        if self.kind == fast.STOP_INVALID:
            return dl.E_TEXT[self.rule]
        return {fast.STOP_ZERO: "zeros (end of written entries)", fast.STOP_BLANK: "blank at the end of the last file",
                fast.STOP_EOF: "fewer bytes left than an entry header",
                fast.STOP_BAD_MAGIC: f"magic {self.magic} is neither an entry (1) nor a blank (-1)",
                fast.STOP_TORN: f"entry size {self.size} runs past the end of its file"}.get(self.kind, self.kind)


@dataclass
class EntryWalk:
    stop: EntryStop | None = None
    blanks: list = field(default_factory=list)  # (absolute offset, size)
    entries: int = 0
    last_index: int = -1
    last_term: int = -1


def dledger_kernel():
    """formats.dledgerkernel through formats.aot: the ahead-of-time kernel when it is built (no numba), else the
    module (numba's)."""
    from rmqstore_cli.formats.aot import kernels

    return kernels("dledgerkernel")


def walk_entries(segments: list, *, start_index: int = 0, start_position: int = 0, last_index: int = -1,
                 last_term: int = -1, result: EntryWalk | None = None, chunk: int = CHUNK_RECORDS,
                 end_index: int | None = None, decode: tuple | None = None) -> Iterator[EntryChunk]:
    """The entries DLedger's recovery accepts, from file ``start_index`` (blank -> next file; any other
    stop ends the log: ``result.stop``), chunk by chunk. ``decode`` (check_crc, property-CRC policy): each chunk
    also carries the messages inside its entries, decoded and validated in the same compiled pass
    (``EntryChunk.headers``, as :meth:`DLedgerCommitLog.messages` would decode them)."""
    k = dledger_kernel()
    result = result if result is not None else EntryWalk()
    result.last_index, result.last_term = last_index, last_term
    if not segments:
        result.stop = EntryStop(0, None, 0, fast.STOP_EOF)
        return
    i, pos = start_index, start_position
    end_index = len(segments) if end_index is None else min(end_index, len(segments))
    while i < end_index:
        seg = segments[i]
        buf = seg.buffer()
        u8 = fast.kernel_view(buf if seg.size else b"")
        while True:
            cols = tuple(np.empty(chunk, np.int64) for _ in k.COLUMNS)
            if decode is None:
                h = None
                n, pos, kind, size, magic, rule = k.walk_entries(u8, int(pos), int(seg.size), int(seg.start),
                                                                 int(result.last_index), int(result.last_term), chunk, cols)
            else:
                h, c32, c64 = fast.new_headers(chunk)
                n, pos, kind, size, magic, rule = k.walk_messages(u8, int(pos), int(seg.size), int(seg.start),
                                                                  int(result.last_index), int(result.last_term), chunk, cols,
                                                                  bool(decode[0]), int(decode[1]), c32, c64, h.reason)
            if n:
                c = {name: col[:n] for name, col in zip(k.COLUMNS, cols)}
                result.entries += n
                result.last_index, result.last_term = int(c["index"][-1]), int(c["term"][-1])
                yield EntryChunk(seg, buf, c, h.take(n) if h is not None else None)
            if kind != k.K_CHUNK:
                break
        kind = fast._KINDS[kind]
        del u8
        if kind == fast.STOP_BLANK:
            result.blanks.append((seg.start + pos, int(size)))
            if i + 1 < end_index:
                _release(buf)
                i, pos = i + 1, 0
                continue
        result.stop = EntryStop(seg.start + pos, seg, pos, kind, int(rule), int(size), int(magic))
        return


def recovery_start_file(cl) -> int:
    """The data file DLedger's recovery walks from (DLedgerMmapFileStore.recover): the third-last, or an earlier
    one when a file's first entry does not check out against its header rules and its index unit. Entries in files
    before it are never read by the recovery: a broken header there does not end the log."""
    segs = cl.segments.segments
    for i in range(max(len(segs) - 3, 0), -1, -1):
        seg = segs[i]
        if seg.size < HEADER:
            continue
        h = dl.ENTRY_HEADER.parse(bytes(seg.buffer()[:HEADER]))
        if h.magic != dl.ENTRY_MAGIC or h.size <= dl.ENTRY_FIXED_SIZE or h.pos != seg.start or h.bodyLength + HEADER != h.size:
            continue
        u = cl.files.index_units(h.index, 1)
        if len(u) and (int(u["magic"][0]), int(u["pos"][0]), int(u["size"][0]), int(u["index"][0]), int(u["term"][0])) \
                == (h.magic, h.pos, h.size, h.index, h.term):
            return i
    return 0


def resume_by_unit(cl, walk: EntryWalk, reach: int = 1024) -> tuple[int, int, int, int] | None:
    """Past a broken entry: (file number, position, last index, last term) of the first later entry that its index
    unit locates and whose header agrees with the unit (a few units are tried); None when none does."""
    segs = cl.segments.segments
    first = walk.last_index + 2 if walk.last_index >= 0 else 1
    for i in range(first, first + reach):
        u = cl.files.index_units(i, 1)
        if not len(u) or int(u["magic"][0]) != dl.ENTRY_MAGIC:
            return None
        pos = int(u["pos"][0])
        seg = cl.segments.find(pos)
        if seg is None or pos - seg.start + HEADER > seg.size:
            continue
        at = pos - seg.start
        head = dl.ENTRY_HEADER.parse(bytes(seg.buffer()[at:at + HEADER]))
        if (head.magic, head.pos, head.index, head.size) == (dl.ENTRY_MAGIC, pos, i, int(u["size"][0])):
            prev = cl.files.index_units(i - 1, 1)
            term = int(prev["term"][0]) if len(prev) and int(prev["index"][0]) == i - 1 else -1
            return segs.index(seg), at, i - 1, term
    return None


class DLedgerCommitLog(CommitLog):
    """The commitlog of a DLedger store (DLedgerCommitLog): the messages inside the entries, each at its
    entry's pos + 48. A scan chunk's ``headers.offsets`` are message positions in the data file, so
    ``chunk.phy`` is the broker's physical offset; ``Stop.position`` of an invalid message is the message's."""

    is_dledger = True
    LISTING_STOPS_AT_INVALID = False
    # verify -j 1: takes the entry chunks of the scans that walk a data file whole (log.dledgerjobs.EntryCapture)
    entry_capture = None

    def __init__(self, directory: str, config: StoreConfig):
        self.config = config
        self.files = DLedgerFiles(directory, config.mappedFileSizeCommitLog)
        self.directory = self.files.data.directory
        self.segments = self.files.data

    def scan(self, *, start_index: int = 0, start_position: int = 0, check_crc: bool = True,
             strict_version: bool = False, result: ScanResult | None = None,
             chunk_records: int = CHUNK_RECORDS, stop_at_invalid: bool = True,
             end_index: int | None = None) -> Iterator[Chunk]:
        """:meth:`CommitLog.scan` over entries: ``start_position`` is an entry's start. Entries end the
        walk as DLedger's recovery ends it; a message that fails the broker's record check stops it too
        (``Stop`` of kind invalid at the message), resumable at the next entry (:meth:`next_entry`); with
        ``stop_at_invalid=False`` such messages are left out (``result.skipped``) and the walk goes on."""
        result = result if result is not None else ScanResult()
        magics = self.magics(strict_version)
        prop_crc = self.prop_crc_policy(check_crc)
        walk = EntryWalk()
        last_index = self.index_before(start_index, start_position)
        capture = self.entry_capture
        if capture is not None:
            capture = capture.start(self.segments.segments, start_index, start_position, last_index, end_index,
                                    chunk_records)
        for ec in walk_entries(self.segments.segments, start_index=start_index, start_position=start_position,
                               last_index=last_index, result=walk, chunk=chunk_records, end_index=end_index,
                               decode=(check_crc, prop_crc)):
            if capture is not None:
                capture.chunk(ec)
            h, bad = self.messages(ec, check_crc, prop_crc, magics)
            if bad < len(h) and not stop_at_invalid:
                # the broker's reput steps over a message it cannot parse (its size is known from the entry)
                ok = h.reason == fast.R_OK
                result.skipped += [(int(ec.segment.start + o), int(r)) for o, r in
                                   zip(h.offsets[~ok].tolist(), h.reason[~ok].tolist())]
                h, bad = h.select(ok), int(ok.sum())
            good = h if bad >= len(h) else h.take(bad)
            if len(good):
                result.records += len(good)
                result.bytes += int(good.totalSize.sum())
                yield Chunk(ec.segment, ec.buf, good, check_crc)
            if bad < len(h):
                p = int(h.offsets[bad])
                result.stop = Stop(ec.segment.start + p, ec.segment, p, fast.STOP_INVALID, int(h.reason[bad]),
                                   int(h.totalSize[bad]), int(h.magicCode[bad]))
                result.entry_stop = None
                return
        if capture is not None:
            capture.done(walk)
        result.blanks.extend(walk.blanks)
        es = walk.stop
        result.stop = Stop(es.offset, es.segment, es.position, es.kind, size=es.size, magic=es.magic, entry_level=True,
                           text=f"the DLedger entries end: {es.text()}")
        result.entry_stop, result.entry_walk = es, walk

    def messages(self, ec: EntryChunk, check_crc: bool, prop_crc: int, magics) -> tuple[fast.Headers, int]:
        """The messages of an entry chunk, decoded and validated by the classic kernels; and the first one
        that fails (len when none): the broker's record check, the entry's body being exactly one message."""
        h = ec.headers
        if h is None:
            buf = ec.buf
            u8 = fast.kernel_view(buf)
            h = fast.decode_headers(buf, ec.cols["at"] + HEADER, u8)
            fast.validate(buf, h, check_crc, prop_crc, u8)
        ok = h.reason == fast.R_OK
        h.reason[ok & (h.totalSize != ec.cols["bodyLength"])] = R_SIZE_MISMATCH
        not_msg = h.totalSize < MIN_MESSAGE_SIZE
        known = np.zeros(len(h), bool)
        for magic in set(magics):  # one or two magic codes: comparisons cost less than np.isin's set-up per chunk
            known |= h.magicCode == np.int32(magic)
        not_msg |= ~known
        h.reason[not_msg] = R_NOT_A_MESSAGE
        return h, fast.first_invalid(h)

    def index_before(self, start_index: int, start_position: int) -> int:
        """Index of the entry before the one at (file, position), -1 at the start of the log (so the
        contiguity rule holds across a resumed walk): read from the entry there."""
        if start_index == 0 and start_position == 0:
            return -1
        segs = self.segments.segments
        if start_index >= len(segs):
            return -1
        seg = segs[start_index]
        if start_position + HEADER > seg.size:
            return -1
        head = dl.ENTRY_HEADER.parse(bytes(seg.buffer()[start_position:start_position + HEADER]))
        return int(head.index) - 1 if head.magic == dl.ENTRY_MAGIC else -1

    def next_entry(self, message_phy: int) -> int | None:
        """Start (relative to its file) of the entry after the one holding the message at ``message_phy``."""
        seg = self.segments.find(message_phy)
        if seg is None:
            return None
        at = message_phy - HEADER - seg.start
        head = dl.ENTRY_HEADER.parse(bytes(seg.buffer()[at:at + HEADER]))
        nxt = at + head.size
        return nxt if head.size > HEADER and nxt <= seg.size else None

    def entry_at_message(self, phy: int) -> dict:
        seg = self.segments.find(phy)
        if seg is None or phy - HEADER < seg.start:
            raise RecordError(f"offset {phy} is not a message inside a DLedger entry")
        at = phy - HEADER - seg.start
        return dict(dl.ENTRY_HEADER.parse(bytes(seg.buffer()[at:at + HEADER])))

    def offset_at(self, timestamp: int) -> int | None:
        """Physical offset of the first message stored at or after ``timestamp`` (None: every message is
        older): the files binary-searched by their first message's store time, then one file walked."""
        segs = [s for s in self.segments.segments if s.size > HEADER]
        if not segs:
            return None
        firsts: dict[int, float] = {}

        def first(i: int) -> float:
            if i not in firsts:
                seg = segs[i]
                h = fast.decode_headers(seg.buffer(), np.asarray([HEADER], np.int64))
                magic = dl.ENTRY_HEADER.parse(bytes(seg.buffer()[:HEADER])).magic  # a file starts with an entry
                ok = h.reason[0] == fast.R_OK and magic == dl.ENTRY_MAGIC
                firsts[i] = float(h.storeTimestamp[0]) if ok else float("inf")
            return firsts[i]

        lo, hi = 0, len(segs) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if first(mid) < timestamp:
                lo = mid
            else:
                hi = mid - 1
        k = self.segments.segments.index(segs[lo])
        for chunk in self.scan(start_index=k, check_crc=False):
            ts = chunk.headers.storeTimestamp
            i = int(np.searchsorted(ts, timestamp, side="left"))
            if i < len(ts):
                return int(chunk.phy[i])
        return None

    def time_window(self, since: int | None, until: int | None, start: int | None = None,
                    end: int | None = None) -> tuple[int | None, int | None, bool]:
        if since is not None:
            first = self.offset_at(since)
            if first is None:
                return start, end, False
            start = first if start is None else max(start, first)
        if until is not None and until < (1 << 63) - 1:
            past = self.offset_at(until + 1)
            if past is not None:
                end = past if end is None else min(end, past)
        return start, end, start is None or end is None or start < end

    def boundaries_near(self, phy: int) -> tuple[int | None, int | None]:
        """Message offsets just before and after ``phy`` (entry walk of its file)."""
        seg = self.segments.find(phy)
        if seg is None:
            return None, None
        before = after = None
        for ec in walk_entries([seg], chunk=1 << 16):
            m = ec.cols["at"] + seg.start + HEADER
            k = int(np.searchsorted(m, phy, side="right"))
            if k:
                before = int(m[k - 1])
            if k < len(m):
                after = int(m[k])
                break
        return before, after

    def close(self) -> None:
        self.files.close()
