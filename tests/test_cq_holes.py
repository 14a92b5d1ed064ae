"""Units after the end of a consume queue (CQ_HOLE): found wherever they are, without reading the queue file's
unwritten part. Past its last unit a queue file is a hole (the broker's sparse pre-allocation) or reserved blocks
(``posix_fallocate``), and a broker with thousands of queues has as many ~6 MB files: only their data extents
are read."""

from __future__ import annotations

import mmap
import os
import struct

import numpy as np
import pytest

from rmqstore_cli.engine.log import segments
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify import queues as verify_queues
from rmqstore_cli.engine.verify.pipeline import verify_store

NAME = "4.9.3-clean"


def _used_units(path) -> tuple[int, int]:
    data = path.read_bytes()
    n = len(data) // 20
    used = next((i for i in range(n) if not any(data[i * 20:i * 20 + 20])), n)
    return used, n


def test_units_after_the_end_of_a_queue_are_a_hole(store_copy):
    """A copy of the queue's first unit three units past its end: the broker stops at the zero unit, so the
    stray unit is out of its reach; verify says so at the break, naming where the stray unit is."""
    root = store_copy(NAME)
    files = sorted(p for p in (root / "consumequeue").rglob("*") if p.is_file())
    path, used = next((p, u) for p in files for u, n in [_used_units(p)] if 0 < u and u + 4 <= n)
    data = bytearray(path.read_bytes())
    data[(used + 3) * 20:(used + 4) * 20] = data[0:20]
    path.write_bytes(bytes(data))
    with Store.open(str(root)) as st:
        holes = [f for f in verify_store(st).findings if f.code == "CQ_HOLE"]
    assert [(f.path, f.offset, f.severity) for f in holes] == [(str(path), used * 20, "error")]
    assert f"next non-zero unit at {path.name}+{(used + 3) * 20}" in holes[0].message


def test_a_clean_queue_has_no_hole(store_copy):
    root = store_copy(NAME)
    with Store.open(str(root)) as st:
        assert not [f for f in verify_store(st).findings if f.code == "CQ_HOLE"]


SIZE = 1 << 20
BASE = 4096 + 20 * 7  # where the queue's units end, inside the file's first written page


def _file(tmp_path, how: str, writes: list[int]) -> np.ndarray:
    """A queue-sized file: sparse (``ftruncate``) or reserved (``posix_fallocate``), with one non-zero byte at each
    of ``writes``; its bytes from BASE on, as verify maps them."""
    path = tmp_path / f"q-{how}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, SIZE)
        if how == "reserved":
            try:
                os.posix_fallocate(fd, 0, SIZE)
            except OSError:
                pytest.skip("no posix_fallocate on this file system")
        os.pwrite(fd, b"\0" * 20, 4096)  # the page holding the queue's last units is written
        for at in writes:
            os.pwrite(fd, b"\x07", at)
        os.fsync(fd)
        m = mmap.mmap(fd, SIZE, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    return str(path), np.frombuffer(m, np.uint8)[BASE:]


@pytest.mark.parametrize("extents", ["fiemap", "seek"])
@pytest.mark.parametrize("how", ["sparse", "reserved"])
@pytest.mark.parametrize("writes", [[], [BASE], [BASE + 19], [700_003], [300_000, 700_003], [SIZE - 1], [100]])
def test_first_non_zero_reads_only_data_extents(tmp_path, monkeypatch, extents, how, writes):
    """The first non-zero byte from BASE on, as numpy finds it in the whole range, whether the extents come from
    FIEMAP or SEEK_DATA (a file system without FIEMAP), in a sparse or a reserved file; a byte before BASE is
    not looked at."""
    if extents == "seek":
        monkeypatch.setattr(segments, "_fiemap_written", lambda *a: None)
    path, rest = _file(tmp_path, how, writes)
    nz = np.flatnonzero(rest)
    want = int(nz[0]) if len(nz) else None
    assert want == (min(w for w in writes if w >= BASE) - BASE if any(w >= BASE for w in writes) else None)
    assert verify_queues._first_non_zero(path, rest, BASE) == want


def test_first_non_zero_skips_the_unwritten_part(tmp_path, monkeypatch):
    """Only the written extents are handed to the scan: a sparse file's one written page, not its megabyte."""
    path, rest = _file(tmp_path, "sparse", [700_003])
    seen = []
    real = np.count_nonzero
    monkeypatch.setattr(verify_queues.np, "count_nonzero", lambda a: seen.append(len(a)) or real(a))
    assert verify_queues._first_non_zero(path, rest, BASE) == 700_003 - BASE
    assert sum(seen) <= 2 * 4096 < SIZE // 4, seen
