"""``append --from`` in batches (engine/log/replay.py, formats/replaykernel.py) writes what the broker wrote
and what one put per line writes, byte for byte; errors and the store they leave are those of one put per line.

References, none produced by the batch route itself:
- the broker's own files: its messages replayed (as ``dump commitlog --json`` lines, or its puts with
  base64 bodies) must give its commitlog (64 KiB segments: many BLANKs), consume queues and index;
- the plain route (``DumpReplay(batch=False)``: one ``MessageBuilder.from_json`` + ``Appender.put`` per
  line, the code every line took before batches): seeded random inputs (odd property characters,
  empty and large bodies, IPv6 hosts, transaction types, small segments) give the same files.
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app as cli
from rmqstore_cli.engine.config.storeconfig import StoreConfig
from rmqstore_cli.engine.derived.indexwriter import store_time_namer
from rmqstore_cli.engine.log.appender import Appender
from rmqstore_cli.engine.log.messages import InputError, MessageBuilder
from rmqstore_cli.engine.log.replay import DumpReplay
from tests.conftest import broker_puts, broker_read, shared_store
from tests.test_replay import assert_same_store_files, write_broker_conf

runner = CliRunner()


def small(version: int, **kw) -> StoreConfig:
    """Small consume queue and index files (the defaults pre-allocate hundreds of MB per store)."""
    return StoreConfig(version=version, **{"mappedFileSizeConsumeQueue": 6000, "maxHashSlotNum": 64,
                                           "maxIndexNum": 256, **kw})


def files(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            if n == "lock":
                continue
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def replay(root: Path, cfg: StoreConfig, data: bytes, *, batch: bool, keep_store_times: bool = False):
    """Feed ``data`` like ``append --from``; returns (the error message or None, lines taken by the batch route)."""
    app = Appender(str(root), cfg, index_namer=store_time_namer, keep_store_times=keep_store_times)
    r = DumpReplay(app, MessageBuilder(cfg), batch=batch)
    error = None
    try:
        for _ in r.feed_stream(io.BytesIO(data)):
            pass
    except InputError as e:
        error = str(e)
    finally:
        app.close()
    return error, r.batched


def assert_same(tmp_path: Path, cfg: StoreConfig, data: bytes, **kw) -> tuple[str | None, int]:
    """Batch and plain routes on the same input: same error, same files. Returns (error, lines batched)."""
    err_b, batched = replay(tmp_path / "batch", cfg, data, batch=True, **kw)
    err_p, plain_batched = replay(tmp_path / "plain", cfg, data, batch=False, **kw)
    assert plain_batched == 0
    assert err_b == err_p
    a, b = files(tmp_path / "batch"), files(tmp_path / "plain")
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k] == b[k], k
    return err_b, batched


# --- against the broker ------------------------------------------------------------------------


def _dump_lines(name: str, body: str) -> bytes:
    r = runner.invoke(cli, ["dump", "commitlog", str(shared_store(name)), "--json", "--body", body])
    assert r.exit_code == 0, r.output
    return r.stdout.encode("utf-8")


def _append_equals_broker(tmp_path, name: str, data: bytes) -> int:
    """``append --from`` of ``data`` into an empty store with the broker's settings of sample ``name`` gives the
    broker's commitlog, consume-queue, ext and index files; returns the broker version."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(data)
    conf, version = write_broker_conf(name, tmp_path / "broker.conf")
    dst = tmp_path / "copy"
    r = runner.invoke(cli, ["append", str(dst), "--from", str(src), "--config", str(conf), "--broker-version",
                            str(version), "--quiet"])
    assert r.exit_code == 0, r.output
    assert_same_store_files(shared_store(name), dst)
    return version


@pytest.mark.parametrize("body", ["base64", "hex"])
def test_dumped_store_appended_equals_broker(tmp_path, body):
    """`dump commitlog --json` of a broker store (no classic batches) appended into an empty store with the
    broker's settings: its commitlog (BLANKs at 16 KiB segment ends), consume queues and index files."""
    name = "5.3.3-v2topic"
    data = _dump_lines(name, body)
    version = _append_equals_broker(tmp_path, name, data)
    cfg = small(version, mappedFileSizeCommitLog=65536)
    _, batched = replay(tmp_path / "again", cfg, data, batch=True)
    assert batched == data.count(b"\n")  # every line took the batch route


