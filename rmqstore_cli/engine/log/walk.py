"""The commitlog walks recovery and salvage need, with each broker version's record test.

``broker_walk`` mirrors the recovery loop of §13.4 (CommitLog.recoverNormally /
recoverAbnormally) driven by ``checkMessageAndReturnSize`` (§13.3) as 4.9.3 or 5.3.3
implements it. The two ways past a bad record (never the broker's) live here too: ``resync``
(salvage, recovery: the next self-consistent record) and ``next_by_size`` (verify: where the
record's own sizes say the next one starts).
Both use the vectorised codec in :mod:`formats.fast`; nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.records import MAGIC_V1, MAGIC_V2, SYSFLAG_TRANSACTION_MASK

from ..config.storeconfig import StoreConfig

# 4.9.3 allocates byte[TOTALSIZE] before any other check (§13.3); beyond this the JVM
# cannot satisfy it with any heap a broker is given (array limit ~2^31, default heap 8 GiB
# is shared), and OutOfMemoryError is not caught by the recovery loop.
OOM_TOTALSIZE = 1 << 30
END_OF_LOG = (1 << 63) - 1


@dataclass
class WalkStop:
    """Where the broker's recovery walk ends (its processOffset) and why."""

    offset: int  # absolute offset where the walk ended (= processOffset)
    segment_index: int
    position: int
    kind: str  # fast.STOP_* or "invalid"
    reason: str  # one line, the broker's view
    total_size: int = 0
    oom: bool = False  # 4.9.3 would die with OutOfMemoryError here


class LogTally:
    """What recovery needs from the records a walk finds, kept as running values: how many, the
    first start, the last start and end, and the store times the checkpoint describes (the last
    record's, the newest, the last one a consume queue takes). Records at or past ``limit`` are not
    counted. A walk sink: nothing per record is kept, so memory does not grow with the log."""

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.count = 0
        self.first: int | None = None
        self.last_start: int | None = None
        self.last_end: int | None = None
        self.last_ts: int | None = None
        self.newest_ts: int | None = None
        self.last_cq_ts: int | None = None  # store time of the last record the consume-queue dispatcher takes
        self.last_cq_phy: int | None = None

    def __len__(self) -> int:
        return self.count

    def __call__(self, seg_start: int, buf, h: fast.Headers) -> None:
        n = len(h)
        if not n:
            return
        phy = h.offsets + seg_start
        if self.limit is not None and int(phy[-1]) >= self.limit:
            n = int(np.searchsorted(phy, self.limit))  # records come in log order
            if not n:
                return
        ts = h.storeTimestamp[:n]
        self.count += n
        if self.first is None:
            self.first = int(phy[0])
        self.last_start = int(phy[n - 1])
        self.last_end = self.last_start + int(h.totalSize[n - 1])
        self.last_ts = int(ts[-1])
        newest = int(ts.max())
        self.newest_ts = newest if self.newest_ts is None else max(self.newest_ts, newest)
        cq = np.flatnonzero(cq_dispatched(h.sysFlag[:n]))
        if len(cq):
            self.last_cq_ts = int(ts[cq[-1]])
            self.last_cq_phy = int(phy[cq[-1]])


    def merge(self, later: "LogTally") -> None:
        """Fold in the tally of the records that follow this one's in the log (a ``-j`` worker's segment)."""
        if not later.count:
            return
        self.count += later.count
        if self.first is None:
            self.first = later.first
        self.last_start, self.last_end, self.last_ts = later.last_start, later.last_end, later.last_ts
        self.newest_ts = later.newest_ts if self.newest_ts is None else max(self.newest_ts, later.newest_ts)
        if later.last_cq_phy is not None:
            self.last_cq_ts, self.last_cq_phy = later.last_cq_ts, later.last_cq_phy


