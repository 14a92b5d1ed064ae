"""Byte-level steps of a repair on one file: where its data ends, and zeroing a range durably."""

from __future__ import annotations

import os

ZERO_CHUNK = bytes(1 << 20)


def last_nonzero(path: str, pos: int) -> int:
    """Offset just past the last non-zero byte at or after ``pos`` (= pos if none)."""
    end = pos
    with open(path, "rb") as f:
        f.seek(pos)
        off = pos
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            s = b.rstrip(b"\0")
            if s:
                end = off + len(s)
            off += len(b)
    return end


def zero_range(path: str, start: int, end: int) -> None:
    with open(path, "r+b") as f:
        f.seek(start)
        left = end - start
        while left > 0:
            n = min(left, len(ZERO_CHUNK))
            f.write(ZERO_CHUNK[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
