"""recover on a store with one damaged index file: the files before it stay untouched, it and the files
after it are rebuilt from the commitlog under their own names. The broker's own files are the reference:
what recover leaves in index/ must be them, byte for byte and name for name.
"""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app

from .conftest import shared_store, tree_digest


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def index_digest(root) -> dict:
    return {k: v for k, v in tree_digest(root / "index").items()}


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
@pytest.mark.parametrize("which", ["first", "middle", "last"])
def test_one_cut_index_file_rebuilds_only_it_and_the_files_after(store_copy, tmp_path, name, which):
    root = store_copy(name)
    broker = {k: v[0] for k, v in index_digest(shared_store(name)).items()}
    names = sorted(broker)
    k = {"first": 0, "middle": len(names) // 2, "last": len(names) - 1}[which]
    with open(root / "index" / names[k], "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)
    before = index_digest(root)
    r = run("recover", root, "--yes", "--backup-dir", tmp_path / "bk")
    assert r.exit_code == 0, r.output
    after = index_digest(root)
    assert {n: v[0] for n, v in after.items()} == broker  # the broker's files, names and bytes
    for n in names[:k]:
        assert after[n] == before[n], (n, names.index(n), k)  # kept: not even rewritten (same modification time)
    for n in names[k:]:
        assert after[n][1] != before[n][1]  # rebuilt
    assert run("verify", root).exit_code == 0
