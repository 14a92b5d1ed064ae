"""formats.jsonkernel (the compiled JSON Lines writer of ``dump commitlog --json``) against the
construct declaration of a record (formats.records.MESSAGE), record by record.

The expected line is built here from ``MESSAGE.parse`` with Python's json module, the Java
property rule (FORMAT.md §3.2: split at ``\\x02``, each entry at its first ``\\x01``, key and value
non-empty, a later entry overwrites) and the broker's msgId/host texts — not from
formats.message, which the jsonl tests already use. The kernel is called directly, so a record
it hands to the reference decoder is seen: on broker-written records none is, and in the fuzzed
ones only the documented cases (malformed UTF-8 in a property string with several entries, more
than MAX_ENTRIES entries) are.
"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from rmqstore_cli.formats import fast, jsonkernel
from rmqstore_cli.formats.jsonl import kernel_lines
from rmqstore_cli.formats.message import BODY_MODES, encode_message
from rmqstore_cli.formats.records import MAGIC_V1, MAGIC_V2, MESSAGE, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6
from rmqstore_cli.engine.store import Store

from .conftest import STORE_NAMES, shared_store


def _java_props(text: str) -> dict:
    out: dict = {}
    for entry in text.split("\x02"):
        key, sep, value = entry.partition("\x01")
        if sep and key and value:
            out[key] = value  # dict: a repeated key keeps its first place, takes the last value
    return out


def _host(h) -> tuple[dict, bytes]:
    ip = bytes(h.ip)
    if len(ip) == 4:
        text = ".".join(str(b) for b in ip)
    else:
        text = ":".join("%x" % int.from_bytes(ip[k:k + 2], "big") for k in range(0, 16, 2))
    return {"ip": text, "ipHex": ip.hex(), "port": h.port}, ip + h.port.to_bytes(4, "big", signed=True)


def declared_line(buf, pos: int, base: int, body: str) -> bytes:
    m = MESSAGE.parse(bytes(buf[pos:]))
    born, _ = _host(m.bornHost)
    store, store_raw = _host(m.storeHost)
    props = m.properties.decode("utf-8", "replace")
    obj = {
        "topic": m.topic.decode("utf-8", "replace"), "queueId": m.queueId, "flag": m.flag,
        "queueOffset": m.queueOffset, "commitLogOffset": m.physicalOffset, "storeSize": m.totalSize,
        "bodyCRC": m.bodyCRC, "sysFlag": m.sysFlag, "bornTimestamp": m.bornTimestamp, "bornHost": born,
        "storeTimestamp": m.storeTimestamp, "storeHost": store, "reconsumeTimes": m.reconsumeTimes,
        "preparedTransactionOffset": m.preparedTransactionOffset, "bodyLen": m.bodyLength,
        "properties": _java_props(props), "propertiesRaw": props,
        "msgId": (store_raw + m.physicalOffset.to_bytes(8, "big", signed=True)).hex().upper(),
        "magicVersion": 2 if m.magicCode == MAGIC_V2 else 1, "offset": base + pos,
    }
    if body == "hex":
        obj["bodyHex"] = m.body.hex()
    elif body == "base64":
        import base64

        obj["bodyBase64"] = base64.b64encode(m.body).decode()
    elif body == "text":
        obj["bodyText"] = m.body.decode("utf-8", "replace")
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def kernel_output(buf, h, base: int, body: str) -> tuple[list[bytes], np.ndarray]:
    out, size, ends, fallback = kernel_lines(buf, h, base, body)
    starts = np.concatenate(([0], ends[:-1]))
    data = out[:size].tobytes()
    return [data[int(a):int(b)] for a, b in zip(starts, ends)], fallback


@pytest.mark.parametrize("name", STORE_NAMES)
def test_every_broker_record_equals_the_declared_decode(name):
    with Store.open(str(shared_store(name))) as s:
        n = 0
        for chunk in s.commitlog.scan(check_crc=False):
            h, base = chunk.headers, chunk.segment.start
            offs = h.offsets.tolist()
            for body in BODY_MODES:
                lines, fallback = kernel_output(chunk.buf, h, base, body)
                assert not fallback.any(), (name, body)  # the kernel itself renders every broker record
                for off, line in zip(offs, lines):
                    assert line == declared_line(chunk.buf, off, base, body), (name, body, base + off)
            n += len(offs)
        assert n > 0


def _record(rng: random.Random, props: bytes, topic: bytes, body: bytes) -> bytes:
    v6b, v6s = rng.random() < 0.2, rng.random() < 0.2
    host = lambda v6: (bytes(rng.randrange(256) for _ in range(16 if v6 else 4)),  # noqa: E731
                       rng.choice([0, 1, 10911, 2**31 - 1, -1, -(2**31)]))
    big = lambda bits: rng.choice([0, 1, -1, 2**(bits - 1) - 1, -(2**(bits - 1)), rng.randrange(-(2**(bits - 1)), 2**(bits - 1))])  # noqa: E731
    return encode_message(
        topic=topic, queue_id=big(32), flag=big(32), queue_offset=big(64), physical_offset=big(64),
        sysflag=rng.randrange(0, 0x100) & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
        | (SYSFLAG_BORNHOST_V6 if v6b else 0) | (SYSFLAG_STOREHOST_V6 if v6s else 0),
        born_timestamp=big(64), born_host=host(v6b), store_timestamp=big(64), store_host=host(v6s),
        reconsume_times=big(32), prepared_offset=big(64), body=body, properties=props,
        magic=MAGIC_V2 if len(topic) > 127 or rng.random() < 0.3 else MAGIC_V1)


# bytes that matter: separators, JSON escapes, controls, DEL, UTF-8 leads/continuations (valid and not)
ODD = [b"\x01", b"\x02", b"\x02", b"\x01", b"\\", b'"', b"\n", b"\r", b"\t", b"\x08", b"\x0c", b"\x00", b"\x1f",
       b"\x7f", b"a", b"k", b"v", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xff", b"\xc3", b"\xe2\x82",
       b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80", "ключ".encode(), b"TAGS", b"KEYS"]


def _text(rng: random.Random, n: int) -> bytes:
    return b"".join(rng.choice(ODD) for _ in range(rng.randrange(n + 1)))


def _expected_fallback(props: bytes) -> bool:
    """The reference path takes a record with more entries than the kernel renders, or with malformed UTF-8
    in a key or a kept value beside another entry (two different byte strings may decode to one key).
    Malformed bytes outside every entry (pieces without a name and a value) are dropped by both."""
    entries = [e.partition(b"\x01") for e in props.split(b"\x02")]
    entries = [(k, v) for k, s, v in entries if s and k and v]
    kept: dict[bytes, bytes] = {}
    for k, v in entries:
        kept[k] = v
    def malformed(b: bytes) -> bool:
        return b.decode("utf-8", "replace").encode() != b
    bad = any(malformed(k) or malformed(v) for k, v in kept.items())
    return (bad and len(entries) > 1) or len(entries) > jsonkernel.MAX_ENTRIES


def test_fuzzed_records_equal_the_declared_decode():
    seed = int(os.environ.get("RMQSTORE_FUZZ_SEED", random.randrange(1 << 30)))
    cases = int(os.environ.get("RMQSTORE_FUZZ_CASES", 400))
    print(f"seed {seed} (RMQSTORE_FUZZ_SEED={seed} reproduces)")
    rng = random.Random(seed)
    records, props_list = [], []
    for i in range(cases):
        props = _text(rng, 30)
        if i % 50 == 0:  # more entries than the kernel renders, and many duplicate keys
            props = b"\x02".join(b"k%d\x01v%d" % (rng.randrange(jsonkernel.MAX_ENTRIES + 50), j)
                                 for j in range(rng.choice([20, jsonkernel.MAX_ENTRIES + 1])))
        topic = b"" if i % 37 == 0 else _text(rng, 40 if i % 7 else 200)
        body = b"" if i % 5 == 0 else _text(rng, 60)
        records.append(_record(rng, props, topic, body))
        props_list.append(props)
    buf = b"".join(records)
    w = fast.walk(buf, 0, len(buf))
    h = fast.decode_headers(buf, w.offsets)
    assert len(h) == cases
    base = rng.randrange(1 << 40)
    for body in BODY_MODES:
        lines, fallback = kernel_output(buf, h, base, body)
        assert fallback.tolist() == [_expected_fallback(p) for p in props_list], seed
        for off, line, fb in zip(h.offsets.tolist(), lines, fallback.tolist()):
            assert line == (b"" if fb else declared_line(buf, off, base, body)), (seed, body, off)


# property strings of plain bytes only (printable ASCII, DEL) and separators: the kernel's one-pass path, and
# every way out of it (empty keys or values, a second \x01, empty entries, a trailing \x02, repeated keys)
PLAIN = [b"\x01", b"\x02", b"\x01", b"\x02", b"a", b"k", b"v", b"TAGS", b"KEYS", b"\x7f", b" ", b"~", b"0A"]


def test_fuzzed_plain_property_strings_equal_the_declared_decode():
    seed = int(os.environ.get("RMQSTORE_FUZZ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (RMQSTORE_FUZZ_SEED={seed} reproduces)")
    rng = random.Random(seed)
    props_list = [b"".join(rng.choice(PLAIN) for _ in range(rng.randrange(40))) for _ in range(300)]
    props_list += [b"\x02".join(b"%s\x01%s" % (rng.choice([b"k", b"a", b"KEYS", b"TAGS"]), rng.choice([b"v", b"x y", b"1"]))
                                for _ in range(rng.randrange(1, 8))) + rng.choice([b"", b"\x02"]) for _ in range(300)]
    buf = b"".join(_record(rng, p, b"T", b"body") for p in props_list)
    h = fast.decode_headers(buf, fast.walk(buf, 0, len(buf)).offsets)
    for body in ("none", "text"):
        lines, fallback = kernel_output(buf, h, 0, body)
        assert not fallback.any(), seed
        for off, line in zip(h.offsets.tolist(), lines):
            assert line == declared_line(buf, off, 0, body), (seed, body, off)
    # each record alone in its buffer: its property string ends the buffer, so the kernel reads its last
    # bytes one by one instead of 32 at a time (and copies them the same way)
    for p in props_list[::5]:
        one = _record(rng, p, b"T", b"")
        h = fast.decode_headers(one, fast.walk(one, 0, len(one)).offsets)
        lines, fallback = kernel_output(one, h, 0, "none")
        assert not fallback.any() and lines == [declared_line(one, 0, 0, "none")], (seed, p)


def test_replacement_of_malformed_utf8_is_cpythons():
    """One U+FFFD per maximal invalid subpart, at every position, for every lead byte."""
    seed = int(os.environ.get("RMQSTORE_FUZZ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    samples = [bytes([a, b, c]) for a in range(0x80, 0x100, 3) for b in (0x7f, 0x80, 0x9f, 0xa0, 0xbf, 0xc0)
               for c in (0x80, 0xbf, 0x41)]
    samples += [bytes(rng.randrange(256) for _ in range(rng.randrange(12))) for _ in range(2000)]
    records = [_record(rng, b"", s, s) for s in samples]
    buf = b"".join(records)
    h = fast.decode_headers(buf, fast.walk(buf, 0, len(buf)).offsets)
    lines, fallback = kernel_output(buf, h, 0, "text")
    assert not fallback.any()
    for s, line in zip(samples, lines):
        obj = json.loads(line)
        assert obj["topic"] == s.decode("utf-8", "replace") and obj["bodyText"] == obj["topic"], (seed, s)


def test_worst_case_line_fits_the_buffer_bound():
    """The kernel writes without checking its buffer's end: every line must fit record_capacity.
    Worst case besides strings: two IPv6 hosts, the longest numbers; strings of bytes that each
    become six (controls) or three (U+FFFD) bytes."""
    worst = dict(topic=b"\x01" * 100, queue_id=-(2**31), flag=-(2**31), queue_offset=-(2**63), physical_offset=-(2**63),
                 sysflag=-(2**31) | SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6, born_timestamp=-(2**63),
                 born_host=(bytes([0xAB] * 16), -(2**31)), store_timestamp=-(2**63),
                 store_host=(bytes([0xCD] * 16), -(2**31)), reconsume_times=-(2**31), prepared_offset=-(2**63),
                 magic=MAGIC_V2)
    records = [encode_message(body=b, properties=p, **worst)
               for b, p in [(b"", b""), (b"\x00" * 50, b"\x1f\x01\x1e"), (b"\xff" * 50, b"\x01\x02" * 30),
                            (b"\x00", b"k\x01" + b"\x00" * 40), (bytes(range(256)), b"\xff\x01\xfe\x02" * 9)]]
    buf = b"".join(records)
    h = fast.decode_headers(buf, fast.walk(buf, 0, len(buf)).offsets)
    for body in BODY_MODES:
        mode = {"none": jsonkernel.BODY_NONE, "hex": jsonkernel.BODY_HEX, "base64": jsonkernel.BODY_BASE64,
                "text": jsonkernel.BODY_TEXT}[body]
        caps = jsonkernel.record_capacity(h, mode)
        lines, fallback = kernel_output(buf, h, 1 << 62, body)
        for off, line, fb, cap in zip(h.offsets.tolist(), lines, fallback.tolist(), caps.tolist()):
            assert len(line) <= cap, (body, off, len(line), cap)
            assert fb or line == declared_line(buf, off, 1 << 62, body)
        assert max(map(len, lines)) > 700  # the case the old fixed bound of 700 bytes missed


def test_large_bodies_come_in_bounded_blocks(monkeypatch):
    """Records whose text would exceed BLOCK_BYTES are encoded in several kernel calls, same text."""
    from rmqstore_cli.formats import jsonl

    rng = random.Random(7)
    records = [encode_message(topic=b"T", queue_id=0, flag=0, queue_offset=i, physical_offset=i, sysflag=0,
                              born_timestamp=1, born_host=(b"\x01\x02\x03\x04", 5), store_timestamp=2,
                              store_host=(b"\x01\x02\x03\x04", 6), reconsume_times=0, prepared_offset=0,
                              body=bytes(rng.randrange(256) for _ in range(rng.randrange(3000))), properties=b"a\x01b",
                              magic=MAGIC_V1) for i in range(60)]
    buf = b"".join(records)
    h = fast.decode_headers(buf, fast.walk(buf, 0, len(buf)).offsets)
    want = b"".join(declared_line(buf, off, 0, "text") for off in h.offsets.tolist())
    monkeypatch.setattr(jsonl, "BLOCK_BYTES", 20_000)
    pieces = list(jsonl.encode_blocks(buf, h, 0, "text"))
    assert len(pieces) > 5 and sum(k for _, k in pieces) == 60
    assert b"".join(t for t, _ in pieces) == want
    assert jsonl.encode_records(buf, h, 0, "text", np.arange(3, 50)) == \
        b"".join(declared_line(buf, off, 0, "text") for off in h.offsets.tolist()[3:50])


def test_records_json_in_bounded_pieces_same_text_and_progress(monkeypatch):
    from rmqstore_cli.formats import jsonl

    with Store.open(str(shared_store("5.3.3-clean"))) as s:
        whole = list(s.commitlog.records_json(body="hex"))
        monkeypatch.setattr(jsonl, "BLOCK_BYTES", 50_000)
        split = list(s.commitlog.records_json(body="hex"))
    assert len(split) > len(whole)
    for i in (0, 1, 2):  # text, records, walked bytes: the same totals
        assert sum_or_join([p[i] for p in split]) == sum_or_join([p[i] for p in whole])


def sum_or_join(values):
    return b"".join(values) if isinstance(values[0], bytes) else sum(values)
