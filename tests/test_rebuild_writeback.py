"""rebuild's early write-back (engine/repair/rebuild.DispatchWriteback) hands the kernel only bytes already written inside
the files being written, and changes no byte: the same files as a rebuild that never starts it."""

from __future__ import annotations

import os

from rmqstore_cli.engine.repair import rebuild as rebuild_mod
from rmqstore_cli.engine.store import Store

from .conftest import copy_store, files_of


def _rebuild(root, monkeypatch, early: bool) -> list:
    calls = []
    real = rebuild_mod._sync_file_range()

    def record(fd, start, n, flags):
        size = os.fstat(fd).st_size
        assert 0 <= start and start + n <= size, (start, n, size)
        calls.append((start, n))
        return real(fd, start, n, flags)

    monkeypatch.setattr(rebuild_mod, "_sync_file_range", (lambda: record) if early else (lambda: None))
    monkeypatch.setattr(rebuild_mod.DispatchWriteback, "WRITEBACK_BYTES", 1)  # after every batch
    with Store.open(str(root)) as st:
        rebuild_mod.rebuild(st, "all")
    return calls


def test_early_writeback_changes_no_byte(tmp_path, monkeypatch):
    early, late = copy_store("4.9.3-clean", tmp_path / "early"), copy_store("4.9.3-clean", tmp_path / "late")
    calls = _rebuild(early, monkeypatch, True)
    assert not _rebuild(late, monkeypatch, False)
    assert calls and any(n > 0 for _, n in calls)
    for sub in ("consumequeue", "index"):
        assert files_of(early, sub) == files_of(late, sub)
