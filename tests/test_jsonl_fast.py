"""formats.jsonl (the JSON Lines writer behind ``dump commitlog --json``) gives the
same bytes as the reference: json_line(render_body(decode_message(...))) with ``offset``.

Checked on every record of every broker-written store in each --body mode, on records built
to hit every fallback (odd property strings, malformed UTF-8, control characters, DEL,
backslashes, duplicate keys, v2 and long topics, IPv6 hosts, extreme numbers), on random
property strings, and through the CLI with its filters.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore_cli.commands.output import json_line
from rmqstore_cli.formats import fast
from rmqstore_cli.formats.jsonl import encode_records
from rmqstore_cli.formats.message import BODY_MODES, decode_message, encode_message, render_body
from rmqstore_cli.formats.records import MAGIC_V1, MAGIC_V2, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6
from rmqstore_cli.engine.log.commitlog import ScanResult
from rmqstore_cli.engine.store import Store

from .conftest import REPO, STORE_NAMES, shared_store


def reference_lines(buf, offsets, base: int, body: str) -> bytes:
    out = []
    for off in offsets:
        m = decode_message(buf, off, with_body=body != "none")
        m["offset"] = base + off
        out.append(json_line(render_body(m, body)) + "\n")
    return "".join(out).encode("utf-8")


def encoded(buf, base: int = 0, body: str = "none"):
    w = fast.walk(buf, 0, len(buf))
    h = fast.decode_headers(buf, w.offsets)
    assert (h.reason == fast.R_OK).all()
    return encode_records(buf, h, base, body), w.offsets.tolist()


@pytest.mark.parametrize("name", STORE_NAMES)
def test_every_record_of_every_store_every_body_mode(name):
    with Store.open(str(shared_store(name))) as s:
        for body in BODY_MODES:
            n = 0
            for chunk in s.commitlog.scan(check_crc=False):
                base = chunk.segment.start
                offs = chunk.headers.offsets.tolist()
                got = encode_records(chunk.buf, chunk.headers, base, body)
                assert got == reference_lines(chunk.buf, offs, base, body), (name, body, base)
                n += len(offs)
            assert n >= (60 if name == "5.3.3-v2topic" else 2000)


def test_records_json_matches_records_with_selection():
    """Same selection as CommitLog.records + the dump filters, same stop, block by block."""
    with Store.open(str(shared_store("5.3.3-clean"))) as s:
        cl = s.commitlog
        all_recs = list(cl.records(with_body=False))
        mid = all_recs[len(all_recs) // 3]["offset"]
        late = all_recs[2 * len(all_recs) // 3]["offset"]
        topic = all_recs[5]["topic"]
        for kw in ({}, {"start": mid}, {"end": late}, {"start": mid + 1, "end": late + 1}, {"queue": 1},
                   {"topic": topic}, {"topic": topic, "queue": 2, "limit": 7}, {"limit": 1}, {"limit": 0},
                   {"topic": "no-such-topic"}):
            ref_res, new_res = ScanResult(), ScanResult()
            recs = cl.records(start=kw.get("start"), end=kw.get("end"), with_body=False, result=ref_res)
            recs = [m for m in recs if ("topic" not in kw or m["topic"] == kw["topic"])
                    and ("queue" not in kw or m["queueId"] == kw["queue"])]
            if "limit" in kw:
                recs = recs[: kw["limit"]]
            want = "".join(json_line(m) + "\n" for m in recs).encode()
            blocks = list(cl.records_json(result=new_res, **kw))
            assert b"".join(b for b, _, _ in blocks) == want, kw
            assert sum(k for _, k, _ in blocks) == len(recs)
            if "limit" not in kw and "end" not in kw:
                assert (new_res.stop.offset, new_res.stop.kind) == (ref_res.stop.offset, ref_res.stop.kind)


HOST_A = (bytes([10, 0, 0, 7]), 51234)
HOST_B = (bytes([192, 168, 1, 200]), 10911)
HOST_6 = (bytes.fromhex("20010db8000000000000000000000001"), 9876)
HOST_NEG = (bytes([255, 255, 255, 255]), -1)


def record(props: bytes, *, topic: bytes = b"T", body: bytes = b"x", v2: bool = False, born=HOST_A, store=HOST_B,
           queue_id=0, queue_offset=0, phy=0, born_ts=1700000000000, store_ts=1700000000001, flag=0, reconsume=0,
           prepared=0, sysflag=0) -> bytes:
    if len(born[0]) == 16:
        sysflag |= SYSFLAG_BORNHOST_V6
    if len(store[0]) == 16:
        sysflag |= SYSFLAG_STOREHOST_V6
    return encode_message(topic=topic, queue_id=queue_id, flag=flag, queue_offset=queue_offset, physical_offset=phy,
                          sysflag=sysflag, born_timestamp=born_ts, born_host=born, store_timestamp=store_ts,
                          store_host=store, reconsume_times=reconsume, prepared_offset=prepared, body=body,
                          properties=props, magic=MAGIC_V2 if v2 else MAGIC_V1)


ODD_PROPERTIES = [
    b"", b"\x02", b"\x01", b"\x01\x02", b"a\x01", b"\x01a", b"ab", b"a\x01b", b"a\x01b\x02", b"a\x01b\x02\x02",
    b"a\x01b\x02\x02c\x01d", b"a\x01b\x01c", b"a\x01\x01b", b"a\x01b\x02a\x01c", b"a\x01b\x02c\x01d\x02a\x01e\x02",
    b"a\x01b\x02c", b"a\x01b\x02cc", b"a\x01b\\c\x01d", b"k\x01v\\u0002w", b"k\x01v\\",
    b"KEY\x01v\\u0001\x02K2\x01w", b"a\\\x01b", b"q\"uote\x01\"v\"", b"d\x7fel\x01x", b"tab\t\x01new\nline\r",
    b"nul\x00\x01v\x00", b"\x1f\x01\x1e", "clé\x01välue\x02ключ\x01值".encode(), b"bad\xff\xfe\x01v\xc3",
    b"trunc\x01\xe2\x82", b"\xed\xa0\x80\x01lone", b"KEYS\x01k1 k2\x02UNIQ_KEY\x010A000007\x02TAGS\x01\x02",
    b"__CRC32#\x010000001234\x02", b"long" * 300 + b"\x01" + b"v" * 2000,
    # keys with equal length and equal first and last 8 bytes (fingerprint collision)
    b"ABCDEFGH1IJKLMNOP\x01a\x02ABCDEFGH2IJKLMNOP\x01b",
    b"\x02".join(b"k%d\x01v%d" % (i, i) for i in range(40)),
    b"\x02".join(b"k%d\x01v%d" % (i % 20, i) for i in range(40)),
]


def odd_records(props_list=ODD_PROPERTIES) -> bytes:
    recs = []
    topics = [b"T", b"%s%d", "t\u00e9pic".encode(), b"t\xffbad", b"a" * 127, b"q\"t\\", b"c\x01t\x02"]
    bodies = [b"", b"x", bytes(range(256)), "h\u00e9llo\n\x00\x01".encode(), b"\xc3(\xff", b"\x7f" * 3]
    for i, props in enumerate(props_list):
        for j in range(3):
            k = i * 3 + j
            recs.append(record(props, topic=topics[k % len(topics)], body=bodies[k % len(bodies)],
                               born=(HOST_A, HOST_6, HOST_NEG)[k % 3], store=(HOST_B, HOST_6, HOST_A, HOST_NEG)[k % 4],
                               queue_id=(0, -1, 2**31 - 1, 7)[k % 4], queue_offset=(0, -5, 2**63 - 1, -(2**63))[k % 4],
                               phy=(-1, 0, 2**63 - 1, -(2**63), 12345)[k % 5], flag=(0, -2**31)[k % 2],
                               born_ts=(0, -1, 1700000000000 + k)[k % 3], reconsume=k, prepared=(0, -(2**63))[k % 2],
                               store_ts=1700000000000 + 997 * k))
    recs.append(record(b"a\x01b", topic=b"V" * 300, v2=True))
    recs.append(record(b"a\x01b", topic="\u00fc".encode() * 200, v2=True))
    recs.append(record(b"a\x01b", topic=b"short", v2=True))
    return b"".join(recs)


@pytest.mark.parametrize("body", BODY_MODES)
def test_odd_records(body):
    # a DEL inside any property string sends its whole block to the reference path: check the
    # blocks without one too, and each property string in a block of its own
    no_del = [p for p in ODD_PROPERTIES if b"\x7f" not in p]
    for buf in [odd_records(), odd_records(no_del)] + [odd_records([p]) for p in ODD_PROPERTIES]:
        got, offs = encoded(buf, 1 << 40, body)
        assert got == reference_lines(buf, offs, 1 << 40, body)
    buf = odd_records()
    offs = fast.walk(buf, 0, len(buf)).offsets.tolist()
    # one record at a time: the constant-column and single-group paths
    for off in offs[:20]:
        h = fast.decode_headers(buf, np.array([off]))
        assert encode_records(buf, h, 0, body) == reference_lines(buf, [off], 0, body)


def test_many_distinct_topics_and_hosts():
    """More distinct values than the row-comparison passes: the sorted grouping path."""
    recs = [record(b"k\x01v%d" % i, topic=b"topic-%d" % (i % 40), born=(bytes([10, 0, i % 50, 1]), i),
                   store=(bytes([10, 1, 0, i % 30]), 7000 + i % 30), queue_offset=i) for i in range(400)]
    buf = b"".join(recs)
    for body in BODY_MODES:
        got, offs = encoded(buf, 0, body)
        assert got == reference_lines(buf, offs, 0, body)


def test_mmap_memoryview_and_bytearray_buffers(tmp_path):
    import mmap

    buf = odd_records()
    p = tmp_path / "seg"
    p.write_bytes(buf)
    ref, offs = encoded(buf)
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert encoded(mm)[0] == ref
        assert encoded(memoryview(mm))[0] == ref
    assert encoded(bytearray(buf))[0] == ref
    # a memoryview that starts inside a larger object must not be read from the object's start
    padded = memoryview(b"\0" * 16 + buf)[16:]
    assert encoded(padded)[0] == ref


# no DEL: it would send the whole block to the reference path (odd records cover it)
# separators weighted up so that plain shapes (and near misses) are frequent
PROP_ALPHABET = [b"a", b"b", b"\x01", b"\x02", b"\x01", b"\x02", b"\\", b'"', "\u00e9".encode(), b"\xff", b"\n"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(PROP_ALPHABET), max_size=10).map(b"".join), min_size=1, max_size=12))
def test_random_property_strings(props_list):
    buf = b"".join(record(p, queue_offset=i) for i, p in enumerate(props_list))
    got, offs = encoded(buf)
    assert got == reference_lines(buf, offs, 0, "none")


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rmqstore_cli", "dump", "commitlog", *args], capture_output=True,
                          cwd=REPO)


@pytest.mark.parametrize("name,args", [
    ("4.9.3-clean", ["--body", "hex"]),
    ("5.3.3-v2topic", ["--body", "text"]),
    ("4.9.3-clean", ["--body", "base64", "--queue", "1", "--limit", "50"]),
    ("5.3.3-clean", ["--topic", "oracle_topic-B%x", "--from", "70000", "--to", "140000"]),
])
def test_cli_json_output_is_the_reference(name, args):
    root = str(shared_store(name))
    p = _cli(root, "--json", *args)
    assert p.returncode == 0, p.stderr
    body = args[args.index("--body") + 1] if "--body" in args else "none"
    opt = dict(zip(args[::2], args[1::2]))
    with Store.open(root) as s:
        recs = s.commitlog.records(start=int(opt["--from"]) if "--from" in opt else None,
                                   end=int(opt["--to"]) if "--to" in opt else None, with_body=body != "none")
        recs = [m for m in recs if ("--topic" not in opt or m["topic"] == opt["--topic"])
                and ("--queue" not in opt or m["queueId"] == int(opt["--queue"]))]
        if "--limit" in opt:
            recs = recs[: int(opt["--limit"])]
        want = "".join(json_line(render_body(m, body)) + "\n" for m in recs).encode()
    assert p.stdout == want
    assert len(recs) > 0


def test_cli_crash_store_stops_like_the_table():
    """The end-of-log warning and exit code do not depend on --json."""
    root = str(shared_store("4.9.3-crash"))
    pj, pt = _cli(root, "--json"), _cli(root)
    assert pj.returncode == pt.returncode
    assert pj.stderr == pt.stderr


def test_non_utf8_stdout_is_written_line_by_line():
    """A stdout that cannot take every character fails on the line that holds it, as before."""
    import os

    root = str(shared_store("4.9.3-clean"))
    with Store.open(root) as s:
        lines = [json_line(m) + "\n" for m in s.commitlog.records(start=766, with_body=False)]
    k = next(i for i, line in enumerate(lines) if any(ord(c) > 255 for c in line))
    assert k > 0
    try:
        lines[k].encode("latin-1")
    except UnicodeEncodeError as e:
        message = str(e)
    p = subprocess.run([sys.executable, "-m", "rmqstore_cli", "dump", "commitlog", root, "--json", "--from", "766"],
                       capture_output=True, cwd=REPO, env={**os.environ, "PYTHONIOENCODING": "latin-1"})
    assert p.returncode == 2
    assert p.stdout == "".join(lines[:k]).encode("latin-1")
    assert message in p.stderr.decode()
