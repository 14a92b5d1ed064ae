"""probes.nonzero_after (does a file hold a non-zero byte from a position on?) skips holes: checked against the
file's bytes read whole, on sparse and dense files with data at seeded places (the seed is printed)."""

from __future__ import annotations

import mmap
import os
import random

from rmqstore_cli.engine.repair.probes import file_has_data, nonzero_after

SEED = int(os.environ.get("RMQSTORE_PROBES_SEED", random.randrange(1 << 30)))


def _write(path, size: int, data: dict[int, bytes], sparse: bool) -> bytes:
    with open(path, "wb") as f:
        if sparse:
            f.truncate(size)
        else:
            f.write(bytes(size))
        for at, b in data.items():
            f.seek(at)
            f.write(b)
    with open(path, "rb") as f:
        return f.read()


def test_nonzero_after_agrees_with_the_bytes(tmp_path):
    print(f"seed {SEED} (RMQSTORE_PROBES_SEED)")
    rng = random.Random(SEED)
    path = tmp_path / "f"
    for case in range(24):
        size = rng.choice((0, 1, 4096, 65536, 3 << 20, (5 << 20) + 17))
        data = {}
        for _ in range(rng.randrange(4)):
            if size:
                at = rng.choice((0, size - 1, rng.randrange(size), (1 << 20) - 1, 1 << 20, 4096 * 9 + 3))
                if at < size:
                    data[at] = bytes([rng.randrange(1, 256)])
        if size and rng.random() < 0.2:
            data[rng.randrange(size)] = b"\0"  # a zero written into a hole: data, but all zeros
        raw = _write(path, size, data, sparse=rng.random() < 0.7)
        for pos in {0, size, size + 5, *(rng.randrange(size + 1) for _ in range(5)), *data, *(k + 1 for k in data)}:
            want = any(raw[pos:])
            assert nonzero_after(str(path), pos) == want, (case, size, sorted(data), pos)
        assert file_has_data(str(path)) == any(raw)


def test_missing_file_has_no_data(tmp_path):
    assert not nonzero_after(str(tmp_path / "none"), 0)


def test_first_unit_is_the_first_hit_of_the_whole_file_test(monkeypatch):
    """first_unit (block by block) against the test on the whole array, with small blocks so hits fall on,
    before and after block edges (the seed is printed)."""
    import numpy as np

    from rmqstore_cli.engine.derived.consumequeue import CQ_DTYPE
    from rmqstore_cli.engine.repair import probes

    print(f"seed {SEED} (RMQSTORE_PROBES_SEED)")
    rng = np.random.default_rng(SEED)
    monkeypatch.setattr(probes, "UNIT_BLOCK", 7)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        units = np.zeros(n, dtype=CQ_DTYPE)
        units["phyOffset"] = rng.integers(-3, 1000, n)
        units["size"] = rng.integers(-2, 50, n)
        hits = np.flatnonzero((units["phyOffset"] < 0) | (units["size"] <= 0))
        assert probes.first_unit(units, probes.invalid_unit) == (int(hits[0]) if len(hits) else n)
        lim = int(rng.integers(0, 1000))
        hits = np.flatnonzero((units["phyOffset"] >= lim) & (units["size"] > 0))
        assert probes.first_unit(units, lambda u: (u["phyOffset"] >= lim) & (u["size"] > 0)) == (int(hits[0]) if len(hits) else n)


def test_reserved_blocks_are_not_read(tmp_path, monkeypatch):
    """A queue file this tool wrote is reserved whole (posix_fallocate): its blocks past the data are unwritten
    extents, which SEEK_DATA reports as data. They read as zeros and are skipped, not read (6 MB a queue file);
    a byte written far into the file is still found."""
    from rmqstore_cli.engine.log.segments import data_extents
    from rmqstore_cli.engine.repair import probes

    path = tmp_path / "00000000000000000000"
    size = 6_000_000
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        os.pwrite(fd, b"\x01" * 2000, 0)
        os.fsync(fd)
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as m:  # its zero pages now in the page cache, as after
            assert m[:: mmap.PAGESIZE].count(0) >= size // mmap.PAGESIZE - 1  # a read of the file
    finally:
        os.close(fd)
    read = []
    real = os.pread

    def counting(fd, n, pos):
        b = real(fd, n, pos)
        read.append(len(b))
        return b

    monkeypatch.setattr(probes.os, "pread", counting)
    assert not nonzero_after(str(path), 2000)
    if [hi for _, hi in data_extents(str(path), 2000, size)][-1:] == [size]:
        return  # this file system reports no unwritten extents (no FIEMAP): nothing to skip here
    assert sum(read) < 1 << 16, sum(read)
    with open(path, "r+b") as f:
        f.seek(5_000_000)
        f.write(b"\x07")
    assert nonzero_after(str(path), 2000)
