"""Layouts the engine does not understand are recognised and refused, never misread or taken apart.

Driven by ``engine.layout.SUPPORT``: for every broker-written sample of a non-classic layout, every
command the table does not declare supported for it exits 3 with one line naming what was found,
and no byte of the store changes (no file added either). When a feature becomes supported for a
command, its own tests show the command is right; these keep the rest refused.
"""

from __future__ import annotations

import os
import shutil

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.layout import READ, WRITE, detect_layout, supported

from .conftest import CLEAN_STORES, STORE_NAMES, STORES, copy_store, tree_digest

runner = CliRunner()

# sample folder (store root inside it) -> the features it must be recognised with
SAMPLES = {
    "dledger-4.9.3-clean/store": {"dledger"},
    "dledger-4.9.3-crash/store": {"dledger"},
    "dledger-5.3.3-clean/store": {"dledger"},
    "dledger-4.9.3-group/store-n0": {"dledger"},
    "rocksdbcq-5.3.3/store": {"rocksdb-cq"},
    "batchcq-5.3.3/store": {"batch-cq"},
    "lmq-5.3.3/store": {"lmq"},
    "timer-5.3.3/store": {"timer"},
    "timer-5.3.3-crash/store": {"timer"},
}

# command name in SUPPORT -> its arguments after the store path (writes on a copy)
WRITING = {
    "recover": ["--yes"],
    "rebuild consumequeue": ["--yes"],
    "rebuild index": ["--yes"],
    "rebuild all": ["--yes"],
    "truncate": ["--offset", "0", "--yes"],
    "append": ["--topic", "LayoutProbe", "--body", "x"],
    "offsets set": ["--group", "G", "--topic", "T", "--to-min", "--yes"],
    "repair config": ["--yes"],
    "reclaim": ["--keep-files", "1", "--yes"],
}
READING = {
    "verify": [],
    "dump commitlog": ["--limit", "1"],
    "dump consumequeue": [],
    "dump store": [],
    "stats": [],
    "get": ["--offset", "0"],
    "dump offsets": [],
    "spark verify": [],  # refused before any Spark session starts
    "spark stats": [],
}


def _argv(command: str, root, rest: list[str]) -> list[str]:
    return command.split(" ") + [str(root)] + rest


def _require(rel: str):
    if not (STORES / rel).is_dir():
        pytest.fail(f"broker-written sample {rel} missing from {STORES}")


@pytest.mark.parametrize("rel", sorted(SAMPLES))
def test_each_sample_is_recognised(rel):
    _require(rel)
    layout = detect_layout(str(STORES / rel))
    assert set(layout.features) == SAMPLES[rel]


@pytest.mark.parametrize("name", STORE_NAMES)
def test_classic_stores_are_classic(name):
    layout = detect_layout(str(STORES / name / "store"))
    assert layout.is_classic, layout.details


def test_settings_name_layouts_the_folders_do_not_show_yet(tmp_path):
    from rmqstore_cli.engine.config.storeconfig import StoreConfig

    (tmp_path / "commitlog").mkdir()
    cfg = StoreConfig(enableDLegerCommitLog=True, storeType="defaultRocksDB")
    assert set(detect_layout(str(tmp_path), cfg).features) == {"dledger", "rocksdb-cq"}
    assert detect_layout(str(tmp_path), StoreConfig()).is_classic


def test_a_dledger_folder_beside_a_full_commitlog_is_not_dledger(tmp_path):
    """A store that moved from DLedger back to a classic commitlog keeps the old folder; the commitlog wins."""
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / "00000000000000000000").write_bytes(b"\0" * 16)
    (tmp_path / "dledger-n0" / "data").mkdir(parents=True)
    assert detect_layout(str(tmp_path)).is_classic


def _cases(table: dict, access: str):
    for rel, feats in sorted(SAMPLES.items()):
        for command in table:
            if not all(supported(f, command, access) for f in feats):
                yield pytest.param(rel, command, id=f"{rel.split('/')[0]}:{command}")


@pytest.mark.parametrize("rel,command", list(_cases(WRITING, WRITE)))
def test_unsupported_writes_exit_3_and_change_nothing(tmp_path, rel, command):
    _require(rel)
    root = tmp_path / "store"
    shutil.copytree(STORES / rel, root)
    for dirpath, _, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    before = tree_digest(root)
    r = runner.invoke(app, _argv(command, root, WRITING[command]))
    assert r.exit_code == 3, (r.exit_code, r.output)
    assert "refusing" in r.output and "nothing was changed" in r.output.lower()
    assert len([ln for ln in r.output.strip().splitlines() if ln.strip()]) == 1, r.output
    assert tree_digest(root) == before
    assert not list(tmp_path.glob("*backup*")) and sorted(os.listdir(tmp_path)) == ["store"]


@pytest.mark.parametrize("rel,command", list(_cases(READING, READ)))
def test_unsupported_reads_say_so_instead_of_false_findings(rel, command):
    _require(rel)
    root = STORES / rel
    before = tree_digest(root)
    r = runner.invoke(app, _argv(command, root, READING[command]))
    assert r.exit_code == 3, (r.exit_code, r.output)
    assert "cannot read" in r.output
    assert tree_digest(root) == before


@pytest.mark.parametrize("name", CLEAN_STORES)
def test_classic_writes_are_not_refused(tmp_path, name):
    root = copy_store(name, tmp_path / "s")
    r = runner.invoke(app, ["recover", str(root), "--dry-run"])
    assert r.exit_code != 3, r.output
