"""Page-cache aids of rebuild change no byte of the files it writes:

1. ``rebuild -j``'s workers start the write-back of the queue units they wrote as they go
   (engine/derived/cqdirect.QueueFiles.start_writeback): only whole pages inside the file, already written;
   the queue files are the broker's.
2. the index writer faults in the pages of the entries it is about to write in one call
   (engine/log/writeback.populate_write, MADV_POPULATE_WRITE): the rebuilt index files are the broker's,
   with the advice taken for every batch and with a kernel that refuses it.
"""

from __future__ import annotations

import mmap
import os

import pytest

from rmqstore_cli.engine.derived import cqdirect
from rmqstore_cli.engine.log import writeback

from .conftest import copy_store
from .test_rebuild import rebuild_all_matches_broker


def _rebuild_matches_broker(name: str, root, jobs: int = 1) -> None:
    rebuild_all_matches_broker(name, root, "--yes", "-j", str(jobs))


@pytest.mark.parametrize("refused", [False, True], ids=["advice-taken", "kernel-refuses"])
def test_populated_index_pages_change_no_byte(refused, tmp_path, monkeypatch):
    calls = []
    real = mmap.mmap.madvise

    class Spy:
        """The mapping's madvise, recorded (and refused as an old kernel does, with ``refused``)."""

        def __init__(self, mm):
            self.mm = mm

        def __len__(self):
            return len(self.mm)

        def madvise(self, option, start, length):
            calls.append((option, start, length, len(self.mm)))
            if refused:
                raise OSError(22, "Invalid argument")
            return real(self.mm, option, start, length)

    populate = writeback.populate_write
    monkeypatch.setattr(writeback, "POPULATE_MIN", 1)  # every batch, however small the broker's stores are
    monkeypatch.setattr(writeback, "_populate", [True])
    from rmqstore_cli.engine.derived import indexwriter

    monkeypatch.setattr(indexwriter, "populate_write", lambda mm, start, n: populate(Spy(mm), start, n))
    _rebuild_matches_broker("4.9.3-clean", copy_store("4.9.3-clean", tmp_path / "store"))
    assert calls
    for option, start, length, size in calls:
        assert start % mmap.PAGESIZE == 0 and length > 0 and start + length <= size
    if refused:
        assert len(calls) == 1 and writeback._populate == [False]  # asked once, then left to the page faults


def test_workers_writeback_of_queue_units_changes_no_byte(tmp_path, monkeypatch):
    """A multi-segment broker store through the workers' path with a write-back after every write; the calls the
    workers make (other processes) are written down in a file, as the test process cannot see them otherwise."""
    log = tmp_path / "calls"
    parent = os.getpid()
    real = writeback._sync_file_range()

    def record(fd, start, n, flags):
        size = os.fstat(fd).st_size
        assert 0 <= start and start + n <= size, (start, n, size)
        if os.getpid() != parent:
            with open(log, "a") as f:
                f.write(f"{start} {n}\n")
        return real(fd, start, n, flags) if real is not None else 0

    from rmqstore_cli.engine.repair import rebuild as rebuild_mod, rebuildwalk

    monkeypatch.setattr(rebuildwalk, "_new_spill", lambda store: None)  # the workers' path, not verify's walk
    monkeypatch.setattr(cqdirect, "WRITEBACK_BYTES", 1)
    monkeypatch.setattr(rebuild_mod, "_sync_file_range", lambda: record)
    root = copy_store("5.3.3-clean", tmp_path / "store")
    assert len(os.listdir(root / "commitlog")) > 1  # the workers' path needs more than one segment
    _rebuild_matches_broker("5.3.3-clean", root, jobs=2)
    calls = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    ranges = [(start, n) for start, n in calls if n]  # n = 0: a whole file, as each is closed
    assert ranges  # started as the units were written, not only at the end
    assert all(start % mmap.PAGESIZE == 0 and n % mmap.PAGESIZE == 0 for start, n in ranges)


def test_queue_files_start_writeback_of_whole_written_pages(tmp_path):
    """In process: the pages handed over are those fully written since the last call, none past them."""
    seen = []
    files = cqdirect.QueueFiles(str(tmp_path), 64 * mmap.PAGESIZE, lambda fd, lo, n, flags: seen.append((lo, n)))
    import numpy as np

    page = mmap.PAGESIZE
    files.write("T", 0, 0, np.ones(2 * page + 100, np.uint8))
    files.start_writeback()
    assert seen == [(0, 2 * page)]  # the third page is not complete yet
    seen.clear()
    files.write("T", 0, 2 * page + 100, np.ones(page, np.uint8))
    files.start_writeback()
    assert seen == [(2 * page, page)]
    seen.clear()
    files.start_writeback()
    assert seen == []  # nothing written since
    files.close()
    data = open(tmp_path / "consumequeue" / "T" / "0" / "00000000000000000000", "rb").read()
    assert data[:3 * page + 100] == b"\1" * (3 * page + 100) and data[3 * page + 100:] == bytes(len(data) - 3 * page - 100)


