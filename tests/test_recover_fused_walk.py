"""The broker's recovery walk (engine/log/walk.broker_walk) on the fused walk+decode+CRC kernel gives what the
three separate steps give: the same chunks of records to the sink, the same pauses and the same stop (offset,
kind, reason, TOTALSIZE, OutOfMemoryError verdict). The reference below is written here from the separate
steps (walk the size chain, decode the headers, then the body CRC of the structurally valid records), on every
broker-written store's commitlog and on seeded damage (the seed is printed)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import numpy as np
import pytest

from rmqstore_cli.engine.config.storeconfig import StoreConfig
from rmqstore_cli.engine.log.walk import OOM_TOTALSIZE, WalkStop, broker_walk, magics_for
from rmqstore_cli.formats import fast
from tests.conftest import STORES

SEED = int(os.environ.get("RMQSTORE_FUSED_WALK_SEED", random.randrange(1 << 30)))
ALL_STORES = sorted(p.name for p in STORES.iterdir() if (p / "store" / "commitlog").is_dir()) if STORES.is_dir() else []


@dataclass
class MemSegment:
    start: int
    data: bytearray

    @property
    def size(self) -> int:
        return len(self.data)

    def buffer(self):
        return self.data


def reference_walk(segments, version: int, check_crc: bool, sink, chunk: int, prop_crc: bool = False) -> tuple:
    """The walk as separate steps: size chain, header decode, body CRC of the structurally valid records
    (``prop_crc``: 5.x with forceVerifyPropCRC, the whole-record property CRC of each instead)."""
    magics = magics_for(version)
    i, pos = 0, 0
    while True:
        seg = segments[i]
        buf = seg.buffer()
        while True:
            w = fast.walk(buf, pos, seg.size, magics, max_records=chunk)
            if len(w.offsets):
                h = fast.decode_headers(buf, w.offsets)
                reason = h.reason.copy()
                if check_crc and prop_crc:
                    for j in range(len(h)):
                        if reason[j] == fast.R_OK and not fast.check_property_crc(buf, int(h.offsets[j]),
                                                                                  int(h.totalSize[j])):
                            reason[j] = fast.R_PROP_CRC
                elif check_crc:
                    ok = fast.check_body_crc(buf, h)
                    reason[(~ok) & (reason == fast.R_OK)] = fast.R_BODY_CRC
                bad = np.flatnonzero(reason != fast.R_OK)
                n = int(bad[0]) if len(bad) else len(h)
                pause = sink(seg.start, buf, h.take(n)) if n else False
                if n < len(h):
                    p = int(h.offsets[n])
                    return seg.start + p, "invalid", int(reason[n]), int(h.totalSize[n]), False
                if pause is True and w.stop < seg.size:
                    return seg.start + w.stop, fast.STOP_CHUNK, None, 0, False
            pos = w.stop
            if w.kind != fast.STOP_CHUNK:
                break
        if w.kind == fast.STOP_BLANK and i + 1 < len(segments):
            i, pos = i + 1, 0
            continue
        oom = version < 5 and w.kind == fast.STOP_TORN and w.size >= OOM_TOTALSIZE
        return seg.start + w.stop, w.kind, None, w.size, oom


class Recorder:
    """A sink keeping each chunk's (segment start, offsets, store times); pauses after every ``pause_every``-th."""

    def __init__(self, pause_every: int = 0):
        self.chunks, self.pause_every = [], pause_every

    def __call__(self, seg_start, buf, h):
        self.chunks.append((seg_start, h.offsets.tolist(), h.storeTimestamp.tolist(), h.queueOffset.tolist()))
        return bool(self.pause_every) and len(self.chunks) % self.pause_every == 0


def _segments(name: str) -> tuple[list, int]:
    root = STORES / name / "store"
    d = root / "commitlog"
    segs = [MemSegment(int(n), bytearray((d / n).read_bytes())) for n in sorted(os.listdir(d)) if n.isdigit()]
    version = 5 if name.startswith(("5.", "batchcq", "lmq", "rocksdb", "timer")) else 4
    return segs, version


def _compare(segs, version: int, check_crc: bool, chunk: int, pause_every: int = 0, prop_crc: bool = False) -> WalkStop:
    """``prop_crc``: forceVerifyPropCRC set (5.x: the walk then checks each record's property CRC, not its body CRC)."""
    cfg = StoreConfig()
    cfg.forceVerifyPropCRC = prop_crc
    got_sink, want_sink = Recorder(pause_every), Recorder(pause_every)
    got = broker_walk(segs, cfg, version, 0, check_crc, got_sink, chunk=chunk)
    want = reference_walk(segs, version, check_crc, want_sink, chunk, prop_crc=prop_crc and version >= 5)
    assert got_sink.chunks == want_sink.chunks
    assert (got.offset, got.kind, got.total_size, got.oom) == (want[0], want[1], want[3], want[4])
    if want[1] == "invalid":
        assert got.reason == fast.REASON_TEXT[want[2]]
    return got


