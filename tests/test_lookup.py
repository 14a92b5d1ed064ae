"""index query / get / msgid decode against the broker's own answers (broker-read.jsonl.gz)."""

from __future__ import annotations

import json
import struct

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.config.storeconfig import StoreConfig
from rmqstore_cli.engine.derived.index import IndexService
from rmqstore_cli.engine.query.lookup import (carries_key, get_by_msgid, get_by_offset, get_by_queue, get_by_uniq_key,
                                              parse_time, query_index)
from rmqstore_cli.engine.store import Store

from .conftest import STORE_NAMES, broker_read, shared_store

runner = CliRunner()
TIME_MAX = (1 << 63) - 1


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def _broker_carries(c: dict, topic: str, key: str) -> bool:
    d = c["dispatch"]
    return c["msg"]["topic"] == topic and (d.get("uniqKey") == key or key in (d.get("keys") or "").split(" "))


def _crash_reindexed_offset(name: str) -> int | None:
    """4.9.3-crash: the broker's query lines were taken after its abnormal load deleted the index files
    newer than checkpoint.indexMsgTimestamp and re-dispatched; buildIndex's strict `phy < endPhyOffset`
    test indexed the last message of the kept file a second time (§10.6). Our files are the pre-recovery
    ones, so that offset appears once where the broker lists it twice."""
    if name != "4.9.3-crash":
        return None
    st = Store.open(str(shared_store(name)))
    cp = st.checkpoint().indexMsgTimestamp
    kept = [f.header() for f in st.index.files if f.header().endTimestamp <= cp]
    return kept[-1].endPhyOffset


@pytest.mark.parametrize("name", STORE_NAMES)
def test_every_broker_query_line(name):
    br = broker_read(name)
    by_offset = {c["offset"]: c for c in br["clmsg"]}
    st = Store.open(str(shared_store(name)))
    dup = _crash_reindexed_offset(name)
    explained = 0
    for q in br["query"]:
        assert q["maxNum"] == 32 and q["begin"] == 0 and q["end"] == TIME_MAX
        ans = query_index(st, q["topic"], q["key"], max_num=32)
        exp = q["offsets"]
        if ans.offsets != exp:
            assert dup is not None and exp.count(dup) == 2 and ans.offsets == sorted(set(exp)), (q, ans.offsets)
            explained += 1
        # filtered answer: exactly the distinct records of the broker answer that carry the key
        want = sorted({o for o in exp if _broker_carries(by_offset[o], q["topic"], q["key"])})
        assert [m["offset"] for m in ans.matches] == want, q
        for m in ans.matches:
            assert carries_key(m, q["topic"], q["key"])
    assert explained <= 3
    if dup is None:
        assert explained == 0


