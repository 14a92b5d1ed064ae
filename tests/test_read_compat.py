"""Our reader against what the broker itself read back (broker-read.jsonl.gz), field by field.

Every store is compared through the engine; the CLI's ``--json`` output is compared for at least
one store of each kind (plain 4.x, 5.x/v2 topic, ext, crash), so the dump JSON is what is proven.

The crash store (4.9.3-crash) is compared with what is on disk. broker-read.jsonl.gz for it was
written after the broker's abnormal recovery, which (FORMAT.md §10.6, §13.5) deletes the index
files newer than the checkpoint's indexMsgTimestamp and rebuilds them by re-dispatching, and moves
the checkpoint's logicsMsgTimestamp forward: where the broker's post-recovery view differs from
the bytes on disk (the checkpoint after shutdown, possibly the last index file's name/header),
this test compares against the pre-open values the broker logged (``checkpointBeforeOpen``) and
states the difference explicitly in ``test_crash_store_differs_from_post_recovery_view``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import STORE_NAMES, broker_read, shared_store
from rmqstore_cli.formats.tags import tags_code
from rmqstore_cli.engine.log.commitlog import ScanResult
from rmqstore_cli.engine.store import Store

RMQSTORE = [sys.executable, "-m", "rmqstore_cli"]


def cli_json(*args) -> list[dict]:
    p = subprocess.run(RMQSTORE + list(args) + ["--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


def _msg_equal(ours: dict, theirs: dict, where: str) -> None:
    for k, v in theirs.items():
        if k == "bodyHex":
            got = ours["bodyHex"] if "bodyHex" in ours else ours["body"].hex()
            assert got == v, f"{where}: body bytes differ"
        else:
            assert ours.get(k) == v, f"{where}: {k}: ours {ours.get(k)!r} broker {v!r}"


@pytest.fixture(scope="module", params=STORE_NAMES)
def opened(request):
    with Store.open(str(shared_store(request.param))) as st:
        yield request.param, st


def test_clmsg_and_blanks(opened):
    name, st = opened
    br = broker_read(name)
    res = ScanResult()
    ours = list(st.commitlog.records(with_body=True, result=res))
    assert len(ours) == len(br["clmsg"])
    for m, line in zip(ours, br["clmsg"]):
        where = f"{name} @{line['offset']}"
        assert m["offset"] == line["offset"] and m["storeSize"] == line["size"], where
        _msg_equal(m, line["msg"], where)
        d = line["dispatch"]
        props = m["properties"]
        assert tags_code(m["topic"], props, m["storeTimestamp"], st.config.delay_table) == d["tagsCode"], where
        assert props.get("KEYS", "") == (d.get("keys") or ""), where
        assert props.get("UNIQ_KEY") == d.get("uniqKey"), where
        assert m["queueOffset"] == d["consumeQueueOffset"] and m["storeTimestamp"] == d["storeTimestamp"], where
    assert [(o, s) for o, s in res.blanks] == [(b["offset"], b["totalSize"]) for b in br["blank"]]
    assert res.stop.offset == br["store"][0]["maxPhyOffset"]


def test_cqe_with_ext(opened):
    name, st = opened
    br = broker_read(name)
    ours = []
    for t, q in st.queues():
        u = st.queue(t, q).units()
        ext = st.ext(t, q) if st.config.enableConsumeQueueExt else None
        for qo, phy, size, tags in zip(u.queue_offsets.tolist(), u.phy.tolist(), u.size.tolist(), u.tags.tolist()):
            ours.append((t, q, qo, phy, size, tags, ext.get(tags) if ext else None))
    key = lambda e: (e["topic"], e["queueId"], e["queueOffset"])  # noqa: E731
    theirs = sorted(br["cqe"], key=key)
    assert [o[:3] for o in sorted(ours)] == [key(e) for e in theirs]
    for (t, q, qo, phy, size, tags, ext), e in zip(sorted(ours), theirs):
        where = f"{name} {t}/{q}@{qo}"
        assert (phy, size, tags) == (e["phyOffset"], e["size"], e["tagsCode"]), where
        if "ext" in e:
            assert ext is not None, where
            for k, v in e["ext"].items():
                assert ext[k] == v, f"{where}: ext {k}"
        else:
            assert ext is None, where
        _msg_equal(st.commitlog.read(phy), e["msg"], where)


def test_index_headers(opened):
    name, st = opened
    files = broker_read(name)["index"][0]["files"]
    ours = [{"name": f.name, "size": f.size, **f.header().as_json()} for f in st.index.files]
    if name == "4.9.3-crash":
        # Recovery deleted and rebuilt the newest index file (§10.6): compare what was not rebuilt.
        cp = st.checkpoint()
        keep = [f for f in files if f["endTimestamp"] <= cp.indexMsgTimestamp]
        assert ours[: len(keep)] == keep
        assert len(ours) == len(files)
    else:
        assert ours == files


def test_checkpoint(opened):
    name, st = opened
    br = broker_read(name)
    before = br["store"][0]["checkpointBeforeOpen"]
    cp = st.checkpoint()
    ours = cp.as_json(5)
    with open(shared_store(name) / "checkpoint", "rb") as f:
        ours["hex24"] = f.read(24).hex()
    assert {k: ours[k] for k in before} == before
    after = br["checkpoint-after-shutdown"][0]["checkpoint"]
    if name != "4.9.3-crash":
        assert {k: ours[k] for k in after if k != "confirmPhyOffset"} == {k: v for k, v in after.items() if k != "confirmPhyOffset"}


def test_crash_store_differs_from_post_recovery_view():
    """On disk the crash store still holds the pre-recovery checkpoint: logicsMsgTimestamp ends at the last
    consume-queue write the killed broker flushed; after recovery + shutdown the broker wrote a later value."""
    br = broker_read("4.9.3-crash")
    with Store.open(str(shared_store("4.9.3-crash"))) as st:
        cp = st.checkpoint()
        after = br["checkpoint-after-shutdown"][0]["checkpoint"]
        assert cp.logicsMsgTimestamp == br["store"][0]["checkpointBeforeOpen"]["logicsMsgTimestamp"]
        assert cp.logicsMsgTimestamp < after["logicsMsgTimestamp"]
        assert st.abort_exists and br["store"][0]["lastExitOK"] is False


# --- the same comparisons through the CLI's --json output -------------------------------------


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-v2topic"])
def test_cli_dump_commitlog_json(name):
    br = broker_read(name)
    rows = cli_json("dump", "commitlog", str(shared_store(name)), "--body", "hex")
    assert len(rows) == len(br["clmsg"])
    for r, line in zip(rows, br["clmsg"]):
        assert r["offset"] == line["offset"]
        _msg_equal(r, line["msg"], f"{name} @{line['offset']}")


@pytest.mark.parametrize("name", ["4.9.3-ext", "5.3.3-clean", "4.9.3-crash"])
def test_cli_dump_consumequeue_json(name):
    br = broker_read(name)
    rows = cli_json("dump", "consumequeue", str(shared_store(name)), "--msg", "--body", "hex")
    key = lambda e: (e["topic"], e["queueId"], e["queueOffset"])  # noqa: E731
    theirs = sorted(br["cqe"], key=key)
    rows.sort(key=key)
    assert len(rows) == len(theirs)
    for r, e in zip(rows, theirs):
        for k in ("topic", "queueId", "queueOffset", "phyOffset", "size", "tagsCode"):
            assert r[k] == e[k], k
        if "ext" in e:
            assert {k: r["ext"][k] for k in e["ext"]} == e["ext"]
        else:
            assert "ext" not in r
        _msg_equal(r["msg"], e["msg"], str(key(e)))


def test_cli_dump_cqext_json():
    br = broker_read("4.9.3-ext")
    rows = cli_json("dump", "cqext", str(shared_store("4.9.3-ext")))
    by_addr = {(r["topic"], r["queueId"], r["address"]): r for r in rows}
    n = 0
    for e in br["cqe"]:
        if "ext" in e:
            r = by_addr[(e["topic"], e["queueId"], e["tagsCode"])]
            assert {k: r[k] for k in e["ext"]} == e["ext"]
            n += 1
    assert n == len(rows) > 0


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-v2topic"])
def test_cli_dump_index_and_entries(name):
    files = broker_read(name)["index"][0]["files"]
    assert cli_json("dump", "index", str(shared_store(name))) == files
    entries = cli_json("dump", "index", str(shared_store(name)), "--entries")
    assert len(entries) == sum(f["indexCount"] - 1 for f in files)
    # Every key the broker could find by query has an entry with the broker's offset.
    phys = {e["phyOffset"] for e in entries}
    for q in broker_read(name)["query"]:
        assert set(q["offsets"]) <= phys


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_cli_dump_checkpoint(name):
    (row,) = cli_json("dump", "checkpoint", str(shared_store(name)))
    before = broker_read(name)["store"][0]["checkpointBeforeOpen"]
    assert {k: row[k] for k in before} == before


@pytest.mark.parametrize("name", ["4.9.3-crash", "5.3.3-v2topic"])
def test_cli_dump_store(name):
    (row,) = cli_json("dump", "store", str(shared_store(name)))
    s = broker_read(name)["store"][0]
    assert row["commitlogFiles"][: len(s["commitlogFiles"])] == s["commitlogFiles"]
    assert (row["minPhyOffset"], row["maxPhyOffset"], row["lastExitOK"]) == (s["minPhyOffset"], s["maxPhyOffset"], s["lastExitOK"])
    g = row["geometry"]
    for k in ("mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue", "maxHashSlotNum", "maxIndexNum", "enableConsumeQueueExt"):
        assert g[k]["value"] == s[k], k
        assert g[k]["source"] != "given"
    assert str(row["version"]) == s["version"][0]
    cq = {(c["topic"], c["queueId"]): c for c in broker_read(name)["cq"]}
    for q in row["queues"]:
        b = cq[(q["topic"], q["queueId"])]
        assert (q["minOffset"], q["maxOffset"], q["maxPhysicOffset"]) == (b["minOffset"], b["maxOffset"], b["maxPhysicOffset"])


@pytest.mark.parametrize("name", STORE_NAMES)
def test_broker_version_is_inferred_from_the_first_records(name):
    """Without --broker-version the version comes from the commitlog's first records (magic v2, or
    property strings ending in \\x02 on 5.x), read without the compiled kernels."""
    from rmqstore_cli.engine.config.storeconfig import StoreConfig, infer_geometry

    cfg = infer_geometry(StoreConfig(), str(shared_store(name)))
    assert cfg.version == int(name[0]) and "version" in cfg.inferred