@pytest.mark.parametrize("name", ALL_STORES)
def test_same_walk_on_broker_stores(name):
    segs, version = _segments(name)
    if not segs:
        pytest.skip("no commitlog files")
    for check_crc in (True, False):
        for chunk in (8192, 5):
            _compare(segs, version, check_crc, chunk)
    _compare(segs, version, True, 3, pause_every=4)
    for chunk in (8192, 5):
        _compare(segs, version, True, chunk, prop_crc=True)
    _compare(segs, version, True, 3, pause_every=4, prop_crc=True)


def _records(segs) -> list:
    """(segment number, position, TOTALSIZE, body start, body length) of every record the walk reaches."""
    out = []
    for k, s in enumerate(segs):
        h = fast.decode_headers(s.data, fast.walk(s.data, 0, s.size, magics_for(5)).offsets)
        out += [(k, int(p), int(t), int(b), int(n)) for p, t, b, n in zip(h.offsets, h.totalSize, h.bodyStart, h.bodyLength)]
    return out


DAMAGE = ("body", "size", "magic", "size_and_body", "zeros", "huge", "topic_len_and_body", "blank_mid")


@pytest.mark.parametrize("kind", DAMAGE)
def test_same_walk_on_seeded_damage(kind):
    print(f"seed {SEED} (RMQSTORE_FUSED_WALK_SEED)")
    rng = random.Random(f"{SEED}-{kind}")
    names = [n for n in ALL_STORES if _segments(n)[0]]
    for _ in range(6):
        name = rng.choice(names)
        segs, version = _segments(name)
        recs = [r for r in _records(segs) if r[4] > 0]
        k, p, total, body, blen = rng.choice(recs)
        d = segs[k].data
        if kind in ("body", "size_and_body", "topic_len_and_body"):
            d[body + rng.randrange(blen)] ^= 0x5A
        if kind in ("size", "size_and_body"):
            d[p + 3] ^= rng.choice((1, 2, 0x80))  # TOTALSIZE off: torn, formula mismatch or a chain jump
        if kind == "topic_len_and_body":
            d[body + blen] = 0xFF  # topic length byte negative (4.x) / high byte of the v2 length
        if kind == "magic":
            d[p + 4:p + 8] = rng.randbytes(4)
        if kind == "zeros":
            d[p:p + total] = bytes(total)
        if kind == "huge":
            d[p:p + 4] = (OOM_TOTALSIZE + 5).to_bytes(4, "big")
        if kind == "blank_mid":
            d[p:p + 8] = (len(d) - p).to_bytes(4, "big") + bytes.fromhex("CBD43194")
        for check_crc in (True, False):
            for chunk in (8192, 4):
                _compare(segs, version, check_crc, chunk)
        _compare(segs, version, True, 2, pause_every=3)
        _compare(segs, version, True, 4, prop_crc=True)


@pytest.mark.parametrize("fail", [False, True])
def test_property_crc_walk_matches_the_reference(fail, monkeypatch):
    """5.x with forceVerifyPropCRC: the walk checks each record's property CRC (walk, decode, then that check).
    No broker-written store carries the ``__CRC32#`` property, so the check is replaced here by one that passes
    every record but (``fail``) one drawn at random: the walk goes through the whole log, in chunks and pauses,
    and stops where the reference does."""
    print(f"seed {SEED} (RMQSTORE_FUSED_WALK_SEED)")
    rng = random.Random(f"{SEED}-propcrc-{fail}")
    names = [n for n in ALL_STORES if _segments(n)[0] and _segments(n)[1] >= 5]
    assert names
    for name in names:
        segs, version = _segments(name)
        monkeypatch.setattr(fast, "check_property_crc", lambda buf, off, size: True)
        reached = Recorder()
        reference_walk(segs, version, True, reached, 8192, prop_crc=True)
        starts = {s.start: s for s in segs}
        recs = [(starts[seg_start], p) for seg_start, offsets, _, _ in reached.chunks for p in offsets]
        assert recs
        bad = rng.choice(recs) if fail else None
        bad_at = (id(bad[0].data), bad[1]) if bad else None
        monkeypatch.setattr(fast, "check_property_crc", lambda buf, off, size: (id(buf), off) != bad_at)
        for chunk in (8192, 5):
            got = _compare(segs, version, True, chunk, prop_crc=True)
            if bad:
                assert (got.kind, got.offset) == ("invalid", bad[0].start + bad[1])
            else:
                assert got.kind != "invalid"
        _compare(segs, version, True, 3, pause_every=4, prop_crc=True)
