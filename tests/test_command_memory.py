"""Commands that look at the records around one offset (get's and truncate's boundary messages, the
msgId explanation, diff's first differing record) walk the segment piecewise and stop past the offset
(formats.fast.neighbours): a broker's 1 GiB segment of 100 B messages holds ~3.6 M records, whose
offsets (or, before, a Python list of them) would grow with the segment (constant memory).
Numpy allocations are measured with tracemalloc, which counts them exactly."""

from __future__ import annotations

import os
import random
import tracemalloc

import numpy as np
import pytest

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.msgid import encode_offset_msgid
from rmqstore_cli.engine.query import diff as diff_mod
from rmqstore_cli.engine.query.explain import explain_msgid
from rmqstore_cli.engine.store import Store
from tests.conftest import STORE_NAMES, shared_store

SEED = int(os.environ.get("RMQSTORE_CMDMEM_SEED", random.randrange(1 << 30)))
PIECE = 1024  # records per walk piece in the memory tests: far fewer than the large segment holds


def _targets(rng, seg_size: int, starts: np.ndarray) -> list[int]:
    picks = [0, 1, seg_size - 1, seg_size, seg_size + 7]
    if len(starts):
        picks += [int(starts[-1]), int(starts[-1]) + 1, int(starts[0]) + 1]
        picks += [int(starts[rng.randrange(len(starts))]) + rng.choice([0, 1, 5]) for _ in range(20)]
    return picks + [rng.randrange(seg_size) for _ in range(20)]


@pytest.mark.parametrize("name", STORE_NAMES)
def test_neighbours_equals_the_whole_segment_walk(name):
    """Same answer as searching the offsets of a whole-segment walk, for any piece size."""
    print("seed", SEED)
    rng = random.Random(SEED)
    with Store.open(str(shared_store(name))) as st:
        for seg in st.commitlog.segments.segments:
            buf = seg.buffer()
            whole = fast.walk(buf, 0, seg.size)
            starts = whole.offsets
            for target in _targets(rng, seg.size, starts):
                k = int(np.searchsorted(starts, target, side="right"))
                before = int(starts[k - 1]) if k else None
                after = int(starts[k]) if k < len(starts) else None
                for piece in (1, 3, 64, None):
                    n = fast.neighbours(buf, target, seg.size, piece=piece)
                    assert (n.before, n.after) == (before, after), (name, seg.name, target, piece)
                    if after is None:
                        assert (n.walk.stop, n.walk.kind) == (whole.stop, whole.kind), (name, target, piece)
                    else:
                        assert n.walk is None


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two generated stores of 100 B messages: ~3.5k records per 1 MiB segment and ~28k per 8 MiB one."""
    from bench import gen

    out = {}
    for seg in (1 << 20, 8 << 20):
        root = str(tmp_path_factory.mktemp("cmdmem") / f"seg{seg}")
        gen.generate(root, 100, total=2 * seg, seg_size=seg)
        out[seg] = root
    return out


def _peak(fn) -> int:
    fn()  # kernels loaded, caches filled: only the call's own allocations are measured below
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def _last_record(st: Store) -> int:
    """Start of the first segment's last record: the walk to reach it crosses the whole segment."""
    seg = st.commitlog.segments.segments[0]
    return seg.start + int(fast.walk(seg.buffer(), 0, seg.size).offsets[-1])


@pytest.mark.parametrize("what", ["boundaries_near", "explain_msgid", "diff_record_at"])
def test_looking_around_an_offset_does_not_grow_with_the_segment(stores, what, monkeypatch):
    monkeypatch.setattr(fast, "WALK_PIECE", PIECE)
    peaks, answers = {}, {}
    for seg, root in stores.items():
        with Store.open(root) as st:
            last = _last_record(st)
            if what == "boundaries_near":
                call = lambda: st.commitlog.boundaries_near(last + 1)  # noqa: E731
            elif what == "explain_msgid":
                mid = encode_offset_msgid(bytes([10, 0, 0, 1]), 10911, last + 1)
                call = lambda: explain_msgid(st, mid)  # noqa: E731
            else:
                call = lambda: diff_mod._record_at(st.commitlog, last + 1)  # noqa: E731
            peaks[seg] = _peak(call)
            answers[seg] = (call(), last)
    small, large = peaks[1 << 20], peaks[8 << 20]
    print(f"{what}: peak {small} B at ~3.5k records per segment, {large} B at ~28k")
    for seg, (answer, last) in answers.items():  # the answers are about the record at `last`
        if what == "boundaries_near":
            assert answer == (last, seg), answer  # a BLANK ends the first segment: the next record opens the next
        elif what == "explain_msgid":
            assert answer["status"] == "not-a-record" and answer["nearestBefore"] == last, answer
        else:
            assert answer["offset"] == last and answer["byteInRecord"] == 1, answer
    # the whole-segment offsets at 28k records are ~226 KB (and a list of them ~1 MB): none of it may show
    assert large - small < 64 << 10, (small, large)


