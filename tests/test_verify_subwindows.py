"""verify in sub-segment windows (verify_commitlog.WINDOW_BYTES): a production segment is 1 GiB, so a window is
a fixed offset range inside a segment. With a tiny window size the broker-written stores have many windows per
segment, window boundaries fall inside records, and damage lands next to them: the findings and summary must
still equal the whole-log formulation's, and memory must follow the window, not the segment."""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.records import MAGIC_BLANK
from rmqstore_cli.engine.verify import commitlog as verify_commitlog
from rmqstore_cli.engine.verify import queueruns
from rmqstore_cli.engine.verify import windows as verify_windows
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify.pipeline import _verify_whole_log, verify_store
from tests.conftest import copy_store
from tests.test_verify_memory import _damage_index, _damage_log, _damage_queues, _undispatch

SEED = int(os.environ.get("RMQSTORE_VMEM_SEED", random.randrange(1 << 30)))
SMALL_WINDOWS = (4096, 3000)  # 3000: boundaries at no alignment the broker's records keep


def _records(root) -> list[tuple[str, int, int, int]]:
    """(segment path, segment start, record offset, record size) of every record verify reads, whole segments."""
    with Store.open(str(root)) as st:
        cl = st.commitlog
        out = []
        for rep in verify_commitlog.verify_segments(cl, range(len(cl.segments.segments)), check_crc=False):
            out += [(rep.path, rep.start, int(p), int(s)) for p, s in zip(rep.cols["phy"], rep.cols["size"])]
    return out


def _damage_near_boundary(root, rng: random.Random, window: int) -> str:
    """One record that crosses a window boundary, or starts just after one, made invalid (a body byte: CRC),
    torn (its second half and the rest of the file zeroed), a BLANK marker, or garbage."""
    recs = _records(root)
    crossing = [r for r in recs if (r[2] - r[1]) // window != (r[2] + r[3] - 1 - r[1]) // window
                or (r[2] - r[1]) % window < 64]
    path, seg_start, phy, size = rng.choice(crossing)
    pos = phy - seg_start
    data = bytearray(open(path, "rb").read())
    how = rng.choice(["crc", "torn", "blank", "garbage"])
    if how == "crc":
        h = fast.decode_headers(bytes(data), np.asarray([pos], np.int64))
        data[int(h.bodyStart[0]) + rng.randrange(max(int(h.bodyLength[0]), 1))] ^= 0xFF
    elif how == "torn":
        cut = pos + size // 2
        data[cut:] = bytes(len(data) - cut)
    elif how == "blank":
        struct.pack_into(">ii", data, pos, len(data) - pos, MAGIC_BLANK)
    else:
        data[pos:pos + 8] = bytes(rng.randrange(256) for _ in range(8))
    os.chmod(path, 0o644)
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    return how


def _same(root) -> tuple[list, dict]:
    with Store.open(str(root)) as st:
        windowed = verify_store(st)
    with Store.open(str(root)) as st:
        whole = _verify_whole_log(st)
    got, want = [f.as_json() for f in windowed.findings], [f.as_json() for f in whole.findings]
    assert got == want
    assert windowed.summary == whole.summary
    return want, whole.summary