@pytest.mark.parametrize("name", STORE_NAMES)
def test_cli_raw_query_sample(name):
    br = broker_read(name)
    root = shared_store(name)
    dup = _crash_reindexed_offset(name)
    sample = br["query"][:: max(1, len(br["query"]) // 12)]
    for q in sample:
        r = _cli("index", "query", root, "--topic", q["topic"], "--key", q["key"], "--raw", "--max", 32, "--json")
        assert r.exit_code == 0, r.output
        got = json.loads(r.stdout.splitlines()[0])["offsets"]
        assert got == q["offsets"] or (dup is not None and got == sorted(set(q["offsets"])))
        r2 = _cli("index", "query", root, "--topic", q["topic"], "--key", q["key"], "--json")
        assert r2.exit_code == 0
        rows = [json.loads(x) for x in r2.stdout.splitlines()]
        assert all(q["key"] in (row["keys"] or "").split(" ") or row["uniqKey"] == q["key"] for row in rows)
        assert sorted(row["offset"] for row in rows) == sorted({o for o in q["offsets"]})


def test_query_unknown_key_exit_1_and_scan():
    root = shared_store("4.9.3-clean")
    r = _cli("index", "query", root, "--topic", "OracleTopicA", "--key", "no-such-key-xyz")
    assert r.exit_code == 1
    q = broker_read("4.9.3-clean")["query"][5]
    r = _cli("index", "query", root, "--topic", q["topic"], "--key", q["key"], "--scan", "--json")
    assert r.exit_code == 0
    assert sorted(json.loads(x)["offset"] for x in r.stdout.splitlines()) == sorted(set(q["offsets"]))


def test_query_missing_index_says_so(tmp_path, store_copy):
    root = store_copy("5.3.3-v2topic")
    for f in (root / "index").iterdir():
        f.unlink()
    q = broker_read("5.3.3-v2topic")["query"][0]
    r = _cli("index", "query", root, "--topic", q["topic"], "--key", q["key"])
    assert r.exit_code == 1
    assert "--scan" in r.output and "no index files" in r.output
    r = _cli("index", "query", root, "--topic", q["topic"], "--key", q["key"], "--scan", "--json")
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == len(set(q["offsets"]))


def test_parse_time():
    assert parse_time("1795313607455", 0) == 1795313607455
    assert parse_time("2026-11-22T02:13:27.455Z", 0) == 1795313607455
    assert parse_time("2026-11-22T03:13:27.455+01:00", 0) == 1795313607455
    assert parse_time(None, 7) == 7


# --- time ranges on index files written by an independent §10.4 writer -------------------------


class TinyIndexWriter:
    """FORMAT.md §10.4 insertion and §10.6 roll-over, written for this test only (not the appender)."""

    def __init__(self, directory, slots, entries):
        self.dir, self.slots, self.entries = directory, slots, entries
        self.files = []  # [header dict, slot list, entry list]
        (directory / "index").mkdir(parents=True, exist_ok=True)

    def _java_hash(self, s):
        h = 0
        b = s.encode("utf-16-be")
        for i in range(0, len(b), 2):
            h = (31 * h + ((b[i] << 8) | b[i + 1])) & 0xFFFFFFFF
        return h - (1 << 32) if h >= 1 << 31 else h

    def key_hash(self, s):
        h = self._java_hash(s)
        return 0 if h == -(1 << 31) else abs(h)

    def _new_file(self):
        prev = self.files[-1][0] if self.files else None
        hdr = {"bt": prev["et"] if prev else 0, "et": prev["et"] if prev else 0, "bp": prev["ep"] if prev else 0,
               "ep": prev["ep"] if prev else 0, "hsc": 0, "ic": 1}
        self.files.append([hdr, [0] * self.slots, [(0, 0, 0, 0)] * self.entries])

    def put(self, key, phy, ts):
        if not self.files or self.files[-1][0]["ic"] >= self.entries:
            self._new_file()
        hdr, slots, ents = self.files[-1]
        kh = self.key_hash(key)
        slot = kh % self.slots
        prev = slots[slot]
        if prev <= 0 or prev > hdr["ic"]:
            prev = 0
        diff = int((ts - hdr["bt"]) / 1000) if hdr["bt"] > 0 else 0
        diff = min(max(diff, 0), 2**31 - 1)
        ents[hdr["ic"]] = (kh, phy, diff, prev)
        slots[slot] = hdr["ic"]
        if hdr["ic"] <= 1:
            hdr["bp"], hdr["bt"] = phy, ts
        if prev == 0:
            hdr["hsc"] += 1
        hdr["ic"] += 1
        hdr["ep"], hdr["et"] = phy, ts

    def flush(self):
        for i, (h, slots, ents) in enumerate(self.files):
            data = struct.pack(">qqqqii", h["bt"], h["et"], h["bp"], h["ep"], h["hsc"], h["ic"])
            data += struct.pack(f">{self.slots}i", *slots)
            data += b"".join(struct.pack(">iqii", *e) for e in ents)
            (self.dir / "index" / f"2026010100000{i:04d}").write_bytes(data)


def _service(root, slots, entries):
    return IndexService(str(root), StoreConfig(maxHashSlotNum=slots, maxIndexNum=entries))


def test_format_18_2_tiny_model(tmp_path):
    t0 = 1_700_000_000_000
    w = TinyIndexWriter(tmp_path, 10, 8)
    for key, phy, dt in (("T#a", 0, 0), ("T#b", 100, 1500), ("T#a", 200, 3000), ("T#k", 300, 4500)):
        w.put(key, phy, t0 + dt)
    w.flush()
    svc = _service(tmp_path, 10, 8)
    assert svc.files[0].entry(3) == (81906, 200, 3, 1) and svc.files[0].entry(4) == (81916, 300, 4, 3)
    assert svc.query("T", "a", 64, 0, TIME_MAX) == [200, 0]
    assert svc.query("T", "a", 64, t0 + 2000, TIME_MAX) == [200]
    assert svc.query("T", "k", 64, 0, TIME_MAX) == [300]


def test_time_ranges_across_files_and_second_rounding(tmp_path):
    """4 slots, 6 entries (5 per file). One key `K` every 700 ms from t0 = ...500 ms."""
    t0 = 1_700_000_000_500
    w = TinyIndexWriter(tmp_path, 4, 6)
    times = {}
    for i in range(14):  # 14 entries -> files of 5, 5, 4
        times[i * 10] = t0 + 700 * i
        w.put("T#K", i * 10, t0 + 700 * i)
    w.flush()
    svc = _service(tmp_path, 4, 6)
    assert len(svc.files) == 3
    # whole range: newest first, across the three files
    assert svc.query("T", "K", 64, 0, TIME_MAX, cap=False) == [130, 120, 110, 100, 90, 80, 70, 60, 50, 40, 30, 20, 10, 0]
    # maxNum stops the walk in the newest file
    assert svc.query("T", "K", 3, 0, TIME_MAX, cap=False) == [130, 120, 110]
    # The broker's 64 cap applies only when asked for.
    # File 2 (entries 50..90): inherited begin = t(40) = t0+2800, then t(50)=t0+3500 becomes begin;
    # its first entry's diff was computed against t0+2800: (3500-2800)//1000 = 0 -> read back as t0+3500+0.
    # Entry 70 stored at t0+4900 has diff (4900-3500)//1000 = 1 -> read back as t0+4500 (rounded down).
    b = t0 + 4600  # inside file 2: excludes 70 (reads as t0+4500 although stored at t0+4900)
    e = t0 + 6300  # inside file 2's range: t(90) = t0+6300 (diff 2 -> t0+5500)
    got = svc.query("T", "K", 64, b, e, cap=False)
    assert got == [90, 80]
    # A range that starts inside file 1 and ends inside file 3 spans the three files;
    # the walk in file 1 stops at the first entry read back before `begin`.
    b, e = t0 + 2000, t0 + 7800
    got = svc.query("T", "K", 64, b, e, cap=False)
    # file 3 [t0+7000, t0+9100] (end inside): 130 -> t0+9000 and 120 -> t0+8000 are after `end`;
    #   110 (stored t0+7700, diff 0) and 100 read back as t0+7000.
    # file 2 [t0+3500, t0+6300] lies inside the range: all five entries.
    # file 1 [t0, t0+2800] (begin inside): 40 and 30 read back as t0+2000 (30 was stored at t0+2100),
    #   20 reads back as t0+1000 < begin: not returned and the walk stops there.
    assert got == [110, 100, 90, 80, 70, 60, 50, 40, 30]
    assert got == _reference_walk(w, "T#K", b, e)
    # a range that ends before every file: nothing
    assert svc.query("T", "K", 64, 0, t0 - 1, cap=False) == []


def _reference_walk(w: TinyIndexWriter, key: str, begin: int, end: int) -> list[int]:
    """§10.5/§10.6 over the writer's in-memory tables (files newest first, chain newest first)."""
    kh = w.key_hash(key)
    out = []
    for hdr, slots, ents in reversed(w.files):
        fb, fe = hdr["bt"], hdr["et"]
        if (begin < fb and end > fe) or fb <= begin <= fe or fb <= end <= fe:
            n = slots[kh % w.slots]
            while 0 < n < hdr["ic"]:
                h, phy, diff, prev = ents[n]
                t = fb + diff * 1000
                if h == kh and begin <= t <= end:
                    out.append(phy)
                if prev <= 0 or prev == n or t < begin:
                    break
                n = prev
        if fb < begin:
            break
    return out


# --- get ---------------------------------------------------------------------------------------

FIELDS = ("topic", "queueId", "queueOffset", "commitLogOffset", "storeSize", "bodyCRC", "sysFlag", "flag",
          "bornTimestamp", "storeTimestamp", "bornHost", "storeHost", "reconsumeTimes", "preparedTransactionOffset",
          "properties", "msgId")


def _same(ours: dict, broker: dict) -> None:
    for k in FIELDS:
        assert ours[k] == broker[k], k
    assert ours["body"].hex() == broker["bodyHex"]


@pytest.mark.parametrize("name", STORE_NAMES)
def test_get_by_every_identifier(name):
    br = broker_read(name)
    st = Store.open(str(shared_store(name)))
    sample = br["clmsg"][:: max(1, len(br["clmsg"]) // 40)]
    uniq_holders: dict[str, set] = {}
    for c in br["clmsg"]:
        if c["dispatch"].get("uniqKey"):
            uniq_holders.setdefault(c["dispatch"]["uniqKey"], set()).add(c["offset"])
    for c in sample:
        m = c["msg"]
        _same(get_by_offset(st, c["offset"]), m)
        _same(get_by_msgid(st, m["msgId"]), m)
        u = c["dispatch"].get("uniqKey")
        if u:
            got, _ = get_by_uniq_key(st, u, m["topic"])
            assert c["offset"] in [g["offset"] for g in got]
            assert {g["offset"] for g in got} <= uniq_holders[u]
    for e in br["cqe"][:: max(1, len(br["cqe"]) // 40)]:
        _same(get_by_queue(st, e["topic"], e["queueId"], e["queueOffset"]), e["msg"])


def test_get_cli_and_not_found(tmp_path):
    root = shared_store("5.3.3-clean")
    c = broker_read("5.3.3-clean")["clmsg"][7]
    r = _cli("get", root, "--msg-id", c["msg"]["msgId"], "--json", "--body", "hex")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["bodyHex"] == c["msg"]["bodyHex"] and got["propertiesRaw"] == c["msg"]["propertiesRaw"]
    r = _cli("get", root, "--uniq-key", c["dispatch"]["uniqKey"], "--json", "--body", "none")
    assert r.exit_code == 0 and c["offset"] in [json.loads(x)["offset"] for x in r.stdout.splitlines()]
    out = tmp_path / "body.bin"
    r = _cli("get", root, "--offset", c["offset"], "--out", out, "--body", "none")
    assert r.exit_code == 0 and out.read_bytes().hex() == c["msg"]["bodyHex"]
    r = _cli("get", root, "--offset", c["offset"])
    assert r.exit_code == 0 and "UNIQ_KEY" in r.stdout
    # unknown identifiers: one line, exit 1
    wrong_host = "0A0A0A0B" + c["msg"]["msgId"][8:] if len(c["msg"]["msgId"]) == 32 else "0A0A0A0A00002A9F" + c["msg"]["msgId"][40:]
    for args in (("--offset", 10**12), ("--offset", c["offset"] + 1), ("--msg-id", wrong_host),
                 ("--uniq-key", "FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF"),
                 ("--topic", "OracleTopicA", "--queue", 0, "--queue-offset", 10**6),
                 ("--topic", "NoSuchTopic", "--queue", 0, "--queue-offset", 0)):
        r = _cli("get", root, *args)
        assert r.exit_code == 1, (args, r.output)
        assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    r = _cli("get", root, "--offset", 1, "--msg-id", c["msg"]["msgId"])
    assert r.exit_code == 3


def test_msgid_decode_vectors():
    """FORMAT.md §18.6."""
    r = _cli("msgid", "decode", "--json", "C0A8000100002A9F0000000040000000",
             "0000000000000000000000000000000100002A9F0000000000000005", "C0A8000104D21B6D3586000186A00007")
    assert r.exit_code == 0, r.output
    a, b, u = (json.loads(x) for x in r.stdout.splitlines())
    assert a["asOffsetMsgId"] == {"storeHost": "192.168.0.1", "storePort": 10911, "commitLogOffset": 1073741824}
    assert a["likely"] == "offset"
    assert b["asOffsetMsgId"]["storeHost"] == "0:0:0:0:0:0:0:1" and b["asOffsetMsgId"]["commitLogOffset"] == 5
    k = u["asUniqKey"]
    assert (k["ip"], k["pid"], k["classLoaderHash"], k["timeInMonthMs"], k["counter"]) == \
        ("192.168.0.1", 1234, "0x1B6D3586", 100000, 7)
    r = _cli("msgid", "decode", "XYZ")
    assert r.exit_code == 3


def test_msgid_decode_broker_ids():
    """Every offset msgId the broker reported decodes to the record's own offset and store host."""
    for name in ("4.9.3-clean", "5.3.3-v2topic"):
        from rmqstore_cli.commands.msgid import decode
        for c in broker_read(name)["clmsg"]:
            d = decode(c["msg"]["msgId"], "offset", 0)["asOffsetMsgId"]
            assert d["commitLogOffset"] == c["offset"]
            assert d["storeHost"] == c["msg"]["storeHost"]["ip"] and d["storePort"] == c["msg"]["storeHost"]["port"]
