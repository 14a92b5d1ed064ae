"""The DLedger entry walk split by data file (engine/log/dledgerjobs.py): verify -j N runs the entry checks in
workers, a file each, and this process follows the entry chain across files. Findings, their order, the summary
and the exit code must be those of -j 1 on every broker-written DLedger store and on seeded damage: a bad message
CRC, a torn entry, garbage over an entry header (in a file DLedger's recovery reads, and in one it never reads,
where the walk resumes by the index), an entry index or term that breaks the chain at a file's first entry, a
wrong index unit."""

from __future__ import annotations

import json
import os
import random
import struct

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.log import dledgerjobs
from tests.conftest import STORES, copy_store, tree_digest

SEED = int(os.environ.get("RMQSTORE_DLEDGER_JOBS_SEED", random.randrange(1 << 30)))
runner = CliRunner()
HEADER = 48


def dledger_roots() -> list:
    if not STORES.is_dir():
        return []
    out = []
    for p in sorted(STORES.iterdir()):
        if p.name.startswith("dledger-"):
            out += [f"{p.name}/{q.name}" for q in sorted(p.iterdir()) if q.is_dir() and q.name.startswith("store")]
    return out


def _entries(path) -> list[tuple]:
    """(position, size, index, term) of the entries of one data file, read here with struct (not the engine)."""
    data = open(path, "rb").read()
    out, pos = [], 0
    while pos + HEADER <= len(data):
        magic, size, index, term = struct.unpack_from(">iiqq", data, pos)
        if magic != 1 or size <= HEADER or pos + size > len(data):
            break
        out.append((pos, size, index, term))
        pos += size
    return out


def _data_files(root) -> list:
    (d,) = [p for p in root.iterdir() if p.name.startswith("dledger-")]
    return sorted((d / "data").iterdir()), sorted((d / "index").iterdir())


def _patch(path, at: int, raw: bytes) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(raw)