def _puts_base64(name: str) -> bytes:
    """The broker's puts (classic batches kept), dump-style: compact, base64 bodies."""
    by_offset = {o["offset"]: o for o in broker_read(name)["clmsg"]}
    out = []
    for p in broker_puts(name):
        if p["type"] != "put":
            continue
        off, msgs = p["wroteOffset"], []
        for _ in range(p["msgNum"]):
            rec = by_offset[off]
            m = dict(rec["msg"])
            m["bodyBase64"] = base64.b64encode(bytes.fromhex(m.pop("bodyHex"))).decode()
            msgs.append(m)
            off += rec["size"]
        out.append(json.dumps({"batch": msgs} if len(msgs) > 1 else msgs[0], ensure_ascii=False,
                              separators=(",", ":")))
    return ("\n".join(out) + "\n").encode("utf-8")


@pytest.mark.parametrize("name", ["4.9.3-clean", "4.9.3-ext", "5.3.3-clean"])
def test_broker_puts_in_base64_equal_broker(tmp_path, name):
    """The broker's puts (64 KiB segments, ext, classic batches in between: those take the plain route at
    their place) give the broker's files byte for byte."""
    data = _puts_base64(name)
    _append_equals_broker(tmp_path, name, data)


# --- against the plain route on seeded inputs ---------------------------------------------------

ODD = ["é", "键", "😀", "\"", "\\", "/", "\t", "\n", " ", "\u2028", "\x7f", "\x00", "%", "=", "&", "ÄÖÜ"]


def _random_props(rng: random.Random) -> dict:
    props = {}
    for k in range(rng.randrange(0, 6)):
        key = rng.choice(["KEYS", "TAGS", "UNIQ_KEY", "WAIT", "a", "k" + rng.choice(ODD)]) + ("" if k else "")
        props[key] = "".join(rng.choice(ODD + ["x", "y", "1"]) for _ in range(rng.randrange(1, 12)))
    return props


def _message(rng: random.Random, i: int, ts: int, v6: bool) -> dict:
    props = _random_props(rng)
    raw = "".join(f"{k}\x01{v}\x02" for k, v in props.items())
    if rng.random() < 0.5 and raw:
        raw = raw[:-1]  # 4.x strings have no trailing separator
    size = rng.choice([0, 0, 1, 2, 3, 50, 1024, 5000])
    body = bytes(rng.randrange(256) for _ in range(size))
    host = {"ip": "::1", "ipHex": "2001" + "0" * 27 + "1", "port": 1} if v6 else \
        {"ip": "10.0.0.1", "ipHex": "0a000001", "port": 10911}
    m = {"topic": rng.choice(["T", "TopicB", "t%x|y", "T_" + "z" * rng.randrange(1, 120)]),
         "queueId": rng.randrange(4), "flag": rng.choice([0, 7, -1]), "queueOffset": 12345,
         "sysFlag": rng.choice([0, 0, 0, 4, 8, 12, 1]), "bornTimestamp": ts - rng.randrange(1000),
         "bornHost": {"ip": "10.0.0.7", "ipHex": "0A000007", "port": 51234}, "storeTimestamp": ts,
         "storeHost": host, "reconsumeTimes": rng.randrange(3), "preparedTransactionOffset": rng.choice([0, 99]),
         "bodyLen": size, "properties": props, "propertiesRaw": raw}
    form = rng.random()
    if form < 0.6:
        m["bodyBase64"] = base64.b64encode(body).decode()
    elif form < 0.9:
        m["bodyHex"] = body.hex()
    else:
        m["bodyText"] = body.decode("latin-1")
    if rng.random() < 0.3:  # another field order
        m = dict(rng.sample(list(m.items()), len(m)))
    return m


def _lines(seed: int, n: int, v6_share: float = 0.2) -> bytes:
    rng = random.Random(seed)
    ts = 1_700_000_000_000
    out = []
    for i in range(n):
        ts += rng.choice([0, 0, 1, 5])
        m = _message(rng, i, ts, rng.random() < v6_share)
        sep = (",", ":") if rng.random() < 0.8 else (", ", ": ")
        out.append(json.dumps(m, ensure_ascii=rng.random() < 0.5, separators=sep))
    return ("\n".join(out) + "\n").encode("utf-8")


