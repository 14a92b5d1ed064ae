"""``stats -j``: the commitlog walk of ``stats`` spread over worker processes, segment by segment.

The walk follows the broker's ``CommitLog`` (a BLANK marker moves on to the next file; anything else ends the
log). Records never cross a segment, so forked workers each walk whole segments into their own
:class:`.stats.StatsAccumulator` and send it back with where the segment's walk stopped; this process merges
them in log order and stops at the first segment whose walk did not end with a BLANK, as one walk would (the
segments after it are not counted). An accumulator is a row per queue plus bounded time keys: nothing per record
crosses processes.
"""

from __future__ import annotations

import dataclasses

from rmqstore_cli.formats import fast


def splits(cl) -> bool:
    """Whether the walk can be cut at segment boundaries (a DLedger log: at data files, :mod:`.dledgerstats`)."""
    return len(cl.segments.segments) > 1


def scan_parallel(cl, acc, res, jobs: int) -> None:
    """What ``for chunk in cl.scan(check_crc=False, result=res): acc.add_chunk(...)`` gives, by ``jobs`` workers."""
    from rmqstore_cli.formats.warmup import warm_up

    if getattr(cl, "is_dledger", False):
        from .dledgerstats import scan_parallel as scan_dledger

        scan_dledger(cl, acc, res, jobs)
        return

    from ..parallel import stream_segments

    segs = cl.segments.segments
    warm_up()  # numba imported and every kernel loaded once, before the fork, not in each worker
    parts = stream_segments(_segment_stats, len(segs), jobs, cl, type(acc))
    try:
        for i, (part, stop, blanks, records, nbytes) in enumerate(parts):
            acc.merge(part)
            res.blanks += blanks
            res.records += records
            res.bytes += nbytes
            if stop.kind != fast.STOP_BLANK or i + 1 == len(segs):  # the log ends in this segment
                res.stop = dataclasses.replace(stop, segment=segs[i])
                return
    finally:
        parts.close()


def _segment_stats(i: int, cl, accumulator: type):
    from ..log.commitlog import ScanResult

    acc = accumulator()
    res = ScanResult()
    for chunk in cl.scan(start_index=i, end_index=i + 1, check_crc=False, result=res, stop_at_invalid=False):
        acc.add_chunk(chunk.buf, chunk.headers)
    yield acc, dataclasses.replace(res.stop, segment=None), res.blanks, res.records, res.bytes
