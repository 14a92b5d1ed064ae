"""Consume-queue writers within the limit on open files. A writer holds two descriptors for the file it writes
(its own and the mapping's copy), where the broker holds one, so a rebuild of 8192 queues stopped with "Too many
open files" under a limit the broker runs under. Writers now share a budget: past it, the writer that opened its
file longest ago lets it go and maps it again when it next writes.

With a budget of two writers, every command that writes consume queues (rebuild, recover's re-dispatch, append)
must leave the same bytes as with no budget, and a repair that fails must still be undone."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.derived import bcqwriter, cqwriter
from rmqstore_cli.engine.log import mappedfile
from tests.conftest import copy_store
from tests.fuzzlib import add_crash, content_digest


class _Counting(mappedfile.OpenWriters):
    def __init__(self, limit):
        super().__init__(limit)
        self.let_go_early = self.seen = 0

    def opened(self, writer):
        self.seen += 1
        n = len(self.writers) + (0 if id(writer) in self.writers else 1)
        super().opened(writer)
        self.let_go_early += n - len(self.writers)


def _run(monkeypatch, limit, args):
    budget = _Counting(limit)
    monkeypatch.setattr(cqwriter, "OPEN_WRITERS", budget)
    monkeypatch.setattr(bcqwriter, "OPEN_WRITERS", budget)
    r = CliRunner().invoke(app, args)
    return r, budget


def _derived(root) -> dict:
    return {k: v for k, v in content_digest(root).items() if k.startswith(("consumequeue", "batchconsumequeue",
                                                                           "index", "checkpoint"))}


@pytest.mark.parametrize("name", ["4.9.3-ext", "lmq-5.3.3", "batchcq-5.3.3"])
def test_rebuild_within_two_open_writers(tmp_path, monkeypatch, name):
    out = {}
    for limit in (None, 2):
        root = copy_store(name, tmp_path / f"s{limit}")
        for gone in ("consumequeue", "consumequeue_ext", "batchconsumequeue"):  # else verify-clean: nothing rebuilt
            shutil.rmtree(root / gone, ignore_errors=True)
        r, budget = _run(monkeypatch, limit or 1 << 40,
                         ["rebuild", "all", str(root), "--backup-dir", str(tmp_path / f"bk{limit}")])
        assert r.exit_code in (0, 1), r.output
        out[limit] = (r.exit_code, _derived(root))
        if limit:
            assert budget.let_go_early >= 3, (budget.seen, budget.let_go_early)  # files were let go and mapped again
    assert out[2] == out[None]


@pytest.mark.parametrize("name", ["4.9.3-clean", "lmq-5.3.3"])
def test_recover_within_two_open_writers(tmp_path, monkeypatch, name):
    """A crash with the consume queues gone: the re-dispatch writes every queue again."""
    out = {}
    for limit in (None, 2):
        root = copy_store(name, tmp_path / f"s{limit}")
        add_crash(root, zero_checkpoint=True)
        shutil.rmtree(root / "consumequeue")
        r, budget = _run(monkeypatch, limit or 1 << 40, ["recover", str(root), "--backup-dir", str(tmp_path / f"bk{limit}")])
        assert r.exit_code in (0, 1), r.output
        out[limit] = (r.exit_code, _derived(root))
        if limit:
            assert budget.let_go_early > 10, (budget.seen, budget.let_go_early)
    assert out[2] == out[None]


def test_failed_recover_is_undone_within_two_open_writers(tmp_path, monkeypatch):
    """A write failing after files were let go and mapped again: every step is still undone (the pre-image of a
    file mapped again is the one saved at its first write)."""
    root = copy_store("4.9.3-clean", tmp_path / "s")
    add_crash(root, zero_checkpoint=True)
    for f in sorted((root / "consumequeue").rglob("0000*"))[::2]:  # half the queues lose their tail
        with open(f, "r+b") as fh:
            fh.truncate(0)
            fh.truncate(mappedfile.os.path.getsize(next((root / "consumequeue").rglob("0000*"))))
    before = content_digest(root)
    real, calls = mappedfile.WritableSegment.write, []

    def failing(self, pos, data):
        calls.append(self.path)
        if len(calls) == 40:
            raise OSError(28, "No space left on device", self.path)
        return real(self, pos, data)

    monkeypatch.setattr(mappedfile.WritableSegment, "write", failing)
    r, budget = _run(monkeypatch, 2, ["recover", str(root), "--backup-dir", str(tmp_path / "bk")])
    assert len(calls) >= 40 and budget.let_go_early > 5, (len(calls), budget.let_go_early)
    assert r.exit_code == 3 and "undone" in r.output, r.output
    after = content_digest(root)
    assert sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)) == []


def test_a_closed_writer_leaves_the_budget(tmp_path):
    """A writer closed (its queue done) is no longer counted: the budget holds only writers with a file open, and
    letting the oldest go never meets one that has none."""
    budget = mappedfile.OpenWriters(limit=2)
    writers = [mappedfile.SegmentQueueWriter(str(tmp_path / str(k)), 4096, None, budget) for k in range(4)]
    writers[0].open(0)
    writers[0].close()
    assert not budget.writers
    for w in writers[1:]:
        w.open(0)
        w.open(0).write(0, b"\x01")
    assert list(budget.writers) == [id(writers[2]), id(writers[3])]
    assert writers[1].current is None and writers[3].current is not None
    for w in writers:
        w.close()
    assert not budget.writers
    assert all((tmp_path / str(k) / ("%020d" % 0)).read_bytes()[:1] == (b"\x01" if k else b"\x00") for k in range(4))
