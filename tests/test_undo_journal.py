"""UndoJournal: a failed write session puts every byte back (pre-images, created files, snapshots)."""

from __future__ import annotations

import os

from rmqstore_cli.engine.log.mappedfile import SegmentQueueWriter, UndoJournal


def test_undo_restores_overwritten_bytes_zero_tail_created_files_and_snapshots(tmp_path):
    d = tmp_path / "q"
    d.mkdir()
    size = 3 << 20
    old = os.urandom(5000)
    first = d / ("%020d" % 0)
    with open(first, "wb") as f:
        f.truncate(size)
        f.write(old)
    cp = tmp_path / "checkpoint"
    cp.write_bytes(b"\x01" * 4096)
    before = {p: p.read_bytes() for p in (first, cp)}

    j = UndoJournal()
    j.snapshot_file(str(cp))
    j.snapshot_file(str(tmp_path / "absent"))
    w = SegmentQueueWriter(str(d), size, j)
    seg = w.open(0)
    seg.write(4000, b"\xff" * 3000)  # over data and into the zero tail
    seg.write(2 << 20, b"\xee" * 10)  # past the read-ahead: a second saved range
    seg.write(100, b"\xdd" * 50)  # before the saved range
    sub = SegmentQueueWriter(str(tmp_path / "new" / "deep"), size, j)
    sub.open(size).write(0, b"x")
    cp.write_bytes(b"\x02" * 5000)
    (tmp_path / "absent").write_bytes(b"made")
    w.close(flush=False)
    sub.close(flush=False)
    assert first.read_bytes() != before[first]

    j.undo()
    assert first.read_bytes() == before[first]
    assert cp.read_bytes() == before[cp]
    assert not (tmp_path / "absent").exists()
    assert not (tmp_path / "new").exists()  # created directories go too
    assert sorted(os.listdir(d)) == ["%020d" % 0]
