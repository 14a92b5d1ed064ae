"""``salvage -j``: the rescue spread over worker processes, the lines written here in log order.

A classic log is cut into parts of :data:`PART_BYTES` bytes of a segment (records never cross a segment, §2.6).
The worker of a part starts at the first self-consistent record at or after the part's first byte (the
salvage's resynchronisation; a segment's first part at its start), walks, decodes and renders every record and
skipped range that *starts* inside the part, and sends back one :class:`Piece`: the lines, what they add to the
report (skipped ranges, rescued counts per queue in order of first sight), where it started and where the walk
stood when it left the part. The salvage walk is memoryless (a record's checks do not depend on the records
before it), so a part whose worker started where the previous part's walk left it holds exactly the lines of
one walk; where they differ (damage across a part boundary, a record look-alike inside a body) this process
walks that part itself from where the previous part's walk left it. The file and the report are those of one
walk byte for byte. With ``--since``/``--until`` the walk ends at the first record past the range, as one walk
does: the part that meets it says so and the workers are stopped.

A DLedger log is walked here (the entry chain crosses files; the walk is compiled and cheap) and the positions
of the rescued messages go to the workers in batches, for the costly part: decoding and rendering.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..log.walk import resync
from ..parallel import stream_segments
from .salvage import SalvageReport, json_line, rescue, scan_segment, time_bounds, to_jsonl

PART_BYTES = 4 << 20  # bytes of a segment per worker task (its lines: ~9 MB with 1 KiB bodies in hex)
WALK_RECORDS = 256  # records a part's walk takes at a time: it stops at the part's end, not far past it


@dataclass
class Piece:
    """Consecutive rendered lines and what they add to the report."""

    text: bytes  # the lines, UTF-8
    skipped: list
    rescued: dict
    records: int
    ended: bool = False  # the walk reached a record past ``--until``: nothing after this piece counts
    begin: int | None = None  # classic part: where in the segment its walk started (None: nothing to walk)
    next: int | None = None  # classic part: where the walk stood when it left the part (None: the segment ended)


def to_jsonl_jobs(store, version: int, path: str, since: int | None = None, until: int | None = None,
                  jobs: int = 1) -> SalvageReport:
    """:func:`.salvage.to_jsonl` with ``jobs`` worker processes rendering the lines (the same file and report)."""
    from functools import partial

    if jobs > 1 and splits(store):
        return to_jsonl(store, version, path, since=since, until=until, write=partial(write_parallel, jobs=jobs))
    return to_jsonl(store, version, path, since=since, until=until)


def splits(store) -> bool:
    """Whether the rescue can be cut: more than one segment (DLedger: data file)."""
    return len(store.commitlog.segments.segments) > 1


class _Parts:
    """The segments from ``start`` on, each cut into parts of PART_BYTES from where its walk starts."""

    def __init__(self, segs: list, start: int):
        self.segs = []  # (segment, position the walk starts at, first part number)
        n = 0
        for seg in segs:
            if seg.start + seg.size <= start or not seg.size:
                continue
            lo = max(0, start - seg.start)
            self.segs.append((seg, lo, n))
            n += -(-(seg.size - lo) // PART_BYTES)
        self.count = n

    def part(self, j: int) -> tuple:
        """(segment, first byte, end byte, first part of its segment?) of part ``j``."""
        import bisect

        k = bisect.bisect_right([first for _, _, first in self.segs], j) - 1
        seg, lo, first = self.segs[k]
        a = lo + (j - first) * PART_BYTES
        return seg, a, min(seg.size, a + PART_BYTES), j == first


def write_parallel(store, version: int, f, report: SalvageReport, start: int, since: int | None, until: int | None,
                   jobs: int) -> None:
    """What ``to_jsonl``'s walk in one process writes to ``f`` and adds to ``report``, by ``jobs`` workers."""
    from rmqstore_cli.formats.warmup import warm_up

    bounds = time_bounds(store, start, since, until)
    if bounds is None:
        return
    start, end, lo, hi = bounds
    if getattr(store.commitlog, "is_dledger", False):
        _write_dledger(store, f, report, start, end, lo, hi, jobs)
        return
    parts = _Parts(store.commitlog.segments.segments, start)
    if not parts.count:
        return
    warm_up()  # numba imported and every kernel loaded once, before the fork, not in each worker
    pieces = stream_segments(_part_piece, parts.count, jobs, store, parts, version, end, lo, hi)
    try:
        stood = None  # where the walk of the previous part left it
        for j, piece in enumerate(pieces):
            seg, a, b, first = parts.part(j)
            want = a if first else stood
            if piece.begin != want:  # the worker did not start where one walk stands: walk this part here
                piece = render_part(store, seg, version, want, b, end, lo, hi)
            _merge(piece, f, report)
            if piece.ended:
                return
            stood = piece.next
    finally:
        pieces.close()


