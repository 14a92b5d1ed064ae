"""``salvage -j``: the rescue of a classic commitlog spread over worker processes, segment by segment.

Records never cross a segment (§2.6) and the salvage walk resynchronises within a segment, so each segment's
walk is independent of the others: forked workers each walk whole segments (:func:`.salvage.scan_segment`),
decode and render the rescued records as ``--jsonl`` lines, and send them back in pieces of at most
:data:`PIECE_RECORDS` lines with what the piece added to the report (skipped ranges, rescued counts per queue in
order of first sight). This process writes the pieces in log order and merges the report, which gives the file
and the report of one walk byte for byte. With ``--since``/``--until`` the walk ends at the first record past the
range, as one walk does: the worker of the segment where that record lies says so and the pieces after it are
not taken (the workers are stopped).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..parallel import stream_segments
from .salvage import SalvageReport, json_line, rescue, scan_segment, time_bounds

PIECE_RECORDS = 2048  # lines a worker renders before handing them on (~5 MB of 1 KiB bodies in hex)


@dataclass
class Piece:
    """Consecutive rendered lines of one segment and what they add to the report."""

    text: str
    skipped: list
    rescued: dict
    records: int
    ended: bool = False  # the walk reached a record past ``--until``: nothing after this piece counts


def splits(store) -> bool:
    """Whether the rescue can be cut at segment (DLedger: data file) boundaries: more than one."""
    return len(store.commitlog.segments.segments) > 1


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
    segs = store.commitlog.segments.segments
    first = next((k for k, s in enumerate(segs) if s.start + s.size > start), len(segs))
    if first == len(segs):
        return
    warm_up()  # numba imported and every kernel loaded once, before the fork, not in each worker
    pieces = stream_segments(_segment_pieces, len(segs) - first, jobs, store, first, version, start, end, lo, hi)
    try:
        for piece in pieces:
            _merge(piece, f, report)
            if piece.ended:
                break
    finally:
        pieces.close()


def _segment_pieces(i: int, store, first: int, version: int, start: int, end: int | None, lo: int, hi: int):
    seg = store.commitlog.segments.segments[first + i]
    rep = SalvageReport()
    lines: list[str] = []
    for s, pos in scan_segment(store, seg, version, rep, start):
        if end is not None and s.start + pos >= end:
            yield Piece("".join(lines), rep.skipped, rep.rescued, rep.records, ended=True)
            return
        msg = rescue(s, pos, lo, hi, rep)
        if msg is None:
            continue
        lines.append(json_line(msg))
        if len(lines) >= PIECE_RECORDS:
            yield Piece("".join(lines), rep.skipped, rep.rescued, rep.records)
            rep, lines = SalvageReport(), []
    yield Piece("".join(lines), rep.skipped, rep.rescued, rep.records)


def _merge(piece: Piece, f, report: SalvageReport) -> None:
    f.write(piece.text)
    report.skipped += piece.skipped
    for key, n in piece.rescued.items():
        report.rescued[key] = report.rescued.get(key, 0) + n
    report.records += piece.records


def _write_dledger(store, f, report: SalvageReport, start: int, end: int | None, lo: int, hi: int, jobs: int) -> None:
    """A DLedger log: workers walk whole data files (:func:`..log.dledgerjobs.walk_log`), this process follows the
    entry chain and walks itself where one process would walk differently (past damage)."""
    from ..log.dledgerjobs import FilePart, LogWalk, walk_log
    from .dledgersalvage import chunk_messages, message_checks, resume_past

    cl = store.commitlog
    checks = message_checks(cl)
    items = walk_log(cl, resume_past(cl, report), LogWalk(), jobs=jobs, file_part=_dledger_pieces,
                     args=(store, start, end, lo, hi))
    try:
        for item in items:
            if isinstance(item, FilePart):
                _merge(item.item, f, report)
                if item.item.ended:
                    return
                continue
            for seg, pos in chunk_messages(cl, item, report, start, checks):
                if end is not None and seg.start + pos >= end:
                    return
                msg = rescue(seg, pos, lo, hi, report)
                if msg is not None:
                    f.write(json_line(msg))
    finally:
        items.close()


def _dledger_pieces(chunks, store, start: int, end: int | None, lo: int, hi: int):
    """In a worker: one data file's rescued messages as :class:`Piece` s."""
    from .dledgersalvage import chunk_messages, message_checks

    cl = store.commitlog
    checks = message_checks(cl)
    rep = SalvageReport()
    lines: list[str] = []
    for ec in chunks:
        for seg, pos in chunk_messages(cl, ec, rep, start, checks):
            if end is not None and seg.start + pos >= end:
                yield Piece("".join(lines), rep.skipped, rep.rescued, rep.records, ended=True)
                return
            msg = rescue(seg, pos, lo, hi, rep)
            if msg is None:
                continue
            lines.append(json_line(msg))
            if len(lines) >= PIECE_RECORDS:
                yield Piece("".join(lines), rep.skipped, rep.rescued, rep.records)
                rep, lines = SalvageReport(), []
    yield Piece("".join(lines), rep.skipped, rep.rescued, rep.records)