def _resident(addr: int, size: int) -> list[bool]:
    """mincore(2): which pages of [addr, addr + size) are in memory."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    pages = -(-size // mmap.PAGESIZE)
    vec = ctypes.create_string_buffer(pages)
    assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
    return [bool(b & 1) for b in vec.raw]


@pytest.mark.parametrize("refused", [False, True], ids=["advice-taken", "kernel-refuses"])
def test_populate_ahead_faults_in_the_next_window_and_changes_no_byte(refused, tmp_path, monkeypatch):
    """writeback.PopulateAhead (recover -j's index writes): after a write of the first pages, the thread has faulted
    in the window after them; no byte of the file changes; a kernel that refuses the advice leaves the pages alone."""
    import numpy as np

    page = mmap.PAGESIZE
    monkeypatch.setattr(writeback, "_populate", [True])
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.truncate(64 * page)  # sparse, as a fresh index file
        f.seek(40 * page)
        f.write(b"\x7f" * page)  # a page with bytes in it: kept as they are
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, 64 * page)
    u8 = np.frombuffer(mm, np.uint8)
    assert not any(_resident(u8.ctypes.data, 32 * page)[8:])
    ahead = writeback.PopulateAhead(u8.ctypes.data, len(mm), window=32 * page)
    if refused:
        ahead._madvise = lambda addr, n, advice: -1
    ahead.before_write(0, 16 * page)  # the writer is about to write pages 0-15: the thread takes 16-47
    ahead.stop()
    resident = _resident(u8.ctypes.data, 64 * page)
    if refused:
        assert writeback._populate == [False] and not any(resident[16:40])
    else:
        assert all(resident[:48]) and ahead.asked == 48 * page
    data = bytes(mm)
    assert data[:40 * page] == bytes(40 * page) and data[40 * page:41 * page] == b"\x7f" * page
    assert data[41 * page:] == bytes(23 * page)
    del u8
    mm.close()
    os.close(fd)


def test_recover_j_writes_the_index_with_the_thread_ahead(tmp_path, monkeypatch):
    """recover -j 2 re-dispatching from the plan's columns writes the index with the thread ahead (every batch asks
    it: POPULATE_MIN 1); its files, output and exit code are -j 1's, which writes with no thread."""
    import random
    from pathlib import Path

    from typer.testing import CliRunner

    from rmqstore_cli.app import app
    from rmqstore_cli.engine.derived import indexwriter

    from .conftest import json_lines
    from .fuzzlib import tree_bytes
    from .test_recover_queues_complete import crash_copy

    started = []
    real_init = writeback.PopulateAhead.__init__

    def init(self, *args, **kwargs):
        started.append(args)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(writeback.PopulateAhead, "__init__", init)
    monkeypatch.setattr(writeback, "POPULATE_MIN", 1)
    monkeypatch.setattr(writeback, "_populate", [True])
    assert indexwriter.PopulateAhead is writeback.PopulateAhead
    root, results = tmp_path / "store", {}
    for jobs in (1, 2):
        crash_copy("5.3.3-clean", root, "crash", random.Random(0))  # at the same path: the plan prints it
        started.clear()
        r = CliRunner().invoke(app, ["recover", str(root), "--json", "--backup-dir", str(tmp_path / f"bak{jobs}"),
                                     "-j", str(jobs)])
        lines = [{k: v for k, v in o.items() if k != "backup"} for o in json_lines(r.stdout)]
        results[jobs] = (r.exit_code, lines, tree_bytes(Path(root)), len(started))
        root.rename(tmp_path / f"done{jobs}")
    assert results[1][3] == 0, "-j 1 wrote the index with a thread"
    assert results[2][3] > 0, "-j 2 wrote the index without the thread ahead"
    assert results[1][:3] == results[2][:3]


def test_index_writes_go_on_without_the_thread_where_libc_has_no_madvise(tmp_path, monkeypatch):
    """No madvise in libc (another platform): recover -j 2 writes the same files, with no thread and no error."""
    import random
    from pathlib import Path

    from typer.testing import CliRunner

    from rmqstore_cli.app import app

    from .fuzzlib import tree_bytes
    from .test_recover_queues_complete import crash_copy

    def no_madvise(self, *args, **kwargs):
        raise AttributeError("madvise")

    root, trees = tmp_path / "store", []
    for refuse in (False, True):
        crash_copy("4.9.3-clean", root, "crash", random.Random(0))
        with monkeypatch.context() as m:
            if refuse:
                m.setattr(writeback.PopulateAhead, "__init__", no_madvise)
            r = CliRunner().invoke(app, ["recover", str(root), "--backup-dir", str(tmp_path / f"bak{refuse}"),
                                         "-j", "2"])
        assert r.exit_code == 0, r.output
        trees.append(tree_bytes(Path(root)))
        root.rename(tmp_path / f"done{refuse}")
    assert trees[0] == trees[1]
