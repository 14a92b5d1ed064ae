"""The multi-dispatch properties parsed in array operations (engine/derived/lmqparse.py) against the rule taken
record by record in Python (MultiDispatchRule.targets, the broker's MultiDispatchUtils/ConsumeQueue rules): the
same targets, in the same order, numbered the same, on seeded random values made of the pieces that matter
(trailing and inner empty pieces, blanks, path separators, signs, offsets of 18, 19 and 20 digits, the long
range's ends, non-ASCII text, lists of different lengths, topics that do not take part)."""

from __future__ import annotations

import os
import random
from types import SimpleNamespace

import numpy as np
import pytest

from rmqstore_cli.engine.derived import lmq
from rmqstore_cli.formats import propscan

SEED = int(os.environ.get("RMQSTORE_LMQPARSE_SEED", random.randrange(1 << 30)))
NAMES = ["%LMQ%room1", "%LMQ%room2", "%LMQ%", "%LMQ", "room", "%LMQ%a/b", "", " ", "x y", "%LMQ%é", "%lmq%c",
         "%LMQ%" + "r" * 300]
OFFSETS = ["0", "7", "-3", "+4", "00012", "", " ", " 5", "5 ", "x", "1e3", "+", "-", "123456789012345678",
           "-123456789012345678", "1234567890123456789", "9223372036854775807", "-9223372036854775808",
           "9223372036854775808", "99999999999999999999", "٣"]
TOPICS = ["T", "%RETRY%g", "rmq_sys_x", "SCHEDULE_TOPIC_XXXX", "LmqParent"]


def _value(rng, pool) -> str:
    if rng.random() < 0.08:
        return rng.choice(["", " ", ",", ",,", " , "])
    parts = [rng.choice(pool) for _ in range(rng.randrange(1, 5))]
    return ",".join(parts) + "," * rng.choice([0, 0, 0, 1, 2])


def _chunk(rng, n: int):
    props, topics, qids = [], [], []
    for _ in range(n):
        names = _value(rng, NAMES)
        offs = _value(rng, OFFSETS)
        if rng.random() < 0.5:  # lists as long: most records
            k = len(lmq._java_split(names))
            offs = ",".join(rng.choice(OFFSETS[:5] + OFFSETS[13:17]) for _ in range(k))
        kv = [("KEYS", "k"), ("INNER_MULTI_DISPATCH", names), ("INNER_MULTI_QUEUE_OFFSET", offs)]
        if rng.random() < 0.1:
            kv = kv[:2]  # no offsets at all
        rng.shuffle(kv)
        props.append("".join(f"{k}\x01{v}\x02" for k, v in kv).encode())
        topics.append(rng.choice(TOPICS) if rng.random() < 0.2 else "T")
        qids.append(rng.randrange(-1, 8))
    buf = b"".join(props)
    starts = np.cumsum([0] + [len(p) for p in props[:-1]]).astype(np.int64)
    h = SimpleNamespace(propsStart=starts, propsLength=np.asarray([len(p) for p in props], np.int64),
                        queueId=np.asarray(qids, np.int32))
    u8 = np.frombuffer(buf, np.uint8)
    pv = propscan.scan(u8, h.propsStart, h.propsLength, names=lmq.LMQ_PROPS)
    has = (pv.start[lmq.DISPATCH_PROP] >= 0) & (pv.start[lmq.OFFSET_PROP] >= 0)
    return u8, h, pv, has, topics


@pytest.mark.parametrize("lmq_zero", [True, False])
def test_arrays_equal_the_rule(lmq_zero):
    print(f"seed {SEED} (RMQSTORE_LMQPARSE_SEED)")
    rng = random.Random(f"{SEED}-{lmq_zero}")
    rule = lmq.MultiDispatchRule(SimpleNamespace(enableMultiDispatch=True, enableLmq=lmq_zero,
                                                 explicit={"enableMultiDispatch", "enableLmq"}, inferred={}))
    fast_records = 0
    for _ in range(60):
        u8, h, pv, has, topics = _chunk(rng, rng.randrange(1, 200))
        got = lmq._targets(rule, u8, h, lmq.RowTopics(np.arange(len(topics)), topics), pv, has)
        want = lmq.LmqTargets.from_lists(lmq._per_record(rule, u8, h, topics.__getitem__, pv, has))
        assert got.names == want.names
        for col in ("row", "name", "queue_id", "queue_offset"):
            assert getattr(got, col).tolist() == getattr(want, col).tolist(), col
        fast_records += int(np.count_nonzero(has & pv.ascii))
    assert fast_records > 1000


def test_nothing_named():
    rule = lmq.MultiDispatchRule(SimpleNamespace(enableMultiDispatch=True, enableLmq=True,
                                                 explicit={"enableMultiDispatch", "enableLmq"}, inferred={}))
    u8, h, pv, has, topics = _chunk(random.Random(1), 5)
    got = lmq._targets(rule, u8, h, lmq.RowTopics(np.arange(len(topics)), topics), pv, np.zeros(len(has), bool))
    assert len(got) == 0 and got.names == []
