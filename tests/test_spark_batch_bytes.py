"""The Spark data source's batches are bounded in bytes as well as rows (``batchBytes``): messages of any size
keep an executor's batch, and the Parquet row group the export writes from it, near the budget. Runs without
a Spark session (the executor-side readers and the export task are called directly)."""

import functools
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")

from rmqstore_cli.formats.arrow import arrow_schema  # noqa: E402
from rmqstore_cli.spark import datasource  # noqa: E402
from tests.conftest import broker_read, shared_store  # noqa: E402
from tests.test_spark_export import _task_for  # noqa: E402

SEED = 20261128


@pytest.mark.parametrize("seed", [SEED, SEED + 1, SEED + 2])
def test_byte_pieces_cut_greedily_in_order(seed):
    print("seed", seed)
    rng = random.Random(seed)
    for _ in range(200):
        n = rng.randrange(0, 60)
        sizes = np.array([rng.choice([0, 1, 7, 100, 1000, 5000, -3]) for _ in range(n)], np.int64)
        budget = rng.choice([1, 50, 999, 1000, 4096, 10 ** 9])
        pieces = datasource.byte_pieces(sizes, budget)
        if n == 0:
            assert pieces == []
            continue
        assert [a for a, _ in pieces] == [0] + [b for _, b in pieces[:-1]]  # in order, no gap, no overlap
        assert (pieces[-1][1] if pieces else 0) == n
        clipped = np.maximum(sizes, 0)
        for a, b in pieces:
            total = int(clipped[a:b].sum())
            assert b > a and (total <= budget or b == a + 1)  # within the budget, or one record alone
            if b < n:  # greedy: the next record would not have fitted
                assert total + int(clipped[b]) > budget


def _rows(batches) -> list:
    return pa.Table.from_batches(batches).to_pylist() if batches else []


@pytest.mark.parametrize("name, folder", [("4.9.3-clean", "store"), ("5.3.3-v2topic", "store"),
                                          ("4.9.3-crash", "store"), ("dledger-4.9.3-clean", "store"),
                                          ("dledger-4.9.3-torn", "store-torn")])
@pytest.mark.parametrize("budget", [1, 3000, 40_000])
def test_batches_stay_within_the_byte_budget_and_hold_the_same_rows(name, folder, budget):
    """Every batch of a broker-written store holds records of at most ``budget`` bytes (or one record), and the
    rows, in order, are those of the read without a byte budget; batches of several ranges are joined only up to
    the budget."""
    root = str(shared_store(name).parent / folder)
    schema = arrow_schema(True)
    ranges = datasource.plan([root], {})
    read = functools.partial(datasource.group_batches, ranges, schema, with_body=True, check_crc=True,
                             batch_rows=1 << 20, failfast=False)
    unbounded = list(read(batch_bytes=1 << 40))
    bounded = list(read(batch_bytes=budget))
    assert _rows(bounded) == _rows(unbounded)
    assert len(bounded) > len(unbounded) or len(unbounded) == sum(b.num_rows for b in unbounded)
    for b in bounded:
        sizes = [s for s in b.column("storeSize").to_pylist() if s is not None and s > 0]
        assert b.num_rows == 1 or sum(sizes) <= budget or b.nbytes <= budget, (b.num_rows, sum(sizes))
    for r in ranges:  # each range alone: every batch within the budget of record bytes
        for b in datasource.read_range(r, schema, with_body=True, check_crc=True, batch_rows=1 << 20,
                                       failfast=False, batch_bytes=budget):
            sizes = [max(s or 0, 0) for s in b.column("storeSize").to_pylist()]
            assert b.num_rows == 1 or sum(sizes) <= budget


def test_the_default_budget_cuts_a_segment_of_clean_records():
    """With the defaults a 1 GiB segment of 1 KiB messages becomes batches of ~16 MiB, not 65,536 rows (80 MB); here
    the same rule on a broker-written store with a budget its segments exceed."""
    root = str(shared_store("4.9.3-clean"))
    want = len(broker_read("4.9.3-clean")["clmsg"])
    schema = arrow_schema(False)
    ranges = datasource.plan([root], {})
    budget = 8192
    batches = list(datasource.group_batches(ranges, schema, with_body=False, check_crc=True,
                                            batch_rows=datasource.DEFAULT_BATCH_ROWS, failfast=False,
                                            batch_bytes=budget))
    assert sum(b.num_rows for b in batches) == want
    assert len(batches) > 1
    assert datasource.DEFAULT_BATCH_BYTES == 16 << 20
    assert datasource.batch_bytes_of({}) == datasource.DEFAULT_BATCH_BYTES
    assert datasource.batch_bytes_of({"batchbytes": "4096"}) == 4096


def test_the_export_task_writes_a_row_group_per_bounded_batch(tmp_path):
    """The Arrow export's task with a small ``batchBytes``: more row groups, each within the budget (or one
    record), and the same rows as with the default budget."""
    root = shared_store("4.9.3-clean")

    def run(dest, budget):
        (dest / "_temporary" / "j").mkdir(parents=True)
        (res,) = list(_task_for(root, dest, "j", with_body=True, batch_bytes=budget))
        return res, pq.ParquetFile(res["tmp"])

    small_res, small = run(tmp_path / "small", 20_000)
    big_res, big = run(tmp_path / "big", datasource.DEFAULT_BATCH_BYTES)
    assert small_res["records"] == big_res["records"] == len(broker_read("4.9.3-clean")["clmsg"])
    assert small.metadata.num_row_groups > big.metadata.num_row_groups
    for i in range(small.metadata.num_row_groups):
        g = small.read_row_group(i, columns=["storeSize"]).column(0).to_pylist()
        assert len(g) == 1 or sum(g) <= 20_000
    assert small.read().to_pylist() == big.read().to_pylist()