def _reference_cuts(seg, limit: int, split: int) -> tuple[list[int], int, str]:
    """spark's range planning over one whole-segment walk (the formulation the piecewise one replaced)."""
    w = fast.walk(seg.buffer(), 0, limit)
    cuts = [0]
    while True:
        k = int(np.searchsorted(w.offsets, cuts[-1] + split))
        if k >= len(w.offsets):
            return cuts + [w.stop], w.stop, w.kind
        cuts.append(int(w.offsets[k]))


@pytest.mark.parametrize("piece", [1, 3, 64, None])
def test_spark_ranges_equal_the_whole_segment_planning(piece, stores, monkeypatch):
    from rmqstore_cli.spark.datasource import plan_segment

    print("seed", SEED)
    rng = random.Random(SEED + (piece or 0))
    if piece:
        monkeypatch.setattr(fast, "WALK_PIECE", piece)
    roots = [str(shared_store(n)) for n in STORE_NAMES] + [stores[1 << 20]]
    for root in roots:
        with Store.open(root) as st:
            for seg in st.commitlog.segments.segments:
                if not seg.size:
                    continue
                split = rng.choice([1, 500, 8000, rng.randrange(1, seg.size + 2), 1 << 62])
                limit = min(seg.size, st.commitlog.segments.file_size)
                ranges = plan_segment(st.root, seg, st.commitlog.segments.file_size, st.config, split)
                bounds, stop, kind = _reference_cuts(seg, limit, split)
                assert [r.pos for r in ranges] + [ranges[-1].end] == bounds, (root, seg.name, split, piece)
                assert ranges[-1].tail_kind == kind, (root, seg.name, split, piece)


def test_spark_range_planning_does_not_grow_with_the_segment(stores, monkeypatch):
    from rmqstore_cli.spark.datasource import plan_segment

    monkeypatch.setattr(fast, "WALK_PIECE", PIECE)
    peaks = {}
    for seg_size, root in stores.items():
        with Store.open(root) as st:
            seg = st.commitlog.segments.segments[0]
            peaks[seg_size] = _peak(lambda: plan_segment(st.root, seg, seg_size, st.config, 1 << 62))
    small, large = peaks[1 << 20], peaks[8 << 20]
    print(f"plan_segment: peak {small} B at ~3.5k records per segment, {large} B at ~28k")
    assert large - small < 64 << 10, (small, large)


def _salvage_scan(root: str) -> tuple[list, list]:
    from rmqstore_cli.engine.repair import salvage

    with Store.open(root) as st:
        report = salvage.SalvageReport()
        found = [(seg.start, pos) for seg, pos in salvage.scan(st, st.config.version, report)]
    return found, report.skipped


def _damaged_copy(src: str, dest, rng: random.Random) -> str:
    import shutil

    shutil.copytree(src, dest)
    cl = os.path.join(dest, "commitlog")
    for name in sorted(os.listdir(cl)):
        size = os.path.getsize(os.path.join(cl, name))
        with open(os.path.join(cl, name), "r+b") as f:
            for _ in range(rng.randint(0, 4)):
                f.seek(rng.randrange(size))
                f.write(bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))))
    return str(dest)


@pytest.mark.parametrize("pause", [1, 100, 5000])
def test_salvage_walks_the_same_in_stretches(pause, stores, tmp_path, monkeypatch):
    """salvage.scan pausing every few records rescues and skips exactly what one walk does."""
    from rmqstore_cli.engine.repair import salvage

    print("seed", SEED)
    rng = random.Random(SEED + pause)
    roots = [str(shared_store(n)) for n in STORE_NAMES]
    roots += [_damaged_copy(stores[1 << 20], tmp_path / f"d{k}", rng) for k in range(2)]
    for root in roots:
        monkeypatch.setattr(salvage, "PAUSE_RECORDS", 1 << 62)
        whole = _salvage_scan(root)
        monkeypatch.setattr(salvage, "PAUSE_RECORDS", pause)
        assert _salvage_scan(root) == whole, root


