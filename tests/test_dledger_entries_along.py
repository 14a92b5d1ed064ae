"""verify -j 1 on a DLedger log takes the entry checks' per-file parts (index units against entries, each file's
entry walk) from the window walk, which walks every data file whole anyway (engine/verify/pipeline._entries_along_walk,
log/dledgerjobs.EntryCapture), instead of walking the entries a second time. The findings, their order, the summary
and the exit code must be those of the entry checks run on their own walk after the window walk, on every
broker-written DLedger store and on seeded damage (tests/test_dledger_jobs.damage_dledger); the stores are not
changed. On a clean store no file is walked a second time."""

from __future__ import annotations

import json
import os
import random

import pytest

from rmqstore_cli.engine.log import dledgerjobs
from rmqstore_cli.engine.verify import pipeline
from tests.conftest import STORES, copy_store, tree_digest
from tests.test_dledger_jobs import _data_files, _entries, damage_dledger, dledger_roots
from tests.test_verify_jobs import _run

SEED = int(os.environ.get("RMQSTORE_DLEDGER_ALONG_SEED", random.randrange(1 << 30)))


def _both(root, monkeypatch) -> tuple:
    """(-j 1 with the entry checks along the window walk, -j 1 with them on their own walk after it): each the
    findings (as JSON), the summary and the exit code; and the files the first walked a second time."""
    walked_again = []
    own_walk = dledgerjobs._file_items

    def counted(i, *args):
        walked_again.append(i)
        return own_walk(i, *args)

    monkeypatch.setattr(dledgerjobs, "_file_items", counted)
    monkeypatch.setattr(pipeline, "_entries_along_walk", lambda store: store.commitlog.is_dledger)
    along = _run(root, 1)
    monkeypatch.setattr(pipeline, "_entries_along_walk", lambda store: False)
    here = _run(root, 1)
    assert json.dumps(along[1]) == json.dumps(here[1])  # the summary's keys in the same order too (--json)
    return along, here, walked_again


@pytest.mark.parametrize("rel", dledger_roots())
def test_entry_checks_along_the_walk_equal_their_own_walk_on_every_dledger_store(rel, monkeypatch):
    root = STORES / rel
    before = tree_digest(root)
    along, here, walked_again = _both(root, monkeypatch)
    assert here[2] in (0, 1), here[2]
    assert along == here
    assert here[1]["dledger"]["entries"] > 0 and "recoveryEnd" in here[1]["commitlog"]
    if here[2] == 0:  # a clean log: every file's entries came from the window walk...
        assert walked_again == []
        if len([p for p in root.iterdir() if p.name.startswith("dledger-")]) == 1:
            # ...and they are the entries read here with struct, file by file
            ents = [e for f in _data_files(root)[0] for e in _entries(f)]
            got = along[1]["dledger"]
            assert (got["entries"], got["firstIndex"], got["lastIndex"]) == (len(ents), ents[0][2], ents[-1][2])
    assert tree_digest(root) == before


@pytest.mark.parametrize("name", ["dledger-4.9.3-clean", "dledger-5.3.3-clean"])
def test_entry_checks_along_the_walk_equal_their_own_walk_on_seeded_damage(tmp_path, monkeypatch, name):
    print(f"seed {SEED} (RMQSTORE_DLEDGER_ALONG_SEED)")
    rng = random.Random(f"{SEED}-{name}")
    for case in range(4):
        root = copy_store(name, tmp_path / f"{name}-{case}")
        hows = damage_dledger(root, rng)
        along, here, _ = _both(root, monkeypatch)
        assert here[2] in (0, 1), (hows, here[2])
        assert along == here, hows