@pytest.mark.parametrize("name", ["4.9.3-clean", "4.9.3-crash", "5.3.3-clean"])
def test_windows_of_several_segments_verify_equal_whole_log_verify(tmp_path, monkeypatch, name):
    """Runs of small segments share a window (verify_commitlog.grouped_windows): two to five 64 KiB segments each,
    the store as written, damage to the first records of segments (next to a boundary inside a window or between
    two) and random damage to the log, queues and index files give the whole-log findings and summary."""
    print(f"seed {SEED} (RMQSTORE_VMEM_SEED)")
    rng = random.Random(SEED)
    for case in range(4):
        segments = (2, 3, 5, 4)[case]
        monkeypatch.setattr(verify_commitlog, "GROUP_BYTES", segments * 65536 + rng.randrange(65536))
        root = copy_store(name, tmp_path / f"{name}-{case}")
        if case:
            _damage_near_boundary(root, rng, 65536)
            for damage in rng.sample([_damage_index, _damage_queues, _damage_log], rng.randint(0, 2)):
                damage(root, rng)
        with Store.open(str(root)) as st:
            cl = st.commitlog
            starts, group = verify_commitlog.grouped_windows(cl.segments.segments, cl.segments.file_size)
            assert len(group) == len(cl.segments.segments) and 1 < len(starts) <= -(-len(group) // segments) + 1
        findings, _ = _same(root)
        if case:
            assert findings, case  # the damage is seen


@pytest.mark.parametrize("name", ["4.9.3-clean", "4.9.3-crash", "5.3.3-clean", "5.3.3-v2topic"])
def test_small_windows_verify_equals_whole_log_verify(tmp_path, monkeypatch, name):
    """Many windows per segment: the store as written, seeded damage near window boundaries, and random damage
    to the log, queues and index files give the whole-log findings and summary."""
    print(f"seed {SEED} (RMQSTORE_VMEM_SEED)")
    rng = random.Random(SEED)
    reached = set()
    for case in range(6):
        window = SMALL_WINDOWS[case % 2]
        monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", window)
        # a queue file's runs found from samples of every 1st, 3rd or 1024th unit's window
        monkeypatch.setattr(verify_windows, "_SAMPLE_STEP", (1, 3, 1024)[case % 3])
        # every queue's run in a call of its own, long and short runs mixed, or every run in one batch
        monkeypatch.setattr(queueruns, "BATCH_UNITS", (1, 2, 8192)[case // 2])
        # an ordered file's run read in rounds of one unit and then twice as many, or read as the samples allow
        monkeypatch.setattr(queueruns, "_GUESS", (1, 64)[case % 2])
        monkeypatch.setattr(queueruns, "_MARGIN", (0, 16)[case % 2])
        root = copy_store(name, tmp_path / f"{name}-{case}")
        if case:
            reached.add(_damage_near_boundary(root, rng, window))
            for damage in rng.sample([_damage_index, _damage_queues, _damage_log], rng.randint(0, 2)):
                damage(root, rng)
        with Store.open(str(root)) as st:
            n_windows = verify_commitlog.first_windows(st.commitlog)[-1]
            assert n_windows >= 4 * len(st.commitlog.segments.segments)
        findings, _ = _same(root)
        if case:
            assert findings, case  # the damage is seen
    print("boundary damage:", sorted(reached))


@pytest.mark.parametrize("window", [4096, 3000, 1 << 30])
def test_window_reports_are_the_segment_report_cut_by_offset(tmp_path, monkeypatch, window):
    """Each window report holds exactly the records whose first byte lies in its range, with their key hashes;
    together they are the whole-segment report (same walk), the segment-level fields on the last one."""
    root = copy_store("5.3.3-clean", tmp_path / "s")
    _damage_near_boundary(root, random.Random(SEED), 4096)
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", window)
    with Store.open(str(root)) as st:
        cl = st.commitlog
        firsts = verify_commitlog.first_windows(cl)
        whole = verify_commitlog.verify_segments(cl, range(len(cl.segments.segments)))
        for i, seg in enumerate(cl.segments.segments):
            starts = verify_commitlog.window_starts(seg, cl.segments.file_size)
            reps = list(verify_commitlog.iter_segment_windows(cl, i))
            assert [r.index for r in reps] == list(range(firsts[i], firsts[i + 1]))
            assert [r.last for r in reps] == [False] * (len(reps) - 1) + [True]
            ends = [*starts[1:].tolist(), seg.start + seg.size]
            for r, lo, hi in zip(reps, starts.tolist(), ends):
                assert r.window_start == lo and r.segment == i
                assert ((r.cols["phy"] >= lo) & (r.cols["phy"] < hi)).all()
                assert len(r.key_hashes) == int(r.cols["keyCount"].sum())
            w = whole[i]
            for c, col in w.cols.items():
                assert np.array_equal(np.concatenate([r.cols[c] for r in reps]) if c != "topic" else
                                      [reps[-1].topics[t] for r in reps for t in r.cols["topic"]],
                                      col if c != "topic" else [w.topics[t] for t in col]), c
            assert np.array_equal(np.concatenate([r.key_hashes for r in reps]), w.key_hashes)
            last = reps[-1]
            for field in ("invalid", "ended_with_blank", "stop_offset", "stop_kind", "data_end", "unread_from",
                          "unread_reported", "all_zero", "records", "bytes", "blanks"):
                assert getattr(last, field) == getattr(w, field), field
            assert [f.as_json() for f in last.findings] == [f.as_json() for f in w.findings]
            assert not any(r.findings or r.invalid for r in reps[:-1])
            (joined,) = verify_commitlog.whole_segments(iter(list(verify_commitlog.iter_segment_windows(cl, i))))
            assert joined.index == i and joined.window_start == seg.start
            for c, col in w.cols.items():
                assert np.array_equal(joined.cols[c], col), c
            assert np.array_equal(joined.key_hashes, w.key_hashes)
    if window < 1 << 20:
        assert len(reps) > 1


@pytest.mark.parametrize("how", ["none", "tails", "shifted"])
def test_small_windows_undispatched_equal_whole_log(tmp_path, monkeypatch, how):
    """CQ_NOT_DISPATCHED / CQ_DISPATCH_LAG with many windows per segment (``shifted``: the high-water mark falls
    inside a window that is read again, alone)."""
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 3000)
    root = copy_store("4.9.3-clean", tmp_path / "s")
    _undispatch(root, how)
    findings, _ = _same(root)
    assert {f["code"] for f in findings} & {"CQ_NOT_DISPATCHED", "CQ_DISPATCH_LAG"}


def test_small_windows_streamed_from_workers(tmp_path, monkeypatch):
    """verify -j 2 streams window reports from the workers: same result as one process; whole-segment reports
    handed to verify_store are cut into windows first."""
    from rmqstore_cli.engine.verify.pipeline import InProcessCrossChecks, iter_segments_parallel, verify_segments_parallel

    print(f"seed {SEED} (RMQSTORE_VMEM_SEED)")
    rng = random.Random(SEED)
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 4096)
    root = copy_store("4.9.3-crash", tmp_path / "s")
    _damage_near_boundary(root, rng, 4096)
    _damage_queues(root, rng)
    class Elsewhere(InProcessCrossChecks):
        """A cross-check object that is not the in-process one: verify_store takes the whole-log formulation."""

    with Store.open(str(root)) as st:
        one = verify_store(st)
        stream = iter_segments_parallel(st.commitlog, 2)
        two = verify_store(st, reports=stream)
        whole_reports = verify_store(st, reports=verify_segments_parallel(st.commitlog, 2))
        # window reports joined back into segment reports for the whole-log formulation
        joined = verify_store(st, reports=iter_segments_parallel(st.commitlog, 2), cross_checks=Elsewhere)
    for other in (two, whole_reports, joined):
        assert [f.as_json() for f in other.findings] == [f.as_json() for f in one.findings]
        assert other.summary == one.summary


@pytest.fixture(scope="module")
def one_segment_stores(tmp_path_factory):
    """Two stores of 100 B messages in ONE segment each (KEYS + UNIQ_KEY on every record), the second 4x larger;
    without their index file: its default-geometry slot table (20 MB, bounded per file, tested in
    test_verify_memory) would hide the walk's memory under its own peak."""
    import shutil

    from bench import gen

    out = []
    for mib in (2, 8):
        root = str(tmp_path_factory.mktemp("vsub") / f"one-{mib}")
        gen.generate(root, 100, total=mib << 20, seg_size=mib << 20)
        shutil.rmtree(os.path.join(root, "index"))
        out.append(root)
    return out


def _peak(root: str) -> tuple[int, int]:
    from tests.test_verify_memory import _verify_peak

    with Store.open(root) as st:
        assert len(st.commitlog.segments.segments) == 1
    return _verify_peak(root, warm=True)


def test_verify_memory_follows_the_window_not_the_segment(monkeypatch, one_segment_stores):
    """A segment holding 4x the records needs no more memory: one window's columns at a time (whole-segment
    columns: ~1.6 MB more for the 8 MiB segment than for the 2 MiB one)."""
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 256 << 10)
    (small, n_small), (large, n_large) = (_peak(r) for r in one_segment_stores)
    print(f"verify peak {small >> 10} KiB ({n_small} records), {large >> 10} KiB ({n_large} records) in one segment")
    assert n_large > 3 * n_small
    assert large - small < 512 << 10, (small, large)


