"""DLedger stores read through the engine and the CLI, compared with what the broker itself read back
(``broker-read*.jsonl.gz`` of the ``dledger-*`` samples): the messages inside the entries at entry pos + 48,
the entries and their index units, the blanks, the consume-queue units and the index queries. Reads never
change a byte."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from functools import lru_cache

import pytest

from tests.conftest import STORES, require_shared, tree_digest
from rmqstore_cli.formats import dledger as dl
from rmqstore_cli.engine.log.commitlog import ScanResult
from rmqstore_cli.engine.query.lookup import query_index
from rmqstore_cli.engine.store import Store

RMQSTORE = [sys.executable, "-m", "rmqstore_cli"]
# (sample, store folder, read-back file)
SAMPLES = [("dledger-4.9.3-clean", "store", "broker-read.jsonl.gz"),
           ("dledger-4.9.3-crash", "store", "broker-read.jsonl.gz"),
           ("dledger-5.3.3-clean", "store", "broker-read.jsonl.gz"),
           ("dledger-4.9.3-group", "store-n0", "broker-read-n0.jsonl.gz"),
           ("dledger-4.9.3-group", "store-n1", "broker-read-n1.jsonl.gz"),
           ("dledger-4.9.3-group", "store-n2", "broker-read-n2.jsonl.gz")]
IDS = [f"{s}/{d}" for s, d, _ in SAMPLES]
MESSAGE_FIELDS = ("totalSize", "bodyCRC", "queueId", "flag", "queueOffset", "sysFlag", "bornTimestamp", "storeTimestamp",
                  "reconsumeTimes", "preparedTransactionOffset", "topic", "msgId", "properties", "propertiesRaw")


@lru_cache(maxsize=None)
def read_back(sample: str, name: str) -> dict:
    require_shared()
    out: dict = {}
    with gzip.open(STORES / sample / name, "rt", encoding="utf-8") as f:
        for line in f:
            o = json.loads(line)
            out.setdefault(o["type"], []).append(o)
    return out


def cli(*args, ok=(0,)) -> subprocess.CompletedProcess:
    p = subprocess.run(RMQSTORE + [str(a) for a in args], capture_output=True, text=True, timeout=300)
    assert p.returncode in ok, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p


def lines(p) -> list[dict]:
    return [json.loads(x) for x in p.stdout.splitlines() if x.strip()]


@pytest.fixture(scope="module", params=SAMPLES, ids=IDS)
def opened(request):
    sample, folder, rb = request.param
    with Store.open(str(STORES / sample / folder)) as st:
        yield st, read_back(sample, rb)


def test_messages_at_entry_pos_plus_48(opened):
    st, br = opened
    entries = br["dledger_entry"]
    res = ScanResult()
    ours = list(st.commitlog.records(with_body=True, result=res))
    assert len(ours) == len(entries)
    for m, e in zip(ours, entries):
        want = e["message"]
        assert m["offset"] == e["pos"] + dl.ENTRY_HEADER_SIZE == want["commitLogOffset"]
        assert m["storeSize"] == want["totalSize"] == e["size"] - dl.ENTRY_HEADER_SIZE
        for k in MESSAGE_FIELDS[1:]:
            assert m.get(k) == want[k], (e["index"], k, m.get(k), want[k])
        assert hashlib.sha256(m["body"]).hexdigest() == want["bodySha256"]
    assert res.stop.offset == br["recovery"][0]["commitLogMaxOffset"]
    assert [b for b, _ in res.blanks] == [b["pos"] for b in br.get("dledger_blank", [])]


def test_consume_queue_units(opened):
    st, br = opened
    ours = set()
    for t, q in st.queues():
        u = st.queue(t, q).units()
        for qo, phy, size, tags in zip(u.queue_offsets.tolist(), u.phy.tolist(), u.size.tolist(), u.tags.tolist()):
            ours.add((t, q, qo, phy, size, tags))
    theirs = {(c["topic"], c["queueId"], c["queueOffset"], c["phyOffset"], c["size"], c["tagsCode"]) for c in br["cq_unit"]}
    assert ours == theirs
    for t, q, _, phy, size, _ in list(theirs)[:50]:  # every unit resolves to its message
        m = st.commitlog.read(phy, with_body=False)
        assert (m["topic"], m["queueId"], m["storeSize"]) == (t, q, size)


def test_index_queries(opened):
    """Equal to the broker's answers; after a crash (abort file) the broker's load first deletes the index
    files written after the checkpoint's indexMsgTimestamp (IndexService.load, FORMAT.md §10.6), so its
    answers then lack hits of those files that it did not index again, which are on disk and which we read."""
    st, br = opened
    cp = br["store_checkpoint_file"][0]["indexMsgTimestamp"]
    deleted_from = min([f.header().beginPhyOffset for f in st.index.files
                        if br["pre_open"][0]["abortFileExists"] and f.header().endTimestamp > cp], default=None)
    for qline in br["index_query"]:
        ours = sorted(query_index(st, qline["topic"], qline["key"], max_num=64, raw=True).offsets)
        if deleted_from is None:
            assert ours == qline["commitLogOffsets"], qline
        else:
            # the broker re-indexes part of the deleted range by re-dispatching; never more than is on disk
            assert set(qline["commitLogOffsets"]) <= set(ours), qline
            assert all(o >= deleted_from for o in set(ours) - set(qline["commitLogOffsets"])), qline


@pytest.mark.parametrize("sample,folder,rb", SAMPLES[:3] + SAMPLES[4:5], ids=IDS[:3] + IDS[4:5])
def test_dump_dledger_json_equals_broker_entries(sample, folder, rb):
    br = read_back(sample, rb)
    out = lines(cli("dump", "dledger", STORES / sample / folder, "--json", "--index-units"))
    entries = [o for o in out if o["type"] == "entry"]
    assert len(entries) == len(br["dledger_entry"])
    for o, e in zip(entries, br["dledger_entry"]):
        for k in ("index", "term", "pos", "size", "magic", "channel", "chainCrc", "bodyCrc", "bodyLen"):
            assert o[k] == e[k], (e["index"], k)
        m = e["message"]
        assert (o["topic"], o["queueId"], o["queueOffset"], o["messageOffset"], o["messageSize"]) == \
            (m["topic"], m["queueId"], m["queueOffset"], m["commitLogOffset"], m["totalSize"])
        # the 4.9.3 read-back has the broker's CRC-checked parse of the entry (5.3.3's harness call did not parse)
        if sample.startswith("dledger-4.9.3"):
            assert o["messageOk"] is m["dispatch"]["success"]
    units = [o for o in out if o["type"] == "indexUnit"]
    assert [{k: u[k] for k in ("magic", "pos", "size", "index", "term")} for u in units] == \
        [e["indexUnit"] for e in br["dledger_entry"]]
    blanks = [{k: o[k] for k in ("pos", "magic", "size", "nextEntryPos")} for o in out if o["type"] == "blank"]
    assert blanks == [{k: b[k] for k in ("pos", "magic", "size", "nextEntryPos")} for b in br.get("dledger_blank", [])]
    (cp,) = [o for o in out if o["type"] == "checkpoint"]
    (ct,) = [o for o in out if o["type"] == "currterm"]
    raw = br["pre_open"][0]
    assert f"committedIndex={cp['committedIndex']}" in raw["dledgerCheckpointFile"]
    assert f"endIndex={cp['endIndex']}" in raw["dledgerCheckpointFile"]
    assert f"currTerm={ct['currTerm']}" in raw["dledgerCurrtermFile"]
    assert f"voteLeader={ct['voteLeader']}" in raw["dledgerCurrtermFile"]
    (end,) = [o for o in out if o["type"] == "end"]
    assert end["lastIndex"] == br["recovery"][0]["ledgerEndIndex"] and end["endPos"] == br["recovery"][0]["writePos"]


def test_cli_reads_and_verify_change_nothing(tmp_path):
    """The CLI's read commands on the 4.9.3 sample (the engine's answers for every sample are compared above)."""
    sample = "dledger-4.9.3-clean"
    root = STORES / sample / "store"
    before = tree_digest(root)
    br = read_back(sample, "broker-read.jsonl.gz")
    msgs = lines(cli("dump", "commitlog", root, "--json", "--body", "hex"))
    assert [(m["offset"], m["msgId"], m["queueOffset"]) for m in msgs] == \
        [(e["message"]["commitLogOffset"], e["message"]["msgId"], e["message"]["queueOffset"]) for e in br["dledger_entry"]]
    e = br["dledger_entry"][len(br["dledger_entry"]) // 2]["message"]
    (got,) = lines(cli("get", root, "--offset", e["commitLogOffset"], "--json"))
    assert (got["msgId"], got["topic"], got["queueOffset"]) == (e["msgId"], e["topic"], e["queueOffset"])
    (got,) = lines(cli("get", root, "--msg-id", e["msgId"], "--json"))
    assert got["commitLogOffset"] == e["commitLogOffset"]
    cq = lines(cli("dump", "consumequeue", root, "--json"))
    assert len(cq) == len(br["cq_unit"])
    q = br["index_query"][0]
    hits = lines(cli("index", "query", root, "--topic", q["topic"], "--key", q["key"], "--json"))
    assert sorted(h["offset"] for h in hits) == q["commitLogOffsets"]
    (stats,) = [o for o in lines(cli("stats", root, "--json")) if "records" in o][:1]
    assert stats["records"] == len(br["dledger_entry"])
    v = cli("verify", root, "--json")
    assert v.returncode == 0
    cli("dump", "store", root, "--json")
    import pyarrow.parquet as pq
    cli("dump", "commitlog", root, "--format", "parquet", "--out", tmp_path / "x.parquet")
    assert pq.read_table(tmp_path / "x.parquet").column("commitLogOffset").to_pylist() == \
        [e["message"]["commitLogOffset"] for e in br["dledger_entry"]]
    assert tree_digest(root) == before


def test_since_finds_the_first_message_stored_then():
    br = read_back("dledger-4.9.3-clean", "broker-read.jsonl.gz")
    msgs = [e["message"] for e in br["dledger_entry"]]
    t = msgs[1234]["storeTimestamp"]
    want = [m["commitLogOffset"] for m in msgs if m["storeTimestamp"] >= t][:5]
    got = lines(cli("dump", "commitlog", STORES / "dledger-4.9.3-clean" / "store", "--since", t, "--limit", 5, "--json"))
    assert [g["offset"] for g in got] == want


def test_several_dledger_folders_need_self_id(tmp_path):
    import shutil

    root = tmp_path / "s"
    shutil.copytree(STORES / "dledger-4.9.3-clean" / "store", root)
    shutil.copytree(root / "dledger-n0", root / "dledger-n1")
    p = cli("dump", "dledger", root, ok=(3,))
    assert "--self-id" in p.stderr and "Traceback" not in p.stderr
    out = lines(cli("dump", "dledger", root, "--self-id", "n1", "--json", "--limit", 1))
    assert out[0]["selfId"] == "n1"


@pytest.mark.parametrize("variant", ["torn", "corrupt"])
def test_damaged_samples_entries_and_crc_checked_parse(variant):
    """dump dledger on the damaged samples: every entry the broker serves, and its CRC-checked parse of each."""
    br = [e for e in read_back("dledger-4.9.3-torn", "broker-read.jsonl.gz")["dledger_entry"]
          if e["variant"] == f"{variant}-abortfalse"]
    out = [o for o in lines(cli("dump", "dledger", STORES / "dledger-4.9.3-torn" / f"store-{variant}", "--json"))
           if o["type"] == "entry"]
    assert [(o["index"], o["term"], o["pos"], o["size"], o["magic"], o["bodyLen"]) for o in out] == \
        [(e["index"], e["term"], e["pos"], e["size"], e["magic"], e["bodyLen"]) for e in br]
    assert [o["messageOk"] for o in out] == [e["dispatchCrcChecked"]["success"] for e in br]


def test_self_id_from_the_broker_config(tmp_path):
    import shutil

    root = tmp_path / "s"
    shutil.copytree(STORES / "dledger-4.9.3-clean" / "store", root)
    shutil.copytree(root / "dledger-n0", root / "dledger-n7")
    conf = tmp_path / "broker.conf"
    conf.write_text("enableDLegerCommitLog=true\ndLegerSelfId=n7\n")
    out = lines(cli("dump", "dledger", root, "--config", conf, "--json", "--limit", 1))
    assert out[0]["selfId"] == "n7"


def test_dump_goes_on_past_a_damaged_message():
    """The broker serves the entries after a damaged one: the listing leaves the damaged message out (warning,
    exit 1) and goes on; stats counts the rest."""
    br = read_back("dledger-4.9.3-clean", "broker-read.jsonl.gz")["dledger_entry"]
    damage = {d["variant"]: d for d in json.loads((STORES / "dledger-4.9.3-torn" / "damage.json").read_text())}
    root = STORES / "dledger-4.9.3-torn" / "store-torn"
    p = cli("dump", "commitlog", root, "--json", ok=(1,))
    want = [e["message"]["commitLogOffset"] for e in br if e["index"] != damage["torn"]["entryIndex"]]
    assert [m["offset"] for m in lines(p)] == want
    assert str(damage["torn"]["entryPos"] + 48) in p.stderr
