"""engine/arrays.py: the queue key every grouping of records by queue uses, and its inverse."""

import numpy as np

from rmqstore_cli.engine.arrays import queue_key, queue_of_key

QUEUE_IDS = (0, 1, 7, 1023, (1 << 31) - 1, -1, -2, -(1 << 31))  # a Java int: a damaged record may hold any


def test_queue_key_round_trips_every_java_int_queue_id():
    for number in (0, 1, 5, 70_000, (1 << 31) - 1):
        for qid in QUEUE_IDS:
            assert queue_of_key(queue_key(number, qid)) == (number, qid), (number, qid)


def test_queue_keys_of_arrays_equal_those_of_ints_and_keep_queues_apart():
    numbers = np.repeat(np.arange(4, dtype=np.int64), len(QUEUE_IDS))
    qids = np.tile(np.asarray(QUEUE_IDS, np.int64), 4)
    keys = queue_key(numbers, qids)
    assert keys.dtype == np.int64
    assert keys.tolist() == [queue_key(int(n), int(q)) for n, q in zip(numbers, qids)]
    assert len(np.unique(keys)) == len(keys)  # a negative queue id does not fall onto another topic's queue
    # sorted by key: by number first, each number's queues together
    order = np.argsort(keys, kind="stable")
    assert (np.diff(numbers[order]) >= 0).all()