def test_salvage_memory_does_not_grow_with_the_segment(stores, monkeypatch):
    from rmqstore_cli.engine.repair import salvage

    monkeypatch.setattr(salvage, "PAUSE_RECORDS", PIECE)
    monkeypatch.setattr(salvage, "WALK_CHUNK", PIECE // 4)
    peaks = {}
    for seg_size, root in stores.items():
        with Store.open(root) as st:
            def consume(st=st):
                report = salvage.SalvageReport()
                for _ in salvage.scan(st, st.config.version, report):
                    pass
            peaks[seg_size] = _peak(consume)
    small, large = peaks[1 << 20], peaks[8 << 20]
    print(f"salvage scan: peak {small} B at ~3.5k records per segment, {large} B at ~28k")
    # gathering a segment's offsets grows by 8 B per record (~198 KB here); pausing keeps the growth
    # to the garbage the walk's chunks leave until the next collection (~2 B per record)
    more = (len(_salvage_scan(stores[8 << 20])[0]) - len(_salvage_scan(stores[1 << 20])[0])) // 2  # per segment
    assert large - small < more * 8 // 2, (small, large, more)


def _times(root: str) -> tuple[list, list]:
    """Every record's (offset, store time) in log order, from one scan."""
    offs, times = [], []
    with Store.open(root) as st:
        for chunk in st.commitlog.scan(check_crc=False):
            offs += (chunk.headers.offsets + chunk.segment.start).tolist()
            times += chunk.headers.storeTimestamp.tolist()
    return offs, times


@pytest.mark.parametrize("piece", [1, 7, 1000])
def test_time_search_in_pieces_finds_the_same_record(piece, stores, monkeypatch):
    """commitlog_offset_at searching a segment piecewise gives the whole-segment answer (on the broker
    stores, whatever it is) and on the generated stores (store times in log order) the first record
    stored at or after the time."""
    from rmqstore_cli.engine.log import storetime

    print("seed", SEED)
    rng = random.Random(SEED + piece)
    roots = [str(shared_store(n)) for n in STORE_NAMES] + list(stores.values())
    for root in roots:
        offs, times = _times(root)
        picks = [times[0] - 1, times[-1], times[-1] + 1] + [rng.choice(times) + rng.choice([-1, 0, 1])
                                                             for _ in range(15)]
        with Store.open(root) as st:
            for t in picks:
                monkeypatch.setattr(storetime, "SEARCH_PIECE", 1 << 40)
                whole = storetime.commitlog_offset_at(st.commitlog, t)
                monkeypatch.setattr(storetime, "SEARCH_PIECE", piece)
                got = storetime.commitlog_offset_at(st.commitlog, t)
                assert got == whole, (root, t, piece)
                if root in stores.values():
                    k = int(np.searchsorted(times, t, side="left"))
                    assert got == (offs[k] if k < len(offs) else None), (root, t)


def test_time_search_does_not_grow_with_the_segment(stores, monkeypatch):
    from rmqstore_cli.engine.log import storetime

    monkeypatch.setattr(storetime, "SEARCH_PIECE", PIECE // 4)
    monkeypatch.setattr(fast, "WALK_PIECE", PIECE)
    peaks = {}
    for seg_size, root in stores.items():
        with Store.open(root) as st:
            seg = st.commitlog.segments.segments[0]
            last = _last_record(st)
            t = int(fast.decode_headers(seg.buffer(), np.array([last - seg.start])).storeTimestamp[0])
            assert storetime.commitlog_offset_at(st.commitlog, t) <= last
            peaks[seg_size] = _peak(lambda: storetime.commitlog_offset_at(st.commitlog, t))
    small, large = peaks[1 << 20], peaks[8 << 20]
    print(f"commitlog_offset_at: peak {small} B at ~3.5k records per segment, {large} B at ~28k")
    assert large - small < 64 << 10, (small, large)


def _follow_offsets(root: str, count: int) -> list:
    from rmqstore_cli.engine.query.follow import Follower

    out = []
    with Store.open(root) as st:
        chunks = Follower(st.commitlog, 0, poll=0.001).chunks(stop=lambda: len(out) >= count)
        for chunk in chunks:
            out += (chunk.headers.offsets + chunk.segment.start).tolist()
    return out[:count]


def test_follow_decodes_in_steps(stores, monkeypatch):
    """dump --follow from an early offset: the same records in order, in steps of FOLLOW_CHUNK, and the
    first step's memory does not grow with the rest of the segment."""
    from rmqstore_cli.engine.query import follow

    root = stores[8 << 20]
    offs, _ = _times(root)
    monkeypatch.setattr(follow, "FOLLOW_CHUNK", 300)
    assert _follow_offsets(root, len(offs)) == offs  # across the BLANK into the second segment
    peaks = {}
    for seg_size, root in stores.items():
        peaks[seg_size] = _peak(lambda root=root: _follow_offsets(root, 10))
    small, large = peaks[1 << 20], peaks[8 << 20]
    print(f"follow: peak {small} B at ~3.5k records per segment, {large} B at ~28k")
    assert large - small < 64 << 10, (small, large)
