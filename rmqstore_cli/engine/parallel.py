"""``-j``: run per-segment work in forked worker processes, results merged in segment order.

Records never cross a commitlog segment (§2.6), so a contiguous range of segments is an
independent unit of work; two processes on two files scale ~1.9x on these machines
(NOTES-performance), while sharing one file's work scales much less. Workers are forked, so
they inherit the opened store (read-only mappings) and nothing has to be re-opened.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Callable, Sequence

_TASK: tuple | None = None  # (fn, args) for the forked workers


def split(n: int, parts: int) -> list[range]:
    """``range(n)`` cut into at most ``parts`` contiguous, near-equal ranges (in order)."""
    parts = max(1, min(parts, n))
    bounds = [n * k // parts for k in range(parts + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _call(part: range):
    fn, args = _TASK
    return fn(part, *args)


def map_ranges(fn: Callable, ranges: Sequence[range], jobs: int, *args, on_result: Callable | None = None,
               keep: bool = True) -> list:
    """[fn(r, *args) for r in ranges], computed by ``jobs`` forked processes, in order.

    ``on_result(range, result)`` is called in this process as each result arrives (in order);
    with ``keep=False`` results are not collected (streaming: memory stays ~``jobs`` results).
    """
    global _TASK
    if jobs <= 1 or len(ranges) <= 1:
        out = []
        for r in ranges:
            res = fn(r, *args)
            if keep:
                out.append(res)
            if on_result:
                on_result(r, res)
        return out
    _TASK = (fn, args)
    try:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(min(jobs, len(ranges))) as pool:
            out = []
            for r, res in zip(ranges, pool.imap(_call, ranges)):
                if keep:
                    out.append(res)
                if on_result:
                    on_result(r, res)
            return out
    finally:
        _TASK = None