@pytest.mark.parametrize("version", [4, 5])
def test_seeded_inputs_equal_plain_route(tmp_path, version):
    seed = random.randrange(1 << 30)
    print("seed", seed)
    cfg = small(version, mappedFileSizeCommitLog=32768, mappedFileSizeConsumeQueue=600)
    data = _lines(seed, 1500)
    err, batched = assert_same(tmp_path, cfg, data)
    assert err is None
    assert batched > 1000, batched  # the batch route took most lines (the rest: JSON escapes it leaves to the plain one)
    cl = files(tmp_path / "batch")
    assert sum(k.startswith("commitlog") for k in cl) > 10  # many segment ends (BLANK) crossed inside blocks


def test_blocks_cross_segments_and_blocks_cross_lines(tmp_path, monkeypatch):
    """Tiny input blocks (a line split over several reads) and a segment end inside almost every batch."""
    from rmqstore_cli.engine.log import replay as replay_mod

    monkeypatch.setattr(replay_mod, "BLOCK_BYTES", 3000)
    seed = random.randrange(1 << 30)
    print("seed", seed)
    cfg = small(5, mappedFileSizeCommitLog=8192)
    err, batched = assert_same(tmp_path, cfg, _lines(seed, 400, 0.5))
    assert err is None and batched > 250


def test_largest_message_and_properties(tmp_path):
    """Sizes at the limits: a body of maxMessageSize on 5.x, a 32767-byte property string, a record that
    exactly fills what a segment leaves; one byte more is refused (by the plain route's message)."""
    cfg = small(5, mappedFileSizeCommitLog=1 << 20, maxMessageSize=300_000)
    base = {"topic": "T", "bornTimestamp": 1, "storeTimestamp": 2, "bornHost": {"ip": "a", "ipHex": "01020304", "port": 1},
            "storeHost": {"ip": "b", "ipHex": "05060708", "port": 2}}
    big = dict(base, bodyBase64=base64.b64encode(b"\xab" * 300_000).decode(), propertiesRaw="")
    raw = "K\x01" + "v" * (32767 - 3) + "\x02"
    props = dict(base, bodyBase64="", propertiesRaw=raw, properties={"K": "v" * (32767 - 3)})
    data = "\n".join(json.dumps(m) for m in [big, props, big, props]).encode() + b"\n"
    err, batched = assert_same(tmp_path / "ok", cfg, data)
    assert err is None and batched == 4
    too_long = dict(props, propertiesRaw=raw + "x", properties={"K": "v" * (32767 - 3)})
    too_big = dict(big, bodyBase64=base64.b64encode(b"\xab" * 300_001).decode())
    for bad, word in ((too_long, "properties are 32768 bytes"), (too_big, "maxMessageSize")):
        data = "\n".join(json.dumps(m) for m in [big, bad, big]).encode() + b"\n"
        err, batched = assert_same(tmp_path / word.split()[0], cfg, data)
        assert err.startswith("line 2: ") and word in err, err
        assert batched == 1


BAD_VALUES = [
    ("queueId", -1, "queueId -1 is negative"),
    ("queueId", 2**31, "queueId 2147483648 is out of range"),
    ("flag", "1", "flag must be an integer"),
    ("sysFlag", 0x80, "inner-batch records"),
    ("storeHost", {"ip": "x", "ipHex": "0a0b0c", "port": 1}, "storeHost.ipHex must be 4 or 16 bytes"),
    ("storeHost", {"ip": "x", "ipHex": "0a0b0c0d", "port": -1}, "is not a port number"),
    ("topic", "a/b", "contains '/'"),
    ("topic", "", "topic is missing or empty"),
    ("propertiesRaw", "A\x01b\x02", "propertiesRaw does not match properties"),
    ("bodyBase64", "abc", "bodyBase64 is not valid"),
    ("bodyHex", "00", "give one body field, not bodyHex, bodyBase64"),
    ("storeTimestamp", 1_600_000_000_000, "older than the newest store time"),
    ("extra", 1, "unknown field(s) extra"),
]


