"""Recovery's derived-file check in verify's sub-segment windows (derived_windows over
verify_commitlog.WINDOW_BYTES windows; kept index files checked with verify's IndexWindows): with a tiny window
size the broker-written stores have many windows per segment, and index findings must equal the whole record
table's (the seeded plans in small windows are test_recovery_memory's small-windows case); the index check's memory
must follow a window, not the records an index file points at."""

from __future__ import annotations

import os
import random
import tracemalloc

import pytest

from rmqstore_cli.engine.verify import commitlog as verify_commitlog, index as verify_index
from rmqstore_cli.engine.store import Store
from tests.conftest import copy_store
from tests.test_verify_memory import _damage_index

SEED = int(os.environ.get("RMQSTORE_VMEM_SEED", random.randrange(1 << 30)))


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean", "5.3.3-v2topic"])
def test_index_problems_by_file_equal_the_whole_table(tmp_path, monkeypatch, name):
    """Kept index files (seeded lies: offsets past the end, into other windows, nowhere, negative; hashes,
    links, times) checked window by window give the whole record table's findings, for the log's end and for
    an end cut in the middle of the log (entries past it)."""
    from rmqstore_cli.engine.repair.derived import record_table
    from rmqstore_cli.engine.repair.derived_windows import index_problems
    from rmqstore_cli.engine.repair.derived_windows import index_problems_by_file

    print("seed", SEED)
    rng = random.Random(SEED)
    seen = 0
    for case in range(4):
        monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", (3000, 4096, 64 << 20, 1000)[case])
        root = copy_store(name, tmp_path / f"{name}-{case}")
        if case:
            _damage_index(root, rng)
        with Store.open(str(root)) as st:
            segs = st.commitlog.segments.segments
            data_end = segs[-1].start + segs[-1].size
            mid = segs[len(segs) // 2]
            for end in (data_end, mid.start + rng.randrange(mid.size)):
                files = st.index.files
                want = [f.as_json() for f in index_problems(st, record_table(st, end), files)]
                got = [f.as_json() for f in index_problems_by_file(st, end, files)]
                assert sorted(map(str, got)) == sorted(map(str, want)), (case, end)
                assert got == want, (case, end)
                seen += len(want)
    assert seen  # the lies and the cut reached the checks


@pytest.fixture(scope="module")
def one_segment_stores_with_index(tmp_path_factory):
    """Two stores of 100 B messages in ONE segment each with their index file, the second 4x larger."""
    from bench import gen

    out = []
    for mib in (2, 8):
        root = str(tmp_path_factory.mktemp("rsub") / f"one-{mib}")
        gen.generate(root, 100, total=mib << 20, seg_size=mib << 20)
        out.append(root)
    return out


def _index_check_peak(root: str) -> tuple[int, int]:
    from rmqstore_cli.engine.repair.derived_windows import index_problems_by_file

    with Store.open(root) as st:
        seg = st.commitlog.segments.segments[-1]
        end = seg.start + seg.size
        files = st.index.files
        index_problems_by_file(st, end, files)  # warm: one-time allocations (kernel caches) are not the check's
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            probs = index_problems_by_file(st, end, files)
            peak = tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()
        entries = sum(f.header().indexCount for f in files)
    assert not probs, [p.code for p in probs]
    return peak, entries


def test_index_check_memory_follows_the_window(monkeypatch, one_segment_stores_with_index):
    """An index file pointing at 4x the records of one segment needs no more memory (a table of the records it
    points at took ~1.4 MB more here); entry blocks kept small so that only the records could grow it."""
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 256 << 10)
    monkeypatch.setattr(verify_index, "_ENTRY_BLOCK", 1024)
    (small, n_small), (large, n_large) = (_index_check_peak(r) for r in one_segment_stores_with_index)
    print(f"index check peak {small >> 10} KiB ({n_small} entries), {large >> 10} KiB ({n_large} entries)")
    assert n_large > 3 * n_small
    assert large - small < 512 << 10, (small, large)
