"""Records per time key (store time // unit) for the stats timeline, as two int64 arrays sorted by key.

About 16 bytes a key where a dict of Python ints took ~90: the bound on keys (``stats.SECOND_KEYS_LIMIT``)
then costs ~1.6 MB instead of ~9 MB, so the accumulator's memory does not visibly follow the store's size
while the key count climbs to that bound. Store times mostly rise along a commitlog, so a chunk's keys
usually go after the last one (an append); anything else (clock steps back, partial accumulators merged)
is merged by sorting.
"""

from __future__ import annotations

import numpy as np


class TimeCounts:
    """A sorted multiset of time keys with their record counts."""

    def __init__(self) -> None:
        self._keys = np.empty(0, np.int64)
        self._counts = np.empty(0, np.int64)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict:  # partial accumulators travel between processes: no spare capacity
        return {"keys": self.keys.copy(), "counts": self.counts.copy()}

    def __setstate__(self, state: dict) -> None:
        self._keys, self._counts = state["keys"], state["counts"]
        self.n = len(self._keys)

    @property
    def keys(self) -> np.ndarray:
        return self._keys[:self.n]

    @property
    def counts(self) -> np.ndarray:
        return self._counts[:self.n]

    def as_dict(self) -> dict[int, int]:
        return dict(zip(self.keys.tolist(), self.counts.tolist()))

    def add(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Adds ``counts`` records at ``keys`` (sorted, distinct)."""
        if not len(keys):
            return
        keys = np.asarray(keys, np.int64)
        counts = np.asarray(counts, np.int64)
        n = self.n
        if n and keys[0] <= self._keys[n - 1]:
            if keys[0] == self._keys[n - 1] and (len(keys) == 1 or keys[1] > keys[0]):
                self._counts[n - 1] += counts[0]
                keys, counts = keys[1:], counts[1:]
            else:
                self._replace(np.concatenate((self.keys, keys)), np.concatenate((self.counts, counts)))
                return
        self._append(keys, counts)

    def merge(self, other: "TimeCounts", factor: int = 1) -> None:
        """Adds ``other``'s counts, its keys divided by ``factor`` (a finer unit folded into this one's)."""
        if other.n:
            self._replace(np.concatenate((self.keys, other.keys // factor)), np.concatenate((self.counts, other.counts)))

    def coarsen(self, factor: int) -> None:
        """Every key divided by ``factor``, the counts of keys that meet added up."""
        if self.n:
            self._fold(self.keys // factor, self.counts)

    def _append(self, keys: np.ndarray, counts: np.ndarray) -> None:
        n, m = self.n, len(keys)
        if n + m > len(self._keys):
            size = max(1024, 2 * (n + m))
            self._keys = np.concatenate((self._keys[:n], np.empty(size - n, np.int64)))
            self._counts = np.concatenate((self._counts[:n], np.empty(size - n, np.int64)))
        self._keys[n:n + m] = keys
        self._counts[n:n + m] = counts
        self.n = n + m

    def _replace(self, keys: np.ndarray, counts: np.ndarray) -> None:
        order = np.argsort(keys, kind="stable")
        self._fold(keys[order], counts[order])

    def _fold(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Keys sorted (repeats allowed) -> this structure, repeats summed."""
        starts = np.concatenate(([0], np.flatnonzero(np.diff(keys)) + 1)) if len(keys) else np.empty(0, np.int64)
        self._keys = keys[starts].copy()
        self._counts = np.add.reduceat(counts, starts) if len(starts) else np.empty(0, np.int64)
        self.n = len(self._keys)