@pytest.mark.parametrize("field,value,message", BAD_VALUES, ids=[m for _, _, m in BAD_VALUES])
def test_bad_record_in_the_middle_of_a_batch(tmp_path, field, value, message):
    """A bad line in the middle of a block: the plain route's error for that line, and the store holds exactly
    the lines before it (decided: the lines before it are written, as one put per line always did; nothing of
    the bad line or after it). The plain route is the reference for both."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    lines = _lines(seed, 300, 0.0).decode().split("\n")[:-1]
    bad = json.loads(lines[150])
    if field.startswith("body"):
        for k in ("bodyBase64", "bodyHex", "bodyText"):
            bad.pop(k, None)
        if field == "bodyHex":
            bad["bodyBase64"] = "AA=="
    bad[field] = value
    lines[150] = json.dumps(bad)
    cfg = small(5, mappedFileSizeCommitLog=65536)
    err, batched = assert_same(tmp_path, cfg, ("\n".join(lines) + "\n").encode())
    assert err is not None and err.startswith("line 151: ") and message in err, err
    assert 100 < batched <= 150
    # exactly the first 150 lines: the same store as those lines alone
    err, _ = replay(tmp_path / "prefix", cfg, ("\n".join(lines[:150]) + "\n").encode(), batch=True)
    assert err is None
    a, b = files(tmp_path / "batch"), files(tmp_path / "prefix")
    assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a)


def test_invalid_json_utf8_and_newlines(tmp_path):
    """Line numbers count as the text-mode reader counted them (\\r, \\r\\n and \\n end lines); a line that is
    not UTF-8 is refused by number, the lines before it kept."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    lines = _lines(seed, 40, 0.0).splitlines()
    cfg = small(4, mappedFileSizeCommitLog=65536)
    crlf = b"\r\n".join(lines[:20]) + b"\r\n" + b"\r".join(lines[20:30]) + b"\r\n   \n\n" + b"\n".join(lines[30:]) + b"\n"
    err, batched = assert_same(tmp_path / "crlf", cfg, crlf)
    assert err is None and batched >= 20
    for tail, message in ((b"{not json", "line 33: not valid JSON (Expecting property name"),
                          (b'{"topic":"\xff"}', "line 33: not valid UTF-8 (byte 0xff at column 11)")):
        data = crlf.replace(lines[30] + b"\n", tail + b"\n", 1)
        text_lines = io.TextIOWrapper(io.BytesIO(data), encoding="latin-1").readlines()
        assert text_lines[32].rstrip("\n").encode("latin-1") == tail  # line 33 as a text-mode reader numbers it
        err, _ = assert_same(tmp_path / message[9:20].replace(" ", "_"), cfg, data)
        assert err is not None and err.startswith(message), err


