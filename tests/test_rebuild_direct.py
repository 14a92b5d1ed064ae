"""``rebuild -j``'s workers write the consume-queue units themselves (engine/derived/cqdirect.py): the files must be
those of the unit-by-unit writer, and the parent must refuse (and build again) whenever they could differ.

1. The protocol on random unit sequences (seed printed): a "worker" writes every straight group at its queue offset
   before the "parent" accepts any, as a worker running ahead does; when nothing is refused the files are byte for
   byte those of ConsumeQueueWriter.put_many and every unit sits at QUEUEOFFSET * 20 (checked on the bytes, with
   struct); a sequence whose offsets run on without gaps or repeats is never refused.
2. On broker-written stores: ``rebuild all -j 2`` takes the workers' path (no second, classic build) and leaves the
   files of ``-j 1``; a log that ends in the middle segment is built again classically, with the same files.
"""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest

from rmqstore_cli.engine.config.storeconfig import StoreConfig
from rmqstore_cli.engine.derived import cqdirect
from rmqstore_cli.engine.derived.consumequeue import CQ_DTYPE
from rmqstore_cli.engine.derived.cqwriter import ConsumeQueueWriter
from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from .conftest import copy_store, seed_params
from .fuzzlib import tree_bytes
from .test_rebuild_jobs import _middle_record, _rebuild, _zeroed_tail

SEEDS = seed_params(6, 1, 2, 3)


@pytest.fixture(autouse=True)
def _workers_path(monkeypatch):
    """The command takes the workers' path when verify's walk kept no columns that stand for every segment
    (engine/repair/rebuildwalk.py): that walk is left out here, so that these tests run the workers' path."""
    from rmqstore_cli.engine.repair import rebuildwalk

    monkeypatch.setattr(rebuildwalk, "_new_spill", lambda store: None)


def _sequence(rng: random.Random, clean: bool) -> list[tuple]:
    """(phy, size, tags, queue offset) of one queue's records in log order: ends increasing; with ``clean`` the
    offsets run on from a first one (not always 0: the pre-blank fill), otherwise with the odd gap or repeat."""
    out = []
    phy = rng.randrange(0, 1000)
    qo = rng.choice([0, 0, 3, 11, 40])
    for _ in range(rng.randrange(1, 60)):
        size = rng.randrange(50, 300)
        out.append((phy, size, rng.randrange(-2**40, 2**40), qo))
        phy += size + rng.choice([0, 0, 7])
        qo += 1
        if not clean and rng.random() < 0.08:
            qo += rng.choice([-3, -1, 1, 2])
            qo = max(qo, 0)
    return out


def _groups(rng: random.Random, seq: list) -> list[list]:
    """The sequence cut into chunk groups, as a worker's chunks cut a queue's records."""
    cuts = sorted(rng.sample(range(1, len(seq)), k=min(len(seq) - 1, rng.randrange(0, 6)))) if len(seq) > 1 else []
    return [seq[a:b] for a, b in zip([0] + cuts, cuts + [len(seq)])]


def _straight(group: list) -> bool:
    ends = [p + s for p, s, _, _ in group]
    return all(b > a for a, b in zip(ends, ends[1:])) and all(
        y[3] == x[3] + 1 for x, y in zip(group, group[1:]))


