"""bench.manyqueues: the same messages spread over many queues, gen's own layout left as it was."""

from __future__ import annotations

import os

from bench import gen, manyqueues
from rmqstore_cli.engine.store import Store


def test_many_queue_store_spreads_the_same_messages(tmp_path):
    """32 queues (4 topics x 8): every queue holds its share of the records, in the topics the spread names; the
    records are as many and as large as with 16 queues; gen's layout is back afterwards."""
    before = (gen.TOPICS, gen.QUEUES)
    with manyqueues._spread(4):
        many = gen.generate(str(tmp_path / "many"), 1024, total=2 << 20, seg_size=2 << 20)
    assert (gen.TOPICS, gen.QUEUES) == before
    with manyqueues._spread(2):  # 16 queues, topic names as long as the 32 queues' (the bench compares these)
        few = gen.generate(str(tmp_path / "few"), 1024, total=2 << 20, seg_size=2 << 20)
    assert (many["records"], many["bytes"]) == (few["records"], few["bytes"])
    with Store.open(str(tmp_path / "many")) as st:
        queues = sorted(st.queues())
        assert queues == sorted((f"BenchTopic{t:04d}", q) for t in range(4) for q in range(8))
        counts = [len(st.queue(t, q).units().phy) for t, q in queues]
    assert sum(counts) == many["records"] and max(counts) - min(counts) <= 1
    assert len(os.listdir(tmp_path / "few" / "consumequeue")) == 2
