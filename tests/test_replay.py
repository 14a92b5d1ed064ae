"""Replay equals the broker byte for byte.

The broker's own stored messages (``clmsg`` lines of broker-read.jsonl.gz), grouped into the
broker's puts (puts.jsonl.gz, so classic batches stay batches) with their store timestamps, are
fed through ``rmqstore append --from`` into an empty store configured like the broker's
(write-begin config line).  The commitlog, consume-queue and ext files must equal the broker's
files byte for byte, the index files must have identical content, and the deterministic
checkpoint fields must match what the broker left.  The Dispatcher alone is checked the same
way by re-dispatching the broker's commitlog (what rebuild does).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmqstore_cli.formats.java_hashmap import parse_properties_lossless
from rmqstore_cli.formats.properties import PROPERTY_SEPARATOR
from rmqstore_cli.app import app
from rmqstore_cli.engine.log.commitlog import CommitLog
from rmqstore_cli.engine.config.storeconfig import StoreConfig, apply_settings
from rmqstore_cli.engine.derived.dispatch import Dispatcher
from rmqstore_cli.engine.derived.indexwriter import store_time_namer
from rmqstore_cli.engine.log.messages import MessageBuilder
from rmqstore_cli.engine.store import Store
from tests.conftest import CLEAN_STORES, STORE_NAMES, broker_puts, broker_read, shared_store

CONF_KEYS = ("mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue", "mappedFileSizeConsumeQueueExt",
             "enableConsumeQueueExt", "maxHashSlotNum", "maxIndexNum", "messageIndexEnable", "maxMessageSize",
             "messageDelayLevel", "enabledAppendPropCRC", "autoMessageVersionOnTopicLen")


def write_broker_conf(name: str, path: Path) -> tuple[Path, int]:
    """broker.conf from the broker's write-begin MessageStoreConfig."""
    begin = broker_puts(name)[0]
    assert begin["type"] == "write-begin"
    lines = []
    for k in CONF_KEYS:
        v = begin["config"].get(k)
        if v is not None:
            lines.append(f"{k}={str(v).lower() if isinstance(v, bool) else v}")
    path.write_text("\n".join(lines) + "\n")
    return path, int(begin["version"][0])


def put_lines(name: str, drop_raw: bool = False) -> list[str]:
    """One JSON line per broker put: a message, or {"batch": [...]} for msgNum > 1."""
    by_offset = {o["offset"]: o for o in broker_read(name)["clmsg"]}
    lines = []
    for p in broker_puts(name):
        if p["type"] != "put":
            continue
        off = p["wroteOffset"]
        msgs = []
        for _ in range(p["msgNum"]):
            rec = by_offset[off]
            m = dict(rec["msg"])
            if drop_raw:
                m.pop("propertiesRaw")
            msgs.append(m)
            off += rec["size"]
        lines.append(json.dumps({"batch": msgs} if len(msgs) > 1 else msgs[0], ensure_ascii=False))
    return lines


def replay(name: str, tmp_path: Path, drop_raw: bool = False, extra: list[str] = ()) -> Path:
    conf, version = write_broker_conf(name, tmp_path / f"{name}.conf")
    src = tmp_path / f"{name}.jsonl"
    src.write_text("\n".join(put_lines(name, drop_raw) + list(extra)) + "\n", encoding="utf-8")
    dst = tmp_path / f"replay-{name}"
    r = CliRunner().invoke(app, ["append", str(dst), "--from", str(src), "--config", str(conf),
                                 "--broker-version", str(version), "--quiet"])
    assert r.exit_code == 0, r.output
    return dst


def files_under(root: Path, sub: str) -> dict[str, bytes]:
    out = {}
    base = root / sub
    for dirpath, _, names in os.walk(base):
        for n in names:
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def index_contents(root: Path) -> list[bytes]:
    d = root / "index"
    return [(d / n).read_bytes() for n in sorted(os.listdir(d))]


def assert_same_store_files(broker_root: Path, ours: Path) -> None:
    for sub in ("commitlog", "consumequeue", "consumequeue_ext"):
        theirs, mine = files_under(broker_root, sub), files_under(ours, sub)
        assert sorted(mine) == sorted(theirs), sub
        for k in theirs:
            assert mine[k] == theirs[k], k
    a, b = index_contents(broker_root), index_contents(ours)
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"index file #{i} differs"


@pytest.mark.parametrize("name", CLEAN_STORES)
def test_replay_equals_broker(name, tmp_path):
    dst = replay(name, tmp_path)
    assert_same_store_files(shared_store(name), dst)
    assert not (dst / "abort").exists()
    assert (dst / "lock").read_bytes() == b"lock"
    cp_broker = broker_read(name)["store"][0]["checkpointBeforeOpen"]
    with Store.open(str(dst)) as st:
        cp = st.checkpoint()
    assert cp.logicsMsgTimestamp == cp_broker["logicsMsgTimestamp"]
    assert cp.indexMsgTimestamp == cp_broker["indexMsgTimestamp"]
    last_ts = broker_read(name)["clmsg"][-1]["msg"]["storeTimestamp"]
    assert cp.physicMsgTimestamp == last_ts  # everything flushed at close


def _empty_value_entries(raw: str) -> bool:
    return any(v == "" for v in parse_properties_lossless(raw).values())


