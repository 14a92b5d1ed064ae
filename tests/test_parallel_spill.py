"""Spilled ``stream_segments`` items (pickle protocol 5, the numpy columns written out of band and read back as
views into one buffer per item) come back equal to what the worker made: every dtype, empty and non-contiguous
arrays, nested containers, arrays that share memory, and each array writable and aligned as a numba kernel wants."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from rmqstore_cli.engine.parallel import _spilled_pieces, _unspill, _write_all, stream_segments

SEED = random.randrange(1 << 30)


def _item(i: int):
    rng = np.random.default_rng(SEED + i)
    n = int(rng.integers(0, 5000))
    base = rng.integers(-(1 << 62), 1 << 62, n, dtype=np.int64)
    return {
        "i": i,
        "i64": base,
        "i32": (base >> 33).astype(np.int32),
        "i16": (base >> 49).astype(np.int16),
        "u8": rng.integers(0, 256, int(rng.integers(0, 77)), dtype=np.uint8),
        "b": rng.integers(0, 2, n).astype(bool),
        "f": rng.random(3),
        "strided": base[::3],  # not contiguous: travels inside the pickle
        "empty": np.zeros(0, np.int64),
        "rec": np.zeros(4, dtype=[("a", ">i4"), ("b", "<i8")]),
        "names": ["T%d" % k for k in range(int(rng.integers(0, 5)))],
        "nested": (base[:7].copy(), None, [np.arange(3, dtype=np.int16)]),
        "none": None,
    }


def _segment_items(i: int):
    for k in range(3):
        yield _item(10 * i + k)


def _assert_same(got, want) -> None:
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
        if got.size and got.flags.c_contiguous:
            assert got.flags.writeable and got.ctypes.data % got.dtype.alignment == 0
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            _assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _assert_same(a, b)
    else:
        assert got == want


def test_spilled_form_round_trips(tmp_path):
    print(f"seed {SEED}")
    path = tmp_path / "items"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        places, at = [], 0
        for i in range(40):
            pieces = _spilled_pieces(_item(i))
            size = sum(len(memoryview(p).cast("B")) for p in pieces)
            _write_all(fd, pieces)
            places.append((at, size))
            at += size
        assert os.path.getsize(path) == at
        for i, (off, size) in reversed(list(enumerate(places))):
            got = _unspill(fd, off, size)
            _assert_same(got, _item(i))
            got["i64"][:1] = 5  # writable views of the read buffer
    finally:
        os.close(fd)


@pytest.mark.parametrize("jobs", [1, 2])
def test_spilled_stream_items_equal_the_made_ones(jobs, tmp_path):
    print(f"seed {SEED}")
    got = list(stream_segments(_segment_items, 5, jobs, spill=str(tmp_path), balance=True))
    want = [it for i in range(5) for it in _segment_items(i)]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        _assert_same(a, b)
    assert os.listdir(tmp_path) == []
