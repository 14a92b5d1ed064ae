"""The kernel's limit on mappings per process (vm.max_map_count, 65530 by default): a command keeps each queue
file it reads mapped, as the broker does, so a store with tens of thousands of queue files can reach it. Mapping
then fails with ENOMEM; the command says which limit it hit and how to raise it (exit 3, one line), and an
ENOMEM far from that limit stays what it is."""

from __future__ import annotations

import errno
import mmap

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.log import segments
from tests import fuzzlib
from tests.conftest import copy_store


class _Refused:
    """mmap.mmap that refuses consume-queue files with ENOMEM, as the kernel does past vm.max_map_count (only
    mappings for writing with ``writes_only``)."""

    def __init__(self, real, writes_only: bool = False, under: str = "consumequeue"):
        self.real, self.writes_only, self.under, self.refused = real, writes_only, under, 0

    def __call__(self, fd, size, *a, **k):
        import os

        if self.writes_only and k.get("access") != mmap.ACCESS_WRITE:
            return self.real(fd, size, *a, **k)
        if self.under in os.readlink(f"/proc/self/fd/{fd}"):
            self.refused += 1
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return self.real(fd, size, *a, **k)


@pytest.mark.parametrize("near_limit", [True, False])
@pytest.mark.parametrize("command", [["verify"], ["rebuild", "all"]])
def test_mapping_limit_is_named(tmp_path, monkeypatch, near_limit, command):
    root = copy_store("4.9.3-clean", tmp_path / "s")
    refused = _Refused(mmap.mmap)
    monkeypatch.setattr(mmap, "mmap", refused)  # the one mmap module every reader and writer calls
    monkeypatch.setattr(segments, "mapping_counts", lambda: (65525, 65530) if near_limit else (900, 65530))
    r = CliRunner().invoke(app, [*command, str(root), "--backup-dir", str(tmp_path / "bk")] if command[0] == "rebuild"
                           else [*command, str(root)])
    assert refused.refused, "a consume-queue file was mapped"
    assert r.exit_code == 3, r.output
    assert "Traceback" not in r.output
    named = "vm.max_map_count" in r.output and "sysctl -w vm.max_map_count=655360" in r.output
    assert named == near_limit, r.output
    assert "65525 memory mappings" in r.output if near_limit else "Cannot allocate memory" in r.output


def test_recover_meeting_the_limit_undoes_its_steps(tmp_path, monkeypatch):
    """The limit met while recover writes (its index and consume-queue writers map their files) is an I/O error
    like a full disk: every step done so far is undone from the backup, the store is as it was."""
    root = copy_store("4.9.3-crash", tmp_path / "s")
    (root / "abort").write_bytes(b"")
    before = fuzzlib.content_digest(root)
    monkeypatch.setattr(mmap, "mmap", _Refused(mmap.mmap, writes_only=True, under=str(root)))  # the plan reads
    refused = mmap.mmap
    monkeypatch.setattr(segments, "mapping_counts", lambda: (65525, 65530))
    r = CliRunner().invoke(app, ["recover", str(root), "--backup-dir", str(tmp_path / "bk")])
    assert refused.refused, "recover mapped a file of the store to write it"
    assert r.exit_code == 3, r.output
    assert "vm.max_map_count" in r.output and "undone" in r.output, r.output
    after = fuzzlib.content_digest(root)
    assert sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)) == []
