"""``rebuild all -j 2`` gives what ``-j 1`` gives: the same files, the same output, the same exit code, on every
broker-written store and on seeded damage (placed with the broker's own record offsets, broker-read.jsonl.gz).

The ``-j`` workers parse segments and group and pack the consume-queue units; the parent writes in log order.
Damage that ends the log in the middle (a broken TOTALSIZE, a zeroed tail) must end it at the same record
whatever the worker that read past it made.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
import struct

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app

from .conftest import STORES, broker_read, copy_store
from .fuzzlib import tree_bytes
from .test_exit_contract import flip_body_byte, seg_size

runner = CliRunner()
MULTI_SEGMENT = sorted(p.name for p in STORES.iterdir() if (p / "store" / "commitlog").is_dir()
                       and len(os.listdir(p / "store" / "commitlog")) > 1) if STORES.is_dir() else []


def _rebuild(root, jobs: int) -> tuple:
    backup = root.parent / f"{root.name}.bak"
    r = runner.invoke(app, ["rebuild", "all", str(root), "--json", "--yes", "--backup-dir", str(backup), "-j", str(jobs)])
    out = r.stdout.replace(str(backup), "BACKUP").replace(str(root), "ROOT")
    saved = tree_bytes(Path(backup)) if backup.exists() else {}
    saved.pop("manifest.jsonl", None)  # names the command's own paths and times
    return r.exit_code, out, tree_bytes(Path(root)), saved


def _both(tmp_path, name: str, damage=None) -> None:
    results = []
    for jobs in (1, 2):
        root = copy_store(name, tmp_path / f"j{jobs}" / "store")
        if damage is not None:
            damage(root)
        results.append(_rebuild(root, jobs))
    one, two = results
    assert one[0] == two[0], (one[1][-2000:], two[1][-2000:])
    assert one[1] == two[1]
    assert one[2] == two[2]
    assert one[3] == two[3]


@pytest.mark.parametrize("name", MULTI_SEGMENT)
def test_jobs_rebuild_equals_one_process_on_broker_stores(name, tmp_path):
    _both(tmp_path, name)


def _middle_record(name: str, rng: random.Random) -> dict:
    recs = broker_read(name)["clmsg"]
    return recs[rng.randrange(len(recs) // 4, 3 * len(recs) // 4)]


def _segment_file(root, name: str, offset: int):
    size = seg_size(name)
    return root / "commitlog" / ("%020d" % (offset - offset % size)), offset % size


def _bad_totalsize(name, rec):
    def damage(root):
        path, pos = _segment_file(root, name, rec["offset"])
        with open(path, "r+b") as f:
            f.seek(pos)
            f.write(struct.pack(">i", rec["size"] + 7))  # the next record no longer starts where this one says
    return damage


def _zeroed_tail(name, rec):
    def damage(root):
        path, pos = _segment_file(root, name, rec["offset"])
        with open(path, "r+b") as f:
            f.seek(pos)
            f.write(bytes(os.path.getsize(path) - pos))  # no BLANK: the log ends in this segment
    return damage


def _body_crc(name, rec):
    # a record with a body to flip a bit of (some broker-written records have an empty body): the first from rec on
    recs = broker_read(name)["clmsg"]
    at = next(i for i, r in enumerate(recs) if r["offset"] == rec["offset"])
    rec = next(r for r in recs[at:] + recs[:at] if len(r["msg"]["bodyHex"]) // 2 > 8)
    return lambda root: flip_body_byte(root, name, rec)


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
@pytest.mark.parametrize("kind", [_bad_totalsize, _zeroed_tail, _body_crc])
def test_jobs_rebuild_equals_one_process_on_seeded_damage(name, kind, tmp_path):
    seed = random.SystemRandom().randrange(2**32)
    print("seed", seed)
    rec = _middle_record(name, random.Random(seed))
    _both(tmp_path, name, kind(name, rec))


def test_jobs_zero_means_one_process_per_core(tmp_path, monkeypatch):
    """``-j 0``: as many processes as the machine has cores (here made three), the same files and output as -j 1."""
    from rmqstore_cli.engine import parallel
    from rmqstore_cli.engine.repair import rebuild as engine

    asked = []
    real = engine.rebuild

    def rebuild(*a, **k):
        asked.append(k.get("jobs"))
        return real(*a, **k)

    monkeypatch.setattr(parallel, "default_jobs", lambda: 3)
    monkeypatch.setattr(engine, "rebuild", rebuild)
    one = _rebuild(copy_store("5.3.3-clean", tmp_path / "j1" / "store"), 1)
    every = _rebuild(copy_store("5.3.3-clean", tmp_path / "j0" / "store"), 0)
    assert asked == [1, 3]
    assert one[0] == every[0] == 0, every[1][-2000:]
    assert one[1:] == every[1:]
