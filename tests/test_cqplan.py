"""Consume queues written from a batch's packed per-queue plan (derived/cqplan, ConsumeQueueWriter.append_straight)
are byte for byte what the broker's one-unit-at-a-time rule writes.

Random records over several queues with the damage a real log holds (queue offsets that skip, repeat or are 0,
re-dispatched older records, transaction types the consume queue leaves out, a topic that cannot be a
directory), small queue files (many roll-overs), dispatched in uneven batches: the files, the counts and the
findings must equal ``ConsumeQueueWriter.put`` called record after record.
"""

from __future__ import annotations

import random

import pytest

from rmqstore_cli.engine.config.storeconfig import StoreConfig
from rmqstore_cli.engine.derived.cqwriter import ConsumeQueueWriter
from rmqstore_cli.engine.derived.dispatch import DispatchBatch, DispatchRequest, Dispatcher

from .conftest import files_of, seed_params

TOPICS = ["A", "B", "主题", "a/b"]


def _records(rng: random.Random, n: int) -> list[DispatchRequest]:
    out, phy, next_qo = [], 1000, {}
    for _ in range(n):
        topic, q = rng.choice(TOPICS), rng.randint(0, 2)
        qo = next_qo.get((topic, q), rng.choice([0, 0, 4]))
        kind = rng.randrange(40)
        if kind == 0:
            qo = 0
        elif kind == 1:
            qo += rng.randint(1, 3)
        elif kind == 2:
            qo = max(0, qo - rng.randint(1, 4))
        flag = rng.choice([0] * 8 + [0x4, 0x8, 0xC])
        if flag in (0x4, 0xC):  # prepared / rollback: no consume queue unit, offset 0 (the queue does not move)
            qo = 0
        else:
            next_qo[(topic, q)] = qo + 1
        size = rng.randint(60, 200)
        p = phy if rng.randrange(40) else max(0, phy - rng.randint(100, 400))  # an older record again
        out.append(DispatchRequest(p, size, topic, q, qo, flag, 1_700_000_000_000 + len(out), rng.randint(-9, 9)))
        phy += size
    return out


@pytest.mark.parametrize("seed", seed_params(3, 11))
def test_planned_queues_match_unit_by_unit(tmp_path, seed, monkeypatch):
    print("seed", seed)
    rng = random.Random(seed)
    units_per_file = rng.choice([3, 8, 40, 400])
    cfg = StoreConfig(version=5).with_(mappedFileSizeConsumeQueue=20 * units_per_file, messageIndexEnable=False)
    recs = _records(rng, 500)
    # the broker's rule, record after record, in an independent writer per queue
    ref_root = tmp_path / "ref"
    writers: dict = {}
    done = skipped = unsafe = 0
    for r in recs:
        if r.sysflag & 0xC not in (0, 0x8):
            continue
        if "/" in r.topic:
            unsafe += 1
            continue
        w = writers.get((r.topic, r.queue_id)) or writers.setdefault((r.topic, r.queue_id),
                                                                      ConsumeQueueWriter(str(ref_root), r.topic, r.queue_id, cfg))
        if w.put(r.phy, r.size, r.tags_code, r.queue_offset):
            done += 1
        else:
            skipped += 1
    for w in writers.values():
        w.close()
    copied = []
    straight = ConsumeQueueWriter.append_straight
    monkeypatch.setattr(ConsumeQueueWriter, "append_straight", lambda w, *a: copied.append(straight(w, *a)) or copied[-1])
    d = Dispatcher(str(tmp_path / "bulk"), cfg, batch_topics=set())
    cuts = sorted(rng.sample(range(1, len(recs)), 3))
    for a, b in zip([0] + cuts, cuts + [len(recs)]):
        d.dispatch_many(DispatchBatch.from_requests(recs[a:b]))
    d.close()
    assert files_of(tmp_path / "bulk") == files_of(ref_root)
    assert (d.stats.cq_units, d.stats.cq_skipped, d.stats.unsafe_topics) == (done, skipped, unsafe)
    assert [f.code for f in d.problems] == ["DISPATCH_UNSAFE_TOPIC"] * unsafe
    if units_per_file >= 40:  # batches of ~10 units per queue fit in a file: the copy path is taken
        assert any(copied)


def test_a_batch_without_queue_units(tmp_path):
    """Only prepared / rollback records (no consume-queue unit): nothing written, nothing taken."""
    cfg = StoreConfig(version=5).with_(messageIndexEnable=False)
    d = Dispatcher(str(tmp_path), cfg, batch_topics=set())
    d.dispatch_many(DispatchBatch.from_requests([DispatchRequest(100 * i, 100, "A", i % 2, 0, 0x4 if i % 2 else 0xC, 1, 0)
                                                  for i in range(5)]))
    d.close()
    assert d.stats.cq_units == 0 and files_of(tmp_path) == {}