def test_cli_json_results_and_error(tmp_path):
    """Through the command: --json lists every record with the values the plain route returns; a bad line
    gives one line and exit 3."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    data = _lines(seed, 200)
    src = tmp_path / "in.jsonl"
    src.write_bytes(data)
    r = runner.invoke(cli, ["append", str(tmp_path / "cli"), "--from", str(src), "--json", "--broker-version", "5",
                            "--cq-file-size", "6000", "--index-slots", "64", "--index-entries", "256",
                            "--commitlog-file-size", str(4 << 20)])
    assert r.exit_code == 0, r.output
    got = [json.loads(line) for line in r.stdout.splitlines()]
    cfg = small(5, mappedFileSizeCommitLog=4 << 20)  # not the default 1 GiB segment (reserved on disk)
    app = Appender(str(tmp_path / "plain"), cfg)
    try:
        want = [res.as_json() for results in DumpReplay(app, MessageBuilder(cfg), batch=False).feed_stream(
            io.BytesIO(data)) for res in results]
    finally:
        app.close()
    assert len(got) == 200 and got == want
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(data + b'{"topic": 1}\n')
    r = runner.invoke(cli, ["append", str(tmp_path / "b2"), "--from", str(bad), "--quiet", "--index-slots", "64",
                            "--index-entries", "256"])
    assert r.exit_code == 3
    assert "line 201: topic is missing or empty" in r.output


def test_input_read_in_blocks(tmp_path):
    """Memory stays flat: the input is read in blocks of BLOCK_BYTES, never as a whole."""
    from rmqstore_cli.engine.log import replay as replay_mod

    reads = []

    class Stream(io.BytesIO):
        def read(self, n=-1):
            reads.append(n)
            return super().read(n)

        def readinto(self, b):
            reads.append(len(b))
            return super().readinto(b)

    data = _lines(1, 50)
    cfg = small(5, mappedFileSizeCommitLog=256 << 10)  # not the default 1 GiB segment (reserved on disk)
    app = Appender(str(tmp_path / "s"), cfg)
    try:
        for _ in DumpReplay(app, MessageBuilder(cfg)).feed_stream(Stream(data)):
            pass
    finally:
        app.close()
    assert reads and all(0 < n <= replay_mod.BLOCK_BYTES for n in reads)


def test_kernel_layout_matches_segment_rule():
    """The compiled layout places records like Appender._put: TOTALSIZE + 8 must fit, else BLANK and next file."""
    from rmqstore_cli.formats import replayencode

    rng = np.random.default_rng(3)
    total = rng.integers(91, 500, 300).astype(np.int64)
    phy, blank = np.empty(300, np.int64), np.empty(300, np.int64)
    end = replayencode.layout(total, 100, 1024, phy, blank)
    offset, expect_phy, expect_blank = 100, [], []
    for t in total.tolist():
        pos = offset % 1024
        b = -1
        if t + 8 > 1024 - pos:
            b, offset = offset, offset + 1024 - pos
        expect_phy.append(offset)
        expect_blank.append(b)
        offset += t
    assert phy.tolist() == expect_phy and blank.tolist() == expect_blank and end == offset


MUTATIONS = [b'"', b"\\", b"{", b"}", b",", b":", b"0", b"9", b"-", b"e", b".", b"u", b"x", b" ", b"\t", b"=", b"A",
             b"null", b"\\u0001", b"\\ud800", b"\\u00e9", "é".encode(), b"1234567890123456789"]


def test_kernel_records_equal_encode_message_on_mutated_lines():
    """Mutated dump lines (bytes replaced, removed, JSON tokens inserted): every line the compiled parser takes
    is one the plain route takes too (or refuses only by the topic/size checks the batch route repeats), and
    the record it encodes equals ``encode_message`` of the plain route's message, byte for byte."""
    from rmqstore_cli.engine.log.linejson import line_messages
    from rmqstore_cli.formats import replayencode, replaykernel
    from rmqstore_cli.formats.message import encode_message

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    lines = _lines(seed, 150, 0.3).split(b"\n")[:-1]
    cases = []
    for _ in range(3000):
        line = bytearray(rng.choice(lines))
        for _ in range(rng.choice([0, 1, 1, 2])):
            at = rng.randrange(len(line))
            op = rng.random()
            if op < 0.4:
                line[at:at + 1] = rng.choice(MUTATIONS)
            elif op < 0.7:
                del line[at]
            else:
                line[at:at] = rng.choice(MUTATIONS)
        try:
            bytes(line).decode("utf-8")
        except UnicodeDecodeError:
            continue  # a block that is not UTF-8 never reaches the parser
        if b"\n" not in line and b"\r" not in line:
            cases.append(bytes(line))
    taken = 0
    for version in (4, 5):
        cfg = StoreConfig(version=version)
        messages = line_messages(MessageBuilder(cfg))
        data = b"\n".join(cases) + b"\n"
        u8 = np.frombuffer(data, np.uint8)
        ends = np.flatnonzero(u8 == 10)
        starts = np.concatenate(([0], ends[:-1] + 1))
        cols, status, side = replaykernel.parse(u8, starts, ends, version >= 5)
        for i in np.flatnonzero(status == replaykernel.OK).tolist():
            text = cases[i].decode("utf-8")
            try:
                (m,) = messages(text)
            except InputError as e:
                assert str(e).startswith("topic") or "bytes" in str(e), (text, str(e))
                continue
            except json.JSONDecodeError as e:
                raise AssertionError(f"the parser took a line json refuses: {text!r}: {e}")
            taken += 1
            want = encode_message(topic=m.topic_b, queue_id=m.queue_id, flag=m.flag, queue_offset=7,
                                  physical_offset=1234, sysflag=m.sysflag, born_timestamp=m.born_timestamp,
                                  born_host=m.born_host, store_timestamp=m.store_timestamp, store_host=m.store_host,
                                  reconsume_times=m.reconsume_times, prepared_offset=m.prepared_offset, body=m.body,
                                  properties=m.props_b, magic=m.magic)
            out = np.zeros(len(want), np.uint8)
            one = np.ones(1, np.int64)
            replayencode.encode_records(u8, side, cols, np.array([i], np.int64), one * m.magic, one * m.total_size,
                                        one * 7, one * 1234, out, np.zeros(1, np.int64))
            assert m.total_size == len(want) and bytes(out) == want, text
    assert taken > 1000, taken