def _part_piece(j: int, store, parts: _Parts, version: int, end: int | None, lo: int, hi: int):
    seg, a, b, first = parts.part(j)
    # a record starting in the part, if any: none (a part inside one big record) is walked here from where one
    # walk stands, which then finds nothing before the part's end
    begin = a if first else resync(seg.buffer(), a, min(seg.size, b + 8), seg.start, max(version, 5))
    yield render_part(store, seg, version, begin, b, end, lo, hi)


def render_part(store, seg, version: int, begin: int | None, b: int, end: int | None, lo: int, hi: int) -> Piece:
    """The salvage walk of ``seg`` from ``begin``: the records and skipped ranges that start before ``b``."""
    rep = SalvageReport()
    lines: list[bytes] = []
    piece = Piece(b"", rep.skipped, rep.rescued, 0, begin=begin)
    if begin is None:
        return piece
    seen = 0
    walk = scan_segment(store, seg, version, rep, seg.start + begin, WALK_RECORDS, WALK_RECORDS)
    try:
        for s, pos in walk:
            if _left(rep.skipped, seen, seg.start, b, piece):
                break
            seen = len(rep.skipped)
            if pos >= b:
                piece.next = pos
                break
            if end is not None and s.start + pos >= end:
                piece.ended = True
                break
            msg = rescue(s, pos, lo, hi, rep)
            if msg is not None:
                lines.append(json_line(msg))
        else:
            _left(rep.skipped, seen, seg.start, b, piece)
    finally:
        walk.close()
    piece.text, piece.records = b"".join(lines), rep.records
    return piece


def _left(skipped: list, seen: int, seg_start: int, b: int, piece: Piece) -> bool:
    """Whether a skipped range added since ``seen`` starts at or after ``b`` (in the next part): it is dropped from
    this part, whose walk left the part there."""
    for k in range(seen, len(skipped)):
        if skipped[k][0] >= seg_start + b:
            piece.next = skipped[k][0] - seg_start
            del skipped[k:]
            return True
    return False


def _merge(piece: Piece, f, report: SalvageReport) -> None:
    f.write(piece.text)
    report.skipped += piece.skipped
    for key, n in piece.rescued.items():
        report.rescued[key] = report.rescued.get(key, 0) + n
    report.records += piece.records


def _write_dledger(store, f, report: SalvageReport, start: int, end: int | None, lo: int, hi: int, jobs: int) -> None:
    """A DLedger log: this process walks the entries and checks their messages (the salvage's own walk, compiled
    and vectorised: ~1 s per GiB) and hands the positions of the rescued messages to the workers in batches of
    :data:`BATCH_RECORDS`, :data:`WINDOW_BATCHES` batches at a time; the workers decode and render them (the
    ~20 s per GiB), one piece per batch, written here in order. The entry chain never leaves this process."""
    from rmqstore_cli.formats.warmup import warm_up

    from .dledgersalvage import scan_dledger

    segs = store.commitlog.segments.segments
    number = {id(seg): k for k, seg in enumerate(segs)}
    warm_up()  # numba imported and every kernel loaded once, before the forks, not in each worker
    batches: list = []  # (segment number, positions) of the window being gathered
    current: list = []
    seg_of = None
    for seg, pos in scan_dledger(store, report, start):  # the skipped ranges go to report here, in log order
        if end is not None and seg.start + pos >= end:
            break
        k = number[id(seg)]
        if current and (k != seg_of or len(current) >= BATCH_RECORDS):
            batches.append((seg_of, current))
            current = []
            if len(batches) >= WINDOW_BATCHES:
                _render_batches(store, batches, f, report, lo, hi, jobs)
                batches = []
        seg_of = k
        current.append(pos)
    if current:
        batches.append((seg_of, current))
    _render_batches(store, batches, f, report, lo, hi, jobs)


BATCH_RECORDS = 2048  # DLedger: messages a worker renders per batch (one piece)
WINDOW_BATCHES = 64  # DLedger: batches gathered before the workers render them (positions held: ~1 MB)


def _render_batches(store, batches: list, f, report: SalvageReport, lo: int, hi: int, jobs: int) -> None:
    if not batches:
        return
    pieces = stream_segments(_batch_piece, len(batches), jobs, store, batches, lo, hi)
    try:
        for piece in pieces:
            _merge(piece, f, report)  # no skipped range: the walk here added them, in order
    finally:
        pieces.close()


def _batch_piece(i: int, store, batches: list, lo: int, hi: int):
    k, positions = batches[i]
    seg = store.commitlog.segments.segments[k]
    rep = SalvageReport()
    lines = []
    for pos in positions:
        msg = rescue(seg, pos, lo, hi, rep)
        if msg is not None:
            lines.append(json_line(msg))
    yield Piece(b"".join(lines), [], rep.rescued, rep.records)
