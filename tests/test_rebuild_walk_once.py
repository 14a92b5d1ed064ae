"""``rebuild`` walking the log once (engine/repair/rebuildwalk.py): verify's walk keeps each segment's dispatch
columns and verify's outcome, the rebuild dispatches from the columns and verify after it takes each segment from
what was kept. Against the same command with that walk turned off (the rebuild's own scan, verify after reading
the log again): the same files, output and exit code on every broker-written store, as it is and with seeded damage
(seed printed, RMQSTORE_WALK_ONCE_SEED)."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.repair import dispatchspill, rebuildwalk

from .conftest import STORES, copy_store, json_lines
from .fuzzlib import tree_bytes
from .test_recover_walk_along import _damage, _records

SEED = int(os.environ.get("RMQSTORE_WALK_ONCE_SEED", random.randrange(1 << 30)))
ALL_STORES = ["4.9.3-clean", "4.9.3-crash", "4.9.3-ext", "5.3.3-clean", "5.3.3-v2topic", "lmq-5.3.3", "batchcq-5.3.3",
              "timer-5.3.3", "dledger-4.9.3-clean"]
DAMAGED = ["4.9.3-clean", "4.9.3-crash", "5.3.3-clean"]
WALKED_ONCE = ("4.9.3-clean", "4.9.3-crash", "5.3.3-clean", "5.3.3-v2topic")  # plain stores: the columns stand
runner = CliRunner()


def _rebuild(root: Path, backup: Path, monkeypatch, once: bool, jobs: int, log: Path | None = None):
    """``rebuild all --json``; ``log`` gets a line per segment the rebuild dispatched from the kept columns
    ("batches START") and per segment verify after took from them without reading it ("replay START")."""
    from rmqstore_cli.engine.repair import rebuild as rebuild_mod

    real_batches = dispatchspill.DispatchSpill.batches
    real_replay = dispatchspill.SpilledColumns.replay
    real_direct = rebuild_mod.direct_requests

    def note(line: str) -> None:
        if log is not None:
            with open(log, "a") as f:
                f.write(line + "\n")

    def batches(self, seg_start):
        note(f"batches {seg_start}")
        return real_batches(self, seg_start)

    def replay(self, commitlog, seg, *a):
        got = real_replay(self, commitlog, seg, *a)
        if got is not None:
            note(f"replay {seg.start}")
        return got

    def direct(*a, **k):
        note("direct 0")
        return real_direct(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(rebuild_mod, "direct_requests", direct)
        m.setattr(dispatchspill.DispatchSpill, "batches", batches)
        m.setattr(dispatchspill.SpilledColumns, "replay", replay)
        if not once:
            m.setattr(rebuildwalk, "_new_spill", lambda store: None)
        r = runner.invoke(app, ["rebuild", "all", str(root), "--json", "--backup-dir", str(backup), "-j", str(jobs)])
    lines = [{k: v for k, v in o.items() if k != "backup"} for o in json_lines(r.stdout)]
    return r.exit_code, lines, tree_bytes(root)


def _case(name: str, root: Path, variant: str) -> str:
    copy_store(name, root)
    rng = random.Random(f"{SEED}-{name}-{variant}")
    if variant == "as-is":
        return variant
    if variant in ("crc", "crc2"):  # a bit of a record's body flipped (one with a body: the CRC then differs), in
        # one segment or in two
        recs = [r for r in _records(root) if r[4] > 0]
        files = sorted({r[0] for r in recs})
        done = []
        for path in rng.sample(files, 1 if variant == "crc" else 2):
            _, pos, _, body, n = rng.choice([r for r in recs if r[0] == path])
            with open(path, "r+b") as f:
                f.seek(body + rng.randrange(n))
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
            done.append(f"{os.path.basename(path)}+{pos}")
        return f"{variant} at {' and '.join(done)}"
    return _damage(rng, root, variant)


def _logged(log: Path, kind: str) -> list[int]:
    if not log.exists():
        return []
    return sorted({int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith(kind + " ")})


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("name, variant", [(n, "as-is") for n in ALL_STORES]
                         + [(n, v) for n in DAMAGED for v in ("crc", "torn", "magic")] + [("4.9.3-clean", "crc2")])
def test_rebuild_from_verifys_walk_changes_nothing(name, variant, jobs, tmp_path, monkeypatch):
    if not (STORES / name / "store").is_dir():
        pytest.fail(f"broker-written store {name} missing under {STORES}")
    print(f"seed {SEED} (RMQSTORE_WALK_ONCE_SEED)")
    root = tmp_path / "store"  # both runs on a copy at the same path: the output prints it
    what = _case(name, root, variant)
    log = tmp_path / "log"
    code_o, out_o, files_o = _rebuild(root, tmp_path / "bak", monkeypatch, True, jobs, log)
    segments = sorted(int(p.name) for p in (root / "commitlog").iterdir()) if (root / "commitlog").is_dir() else []
    root.rename(tmp_path / "once")
    (tmp_path / "bak").rename(tmp_path / "bak-once")
    _case(name, root, variant)
    code_t, out_t, files_t = _rebuild(root, tmp_path / "bak", monkeypatch, False, jobs)
    where = f"seed {SEED}: {name}, {what}, -j {jobs}"
    assert code_o == code_t, where
    assert out_o == out_t, where
    assert files_o == files_t, where
    if name in WALKED_ONCE and variant == "as-is":
        assert _logged(log, "batches"), f"{where}: the rebuild scanned the log although verify's walk kept its columns"
        assert _logged(log, "replay") == segments, f"{where}: verify after the rebuild read unchanged segments again"
    if name.startswith("dledger"):
        assert not _logged(log, "batches"), where
    if variant in ("crc", "crc2"):  # a record verify rejects (the scan takes it: it reads no CRC): its segment is
        # the rebuild's own scan's, and read again by verify after
        for damaged in (int(part.split("+")[0]) for part in what.split(" at ")[1].split(" and ")):
            assert damaged not in _logged(log, "batches"), f"{where}: columns used although verify's records are not the scan's"
            assert damaged not in _logged(log, "replay"), f"{where}: verify after took a damaged segment from the walk"
        # -j: the main process scans one such segment itself; at two, the workers build it all
        assert bool(_logged(log, "direct")) == (jobs > 1 and variant == "crc2"), where


def test_the_walks_folder_is_removed(tmp_path, monkeypatch):
    """The scratch folder of the columns is gone when the rebuild and verify after it are done."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = copy_store("5.3.3-clean", tmp_path / "store")
    log = tmp_path / "log"
    code, _, _ = _rebuild(root, tmp_path / "bak", monkeypatch, True, 1, log)
    assert code == 0
    assert _logged(log, "replay"), "verify after did not use the columns: nothing here was tested"
    left = [p for d in (tmp_path / "tmp", tmp_path) for p in os.listdir(d) if p.startswith(dispatchspill.PREFIX)]
    assert not left, left