def damage_dledger(root, rng: random.Random) -> list[str]:
    """One to three of: a flipped message body byte (CRC), a torn entry (its second half and the rest of the file
    zeroed), garbage over an entry header, a chain break at a file's first entry (index or term), a wrong index
    unit. Returns what was done.

    Entries are listed once, before any damage: a second pick must not read an index that garbage just wrote over
    (a "unit" damage aimed at such an index would point past the last index file)."""
    data, index = _data_files(root)
    entries = [_entries(f) for f in data]
    done = []
    for _ in range(rng.randint(1, 3)):
        how = rng.choice(["crc", "torn", "garbage", "first-index", "first-term", "unit"])
        k = rng.randrange(len(data)) if how not in ("first-index", "first-term") else rng.randrange(1, len(data))
        ents = entries[k]
        if not ents:
            continue
        pos, size, idx, term = ents[0] if how.startswith("first") else rng.choice(ents)
        if how == "crc":
            at = pos + HEADER + rng.randrange(size - HEADER - 1) + 1
            b = open(data[k], "rb").read()[at]
            _patch(data[k], at, bytes([b ^ 0x5A]))
        elif how == "torn":
            cut = pos + size // 2
            _patch(data[k], cut, bytes(os.path.getsize(data[k]) - cut))
        elif how == "garbage":
            _patch(data[k], pos + rng.randrange(0, 40), bytes(rng.randrange(256) for _ in range(8)))
        elif how == "first-index":
            _patch(data[k], pos + 8, struct.pack(">q", idx + rng.choice([1, 5, -3])))
        elif how == "first-term":
            _patch(data[k], pos + 16, struct.pack(">q", rng.choice([-7, term + 3])))
        else:
            unit = idx * 32
            f = index[unit // os.path.getsize(index[0])]
            _patch(f, unit % os.path.getsize(index[0]) + 8, struct.pack(">q", rng.randrange(1 << 20)))
        done.append(f"{how} file {k} entry {idx}")
    return done


def _verify(root, jobs: int) -> tuple:
    r = runner.invoke(app, ["verify", str(root), "--json", "-j", str(jobs)])
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize("rel", dledger_roots())
def test_verify_jobs_equal_one_process_on_every_dledger_store(rel):
    root = STORES / rel
    before = tree_digest(root)
    one = _verify(root, 1)
    assert one[0] in (0, 1), one
    assert _verify(root, 2) == one
    assert _verify(root, 3) == one
    assert tree_digest(root) == before


@pytest.mark.parametrize("name", ["dledger-4.9.3-clean", "dledger-5.3.3-clean"])
def test_verify_jobs_equal_one_process_on_seeded_damage(tmp_path, name):
    print(f"seed {SEED} (RMQSTORE_DLEDGER_JOBS_SEED)")
    rng = random.Random(f"{SEED}-{name}")
    for case in range(6):
        root = copy_store(name, tmp_path / f"{name}-{case}")
        hows = damage_dledger(root, rng)
        one = _verify(root, 1)
        assert one[0] in (0, 1), (hows, one)
        assert _verify(root, 2) == one, hows


def test_a_chain_break_at_a_file_start_is_walked_here(tmp_path, monkeypatch):
    """An entry index that does not follow the previous file's last entry: the worker (no entry before) accepts it,
    one walk does not; this process walks that file itself, and the findings are those of one walk."""
    root = copy_store("dledger-4.9.3-clean", tmp_path / "s")
    data, _ = _data_files(root)
    pos, _, idx, _ = _entries(data[1])[0]
    _patch(data[1], pos + 8, struct.pack(">q", idx + 2))
    walked_here = []
    real = dledgerjobs.walk_entries

    def spy(segs, **kw):
        if kw.get("end_index") is not None and kw.get("start_index") == 1 and os.getpid() == me:
            walked_here.append(kw)
        return real(segs, **kw)

    me = os.getpid()
    monkeypatch.setattr(dledgerjobs, "walk_entries", spy)
    one = _verify(root, 1)
    two = _verify(root, 2)
    assert two == one and walked_here
    codes = [json.loads(line)["code"] for line in one[1].splitlines()]
    assert "DL_ENTRY_INDEX" in codes


def test_the_workers_check_the_entries(tmp_path, monkeypatch):
    log = tmp_path / "pids"
    real = dledgerjobs._file_items

    def items(i, *args):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        yield from real(i, *args)

    monkeypatch.setattr(dledgerjobs, "_file_items", items)
    root = STORES / "dledger-4.9.3-clean" / "store"
    _verify(root, 2)
    pids = log.read_text().split()
    assert len(pids) == len(_data_files(root)[0]) and str(os.getpid()) not in pids and len(set(pids)) == 2


def _stats(root, jobs: int) -> dict:
    from rmqstore_cli.engine.query.stats import compute_stats
    from rmqstore_cli.engine.store import Store

    with Store.open(str(root)) as st:
        out = compute_stats(st, jobs=jobs)
    out.pop("nextCleanup", None)  # the disk's fill level and the clock now: not the log's
    return out


@pytest.mark.parametrize("rel", dledger_roots())
def test_stats_jobs_equal_one_process_on_every_dledger_store(rel):
    one = _stats(STORES / rel, 1)
    assert one["commitlog"]["maxOffset"] > 0
    assert _stats(STORES / rel, 2) == one


@pytest.mark.parametrize("name", ["dledger-4.9.3-clean", "dledger-5.3.3-clean"])
def test_stats_jobs_equal_one_process_on_seeded_damage(tmp_path, name):
    print(f"seed {SEED} (RMQSTORE_DLEDGER_JOBS_SEED)")
    rng = random.Random(f"{SEED}-stats-{name}")
    for case in range(4):
        root = copy_store(name, tmp_path / f"{name}-{case}")
        hows = damage_dledger(root, rng)
        assert _stats(root, 2) == _stats(root, 1), hows
