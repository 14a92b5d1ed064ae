"""spark export and spark stats on DLedger stores: the messages inside the entries at the broker's offsets,
damaged entries as finding rows; stats equal to the single-process stats (which equal the broker's read-back,
tests/test_dledger_read.py)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark", reason="pyspark is an optional extra (pip install -e .[spark])")

from tests.conftest import STORES  # noqa: E402
from tests.test_dledger_read import read_back  # noqa: E402
from rmqstore_cli.engine.query.stats import compute_stats  # noqa: E402
from rmqstore_cli.engine.store import Store  # noqa: E402
from rmqstore_cli.spark import jobs  # noqa: E402


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_export_rows_are_the_broker_messages(spark, tmp_path, writer):
    import pyarrow.dataset as ds

    br = read_back("dledger-4.9.3-clean", "broker-read.jsonl.gz")["dledger_entry"]
    jobs.export(spark, [str(STORES / "dledger-4.9.3-clean" / "store")], str(tmp_path / "x"), writer=writer)
    t = ds.dataset(str(tmp_path / "x"), format="parquet").to_table()
    rows = sorted(zip(t.column("commitLogOffset").to_pylist(), t.column("uniqKey").to_pylist(),
                      t.column("physicalOffsetField").to_pylist()))
    assert rows == [(e["message"]["commitLogOffset"], e["message"]["uniqKey"], e["message"]["commitLogOffset"]) for e in br]


def test_export_names_the_damaged_entry(spark, tmp_path):
    import pyarrow.dataset as ds

    damage = {d["variant"]: d for d in json.loads((STORES / "dledger-4.9.3-torn" / "damage.json").read_text())}
    jobs.export(spark, [str(STORES / "dledger-4.9.3-torn" / "store-corrupt")], str(tmp_path / "x"), writer="arrow")
    t = ds.dataset(str(tmp_path / "x"), format="parquet").to_table()
    bad = [(o, f) for o, f in zip(t.column("commitLogOffset").to_pylist(), t.column("finding").to_pylist()) if f]
    assert bad == [(damage["corrupt"]["entryPos"] + 48, "DL_MESSAGE_CRC")]


@pytest.mark.parametrize("folder", ["dledger-4.9.3-clean/store", "dledger-4.9.3-torn/store-torn"])
def test_stats_equal_the_single_process_stats(spark, folder):
    root = str(STORES / folder)
    got = jobs.stats(spark, root)
    with Store.open(root) as st:
        want = compute_stats(st)
    for k in ("records", "bytes", "firstStoreTimestamp", "lastStoreTimestamp", "topics", "queues", "commitlog"):
        assert got[k] == want[k], k


DLEDGER_FOLDERS = ["dledger-4.9.3-clean/store", "dledger-4.9.3-crash/store", "dledger-5.3.3-clean/store",
                   "dledger-4.9.3-torn/store-corrupt", "dledger-4.9.3-torn/store-torn"]


def test_spark_verify_finds_what_verify_finds(spark):
    """spark verify on every DLedger sample (one job, several tasks per store) gives verify's findings and summary:
    the messages' checks in executor tasks, the entry / index-unit / checkpoint checks (DL_*) on the driver."""
    from rmqstore_cli.engine.verify.pipeline import verify_store

    roots = [str(STORES / f) for f in DLEDGER_FOLDERS]
    res = jobs.verify(spark, roots, split=1 << 20)
    assert res["tasks"] > len(roots)
    seen = set()
    for root, summary in zip(roots, res["stores"]):
        with Store.open(root) as st:
            single = verify_store(st)
        got = sorted((r["code"], r["severity"], r["path"], r["offset"], r["message"]) for r in res["findings"]
                     if r["store"] == root)
        assert got == sorted((f.code, f.severity, f.path, f.offset, f.message) for f in single.findings), root
        assert summary == single.summary, root
        seen |= {g[0] for g in got}
    # the damaged samples are seen at all, by both the message and the entry checks
    assert {"DL_MESSAGE_CRC", "DL_TORN_ENTRY", "DL_CHECKPOINT_STALE"} <= seen, seen
    assert res["exitCode"] == 1


def test_spark_verify_command_on_a_dledger_store(spark):
    from typer.testing import CliRunner

    from rmqstore_cli.app import app

    r = CliRunner().invoke(app, ["spark", "verify", str(STORES / "dledger-4.9.3-torn" / "store-corrupt"),
                                 "--master", "local[2]", "--json"])
    assert r.exit_code == 1, r.output
    codes = [json.loads(ln)["code"] for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert codes == ["DL_MESSAGE_CRC"]


@pytest.mark.parametrize("what", ["consumequeue", "index", "all"])
def test_spark_rebuild_is_refused_and_says_why(tmp_path, what):
    """Refused before any Spark session starts: one line naming the DLedger log and the command that does it."""
    from typer.testing import CliRunner

    from rmqstore_cli.app import app

    r = CliRunner().invoke(app, ["spark", "rebuild", str(STORES / "dledger-4.9.3-clean" / "store"), "--what", what,
                                 "--out", str(tmp_path / "out")])
    assert r.exit_code == 3, r.output
    assert "DLedger" in r.output and f"rmqstore rebuild {what}" in r.output and "nothing was changed" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()
