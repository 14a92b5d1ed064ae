"""A few files of each directory mapped at once (mappings released segment by segment)."""

import gc
import re

import pytest

from rmqstore_cli.engine.log import segments as segments_mod
from rmqstore_cli.engine.log.segments import MapBudget, Segment
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify.pipeline import verify_store

from .conftest import shared_store


def _mappings(directory: str) -> set[tuple[str, str]]:
    """(address range, file) of each of this process's mappings of a segment file in ``directory``."""
    pattern = re.compile(re.escape(directory) + r"/\d+$")
    with open("/proc/self/maps") as f:
        return {(fields[0], fields[-1]) for fields in (line.split() for line in f) if pattern.search(fields[-1])}


@pytest.mark.parametrize("name", ["4.9.3-crash", "5.3.3-clean"])
def test_verify_keeps_a_few_segments_mapped_and_finds_the_same(name, monkeypatch):
    """verify maps at most two commitlog files at once and finds what it finds with every file mapped.
    The unbounded store stays open meanwhile, as a store another test left open would: only the
    bounded store's own mappings are counted."""
    root = shared_store(name)
    commitlog_dir = str(root / "commitlog")
    monkeypatch.setattr(segments_mod, "MAPPED_FILES", 1 << 20)  # every file stays mapped: the old behaviour
    with Store.open(str(root)) as other:
        unbounded = verify_store(other)
        assert sum(s._map is not None for s in other.commitlog.segments.segments) > 8
        monkeypatch.setattr(segments_mod, "MAPPED_FILES", 2)
        gc.collect()
        before = _mappings(commitlog_dir)
        assert len(before) > 8
        with Store.open(str(root)) as st:
            bounded = verify_store(st)
            segs = st.commitlog.segments.segments
            assert len(segs) > 8
            assert sum(s._map is not None for s in segs) <= 2
            assert len({path for _, path in _mappings(commitlog_dir) - before}) <= 2
            assert sum(f.segment._map is not None for f in st.index.files) <= 2
    assert [f.as_json() for f in bounded.findings] == [f.as_json() for f in unbounded.findings]
    assert bounded.summary == unbounded.summary


def test_a_dropped_mapping_stays_valid_for_whoever_holds_it():
    files = sorted((shared_store("4.9.3-clean") / "commitlog").iterdir())[:3]
    budget = MapBudget(1)
    segs = [Segment(str(p), p.name, int(p.name), p.stat().st_size, budget=budget) for p in files]
    held = segs[0].buffer()
    first = bytes(held[:64])
    segs[1].buffer()
    segs[2].buffer()
    assert segs[0]._map is None and segs[1]._map is None and segs[2]._map is not None
    assert bytes(held[:64]) == first == files[0].read_bytes()[:64]  # still readable
    assert bytes(segs[0].buffer()[:64]) == first  # mapped again on demand
    for s in segs:
        s.close()