def cq_dispatched(sysflag: np.ndarray) -> np.ndarray:
    """Build-consume-queue dispatcher only takes NOT and COMMIT records (§14.1)."""
    tran = sysflag & SYSFLAG_TRANSACTION_MASK
    return (tran == 0x0) | (tran == 0x8)


def magics_for(version: int) -> tuple:
    return (MAGIC_V1,) if version < 5 else (MAGIC_V1, MAGIC_V2)


def validate(buf, u8, h: fast.Headers, cfg: StoreConfig, version: int, check_crc: bool) -> None:
    """checkMessageAndReturnSize's content checks, per version, into ``h.reason``."""
    if not len(h):
        return
    force_prop = version >= 5 and cfg.forceVerifyPropCRC
    if check_crc and not force_prop:
        ok = fast.check_body_crc(buf, h)
        h.reason[(~ok) & (h.reason == fast.R_OK)] = fast.R_BODY_CRC
    if check_crc and force_prop:
        for i in range(len(h)):
            if h.reason[i] == fast.R_OK and not fast.check_property_crc(buf, int(h.offsets[i]), int(h.totalSize[i])):
                h.reason[i] = fast.R_PROP_CRC


def _stop_reason(kind: str, size: int, magic: int, version: int, reason_code: int = 0) -> str:
    if kind == "invalid":
        return fast.REASON_TEXT.get(reason_code, "invalid record")
    if kind == fast.STOP_ZERO:
        return "zeros (end of written data)"
    if kind == fast.STOP_BAD_MAGIC:
        if magic == MAGIC_V2 and version < 5:
            return "magic v2 record (0xDAA320AB): 4.9 only knows v1 and stops here"
        return f"illegal magic 0x{magic & 0xFFFFFFFF:08X}"
    if kind == fast.STOP_BAD_SIZE:
        return f"TOTALSIZE {size} is below the minimum record size"
    if kind == fast.STOP_TORN:
        return f"TOTALSIZE {size} runs past the end of the file (torn or garbled record)"
    if kind == fast.STOP_EOF:
        return "fewer than 8 bytes left in the file without a BLANK marker"
    if kind == fast.STOP_BLANK:
        return "BLANK marker of the last file"
    return kind


@dataclass
class _ChunkStep:
    """One chunk of a walk: its valid records, then where and how the chunk ended (``kind`` is
    ``fast.STOP_CHUNK`` when the segment goes on, "invalid" at a record that fails the checks, else
    the walk's end there: BLANK, zeros, torn, ...)."""

    headers: fast.Headers
    kind: str
    stop: int  # the next record's position; "invalid": the invalid record's
    size: int = 0  # TOTALSIZE read at the stop
    magic: int = 0
    reason: int = 0  # "invalid": the fast.R_* reason validate names


