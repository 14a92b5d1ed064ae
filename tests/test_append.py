"""``rmqstore append``: broker rules for sends, appending to broker-written stores, bad input.

Expected values come from FORMAT.md (rules, layouts) and from the broker's read-back of the
shared stores (queue max offsets, end of the commitlog), not from the code under test.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from rmqstore_cli.formats.fast import check_property_crc
from rmqstore_cli.formats.hashing import java_hash
from rmqstore_cli.app import app
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify.pipeline import verify_store
from tests.conftest import broker_read, tree_digest
from tests.test_replay import assert_same_store_files, put_lines, replay

SMALL = ["--commitlog-file-size", "65536", "--cq-file-size", "6000", "--index-slots", "64", "--index-entries", "256"]
LONG_TOPIC = "T" * 200
MAGIC_BLANK = 0xCBD43194


def run(*args):
    return CliRunner().invoke(app, ["append", *map(str, args)])


def send(root, version, *args):
    r = run(root, "--broker-version", version, *SMALL, "--json", *args)
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]


def records(root):
    with Store.open(str(root)) as st:
        return list(st.commitlog.records())


def cq_unit(root, topic, qid, qoff):
    with Store.open(str(root)) as st:
        return st.queue(topic, qid).unit_at(qoff)


def no_problems(root):
    with Store.open(str(root)) as st:
        return [f for f in verify_store(st).findings if f.severity != "info"]


# --------------------------------------------------------------------------- sends (options)


def test_send_4x_broker_additions(tmp_path):
    root = tmp_path / "s4"
    out = send(root, 4, "--topic", "TopicA", "--queue", 3, "--body", "hello", "--tags", "TagA", "--keys", "k1 k2",
               "--property", "WAIT=true", "--property", "user=v", "--cluster", "DefaultCluster")
    assert out[0]["offset"] == 0 and out[0]["queueOffset"] == 0
    (m,) = records(root)
    assert m["properties"] == {"TAGS": "TagA", "KEYS": "k1 k2", "user": "v", "CLUSTER": "DefaultCluster"}
    assert not m["propertiesRaw"].endswith("\x02")  # 4.9: no trailing separator, WAIT stripped
    assert m["queueId"] == 3 and m["body"] == b"hello" and m["magicVersion"] == 1
    assert cq_unit(root, "TopicA", 3, 0) == (0, m["storeSize"], java_hash("TagA"))
    with Store.open(str(root)) as st:
        for key in ("k1", "k2"):
            assert st.index.query("TopicA", key, 32, 0, 2**62) == [0]
    assert not (root / "abort").exists() and (root / "lock").read_bytes() == b"lock"
    assert no_problems(root) == []


def test_send_5x_broker_additions_and_queue_offsets(tmp_path):
    root = tmp_path / "s5"
    send(root, 5, "--topic", "TopicA", "--body", "a", "--keys", "k")
    out = send(root, 5, "--topic", "TopicA", "--body", "b")
    assert out[0]["queueOffset"] == 1
    m = records(root)[1]
    assert m["properties"]["WAIT"] == "true" and len(m["properties"]["UNIQ_KEY"]) == 32
    assert m["propertiesRaw"].endswith("\x02")
    with Store.open(str(root)) as st:
        assert st.index.query("TopicA", m["properties"]["UNIQ_KEY"], 32, 0, 2**62) == [m["offset"]]
    assert records(root)[0]["storeTimestamp"] <= m["storeTimestamp"]


def test_long_topic_v2_on_5x_refused_on_4x(tmp_path):
    send(tmp_path / "v5", 5, "--topic", LONG_TOPIC, "--body", "x")
    (m,) = records(tmp_path / "v5")
    assert m["magicVersion"] == 2 and m["topic"] == LONG_TOPIC
    r = run(tmp_path / "v4", "--broker-version", 4, *SMALL, "--topic", LONG_TOPIC, "--body", "x")
    assert r.exit_code == 3 and "127" in r.output
    assert not (tmp_path / "v4").exists() or not os.listdir(tmp_path / "v4")


def test_ipv6_hosts_set_sysflag_bits(tmp_path):
    send(tmp_path / "s", 4, "--topic", "T", "--born-host", "[2001:db8::1]:7000", "--store-host", "[::1]:10911")
    send(tmp_path / "s", 4, "--topic", "T", "--born-host", "[::ffff:10.0.0.1]:7000")  # IPv4-mapped = IPv4 in Java
    a, b = records(tmp_path / "s")
    assert a["sysFlag"] & 0x30 == 0x30 and a["bornHost"]["ipHex"] == "20010db8000000000000000000000001"
    assert b["sysFlag"] & 0x30 == 0 and b["bornHost"]["ip"] == "10.0.0.1"


def test_delay_level_goes_to_schedule_topic(tmp_path):
    root = tmp_path / "s"
    send(root, 4, "--topic", "TopicA", "--queue", 5, "--delay-level", 3, "--tags", "x")
    (m,) = records(root)
    assert (m["topic"], m["queueId"]) == ("SCHEDULE_TOPIC_XXXX", 2)
    assert m["properties"]["REAL_TOPIC"] == "TopicA" and m["properties"]["REAL_QID"] == "5"
    assert m["properties"]["DELAY"] == "3"
    # deliver time: level 3 = 10s (messageDelayLevel default), FORMAT.md §5.2
    assert cq_unit(root, "SCHEDULE_TOPIC_XXXX", 2, 0) == (0, m["storeSize"], m["storeTimestamp"] + 10_000)


def test_transactions_prepared_rollback_get_no_queue_position(tmp_path):
    root = tmp_path / "s"
    send(root, 4, "--topic", "T", "--transaction", "prepared", "--keys", "half")
    send(root, 4, "--topic", "T", "--transaction", "rollback", "--keys", "rb")
    out = send(root, 4, "--topic", "T", "--transaction", "commit", "--prepared-offset", 0)
    p, rb, c = records(root)
    assert p["queueOffset"] == 0 and p["sysFlag"] & 0xC == 4 and rb["sysFlag"] & 0xC == 12
    assert out[0]["queueOffset"] == 0 and c["sysFlag"] & 0xC == 8
    assert cq_unit(root, "T", 0, 0) == (c["offset"], c["storeSize"], 0)
    assert cq_unit(root, "T", 0, 1) in (None, (0, 0, 0))
    with Store.open(str(root)) as st:
        assert st.index.query("T", "half", 32, 0, 2**62) == [0]  # prepared is indexed
        assert st.index.query("T", "rb", 32, 0, 2**62) == []  # rollback is not


def test_crc_property_when_enabled(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("enabledAppendPropCRC=true\n")
    root = tmp_path / "s"
    send(root, 5, "--config", conf, "--topic", "T", "--body", "payload", "--property", "__CRC32#=0000000000")
    (m,) = records(root)
    assert m["propertiesRaw"].endswith("\x02") and m["propertiesRaw"].count("__CRC32#") == 1
    with Store.open(str(root)) as st:
        buf = st.commitlog.segments.segments[0].buffer()
        assert check_property_crc(buf, 0, m["storeSize"])


def test_segment_roll_writes_blank(tmp_path):
    root = tmp_path / "s"
    body = "x" * 1000
    outs = []
    for _ in range(5):
        r = run(root, "--broker-version", 4, "--commitlog-file-size", 4096, "--topic", "T", "--body", body, "--json")
        assert r.exit_code == 0, r.output
        outs.append(json.loads(r.output.splitlines()[0]))
    size = outs[0]["size"]
    per_file = (4096 - 8) // size
    assert [o["offset"] for o in outs[per_file:per_file + 1]] == [4096]
    data = (root / "commitlog" / "00000000000000000000").read_bytes()
    pos = per_file * size
    assert struct.unpack_from(">iI", data, pos) == (4096 - pos, MAGIC_BLANK)
    assert [o["queueOffset"] for o in outs] == list(range(5))
    assert no_problems(root) == []


# --------------------------------------------------------------------------- broker stores


def test_append_continues_a_broker_store(store_copy, tmp_path):
    name = "4.9.3-clean"
    root = store_copy(name)
    info = broker_read(name)["store"][0]
    cq = {(c["topic"], c["queueId"]): c for c in broker_read(name)["cq"]}
    topic, qid = "OracleTopicA", 0
    expected_qoff = cq[(topic, qid)]["maxOffset"]
    extra = [json.dumps({"topic": topic, "queueId": qid, "bodyText": f"extra-{i}", "bornTimestamp": 1700000009000 + i,
                         "storeTimestamp": 1795313700000 + i, "storeHost": "10.10.10.10:10911",
                         "bornHost": "10.0.0.1:1", "properties": {"KEYS": f"extra-{i}", "UNIQ_KEY": "%032X" % i,
                                                                  "CLUSTER": "DefaultCluster"}})
             for i in range(300)]  # enough keys to fill the broker's last index file and start new ones
    src = tmp_path / "extra.jsonl"
    src.write_text("\n".join(extra) + "\n")
    r = CliRunner().invoke(app, ["append", str(root), "--from", str(src), "--json"])
    assert r.exit_code == 0, r.output
    out = [json.loads(line) for line in r.output.splitlines()]
    assert out[0]["offset"] == info["maxPhyOffset"]
    assert [o["queueOffset"] for o in out] == list(range(expected_qoff, expected_qoff + 300))
    assert no_problems(root) == []
    with Store.open(str(root)) as st:
        assert st.queue(topic, qid).units().end_offset == expected_qoff + 300
        assert st.index.query(topic, "extra-7", 32, 0, 2**62) == [out[7]["offset"]]
    # the same puts replayed into a fresh store give the same bytes
    fresh = replay(name, tmp_path, extra=extra)
    assert_same_store_files(root, fresh)


# --------------------------------------------------------------------------- bad input


BAD_OPTIONS = [
    (["--topic", "bad topic!"], "characters"),
    (["--topic", "T" * 128], "127"),
    (["--topic", "T", "--queue", "-1"], "negative"),
    (["--topic", "T", "--property", "novalue"], "key=value"),
    (["--topic", "T", "--property", "k=" + "v" * 40000], "32767"),
    (["--topic", "T", "--body", "x" * 5000, "--commitlog-file-size", "65536"], "maxMessageSize"),
    (["--topic", "T", "--delay-level", "-2"], "delay"),
    (["--topic", "T", "--transaction", "maybe"], "transaction"),
    (["--topic", "T", "--from", "x.jsonl"], "cannot be combined"),
]

BAD_JSON = [
    ('{"topic": "T", "color": "red"}', "unknown field"),
    ('{"topic": "a/b"}', "'/'"),
    ('{"topic": ".."}', "'..'"),
    ('{"topic": "T"', "not valid JSON"),
    ('{"topic": "T", "propertiesRaw": "a\\u0001b", "properties": {"a": "c"}}', "does not match"),
    ('{"topic": "T", "bodyLen": 5}', "no body"),
    ('{"topic": "T", "queueId": "1"}', "queueId"),
    ('{"topic": "T", "sysFlag": 128}', "inner-batch"),
    ('{"topic": "T", "bodyHex": "zz"}', "bodyHex"),
    ('{"topic": "T", "bornHost": {"ip": "1.2.3.4", "port": -1}}', "port"),
    ('{"batch": [{"topic": "T"}, {"topic": "U"}]}', "share"),
    ('{"batch": []}', "non-empty"),
]


def _one_error_line(output: str, code_word: str) -> None:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rmqstore: "), output
    assert code_word in lines[0], output


@pytest.mark.parametrize("args,word", BAD_OPTIONS)
def test_bad_options_leave_store_unchanged(store_copy, tmp_path, args, word):
    root = store_copy("4.9.3-clean")
    conf = tmp_path / "b.conf"
    conf.write_text("maxMessageSize=4096\n")
    before = tree_digest(root)
    r = run(root, "--config", conf, *args)
    assert r.exit_code == 3, r.output
    _one_error_line(r.output, word)
    assert tree_digest(root) == before


@pytest.mark.parametrize("line,word", BAD_JSON)
def test_bad_json_leaves_store_unchanged(store_copy, tmp_path, line, word):
    root = store_copy("5.3.3-clean")
    src = tmp_path / "in.jsonl"
    src.write_text(line + "\n")
    before = tree_digest(root)
    r = run(root, "--from", src)
    assert r.exit_code == 3, r.output
    _one_error_line(r.output, word)
    assert "line 1" in r.output
    assert tree_digest(root) == before


def test_failure_on_a_later_line_keeps_earlier_messages(store_copy, tmp_path):
    name = "4.9.3-clean"
    root = store_copy(name)
    src = tmp_path / "in.jsonl"
    src.write_text('{"topic": "T", "bodyText": "ok"}\n\n{"topic": "T", "what": 1}\n')
    r = run(root, "--from", src, "--quiet")
    assert r.exit_code == 3 and "line 3" in r.output and "unknown field" in r.output
    recs = records(root)
    assert len(recs) == len(broker_read(name)["clmsg"]) + 1 and recs[-1]["body"] == b"ok"
    assert not (root / "abort").exists()
    assert no_problems(root) == []


def test_locked_store_is_refused(store_copy):
    root = store_copy("4.9.3-clean")
    holder = subprocess.Popen([sys.executable, "-c",
                               "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
                               "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0); print('locked', flush=True); "
                               "time.sleep(60)", str(root / "lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = tree_digest(root)
        r = run(root, "--topic", "T", "--body", "x")
        assert r.exit_code == 4, r.output
        _one_error_line(r.output, "in use")
        assert tree_digest(root) == before
    finally:
        holder.kill()
        holder.wait()


def test_store_with_abort_file_is_refused(store_copy):
    root = store_copy("4.9.3-crash")
    before = tree_digest(root)
    t0 = time.time()
    r = run(root, "--topic", "T", "--body", "x")
    assert r.exit_code == 2, r.output
    _one_error_line(r.output, "abort")
    assert tree_digest(root) == before
    assert time.time() - t0 < 60


def test_dump_pipe_append_copies_a_store(tmp_path):
    """`dump commitlog OLD --json --body hex | append NEW --from -` (a store without batches)."""
    name = "5.3.3-v2topic"
    from tests.conftest import shared_store

    new = tmp_path / "copy"
    dump = subprocess.Popen([sys.executable, "-m", "rmqstore_cli", "dump", "commitlog", str(shared_store(name)),
                             "--json", "--body", "hex"], stdout=subprocess.PIPE)
    app_ = subprocess.run([sys.executable, "-m", "rmqstore_cli", "append", str(new), "--from", "-", "--quiet",
                           "--broker-version", "5", "--commitlog-file-size", "16384", "--cq-file-size", "600",
                           "--index-slots", "16", "--index-entries", "64"], stdin=dump.stdout, capture_output=True,
                          text=True)
    dump.stdout.close()
    assert dump.wait() == 0 and app_.returncode == 0, app_.stderr
    assert_same_store_files(shared_store(name), new)