from tests.test_verify_memory import larger_bench_store, small_bench_store  # noqa: E402,F401 (fixtures)


def test_undispatched_memory_does_not_grow_with_many_windows(tmp_path, monkeypatch, small_bench_store, larger_bench_store):  # noqa: F811
    """No consume queue at all, 4 KiB windows (thousands per store): every record is undispatched, and what is
    carried between windows is one summary per queue, not one per queue and window (which took ~11 MB more for
    the 4x longer log)."""
    from tests.test_verify_memory import test_verify_memory_without_consume_queues_does_not_grow as check

    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 4096)
    with Store.open(small_bench_store) as st:
        verify_store(st)  # warm: the first call's one-time allocations (kernel caches) are not verify's
    check(tmp_path, small_bench_store, larger_bench_store)


def test_verify_memory_is_flat_with_thousands_of_small_windows(small_bench_store, larger_bench_store, monkeypatch):
    """4 KiB windows (a 4 TB log has ~65k windows of 64 MiB): what a queue carries from window to window is a
    sample of its files' window numbers, not a row per window a file points into (that grew ~1.4 MB here)."""
    from tests.test_verify_memory import _verify_peak

    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 4096)
    small, n_small = _verify_peak(small_bench_store, warm=True)  # lazy kernels and caches are not the windows' memory
    large, n_large = _verify_peak(larger_bench_store)
    print(f"verify peak, 4 KiB windows: {small >> 10} KiB ({n_small} records), {large >> 10} KiB ({n_large} records)")
    assert n_large > 3 * n_small
    assert large - small < 1 << 20, (small, large)


