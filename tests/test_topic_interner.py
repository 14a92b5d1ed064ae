"""The topic interner of verify's walk matches a chunk's known topics in array operations (a broker with thousands of
topics has thousands in every chunk). Its ids must be those of one Python step per topic group: the same topic the
same id in every chunk, new topics numbered in (hash, length) order, topics that share a hash and length (``Aa`` and
``BB`` do in Java) told apart byte for byte, whatever hash the caller hands in."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from rmqstore_cli.engine.derived.dispatchcolumns import TopicInterner
from rmqstore_cli.formats import propscan

SEED = int(os.environ.get("RMQSTORE_INTERNER_SEED", random.randrange(1 << 30)))

# equal Java hash and length in each row (hash("Aa") == hash("BB"))
_CLASHING = [b"Aa", b"BB", b"AaAa", b"AaBB", b"BBAa", b"BBBB", b"TopicAa", b"TopicBB"]


class _OneStepPerGroup:
    """The interner as one Python step per topic group: ids by bytes, new ones in (hash, length) order."""

    def __init__(self):
        self.ids: dict[bytes, int] = {}

    def group_ids(self, u8, fs, fl, hashes):
        key = (hashes.astype(np.int64) << 16) ^ fl
        out = np.empty(len(fs), np.int32)
        for g in np.argsort(key, kind="stable").tolist():
            raw = bytes(u8[int(fs[g]):int(fs[g]) + int(fl[g])])
            out[g] = self.ids.setdefault(raw, len(self.ids))
        return out


def _topics(rng: random.Random, many: int) -> list[bytes]:
    names = [b"T%d" % i for i in range(many)] + _CLASHING + [b"", "主题".encode(), b"%LMQ%x", b"L" * 200]
    return rng.sample(names, rng.randint(min(len(names), 60), len(names)))


@pytest.mark.parametrize("many", [3, 60, 900])  # a chunk holds a few topics (one step each) or many (arrays)
@pytest.mark.parametrize("hashes_from", ["java", "zero", "random"])
def test_ids_match_one_step_per_group(hashes_from, many):
    print(f"seed {SEED} (RMQSTORE_INTERNER_SEED)")
    rng = random.Random(f"{SEED}-{hashes_from}-{many}")
    names = _topics(rng, many)
    ours, ref = TopicInterner(), _OneStepPerGroup()
    for _ in range(30):
        # a chunk: some of the topics, each once (the groups), in a buffer with other bytes around them
        chunk = rng.sample(names, rng.randint(1, len(names))) if rng.random() < 0.8 else [rng.choice(names)]
        buf, fs, fl = bytearray(), [], []
        for t in chunk:
            buf += bytes(rng.randrange(256) for _ in range(rng.randrange(0, 5)))
            fs.append(len(buf))
            fl.append(len(t))
            buf += t
        u8 = np.frombuffer(bytes(buf), np.uint8)
        fs, fl = np.asarray(fs, np.int64), np.asarray(fl, np.int64)
        if hashes_from == "java":
            hashes = propscan.java_hash_spans(u8, fs, fs + fl)
        elif hashes_from == "zero":  # every topic of one length clashes
            hashes = np.zeros(len(fs), np.uint32)
        else:  # a hash that is not even a function of the bytes: only speed may depend on it
            hashes = np.asarray([rng.randrange(4) for _ in fs], np.uint32)
        got = ours.group_ids(u8, fs, fl, hashes)
        want = ref.group_ids(u8, fs, fl, hashes)
        assert got.tolist() == want.tolist(), chunk
    assert ours.ids == ref.ids
    assert ours.topics() == [t.decode("utf-8", "replace") for t in ref.ids]


def test_topics_that_keep_coming_do_not_remake_the_table_every_chunk(monkeypatch):
    """A log whose topics keep coming (one new in every chunk): the table of known topics is made again only when
    they grew by a quarter, a few dozen times for a thousand topics, and the ids stay those of one step per group."""
    made = []
    index = TopicInterner._index
    monkeypatch.setattr(TopicInterner, "_index", lambda self: made.append(len(self.ids)) or index(self))
    ours, ref = TopicInterner(), _OneStepPerGroup()
    for c in range(1000):
        names = [b"Old%d" % i for i in range(0, c, max(1, c // 60))] + [b"New%d" % c]  # many known, one new
        buf = b"".join(names)
        fl = np.asarray([len(n) for n in names], np.int64)
        fs = np.cumsum(fl) - fl
        u8 = np.frombuffer(buf, np.uint8)
        hashes = propscan.java_hash_spans(u8, fs, fs + fl)
        assert ours.group_ids(u8, fs, fl, hashes).tolist() == ref.group_ids(u8, fs, fl, hashes).tolist()
    assert len(ours.ids) > 1000
    assert len(made) < 60, made


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean", "5.3.3-v2topic", "lmq-5.3.3", "timer-5.3.3"])
def test_broker_stores_verify_the_same_with_every_chunk_matched_as_arrays(monkeypatch, name):
    """The broker-written stores hold a few topics per chunk, which take the Python step; matched as arrays instead
    (the path of a broker with thousands of topics), verify finds the same."""
    from rmqstore_cli.engine.derived import dispatchcolumns
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store
    from tests.conftest import shared_store

    def findings():
        with Store.open(str(shared_store(name))) as st:
            r = verify_store(st)
            return sorted(json.dumps(f.as_json(), sort_keys=True) for f in r.findings), r.summary

    from rmqstore_cli.engine.log.commitlog import CommitLog

    scan = CommitLog.scan  # chunks of 8 records: many chunks per segment, one interner, the table in use
    monkeypatch.setattr(CommitLog, "scan", lambda self, **k: scan(self, **dict(k, chunk_records=8)))
    usual = findings()
    monkeypatch.setattr(dispatchcolumns, "_FEW_GROUPS", 0)
    groups, steps = [], []
    group_ids, step = TopicInterner.group_ids, TopicInterner._id
    monkeypatch.setattr(TopicInterner, "group_ids", lambda self, u8, fs, *a: groups.append(len(fs)) or group_ids(self, u8, fs, *a))
    monkeypatch.setattr(TopicInterner, "_id", lambda self, *a: steps.append(1) or step(self, *a))
    assert findings() == usual
    assert len(steps) < sum(groups), (len(steps), sum(groups))  # topic groups were found in the table
