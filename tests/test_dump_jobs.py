"""dump commitlog -j N (--json, --format jsonl|csv|parquet): worker processes render whole segments, this process
writes their pieces out in log order. The bytes, where the listing ends (--limit, --to, the end of the log, a torn
or invalid record) and the exit code must be those of -j 1, on every broker-written store dump accepts and on
seeded damage; the stores are not changed."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys

import pytest

from rmqstore_cli.commands.common import open_store
from rmqstore_cli.commands.dump import _json_blocks
from rmqstore_cli.engine.errors import RmqStoreError
from rmqstore_cli.engine.log.commitlog import ScanResult
from rmqstore_cli.engine.query import dumpjobs
from rmqstore_cli.engine.query.export import export_commitlog
from tests.conftest import REPO, STORES, copy_store, tree_digest
from tests.test_verify_memory import _damage_log
from tests.test_verify_subwindows import _damage_near_boundary, _records

SEED = int(os.environ.get("RMQSTORE_DJOBS_SEED", random.randrange(1 << 30)))
ALL_STORES = sorted(p.name for p in STORES.iterdir() if (p / "store").is_dir()) if STORES.is_dir() else []


def _accepted(name: str) -> bool:
    try:
        open_store(str(STORES / name / "store"), command="dump commitlog").close()
    except RmqStoreError:
        return False
    return True


DUMPED = [n for n in ALL_STORES if _accepted(n)]


def _stop(res: ScanResult):
    s = res.stop
    return None if s is None else (s.offset, s.kind, s.position, s.reason, s.segment.path if s.segment else None,
                                   res.records, res.blanks)


def _listing(root, jobs: int, **kw):
    """The text `dump commitlog --json` writes and where its walk ended."""
    kw = {"from_": None, "to": None, "body": "none", "topic": None, "queue": None, "limit": None, "since_ms": None,
          "until_ms": None} | kw
    res = ScanResult()
    with open_store(str(root), command="dump commitlog") as st:
        text = b"".join(bytes(d) for d, _, _ in _json_blocks(st.commitlog, kw["from_"], kw["to"], kw["body"], kw["topic"],
                                                             kw["queue"], kw["limit"], res, kw["since_ms"],
                                                             kw["until_ms"], jobs))
    return text, _stop(res)


def _selections(root, rng: random.Random) -> list[dict]:
    """The options that pick records: offsets inside and at segment starts, a topic, a queue, store times, limits
    that end inside a segment, at its end, or past the log."""
    recs = _records(root)
    if not recs:
        return [{}]
    with open_store(str(root), command="dump commitlog") as st:
        first = next(st.commitlog.records(with_body=False), None)
        times = [m["storeTimestamp"] for m in st.commitlog.records(with_body=False)]
    phys = [r[2] for r in recs]
    seg_starts = sorted({r[1] for r in recs})
    mid = phys[len(phys) // 2]
    out = [{}, {"body": "hex"}, {"body": "text", "limit": rng.randrange(1, len(phys) + 5)},
           {"limit": len(phys)}, {"limit": len(phys) + 1}, {"limit": 0}, {"limit": 1},
           {"from_": mid, "to": rng.choice(phys[len(phys) // 2:] + [phys[-1] + 1])},
           {"from_": rng.choice(seg_starts), "to": rng.choice(seg_starts + [None])},
           {"from_": rng.choice(phys), "limit": rng.randrange(1, 2000)}]
    if first is not None:
        out += [{"topic": first["topic"]}, {"topic": first["topic"], "limit": rng.randrange(1, 50)},
                {"queue": first["queueId"], "body": "base64"}, {"topic": "no-such-topic"}]
    if times:
        a, b = sorted(rng.sample(times, 2) if len(times) > 1 else times * 2)
        out += [{"since_ms": a}, {"since_ms": a, "until_ms": b, "limit": rng.randrange(1, 500)}]
    return out


def test_every_dumped_store_is_a_case():
    assert {"4.9.3-clean", "4.9.3-crash", "5.3.3-clean"} <= set(DUMPED)
    assert any(dumpjobs.splits(open_store(str(STORES / n / "store"), command="dump commitlog").commitlog) for n in DUMPED)


@pytest.mark.parametrize("name", DUMPED)
def test_json_jobs_equal_one_process_on_every_dumped_store(name):
    print(f"seed {SEED} (RMQSTORE_DJOBS_SEED)")
    rng = random.Random(f"{SEED}-{name}")
    root = STORES / name / "store"
    before = tree_digest(root)
    for kw in _selections(root, rng):
        one = _listing(root, 1, **kw)
        assert _listing(root, 2, **kw) == one, kw
        if not kw:
            assert _listing(root, 3, **kw) == one
    assert tree_digest(root) == before


@pytest.mark.parametrize("name", ["4.9.3-clean", "4.9.3-crash", "5.3.3-clean", "5.3.3-v2topic"])
def test_json_jobs_equal_one_process_on_seeded_damage(tmp_path, name):
    """A record made invalid, torn, a BLANK or garbage near a window boundary, plus random log bytes: the listing
    ends where the one-process walk ends (and says the same)."""
    print(f"seed {SEED} (RMQSTORE_DJOBS_SEED)")
    rng = random.Random(f"{SEED}-{name}-damage")
    for case in range(3):
        root = copy_store(name, tmp_path / f"{name}-{case}")
        _damage_near_boundary(root, rng, rng.choice([4096, 7000, 65536]))
        if case:
            _damage_log(root, rng)
        before = tree_digest(root)
        for kw in [{}, {"body": "text"}] + rng.sample(_selections(root, rng), 3):
            assert _listing(root, 2, **kw) == _listing(root, 1, **kw), (case, kw)
        assert tree_digest(root) == before


def _export(root, out, fmt, jobs, **kw):
    with open_store(str(root), command="dump commitlog") as st:
        res = export_commitlog(st, str(out), fmt, jobs=jobs, **kw)
    return out.read_bytes(), res.records, res.findings, _stop(res.scan)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_format_jobs_equal_one_process(tmp_path, fmt):
    """The files written, their record counts and findings; on a damaged copy (a CRC the export checks, a torn
    record) too."""
    print(f"seed {SEED} (RMQSTORE_DJOBS_SEED)")
    rng = random.Random(f"{SEED}-{fmt}")
    damaged = copy_store("4.9.3-clean", tmp_path / "damaged")
    _damage_near_boundary(damaged, rng, 65536)
    for root in (STORES / "4.9.3-clean" / "store", STORES / "5.3.3-clean" / "store", damaged):
        recs = _records(root)
        for kw in [{}, {"limit": rng.randrange(1, len(recs))}, {"start": recs[len(recs) // 3][2], "body": False}]:
            one = _export(root, tmp_path / f"one.{fmt}", fmt, 1, **kw)
            two = _export(root, tmp_path / f"two.{fmt}", fmt, 2, **kw)
            assert two == one, (root, kw)


def _cli(*args):
    env = {"COLUMNS": "120", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "rmqstore_cli", *args], capture_output=True, env=env, timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_cli_output_and_exit_code_equal_one_process(tmp_path):
    """stdout, the end-of-log warning and the exit code of a torn log; -j 0 (every core) included."""
    print(f"seed {SEED} (RMQSTORE_DJOBS_SEED)")
    rng = random.Random(SEED)
    root = copy_store("4.9.3-clean", tmp_path / "s")  # every record is in the log (a crash copy has some past its end)
    recs = _records(root)
    path, seg_start, phy, size = recs[rng.randrange(len(recs) // 4, len(recs))]
    data = bytearray(open(path, "rb").read())
    pos = phy - seg_start
    struct.pack_into(">i", data, pos, len(data) - pos + size)  # a torn record (past the file's end): exit 2
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    one = _cli("dump", "commitlog", str(root), "--json")
    assert one[0] == 2 and one[1] and b"stops early" in one[2]
    for j in ("2", "0"):
        assert _cli("dump", "commitlog", str(root), "--json", "-j", j) == one, j
    assert _cli("dump", "commitlog", str(root), "-j", "2")[0] == 3  # the table is one process


def test_the_workers_render_the_pieces(monkeypatch):
    """With -j 2 every piece is rendered in a worker, never in this process."""
    import tempfile

    log = tempfile.NamedTemporaryFile(delete=False)
    real = dumpjobs.json_render

    def json_render(body):
        render = real(body)

        def logged(chunk, idx):
            with open(log.name, "a") as fh:
                fh.write(f"{os.getpid()}\n")
            yield from render(chunk, idx)

        return logged

    monkeypatch.setattr(dumpjobs, "json_render", json_render)
    root = STORES / "4.9.3-clean" / "store"
    assert _listing(root, 2)[0]
    pids = open(log.name).read().split()
    os.unlink(log.name)
    assert pids and str(os.getpid()) not in pids and len(set(pids)) == 2


def test_pieces_larger_than_a_slot_and_slots_reused(monkeypatch):
    """Small shared-memory slots: most pieces are cut to fit, a record's text larger than a slot goes through the
    queue as bytes; a worker waits for its slots to be written out. Same text, same end."""
    monkeypatch.setattr(dumpjobs, "SLOT_BYTES", 3000)
    root = STORES / "5.3.3-clean" / "store"
    for kw in ({"body": "hex"}, {"body": "text", "limit": 77}):
        assert _listing(root, 2, **kw) == _listing(root, 1, **kw), kw
