"""Array helpers the engine shares.

``distinct`` stands in for a bare ``np.unique``: numpy 2.3 and later check every bare ``np.unique`` call for a
masked array, and that check imports ``numpy.ma`` (with ``inspect`` and a regular-expression compile) the first
time: ~25 ms, a tenth of a command's start on the demo store. The calls that ask for indexes or counts skip
that check and stay as they are.
"""

from __future__ import annotations

import numpy as np


def distinct(values) -> np.ndarray:
    """The sorted distinct values of ``values`` (flattened), as ``np.unique(values)`` gives them."""
    a = np.sort(np.ravel(np.asarray(values)))
    if len(a) < 2:
        return a
    keep = np.empty(len(a), dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def distinct_rows(rows: np.ndarray) -> np.ndarray:
    """The distinct rows of a 2-d array in sorted order, as ``np.unique(rows, axis=0)`` gives them."""
    return np.unique(rows, axis=0, return_index=True)[0]
