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


def test_a_mapped_queue_file_is_asked_for_its_extents_once(tmp_path, monkeypatch):
    """verify maps each queue file (reading ahead its data) and then looks past its queue's end for stranded units:
    both use the extents the file system gave once, at the mapping (FIEMAP and its open are ~50 µs a file, seconds
    on a broker with tens of thousands of queue files). The findings are the same as when each asks again."""
    import shutil

    from rmqstore_cli.engine.log import segments
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store
    from tests.conftest import shared_store

    root = tmp_path / "store"
    shutil.copytree(shared_store("4.9.3-clean"), root)
    asked: list = []
    real = segments._fiemap_written

    def counting(path, start, end):
        asked.append(path)
        return real(path, start, end)

    def run():
        asked.clear()
        with Store.open(str(root)) as st:
            return [f.as_json() for f in verify_store(st).findings], sorted(asked)

    monkeypatch.setattr(segments, "_fiemap_written", counting)
    got, asked_once = run()
    queue_files = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root / "consumequeue") for f in fs)
    assert queue_files and [p for p in asked_once if "consumequeue" in p] == queue_files
    # the same verify when every caller asks the file system itself (nothing kept with the mapping)
    monkeypatch.setattr(segments.Segment, "data_extents",
                        lambda self, start=0, end=None: list(segments.data_extents(self.path, start,
                                                                                    self.size if end is None else end)))
    want, asked_each = run()
    assert got == want
    assert len([p for p in asked_each if "consumequeue" in p]) > len(queue_files)


def test_extents_are_kept_until_the_file_is_closed(tmp_path, monkeypatch):
    """What a file holds is asked once while it is open, even when the queue-file budget lets it go and it is
    mapped again; closed and written past its old data, the file is asked afresh."""
    from rmqstore_cli.engine.log import segments

    asked: list = []
    real = segments._fiemap_written
    monkeypatch.setattr(segments, "_fiemap_written", lambda *a: asked.append(a[0]) or real(*a))
    directory, data = _queue_dir(tmp_path, "consume queue")
    (seg,) = SegmentQueue(directory, SIZE, "consume queue").segments
    seg.buffer()
    seg.budget._drop(seg)  # let go, as past the budget
    assert seg._map is None
    assert bytes(seg.buffer()[:len(data)]) == data
    before = seg.data_extents()
    assert len(asked) == 1
    assert before and max(hi for _, hi in before) < 1_000_000
    assert seg.data_extents(4096, 8192) == [(4096, 8192)]
    seg.close()
    fd = os.open(seg.path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\x07" * 20, 3_000_000)
        os.fsync(fd)
    finally:
        os.close(fd)
    after = seg.data_extents()
    assert any(lo <= 3_000_000 < hi for lo, hi in after), after
    seg.buffer()
    assert seg.data_extents() == after