def _files(d: str) -> dict:
    out = {}
    for dp, _, fn in os.walk(d):
        for f in fn:
            with open(os.path.join(dp, f), "rb") as fh:
                out[os.path.relpath(os.path.join(dp, f), d)] = fh.read()
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_workers_units_are_the_unit_writers(seed, tmp_path):
    print("seed", seed)
    rng = random.Random(seed)
    clean = rng.random() < 0.6
    seq = _sequence(rng, clean)
    groups = _groups(rng, seq)
    fs = CQ_UNIT_SIZE * rng.choice([4, 7, 300])  # small files: groups cross file ends
    cfg = StoreConfig().with_(mappedFileSizeConsumeQueue=fs)

    serial = ConsumeQueueWriter(str(tmp_path / "serial"), "T", 1, cfg)
    for g in groups:
        a = np.array(g, dtype=np.int64)
        serial.put_many(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    serial.close()

    root = str(tmp_path / "direct")
    files = cqdirect.QueueFiles(root, fs)
    written = []
    for g in groups:  # the worker runs ahead: every straight group written before the parent looks at any
        w = _straight(g)
        written.append(w)
        if w:
            units = np.array([(p, s, t) for p, s, t, _ in g], dtype=CQ_DTYPE)
            files.write("T", 1, g[0][3] * CQ_UNIT_SIZE, units.view(np.uint8))
    files.close()
    parent = ConsumeQueueWriter(root, "T", 1, cfg, recover=False)
    refused = False
    for g, w in zip(groups, written):
        a = np.array(g, dtype=np.int64)
        if not w:
            parent.put_many(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
        elif not parent.accept_written(int(a[0, 3]) * CQ_UNIT_SIZE, int(a[0, 0] + a[0, 1]), int(a[-1, 0] + a[-1, 1]),
                                       len(g), (int(a[0, 0]), int(a[0, 1]), int(a[0, 2]))):
            refused = True
            break
    parent.close()
    gap_free = all(y[3] == x[3] + 1 for x, y in zip(seq, seq[1:]))
    if gap_free:
        assert not refused
    if refused:
        return  # the rebuild builds again the classic way
    got, want = _files(root + "/consumequeue/T/1"), _files(str(tmp_path / "serial/consumequeue/T/1"))
    assert got == want
    if gap_free:  # independent of both writers: each unit at its queue offset, fillers before the first
        names = sorted(got)  # files named by their first byte's queue position; none before the first unit's
        assert [int(n) for n in names] == list(range(int(names[0]), int(names[0]) + fs * len(names), fs))
        data = b"".join(got[k] for k in names)
        base = int(names[0])
        for p, s, t, qo in seq:
            assert struct.unpack_from(">qiq", data, qo * CQ_UNIT_SIZE - base) == (p, s, t)
        before = seq[0][3] * CQ_UNIT_SIZE - base  # the pre-blank fill: filler units (0, INT_MAX, 0)
        assert data[:before] == struct.pack(">qiq", 0, 2**31 - 1, 0) * (before // CQ_UNIT_SIZE)


def _tracked(monkeypatch) -> list:
    """Calls of the classic build (the parent writing every unit), recorded."""
    from rmqstore_cli.engine.repair import rebuild as rb

    calls = []
    classic = rb._dispatch_all

    def spy(store, d, jobs, *args):
        calls.append(jobs)
        return classic(store, d, jobs, *args)

    monkeypatch.setattr(rb, "_dispatch_all", spy)
    return calls


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean", "5.3.3-v2topic", "lmq-5.3.3", "4.9.3-crash", "timer-5.3.3-crash",
                                  "dledger-4.9.3-clean", "dledger-5.3.3-clean"])
def test_broker_stores_take_the_workers_path(name, tmp_path, monkeypatch):
    one = _rebuild(copy_store(name, tmp_path / "j1" / "store"), 1)
    calls = _tracked(monkeypatch)
    two = _rebuild(copy_store(name, tmp_path / "j2" / "store"), 2)
    assert calls == []  # no classic build: the workers' units stood
    assert one == two


def test_log_ending_in_a_middle_segment_is_built_again(tmp_path, monkeypatch):
    seed = random.SystemRandom().randrange(2**32)
    print("seed", seed)
    name = "4.9.3-clean"
    damage = _zeroed_tail(name, _middle_record(name, random.Random(seed)))
    roots = [copy_store(name, tmp_path / f"j{j}" / "store") for j in (1, 2)]
    for r in roots:
        damage(r)
    one = _rebuild(roots[0], 1)
    calls = _tracked(monkeypatch)
    two = _rebuild(roots[1], 2)
    assert calls == [2]  # refused, then built with the parent writing
    assert one == two
    assert not [n for n in os.listdir(tmp_path / "j2") if ".rebuild-" in n]  # the scratch folder is gone
    assert tree_bytes(roots[0] / "consumequeue") == tree_bytes(roots[1] / "consumequeue")


@pytest.mark.parametrize("change", [lambda qo: -5, lambda qo: 1 << 61, lambda qo: qo - 1, lambda qo: qo + 3],
                         ids=["negative", "huge", "repeat", "gap"])
def test_a_damaged_queue_offset_gives_the_files_of_one_process(change, tmp_path):
    """QUEUEOFFSET (8 bytes at +20 in the record; rebuild checks no CRC) of a record in the middle of the log
    rewritten: the group holding it is not where the workers would write it, or not straight."""
    from .test_rebuild_jobs import _both, _segment_file

    seed = random.SystemRandom().randrange(2**32)
    print("seed", seed)
    name = "4.9.3-clean"
    rec = _middle_record(name, random.Random(seed))

    def damage(root):
        path, pos = _segment_file(root, name, rec["offset"])
        with open(path, "r+b") as f:
            f.seek(pos + 20)
            (qo,) = struct.unpack(">q", f.read(8))
            f.seek(pos + 20)
            f.write(struct.pack(">q", change(qo)))

    _both(tmp_path, name, damage)


def _bad_delay(root) -> None:
    """The DELAY property of the last SCHEDULE_TOPIC_XXXX record made no number: reput skips the record and rebuild
    reports DISPATCH_BAD_DELAY (found by a worker with -j, past the first segment)."""
    from rmqstore_cli.engine.derived.dispatch import Dispatcher
    from rmqstore_cli.engine.store import Store

    with Store.open(str(root)) as st:
        target = None
        for chunk in st.commitlog.scan(check_crc=False):
            for r in Dispatcher(str(root) + ".x", st.config).requests_from_chunk(chunk):
                if r.topic == "SCHEDULE_TOPIC_XXXX":
                    target = (chunk.segment.path, r.phy - chunk.segment.start, r.size)
    assert target, "the store has a delayed message"
    assert not target[0].endswith("00000000000000000000"), "the last delayed message lies past the first segment"
    path, pos, size = target
    with open(path, "r+b") as f:
        f.seek(pos)
        rec = bytearray(f.read(size))
        rec[rec.index(b"DELAY\x01") + 6] = ord("x")
        f.seek(pos)
        f.write(rec)


@pytest.mark.parametrize("path", ["workers write", "classic"])
def test_findings_of_the_workers_parse_are_reported_as_by_one_process(path, tmp_path, monkeypatch):
    roots = [copy_store("4.9.3-clean", tmp_path / f"j{j}" / "store") for j in (1, 2)]
    for r in roots:
        _bad_delay(r)
    one = _rebuild(roots[0], 1)
    if path == "classic":  # the parent writes every unit (what --topic, ext files, a refused group use)
        from rmqstore_cli.engine.repair import rebuild as rb

        def refuse(*_a, **_k):
            raise cqdirect.SpeculationRefused("test")

        monkeypatch.setattr(rb, "direct_requests", refuse)
    two = _rebuild(roots[1], 2)
    assert "DISPATCH_BAD_DELAY" in one[1]
    assert one == two


def test_no_disk_with_room_to_spill_gives_the_same_files(tmp_path, monkeypatch):
    """Where no disk has room for the workers' spilled items (a full incident disk), -j passes them through the
    queue instead: the same files, nothing spilled."""
    from rmqstore_cli.engine import parallel

    real = os.statvfs
    made = []

    class Full:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, 0

    monkeypatch.setattr(parallel.os, "statvfs", lambda p: Full(real(p)))
    spill = parallel.spill_dir
    monkeypatch.setattr(parallel, "spill_dir", lambda *a, **k: made.append(spill(*a, **k)) or made[-1])
    name = "4.9.3-clean"
    one = _rebuild(copy_store(name, tmp_path / "j1" / "store"), 1)
    two = _rebuild(copy_store(name, tmp_path / "j2" / "store"), 2)
    assert made and all(m is None for m in made)
    assert one == two


def test_spill_dir_needs_room_for_two_segments_per_worker(tmp_path, monkeypatch):
    from rmqstore_cli.engine import parallel

    free = {"bytes": 0}

    class Vfs:
        f_frsize = 4096

        @property
        def f_bavail(self):
            return free["bytes"] // 4096

    monkeypatch.setattr(parallel.os, "statvfs", lambda p: Vfs())
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    free["bytes"] = 3 * 2 * (1 << 20) - 4096
    assert parallel.spill_dir(3, 1 << 20) is None
    free["bytes"] = 3 * 2 * (1 << 20)
    got = parallel.spill_dir(3, 1 << 20)
    assert got is not None and os.path.dirname(got) == str(tmp_path) and os.path.isdir(got)