def broker_walk(segments, cfg: StoreConfig, version: int, start_index: int, check_crc: bool,
                sink=None, chunk: int = 8192, start_position: int = 0) -> WalkStop:
    """The §13.4 walk from ``segments[start_index]``; each chunk of valid records goes to
    ``sink(segment_start, buffer, headers)``. A sink that returns True pauses the walk after that
    chunk: the answer is then a stop of kind ``fast.STOP_CHUNK`` where the next record starts (a walk
    resumed there goes on exactly as this one would have: no record check looks at the ones before).

    A chunk is read by one of two steps with the same answers: when a record's content check is its body
    CRC alone (every 4.9 walk; 5.x unless forceVerifyPropCRC has the property CRC checked instead), walk,
    decode and body CRC in one compiled pass (:func:`formats.fast.scan_records`, each record read once
    where three steps read it three times); else walk, decode and ``validate``. ``start_position``: where in
    ``segments[start_index]`` the walk begins (a walk resumed after records already read elsewhere)."""
    if not segments:
        return WalkStop(0, 0, 0, fast.STOP_EOF, "no commitlog files")
    magics = magics_for(version)
    if check_crc and version >= 5 and cfg.forceVerifyPropCRC:
        step, view = partial(_validating_step, cfg, version, magics, check_crc, chunk), fast.as_u8
    else:
        step, view = partial(_scanning_step, magics, check_crc, chunk), fast.kernel_view
    i, pos = start_index, start_position
    while True:
        seg = segments[i]
        buf = seg.buffer()
        limit = seg.size
        u8 = view(buf) if limit else np.zeros(0, np.uint8)
        while True:
            c = step(buf, u8, pos, limit)
            pause = sink(seg.start, buf, c.headers) if sink is not None and len(c.headers) else False
            if c.kind == "invalid":
                return WalkStop(seg.start + c.stop, i, c.stop, "invalid",
                                _stop_reason("invalid", 0, 0, version, c.reason), c.size)
            if pause is True and c.stop < limit:
                return WalkStop(seg.start + c.stop, i, c.stop, fast.STOP_CHUNK, "paused by the caller")
            pos = c.stop
            if c.kind != fast.STOP_CHUNK:
                break
        if c.kind == fast.STOP_BLANK and i + 1 < len(segments):
            i += 1
            pos = 0
            continue
        oom = version < 5 and c.kind == fast.STOP_TORN and c.size >= OOM_TOTALSIZE
        return WalkStop(seg.start + c.stop, i, c.stop, c.kind, _stop_reason(c.kind, c.size, c.magic, version),
                        c.size, oom)


def _scanning_step(magics, check_crc: bool, chunk: int, buf, u8, pos: int, limit: int) -> _ChunkStep:
    """Up to ``chunk`` records from ``pos``: walk, decode and body CRC in one compiled pass."""
    s = fast.scan_records(buf, pos, limit, magics, chunk, check_crc, fast.PROP_NONE, u8)
    if s.kind == fast.STOP_INVALID:
        return _ChunkStep(s.headers, "invalid", s.stop, s.size, reason=_walked_reason(buf, u8, s.stop, s.reason))
    return _ChunkStep(s.headers, s.kind, s.stop, s.size, s.magic)


def _validating_step(cfg: StoreConfig, version: int, magics, check_crc: bool, chunk: int, buf, u8, pos: int,
                     limit: int) -> _ChunkStep:
    """Up to ``chunk`` records from ``pos``: walk, decode, then ``validate`` (the property CRC on 5.x)."""
    w = fast.walk(buf, pos, limit, magics, max_records=chunk)
    if len(w.offsets):
        h = fast.decode_headers(buf, w.offsets, u8)
        validate(buf, u8, h, cfg, version, check_crc)
        bad = fast.first_invalid(h)
        if bad < len(h):
            return _ChunkStep(h.take(bad), "invalid", int(h.offsets[bad]), int(h.totalSize[bad]),
                              reason=int(h.reason[bad]))
    else:
        h = fast.decode_headers(buf, w.offsets, u8)
    return _ChunkStep(h, w.kind, w.stop, w.size, w.magic)


def _walked_reason(buf, u8, p: int, reason: int) -> int:
    """The reason ``validate`` names for the record at ``p`` that the fused scan failed with ``reason``: the
    scan lets a body CRC mismatch replace a structural reason, ``validate`` keeps the structural one."""
    if reason != fast.R_BODY_CRC:
        return reason
    structural = int(fast.decode_headers(buf, np.asarray([p], np.int64), u8).reason[0])
    return structural if structural != fast.R_OK else reason


def lenient_records(segments, upto_index: int, sink, chunk: int = 8192) -> None:
    """Records of segments before ``upto_index``, each segment walked alone without CRC
    (what reput would read), to ``sink``; used to find queue units the broker would never rebuild."""
    rewalk(segments[:upto_index], upto_index, 0, 0, END_OF_LOG, sink, chunk)


