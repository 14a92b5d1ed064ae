"""Queue files mapped for reading share one budget (``segments.QUEUE_FILES``): half the descriptors the process may
hold. Every mapping keeps a descriptor, and a broker with tens of thousands of queues (an LMQ broker: one per LMQ
queue) has more queue files than a host whose hard limit cannot be raised (a container) lets a process open: verify
stopped with "Too many open files" at 20,000 queue files under a hard limit of 20,000. Past the budget the least
recently used file is let go, and the window checks keep no view of a queue file longer than they use it, so a file
let go is unmapped and its descriptor closed.

Checked on the broker-written stores with the budget forced down to two files: the same findings and summary as
with room for every file, at ``-j 1`` and ``-j 2``, and never more than a few queue files mapped at once."""

from __future__ import annotations

import os
import weakref

import pytest

from rmqstore_cli.engine.log import segments
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify.pipeline import verify_store, verify_store_jobs
from tests.conftest import require_shared, shared_store

STORES = ["4.9.3-clean", "4.9.3-crash", "5.3.3-clean", "lmq-5.3.3", "4.9.3-ext"]


class _Mapped:
    """Counts the queue files' read-only mappings alive, and the most alive at once (weak references: a mapping
    let go and no longer viewed is gone)."""

    def __init__(self, monkeypatch):
        self.alive: list = []
        self.most = 0
        real = segments._map_read_only

        def mapping(path, size, data_ahead=False, *more):
            m = real(path, size, data_ahead, *more)
            if data_ahead:  # queue files (segments.DATA_AHEAD_KINDS)
                self.alive = [r for r in self.alive if r() is not None]
                self.alive.append(weakref.ref(m))
                self.most = max(self.most, len(self.alive))
            return m

        monkeypatch.setattr(segments, "_map_read_only", mapping)


def _verify(name: str, jobs: int):
    st = Store.open(str(shared_store(name)))
    try:
        r = verify_store(st) if jobs == 1 else verify_store_jobs(st, jobs)
        return [f.as_json() for f in r.findings], r.summary
    finally:
        st.close()


@pytest.fixture
def budget(monkeypatch):
    """QUEUE_FILES as at the start of a command (nothing mapped, nothing let go); returns a setter of its limit."""
    fresh = segments.SharedQueueFiles()
    monkeypatch.setattr(segments, "QUEUE_FILES", fresh)
    from rmqstore_cli.engine.verify import queueruns

    monkeypatch.setattr(queueruns, "QUEUE_FILES", fresh)
    return fresh


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("name", STORES)
def test_verify_with_two_queue_files_mapped_finds_the_same(name, jobs, budget, monkeypatch):
    require_shared()
    free = _verify(name, jobs)
    assert not budget.let_go  # room for every file: nothing let go, nothing changed
    budget.limit = 2
    mapped = _Mapped(monkeypatch)
    tight = _verify(name, jobs)
    assert tight == free
    files = sum(len(fs) for dp, _, fs in os.walk(shared_store(name)) if "consumequeue" in dp)
    if jobs == 1 and files > 4:
        assert budget.let_go
        # the budget, the file being read and one the per-queue rule (4 a queue) has not let go yet
        assert mapped.most <= 4, (mapped.most, files)


def test_the_budget_lets_the_oldest_go_and_forgets_closed_files(tmp_path, budget):
    budget.limit = 2
    paths = []
    for k in range(4):
        d = tmp_path / f"q{k}"
        d.mkdir()
        p = d / ("%020d" % 0)
        p.write_bytes(b"\1" * 4096)
        paths.append(str(d))
    queues = [segments.SegmentQueue(d, 4096, "consume queue") for d in paths]
    segs = [q.segments[0] for q in queues]
    assert all(q.budget.shared is budget for q in queues)
    for s in segs[:3]:
        assert bytes(s.buffer()[:1]) == b"\1"
    assert segs[0]._map is None and segs[1]._map is not None and segs[2]._map is not None
    assert id(segs[0]) not in queues[0].budget.mapped  # let go from its queue's own budget too
    assert budget.let_go
    segs[1].buffer()  # used again: now the newest
    segs[3].buffer()
    assert segs[2]._map is None and segs[1]._map is not None
    segs[1].close()
    assert id(segs[1]) not in budget.mapped
    assert bytes(segs[0].buffer()[:1]) == b"\1"  # mapped again when next needed
    commitlog = segments.SegmentQueue(paths[0], 4096, "commitlog")
    assert commitlog.budget.shared is None  # commitlog files keep their own budget


def _plan(name: str, jobs: int):
    from rmqstore_cli.engine.repair.recovery import plan_recovery

    st = Store.open(str(shared_store(name)))
    try:
        plan = plan_recovery(st, with_verify=True, jobs=jobs)
        return plan.as_json(), [f.as_json() for f in plan.verify_findings or []]
    finally:
        st.close()


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("name", ["4.9.3-crash", "5.3.3-clean", "lmq-5.3.3"])
def test_recovery_plan_with_two_queue_files_mapped_is_the_same(name, jobs, budget, monkeypatch):
    """The derived-file check of recover's plan (and truncate's, rebuild's) keeps no view of a queue file between
    windows once files are let go: it reads each window's units from the file, mapped again."""
    require_shared()
    free = _plan(name, jobs)
    budget.limit = 2
    mapped = _Mapped(monkeypatch)
    tight = _plan(name, jobs)
    assert tight == free
    if jobs == 1:
        assert budget.let_go
        assert mapped.most <= 4, mapped.most


def test_a_store_left_unclosed_is_collected_with_its_files(tmp_path, budget):
    """The shared budget holds its files weakly: a store nobody closed goes, and its mappings with it."""
    import gc

    d = tmp_path / "q"
    d.mkdir()
    (d / ("%020d" % 0)).write_bytes(b"\1" * 4096)
    q = segments.SegmentQueue(str(d), 4096, "consume queue")
    seg = q.segments[0]
    mapping = weakref.ref(seg.buffer())
    assert id(seg) in budget.mapped
    del q, seg
    gc.collect()
    assert mapping() is None  # unmapped, its descriptor closed


def test_a_collected_file_leaves_the_budget(tmp_path, budget):
    import gc

    d = tmp_path / "q"
    d.mkdir()
    (d / ("%020d" % 0)).write_bytes(b"\1" * 4096)
    q = segments.SegmentQueue(str(d), 4096, "consume queue")
    q.segments[0].buffer()
    assert len(budget.mapped) == 1
    del q
    gc.collect()
    assert len(budget.mapped) == 0  # no entry left behind per file ever read
