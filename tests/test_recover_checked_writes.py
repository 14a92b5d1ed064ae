"""recover proves its writes: the verify after the apply reads back what the re-dispatch wrote and checks it
against the commitlog, so a wrong write is reported (exit 1, the finding in the verify line), not hidden behind a
plan that said it would be fine. The write path is broken on purpose here (an index entry with a wrong key
hash, a consume-queue unit with a wrong tagsCode); the same store recovered without the fault comes out clean."""

from __future__ import annotations

import shutil

import numpy as np

from rmqstore_cli.engine.derived import dispatch, indexwriter
from tests.conftest import json_lines
from tests.fuzzlib import _make_runner

_runner = None


def _recover(root) -> tuple[int, dict]:
    """recover --json on ``root``: exit code and its verify-after line."""
    global _runner
    if _runner is None:
        _runner = _make_runner()
    res = _runner.invoke(None, ["recover", str(root), "--backup-dir", f"{root}.bak", "--json"],
                         env={"COLUMNS": "200"})
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    verify = next(o for o in json_lines(res.stdout) if o.get("type") == "verify")
    return res.exit_code, verify


def _crash_without_queues(store_copy, sub: str):
    """4.9.3-crash (abort present: every record re-dispatched, its newest index file rebuilt) with its consume
    queues removed, so the re-dispatch writes every queue unit and index entry."""
    root = store_copy("4.9.3-crash", sub)
    shutil.rmtree(root / "consumequeue")
    return root


def test_clean_without_a_fault(store_copy):
    code, verify = _recover(_crash_without_queues(store_copy, "control"))
    assert code == 0 and not verify["findings"], verify


def test_a_wrong_index_entry_is_reported(store_copy, monkeypatch):
    real = indexwriter._OpenIndex.put_many
    done = []

    def put_many(self, hashes, phys, tss):
        if not done and len(hashes):
            done.append(int(phys[0]))
            hashes = np.array(hashes, copy=True)
            hashes[0] ^= 0x5A5A5A  # the entry of the first key: a hash no key of its record has
        return real(self, hashes, phys, tss)

    monkeypatch.setattr(indexwriter._OpenIndex, "put_many", put_many)
    code, verify = _recover(_crash_without_queues(store_copy, "index"))
    assert done, "the index writer was never called"
    assert code == 1, verify
    assert "IDX_KEY_HASH" in {f["code"] for f in verify["findings"]}, verify


def test_a_wrong_queue_unit_is_reported(store_copy, monkeypatch):
    real = dispatch.Dispatcher.dispatch_many
    done = []

    def dispatch_many(self, reqs):
        b = dispatch.DispatchBatch.from_requests(reqs)
        dispatched = np.flatnonzero((b.sysflag & 0xC) == 0)  # transaction type NOT: it gets a unit
        if not done and len(dispatched):
            i = int(dispatched[len(dispatched) // 2])
            done.append(int(b.phy[i]))
            b.tags_code[i] += 1
            b.cq_plan = None
        return real(self, b)

    monkeypatch.setattr(dispatch.Dispatcher, "dispatch_many", dispatch_many)
    code, verify = _recover(_crash_without_queues(store_copy, "queue"))
    assert done, "nothing was dispatched"
    assert code == 1, verify
    bad = [f for f in verify["findings"] if f["code"] == "CQ_TAGS"]
    assert bad, verify
