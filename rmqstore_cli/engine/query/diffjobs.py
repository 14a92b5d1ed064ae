"""``diff -j``: the long parts of a diff of two classic stores spread over worker processes.

* Each side's valid end: the walk of ``stats -j`` (:func:`.statsjobs.scan_parallel`: workers walk whole segments,
  this process stops at the first segment whose walk did not end with a BLANK), with nothing totalled.
* The bytes both logs hold: cut into :data:`TASK`-byte ranges that workers compare (the windows of one
  process, on the read-only mappings) in order; each sends back only the first differing offset of its range,
  or None. The first range with a difference gives the divergence, as the walk in one process finds it: the
  ranges before it hold no difference, and a range starts where one process would stand at that offset (a
  window ends at every file end, so a missing file is met at the same offset).
* The index files both sides hold: their digests computed by the workers, a file each.

Records, bytes and digests stay in the workers: what crosses is an offset or a hash per range or file.
"""

from __future__ import annotations

import numpy as np

WINDOW = 8 << 20  # bytes compared at a time (numpy on the read-only mappings): memory does not grow with the log
TASK = 8 * WINDOW  # bytes of the logs a worker compares per task (64 MiB)


class _NoTotals:
    """The per-segment accumulator of :func:`.statsjobs.scan_parallel`, for a walk that only wants the log's end."""

    def add_chunk(self, buf, headers) -> None:
        pass

    def merge(self, other) -> None:
        pass


def find_end(cl, jobs: int):
    """``cl.find_end(check_crc=False)`` (the end, its kind, the records before it), by ``jobs`` workers."""
    from . import statsjobs
    from ..log.commitlog import ScanResult

    if jobs <= 1 or not statsjobs.splits(cl):
        return cl.find_end(check_crc=False)
    res = ScanResult()
    statsjobs.scan_parallel(cl, _NoTotals(), res, jobs)
    return res


def first_difference(cla, clb, lo: int, hi: int, progress, jobs: int = 1) -> tuple[int | None, int]:
    """(the first offset in [lo, hi) where the logs differ or one has no file, or None; the bytes compared before
    it), by ``jobs`` workers (TASK bytes each) or in this process."""
    if jobs <= 1:
        return compare_range(cla, clb, lo, hi, progress)
    from ..parallel import stream_segments

    starts = list(range(lo, hi, TASK))
    first = None
    found = stream_segments(_compare_task, len(starts), jobs, cla, clb, starts, hi)
    try:
        for k, (at, _) in enumerate(found):
            if at is not None:
                first = at
                break
            if progress:
                progress(min(hi, starts[k] + TASK) - starts[k])
    finally:
        found.close()
    return first, (first if first is not None else max(hi, lo)) - lo


def _compare_task(k: int, cla, clb, starts: list, hi: int):
    a = starts[k]
    yield compare_range(cla, clb, a, min(hi, a + TASK), None)  # a tuple: a bare None ends a stream's task


def compare_range(cla, clb, lo: int, hi: int, progress) -> tuple[int | None, int]:
    """The walk of one process over [lo, hi): window by window, each ending at the end of either side's file."""
    pos, compared = lo, 0
    while pos < hi:
        sa, sb = cla.segments.find(pos), clb.segments.find(pos)
        if sa is None or sb is None:
            return pos, compared  # one side has no file here: the logs cannot agree
        stop = min(hi, sa.start + sa.size, sb.start + sb.size, pos + WINDOW)
        if stop <= pos:
            return pos, compared
        va = np.frombuffer(sa.buffer(), np.uint8, count=stop - pos, offset=pos - sa.start)
        vb = np.frombuffer(sb.buffer(), np.uint8, count=stop - pos, offset=pos - sb.start)
        ne = np.flatnonzero(va != vb)
        del va, vb
        if len(ne):
            return pos + int(ne[0]), compared + int(ne[0])
        compared += stop - pos
        if progress:
            progress(stop - pos)
        pos = stop
    return None, compared


def digests(paths: list, jobs: int, digest) -> dict:
    """{path: digest(path)} for each index file path, by ``jobs`` workers (a file each)."""
    from ..parallel import map_ranges
    from types import SimpleNamespace

    files = [SimpleNamespace(path=p) for p in dict.fromkeys(paths)]
    got = map_ranges(_digest_range, [range(k, k + 1) for k in range(len(files))], jobs, files, digest)
    return {f.path: h for f, h in zip(files, got)}


def _digest_range(part: range, files: list, digest):
    return digest(files[part.start])
