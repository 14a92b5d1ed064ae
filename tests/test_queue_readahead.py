"""Queue files are mapped to read ahead only their data: past its last unit a queue file is a hole of several MB
(the broker's sparse pre-allocation), and a fault in a plain mapping reads the device's whole read-ahead window
around it (8 MB on some disks), zero-filling the hole into the page cache for every queue of the store."""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

from rmqstore_cli.engine.log.segments import SegmentQueue, data_extents

PAGE = mmap.PAGESIZE
SIZE = 6_000_000  # the broker's default consume-queue file: 300,000 units


def _resident(m) -> int:
    """Pages of the mapping's file range that are in the page cache (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    n = (len(m) + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * n)()
    addr = np.frombuffer(m, np.uint8).ctypes.data
    assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(len(m)), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec)


def _queue_dir(tmp_path, kind: str):
    d = tmp_path / kind.replace(" ", "-")
    d.mkdir()
    path = d / ("%020d" % 0)
    data = bytes(range(256)) * 32  # 8 KB of units, then the hole
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, SIZE)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold, as after a restart
    finally:
        os.close(fd)
    return str(d), data


def test_a_cold_queue_file_reads_ahead_only_its_data(tmp_path):
    """At most the pages the file system reports as data (on ext4 here: the 8 KB written) are in the page cache,
    plus the few the reads fault in; a file system that cannot tell data from holes reports the whole file."""
    for kind in ("consume queue", "batch consume queue"):
        directory, data = _queue_dir(tmp_path, kind)
        (seg,) = SegmentQueue(directory, SIZE, kind).segments
        data_pages = sum(-(-hi // PAGE) - lo // PAGE for lo, hi in data_extents(seg.path, 0, SIZE))
        m = seg.buffer()
        assert bytes(m[:len(data)]) == data and not any(m[len(data):len(data) + 4 * PAGE])
        assert _resident(m) <= data_pages + 4, (kind, data_pages)


def test_a_commitlog_file_is_still_read_sequentially(tmp_path):
    """The log is walked front to back: its mapping keeps the sequential read-ahead."""
    directory, data = _queue_dir(tmp_path, "commitlog")
    (seg,) = SegmentQueue(directory, SIZE, "commitlog").segments
    assert not seg.data_ahead
    assert bytes(seg.buffer()[:len(data)]) == data