def rewalk(segments, lenient_upto: int, version: int, lo: int, hi: int, sink, chunk: int = 8192) -> None:
    """The records a recovery walk finds with ``lo <= phy < hi``, chunk by chunk to ``sink``, CRCs not
    checked: segments before ``lenient_upto`` as ``lenient_records`` reads them (each alone, up to its
    first invalid record), the later ones as ``broker_walk`` does (the version's magics). With ``hi`` at
    most the walk's stop, every record the CRC-checking walk accepted is found again and no other one:
    the walk reaches a segment only past the BLANKs of the ones before it, which then start below ``hi``."""
    for k, seg in enumerate(segments):
        if seg.start >= hi:
            break
        if not seg.size or seg.start + seg.size <= lo:
            continue
        magics = (MAGIC_V1, MAGIC_V2) if k < lenient_upto else magics_for(version)
        buf = seg.buffer()
        pos = 0
        while True:
            w = fast.walk(buf, pos, seg.size, magics, max_records=chunk)
            if len(w.offsets):
                h = fast.decode_headers(buf, w.offsets)
                n = len(h)
                bad = fast.first_invalid(h)
                if bad < n:
                    h = h.take(bad)
                phy = h.offsets + seg.start
                a, b = int(np.searchsorted(phy, lo)), int(np.searchsorted(phy, hi))
                if b > a:
                    sink(seg.start, buf, h if a == 0 and b == len(h) else h.select(slice(a, b)))
                if bad < n or b < len(h):
                    break
            pos = w.stop
            if w.kind != fast.STOP_CHUNK:
                break


def self_consistent(buf, u8, pos: int, seg_start: int, version: int, check_crc: bool = True) -> int:
    """TOTALSIZE of a self-consistent record at ``pos`` (magic, length formula, PHYSICALOFFSET
    equal to its position, body CRC), or 0."""
    if pos + 8 > len(buf):
        return 0
    h = fast.decode_headers(buf, np.asarray([pos], dtype=np.int64), u8)
    if h.magicCode[0] not in magics_for(version) or h.reason[0] != fast.R_OK:
        return 0
    size = int(h.totalSize[0])
    if size < 91 or pos + size > len(buf) or int(h.physicalOffset[0]) != seg_start + pos:
        return 0
    if check_crc and not fast.check_body_crc(buf, h)[0]:
        return 0
    return size


def resync(buf, pos: int, limit: int, seg_start: int, version: int) -> int | None:
    """Next position >= ``pos`` in this file where a self-consistent record starts (salvage)."""
    u8 = fast.as_u8(buf)
    hay = buf if hasattr(buf, "find") else bytes(buf)  # mmap.find scans without copying
    needles = [m.to_bytes(4, "big", signed=True) for m in magics_for(version)]
    cursor = pos + 4
    while True:
        hits = [hay.find(n, cursor, limit) for n in needles]
        hits = [x for x in hits if x >= 0]
        if not hits:
            return None
        k = min(hits)
        p = k - 4
        if self_consistent(buf, u8, p, seg_start, version):
            return p
        cursor = k + 1


# Reasons after which TOTALSIZE can still be trusted to find the next record.
CHAIN_INTACT = frozenset({fast.R_BODY_CRC, fast.R_PROP_CRC, fast.R_MAGIC_VERSION})


def next_by_size(buf, u8, p: int, reason: int, total_size: int, limit: int, magics) -> int | None:
    """Where the next record starts after the invalid one at ``p``, going by its TOTALSIZE (and,
    when the lengths are what failed, the size computed from its fields); None if neither
    candidate is followed by a record, a BLANK, zeros or the end of the file."""
    cands = []
    if reason in CHAIN_INTACT:
        cands.append(p + total_size)
    else:
        h = fast.decode_headers(buf, np.asarray([p], np.int64), u8)
        cands += [p + int(h.computedSize[0]), p + total_size]
    for c in cands:
        if p < c <= limit - 8:
            w = fast.walk(buf, c, limit, magics, max_records=1)
            if len(w.offsets) or w.kind in (fast.STOP_BLANK, fast.STOP_ZERO):
                return c
        elif c == limit:
            return c
    return None