def test_grouped_windows_join_runs_of_one_window_segments(monkeypatch):
    """Worked by hand: segments of one window join the window being filled up to GROUP_BYTES; a segment of several
    windows keeps its own and ends the run; each report of the log's numbering maps to the window holding it."""
    from types import SimpleNamespace as NS

    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 300)
    monkeypatch.setattr(verify_commitlog, "GROUP_BYTES", 250)
    segs = [NS(start=0, size=60), NS(start=400, size=60), NS(start=800, size=400), NS(start=1200, size=60),
            NS(start=1600, size=60), NS(start=2000, size=400)]
    cl = NS(segments=NS(segments=segs, file_size=400))
    starts, group = verify_commitlog.grouped_windows(segs, 400)
    # the log's windows: A, B, C (two), D, E, F (two)
    assert starts.tolist() == [0, 800, 1100, 1200, 2000, 2300]
    assert group.tolist() == [0, 0, 1, 2, 3, 3, 4, 5]
    w = verify_windows.Windows(cl, grouped=True)
    assert [w.of_report(k) for k in range(8)] == [(0, False), (0, True), (1, True), (2, True), (3, False), (3, True),
                                                  (4, True), (5, True)]
    assert [list(w.members(g)) for g in range(6)] == [[0, 1], [2], [3], [4, 5], [6], [7]]
    assert w.bounds(0) == (0, 800) and w.of(np.asarray([0, 799, 800, 1250, 1999])).tolist() == [0, 0, 1, 3, 3]
    monkeypatch.setattr(verify_commitlog, "GROUP_BYTES", 120)  # two 60-byte segments still fit, three do not
    starts, group = verify_commitlog.grouped_windows(segs[:2] + [NS(start=800, size=60)], 400)
    assert (starts.tolist(), group.tolist()) == ([0, 800], [0, 0, 1])
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 100)  # a window never holds more than WINDOW_BYTES
    starts, group = verify_commitlog.grouped_windows(segs[:2], 400)
    assert (starts.tolist(), group.tolist()) == ([0, 400], [0, 1])
    ungrouped = verify_windows.Windows(cl)
    assert ungrouped.group is None and ungrouped.of_report(4) == (4, True) and list(ungrouped.members(4)) == [4]
