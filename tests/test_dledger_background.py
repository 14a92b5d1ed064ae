"""verify -j 1 on a DLedger log checks the entries in a background process beside the window walk
(engine/verify/pipeline._entries_beside_walk). The findings, their order, the summary and the exit code must be
those of the same checks run in this process after the walk, on every broker-written DLedger store and on seeded
damage (tests/test_dledger_jobs.damage_dledger); the stores are not changed."""

from __future__ import annotations

import json
import os
import random

import pytest

from rmqstore_cli.engine import parallel
from rmqstore_cli.engine.verify import pipeline
from tests.conftest import STORES, copy_store, tree_digest
from tests.test_dledger_jobs import damage_dledger, dledger_roots
from tests.test_verify_jobs import _run

SEED = int(os.environ.get("RMQSTORE_DLEDGER_BG_SEED", random.randrange(1 << 30)))


def _both(root, monkeypatch) -> tuple:
    """(-j 1 with the entry checks in a background process, -j 1 with them in this process): each the findings
    (as JSON), the summary and the exit code."""
    started = []

    class Counted(parallel.Background):
        def __init__(self, fn, *args):
            started.append(fn)
            super().__init__(fn, *args)

    monkeypatch.setattr(parallel, "Background", Counted)
    monkeypatch.setattr(pipeline, "_entries_beside_walk", lambda store: store.commitlog.is_dledger)
    background = _run(root, 1)
    assert started == [pipeline._log_independent_checks]  # the entries were checked beside the walk
    monkeypatch.setattr(pipeline, "_entries_beside_walk", lambda store: False)
    here = _run(root, 1)
    assert len(started) == 1  # and here in this process
    assert json.dumps(background[1]) == json.dumps(here[1])  # the summary's keys in the same order too (--json)
    return background, here


@pytest.mark.parametrize("rel", dledger_roots())
def test_background_entry_checks_equal_in_process_on_every_dledger_store(rel, monkeypatch):
    root = STORES / rel
    before = tree_digest(root)
    background, here = _both(root, monkeypatch)
    assert here[2] in (0, 1), here[2]
    assert background == here
    assert here[1]["dledger"]["entries"] > 0 and "recoveryEnd" in here[1]["commitlog"]
    assert tree_digest(root) == before


@pytest.mark.parametrize("name", ["dledger-4.9.3-clean", "dledger-5.3.3-clean"])
def test_background_entry_checks_equal_in_process_on_seeded_damage(tmp_path, monkeypatch, name):
    print(f"seed {SEED} (RMQSTORE_DLEDGER_BG_SEED)")
    rng = random.Random(f"{SEED}-{name}")
    for case in range(4):
        root = copy_store(name, tmp_path / f"{name}-{case}")
        hows = damage_dledger(root, rng)
        background, here = _both(root, monkeypatch)
        assert here[2] in (0, 1), (hows, here[2])
        assert background == here, hows
