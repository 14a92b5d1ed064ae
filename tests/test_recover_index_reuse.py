"""recover's plan takes verify's index findings instead of checking the index files a second time when the
recovered log is the log verify read (indexplan._verified). The plan must be the one the second check gives:
every broker-written store, and copies with seeded index damage (seed printed), planned both ways."""

from __future__ import annotations

import random
import struct

import pytest

from .conftest import STORES, copy_store
from rmqstore_cli.engine.repair import indexplan
from rmqstore_cli.engine.repair.recovery import plan_recovery
from rmqstore_cli.engine.store import Store

ALL_STORE_ROOTS = sorted(str(p.relative_to(STORES)) for p in STORES.glob("*/store*") if p.is_dir()) if STORES.is_dir() else []


def _recover_takes(root) -> bool:
    """recover plans this layout (the command refuses the others before planning)."""
    from rmqstore_cli.engine.layout import WRITE, UnsupportedLayoutError, detect_layout, require_understood

    try:
        require_understood(detect_layout(str(root)), "recover", WRITE)
    except UnsupportedLayoutError:
        return False
    return True
_REAL_VERIFIED = indexplan._verified
_HEADER = struct.Struct(">qqqqii")  # beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount, indexCount


def _plans(root, monkeypatch, jobs: int = 1) -> tuple[dict, dict, bool]:
    """(plan with verify's findings reused, plan with the index checked again, whether the reuse was taken)."""
    real = _REAL_VERIFIED
    taken = []

    def spy(planner, files):
        got = real(planner, files)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(indexplan, "_verified", spy)
    with Store.open(str(root)) as st:
        reused = plan_recovery(st, with_verify=True, jobs=jobs).as_json()
    monkeypatch.setattr(indexplan, "_verified", lambda planner, files: None)
    with Store.open(str(root)) as st:
        checked = plan_recovery(st, with_verify=True, jobs=jobs).as_json()
    return reused, checked, any(taken)


def test_stores_are_listed():
    assert {"4.9.3-clean/store", "5.3.3-clean/store", "4.9.3-crash/store"} <= set(ALL_STORE_ROOTS)


@pytest.mark.parametrize("rel", ALL_STORE_ROOTS)
def test_broker_written_stores_plan_the_same(rel, monkeypatch):
    if not _recover_takes(STORES / rel):
        pytest.skip(f"recover refuses the layout of {rel}: it plans nothing there")
    reused, checked, _ = _plans(STORES / rel, monkeypatch)  # planning reads only
    assert reused == checked


def test_the_clean_stores_take_the_reuse(tmp_path, monkeypatch):
    for name in ("4.9.3-clean", "5.3.3-clean"):
        _, _, taken = _plans(copy_store(name, tmp_path / name), monkeypatch)
        assert taken, name


def _damage_entry(root, rng: random.Random) -> str:
    """One entry of a random index file changed: its key hash (IDX_KEY_HASH) or its phyOffset (IDX_NO_RECORD)."""
    with Store.open(str(root)) as st:
        files = [(f.path, f.slots) for f in st.index.files if f.complete]
    path, slots = files[rng.randrange(len(files))]
    with open(path, "r+b") as fh:
        count = _HEADER.unpack(fh.read(_HEADER.size))[5]
        e = rng.randrange(1, count)
        pos = _HEADER.size + slots * 4 + e * 20
        what = rng.choice(["keyHash", "phyOffset"])
        fh.seek(pos if what == "keyHash" else pos + 4)
        fh.write(struct.pack(">i", rng.randrange(1, 2**31)) if what == "keyHash" else struct.pack(">q", 7))
    return f"{path} entry {e} {what}"


@pytest.mark.parametrize("name,jobs", [("4.9.3-clean", 1), ("5.3.3-clean", 1), ("4.9.3-clean", 2)])
def test_seeded_index_damage_plans_the_same(name, jobs, tmp_path, monkeypatch):
    seed = random.SystemRandom().randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    root = copy_store(name, tmp_path / name)
    print(_damage_entry(root, rng))
    reused, checked, taken = _plans(root, monkeypatch, jobs)
    assert taken
    assert reused == checked
    assert reused["indexDeleted"], reused["notes"]  # the damaged file is rebuilt (with those after it)