def _strip_empty_values(raw: str) -> str:
    segs = raw.split(PROPERTY_SEPARATOR)
    return PROPERTY_SEPARATOR.join(s for s in segs if not (s.endswith("\x01") and s.count("\x01") == 1))


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_replay_from_properties_dict_only(name, tmp_path):
    """Without propertiesRaw, exactly the records with an empty-valued property differ: their
    stored string lacks those entries (Java's decoder dropped them from the dict); every other
    record is identical apart from the offsets the shorter records shift."""
    dst = replay(name, tmp_path, drop_raw=True)
    broker = broker_read(name)["clmsg"]
    with Store.open(str(dst)) as st:
        ours = list(st.commitlog.records(with_body=True))
    assert len(ours) == len(broker)
    differing = 0
    for mine, rec in zip(ours, broker):
        b = rec["msg"]
        raw = b["propertiesRaw"]
        if _empty_value_entries(raw):
            differing += 1
            assert mine["propertiesRaw"] == _strip_empty_values(raw)
            assert mine["storeSize"] == b["storeSize"] - (len(raw.encode()) - len(mine["propertiesRaw"].encode()))
        else:
            assert mine["propertiesRaw"] == raw
            assert mine["storeSize"] == b["storeSize"]
        for k in ("topic", "queueId", "queueOffset", "sysFlag", "bornTimestamp", "storeTimestamp", "bodyCRC",
                  "properties", "flag", "reconsumeTimes", "preparedTransactionOffset", "bornHost", "storeHost"):
            assert mine[k] == b[k], k
        assert mine["body"].hex() == b["bodyHex"]
    assert differing == sum(1 for r in broker if _empty_value_entries(r["msg"]["propertiesRaw"])) > 0


@pytest.mark.parametrize("name", STORE_NAMES)
def test_builder_reproduces_every_properties_raw(name):
    """The replay path's serialiser (HashMap order, version separator, batch split) gives every
    stored propertiesRaw from the record's full property map."""
    version = 5 if name.startswith("5") else 4
    builder = MessageBuilder(apply_settings(StoreConfig(version=version), {"mappedFileSizeCommitLog": "1073741824"}))
    batch_offsets = set()
    by_offset = {o["offset"]: o for o in broker_read(name)["clmsg"]}
    for p in broker_puts(name):
        if p.get("type") == "put" and p["msgNum"] > 1:
            off = p["wroteOffset"]
            for _ in range(p["msgNum"]):
                batch_offsets.add(off)
                off += by_offset[off]["size"]
    n = 0
    for rec in broker_read(name)["clmsg"]:
        m = dict(rec["msg"])
        raw = m.pop("propertiesRaw")
        m["properties"] = parse_properties_lossless(raw)
        out = builder.from_json(m, in_batch=rec["offset"] in batch_offsets)
        assert out.props_b.decode("utf-8") == raw, rec["offset"]
        n += 1
    assert n == len(by_offset)


@pytest.mark.parametrize("name", CLEAN_STORES)
def test_dispatcher_rebuilds_broker_queues_and_index(name, tmp_path):
    """Dispatcher API (for rebuild/recover): re-dispatching the broker's commitlog into an
    empty store, in two sessions, gives the broker's consume queues, ext and index content."""
    src = shared_store(name)
    with Store.open(str(src)) as st:
        cfg = st.config
        reqs = []
        d0 = Dispatcher(str(tmp_path / "scratch"), cfg)
        for chunk in st.commitlog.scan(check_crc=True):
            reqs += d0.requests_from_chunk(chunk)
        d0.close(flush=False)
    assert len(reqs) == len(broker_read(name)["clmsg"])
    dst = tmp_path / "rebuilt"
    half = len(reqs) // 2
    for part in (reqs[:half], reqs[half:]):
        d = Dispatcher(str(dst), cfg, index_namer=store_time_namer)
        d.dispatch_many(part)
        d.close()
    for sub in ("consumequeue", "consumequeue_ext"):
        assert files_under(dst, sub) == files_under(src, sub), sub
    assert index_contents(dst) == index_contents(src)
    names = sorted(os.listdir(dst / "index"))
    first_ts = broker_read(name)["clmsg"][0]["msg"]["storeTimestamp"]
    assert names[0] == store_time_namer(first_ts)
    # a full re-dispatch skips every consume queue unit (idempotent, §7.5)
    d = Dispatcher(str(dst), cfg)
    d.dispatch_many(reqs)
    d.close()
    assert d.stats.cq_units == 0 and d.stats.cq_skipped == sum(1 for o in broker_read(name)["cqe"])
    for sub in ("consumequeue", "consumequeue_ext"):
        assert files_under(dst, sub) == files_under(src, sub), sub


def test_dispatch_chunk_matches_broker_dispatch_info():
    """requests_from_chunk parses what the broker's reput parsed (tagsCode, keys, uniq key, queue offset)."""
    name = "4.9.3-clean"
    with Store.open(str(shared_store(name))) as st:
        d = Dispatcher("/nonexistent-never-written", st.config)
        reqs = [r for c in st.commitlog.scan(check_crc=False) for r in d.requests_from_chunk(c)]
    for r, rec in zip(reqs, broker_read(name)["clmsg"]):
        disp = rec["dispatch"]
        assert (r.phy, r.size, r.tags_code, r.queue_offset, r.store_timestamp) == \
               (rec["offset"], rec["size"], disp["tagsCode"], disp["consumeQueueOffset"], disp["storeTimestamp"])
        assert r.uniq_key == disp.get("uniqKey") and (r.keys or None) == (disp.get("keys") or None)
