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

from .diff import WINDOW, StoreDiff, _first_difference

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


def first_difference(cla, clb, lo: int, hi: int, d: StoreDiff, progress, jobs: int) -> int | None:
    """The first offset in [lo, hi) where the logs differ (or one has no file), by ``jobs`` workers; counts the
    bytes compared before it into ``d`` as one process does."""
    from ..parallel import stream_segments

    starts = list(range(lo, hi, TASK))
    first = None
    found = stream_segments(_compare_range, len(starts), jobs, cla, clb, starts, hi)
    try:
        for k, (at,) in enumerate(found):
            if at is not None:
                first = at
                break
            if progress:
                progress(min(hi, starts[k] + TASK) - starts[k])
    finally:
        found.close()
    d.compared_bytes += (first if first is not None else max(hi, lo)) - lo
    return first


def _compare_range(k: int, cla, clb, starts: list, hi: int):
    a = starts[k]
    # a tuple: a bare None is how a stream's worker says a task is done
    yield (_first_difference(cla, clb, a, min(hi, a + TASK), StoreDiff("", ""), None),)


def digests(paths: list, jobs: int, digest) -> dict:
    """{path: digest(path)} for each index file path, by ``jobs`` workers (a file each)."""
    from ..parallel import map_ranges
    from types import SimpleNamespace

    files = [SimpleNamespace(path=p) for p in dict.fromkeys(paths)]
    got = map_ranges(_digest_range, [range(k, k + 1) for k in range(len(files))], jobs, files, digest)
    return {f.path: h for f, h in zip(files, got)}


def _digest_range(part: range, files: list, digest):
    return digest(files[part.start])
