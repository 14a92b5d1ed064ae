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


def _queue_files(tmp_path, n: int, budget) -> list:
    """``n`` small queue files (mapped as the queue files of a store are, under ``budget``)."""
    segs = []
    for k in range(n):
        path = tmp_path / ("%020d" % (k * 2000))
        path.write_bytes(bytes(range(20)) * 100)
        segs.append(segments.Segment(str(path), path.name, k * 2000, 2000,
                                     budget=segments.MapBudget(shared=budget), data_ahead=True))
    return segs


def _mappings(monkeypatch) -> list:
    calls, real = [], segments._map_read_only
    monkeypatch.setattr(segments, "_map_read_only", lambda path, *a: calls.append(path) or real(path, *a))
    return calls


def test_passes_in_file_order_keep_the_budgets_first_files(tmp_path, budget, monkeypatch):
    """A command's passes go through the queue files in the same order. Past the budget, letting the least recently
    used file go let go the one the next pass needs first: every file was mapped again in every pass (recover's plan
    of 20,000 queue files under a budget of 10,000: 140,000 mappings). Most of the budget's files of a pass now stay
    for the next: 100 files under a budget of 50, a second pass maps about the 50 files the budget cannot hold."""
    budget.limit = 50
    segs = _queue_files(tmp_path, 100, budget)
    calls = _mappings(monkeypatch)
    for s in segs:
        s.buffer()
    assert len(calls) == 100 and len(budget.mapped) == 50
    del calls[:]
    for s in segs:
        s.buffer()
    assert 50 <= len(calls) <= 100 - (50 - budget.RECENT), len(calls)  # least-recently-used: all 100 again
    assert len(budget.mapped) == 50 and budget.let_go


def test_the_files_last_used_stay_past_the_budget(tmp_path, budget, monkeypatch):
    """The files last used are not let go for another (least-recently-used there): two files used in turn, after a
    pass over more files than the budget, are mapped once each; and with a budget smaller than the files kept that
    way, the least recently used goes (never more than the limit mapped)."""
    budget.limit = 20
    segs = _queue_files(tmp_path, 40, budget)
    for s in segs[:30]:
        s.buffer()
    calls = _mappings(monkeypatch)
    for _ in range(10):
        segs[35].buffer()
        segs[36].buffer()
    assert sorted(calls) == sorted([segs[35].path, segs[36].path])
    fresh = segments.SharedQueueFiles()
    fresh.limit = 2
    (tmp_path / "small").mkdir()
    small = _queue_files(tmp_path / "small", 5, fresh)
    for s in small + small:
        s.buffer()
        assert len(fresh.mapped) <= 2
    assert list(fresh.mapped) == [id(small[3]), id(small[4])]  # least recently used let go
