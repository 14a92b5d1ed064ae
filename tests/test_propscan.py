"""formats.propscan (bulk TAGS/KEYS/UNIQ_KEY/DELAY lookup for verify) equals parse_properties."""

from __future__ import annotations

import random

import numpy as np
import pytest

from formats import fast, propscan
from formats.hashing import index_key_hash, java_hash
from formats.message import decode_utf8
from formats.properties import parse_properties
from tests.conftest import STORE_NAMES, shared_store


def _expected(raw: bytes) -> dict:
    p = parse_properties(decode_utf8(raw))
    return {k: p.get(k) for k in propscan.WANTED}


def _got(u8, pv, i) -> dict:
    return {k: (decode_utf8(bytes(u8[pv.start[k][i]:pv.end[k][i]])) if pv.start[k][i] >= 0 else None)
            for k in propscan.WANTED}


def _check(buf: bytes, starts, lengths) -> int:
    u8 = np.frombuffer(buf, dtype=np.uint8)
    pv = propscan.scan(u8, np.asarray(starts, np.int64), np.asarray(lengths, np.int64))
    for i, (s, n) in enumerate(zip(starts, lengths)):
        raw = buf[s:s + max(n, 0)]
        assert pv.ascii[i] == all(b < 0x80 for b in raw)
        if pv.ascii[i]:
            assert _got(u8, pv, i) == _expected(raw), raw
    return len(starts)


@pytest.mark.parametrize("name", STORE_NAMES)
def test_every_shared_store_record(name):
    import os
    d = shared_store(name) / "commitlog"
    total = 0
    for fn in sorted(os.listdir(d)):
        buf = (d / fn).read_bytes()
        w = fast.walk(buf, 0, len(buf))
        h = fast.decode_headers(buf, w.offsets)
        ok = h.reason == fast.R_OK
        total += _check(buf, h.propsStart[ok].tolist(), h.propsLength[ok].tolist())
    assert total > 0


EDGE = [
    b"", b"TAGS\x01a", b"TAGS\x01", b"TAGS\x01\x02KEYS\x01k1 k2", b"TAGS\x01a\x02TAGS\x01b", b"TAGS\x01a\x02TAGS\x01",
    b"TAGS\x01a\x01b", b"\x01TAGS\x01a", b"XTAGS\x01a\x02UNIQ_KEY\x01u", b"TAGS\x01x\x02\x02\x02", b"\x02\x02TAGS\x01q",
    b"TAG\x01a\x02KEYS\x01  a  b ", b"DELAY\x013\x02TAGS\x01t\x02DELAY\x01x", b"a\x01\x02TAGS\x01ok", b"TAGS\x02a",
    b"TAGS\x01v\x02", b"UNIQ_KEY\x01" + b"F" * 32 + b"\x02", b"KEYS\x01\x01", b"TAGS\x01\xc3\xa9",
]


def test_edge_cases_and_random():
    # Each property string after 9 bytes of unrelated data (a record's body), the last at the buffer's end.
    rng = random.Random(7)
    alphabet = [b"TAGS", b"KEYS", b"UNIQ_KEY", b"DELAY", b"TAG", b"", b"\x01", b"\x02", b"a", b"b c", b"\xe9", b" "]
    cases = list(EDGE)
    for _ in range(3000):
        cases.append(b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))))
    buf = bytearray()
    starts, lengths = [], []
    for c in cases:
        buf += b"\x02\x01body\x02\x01\xff"
        starts.append(len(buf))
        lengths.append(len(c))
        buf += c
    assert _check(bytes(buf), starts, lengths) == len(cases)


def test_hash_spans_equal_java_hash():
    rng = random.Random(3)
    words = ["", "a", "TagA", "key-123 ", "F" * 32, "x" * 200] + [
        "".join(rng.choice("abcXYZ#-_ 019") for _ in range(rng.randint(0, 60))) for _ in range(500)]
    buf = "".join(words).encode("ascii")
    u8 = np.frombuffer(buf, dtype=np.uint8)
    starts, pos = [], 0
    for w in words:
        starts.append(pos)
        pos += len(w)
    s = np.asarray(starts, np.int64)
    e = s + np.asarray([len(w) for w in words], np.int64)
    h = propscan.java_hash_spans(u8, s, e)
    assert h.view(np.int32).tolist() == [java_hash(w) for w in words]
    topic = "TopicTest"
    pre = np.full(len(words), java_hash(topic + "#") & 0xFFFFFFFF, dtype=np.uint32)
    kh = propscan.key_hash(propscan.combine(pre, h, e - s))
    assert kh.tolist() == [index_key_hash(f"{topic}#{w}") for w in words]
