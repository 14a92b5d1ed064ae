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


def queue_key(number, queue_id):
    """A queue as one int64: ``number`` (a topic's or queue name's index) << 32 | ``queue_id`` as uint32 (a Java
    int; negative ids keep their bits). Arrays or ints."""
    return (number << 32) | (queue_id & 0xFFFFFFFF)


def queue_of_key(key: int) -> tuple[int, int]:
    """(number, queue id) of a :func:`queue_key` (an int): the queue id signed again, as the Java int it was."""
    q = key & 0xFFFFFFFF
    return key >> 32, q - (1 << 32) if q >= 1 << 31 else q


def packed_rows(*cols: np.ndarray) -> np.ndarray:
    """Row ``i`` of the int64 columns ``cols`` as one comparable value each (8 bytes per column), for set
    operations on tuples (``np.isin``)."""
    out = np.empty((len(cols[0]), len(cols)), np.int64)
    for j, c in enumerate(cols):
        out[:, j] = c
    return out.view(np.dtype((np.void, 8 * len(cols)))).ravel()


def distinct_rows(rows: np.ndarray) -> np.ndarray:
    """The distinct rows of a 2-d array in sorted order, as ``np.unique(rows, axis=0)`` gives them."""
    return np.unique(rows, axis=0, return_index=True)[0]


def sampled_runs(entries: np.ndarray, w: int, keys: np.ndarray, units: np.ndarray, s0: np.ndarray, s1: np.ndarray,
                 n: np.ndarray, cursor: np.ndarray, stride: int) -> tuple:
    """(first unit, end unit) per file ``entries`` that can hold its units pointing into window ``w``. A file whose
    units' windows never go down has samples: its every k-th unit's window, all files' in one sorted column ``keys``
    (file * ``stride`` + window + 1) with the units in ``units``, file e's at ``s0[e] .. s1[e] - 1`` (-1: no samples,
    the whole file, ``n[e]`` units). Such a file's run lies between the last sample before the window (or its
    ``cursor``, where its previous window's units ended, if later) and the first sample after it."""
    first = np.zeros(len(entries), np.int64)
    stop = n[entries]
    sampled = s0[entries] >= 0
    if sampled.any():
        s = entries[sampled]
        key = s * stride + (w + 1)
        j0 = np.searchsorted(keys, key, "left") - 1  # the last sample before the window
        j1 = np.searchsorted(keys, key, "right")  # the first after it
        top = len(units) - 1
        first[sampled] = np.maximum(np.where(j0 >= s0[s], units[np.clip(j0, 0, top)], 0), cursor[s])
        stop[sampled] = np.where(j1 < s1[s], units[np.clip(j1, 0, top)], n[s])
    return first, stop
