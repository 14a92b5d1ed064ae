"""formats.propscan (bulk TAGS/KEYS/UNIQ_KEY/DELAY lookup for verify) equals parse_properties."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rmqstore_cli.formats import fast, propscan
from rmqstore_cli.formats.hashing import index_key_hash, java_hash
from rmqstore_cli.formats.message import decode_utf8
from rmqstore_cli.formats.properties import parse_properties
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
    # index key hashes of topic#key through the KEYS tokenizer: one token per word (no spaces inside)
    topic = "TopicTest"
    single = [w for w in words if w and " " not in w]
    keys = "\x02".join("KEYS\x01" + w for w in single).encode("ascii")
    u8 = np.frombuffer(keys, dtype=np.uint8)
    pos, starts = 0, []
    for w in single:
        starts.append(pos)
        pos += len("KEYS\x01" + w) + 1
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray([len(w) + 5 for w in single], np.int64)
    pv = propscan.scan(u8, starts, lengths)
    pre = np.full(len(single), java_hash(topic + "#") & 0xFFFFFFFF, dtype=np.uint32)
    counts, kh = propscan.key_hashes(u8, np.ones(len(single), bool), pre, pv)
    assert counts.tolist() == [1] * len(single)
    assert kh.tolist() == [index_key_hash(f"{topic}#{w}") for w in single]


def test_key_hashes_equal_the_decoded_keys():
    """UNIQ_KEY first, then the non-empty space-separated KEYS tokens, as the index writer hashes them
    from the decoded property map (random property strings, some with Chinese characters, an é or a character past
    U+FFFF, edge cases included)."""
    seed = 11
    print(f"seed {seed}")
    rng = random.Random(seed)
    pieces = [b"KEYS\x01", b"UNIQ_KEY\x01", b"TAGS\x01", b"\x02", b"\x01", b" ", b"  ", b"k1", b"key-2", b"u", b"#", b"x y"]
    pieces += ["\u8ba2\u5355".encode(), "\u00e9".encode(), "\U0001f600".encode()]  # well-formed UTF-8: hashed over UTF-16 units
    cases = [b"KEYS\x01 a  b ", b"UNIQ_KEY\x01u1\x02KEYS\x01k", b"KEYS\x01", b"KEYS\x01   ", b"UNIQ_KEY\x01\x02KEYS\x01k"]
    cases += [b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 10))) for _ in range(3000)]
    buf = bytearray()
    starts, lengths = [], []
    for c in cases:
        buf += b"\x02body\x01"
        starts.append(len(buf))
        lengths.append(len(c))
        buf += c
    u8 = np.frombuffer(bytes(buf), dtype=np.uint8)
    pv = propscan.scan(u8, np.asarray(starts, np.int64), np.asarray(lengths, np.int64))
    topic = "TopicKeys"
    pre = np.full(len(cases), java_hash(topic + "#") & 0xFFFFFFFF, dtype=np.uint32)
    use = np.asarray([i % 7 != 3 for i in range(len(cases))])  # some records left to the slow path
    counts, kh = propscan.key_hashes(u8, use, pre, pv)
    expected_counts, expected = [], []
    for i, c in enumerate(cases):
        if not use[i]:
            expected_counts.append(0)
            continue
        p = parse_properties(decode_utf8(c))
        keys = ([p["UNIQ_KEY"]] if p.get("UNIQ_KEY") else []) + [k for k in p.get("KEYS", "").split(" ") if k]
        expected_counts.append(len(keys))
        expected += [index_key_hash(f"{topic}#{k}") for k in keys]
    assert counts.tolist() == expected_counts
    assert kh.tolist() == expected


def _reference_groups(data: bytes, starts, lengths):
    first: dict[bytes, int] = {}
    group, firsts = [], []
    for i, (s, n) in enumerate(zip(starts, lengths)):
        raw = data[s:s + n]
        if raw not in first:
            first[raw] = len(firsts)
            firsts.append(i)
        group.append(first[raw])
    return group, firsts


def test_group_spans_equals_a_dict_of_bytes_even_on_hash_collisions():
    """Java hash collisions ("Aa"/"BB", and their concatenations) of the same length, empty spans, prefixes
    and thousands of random spans: groups by bytes, numbered in first-occurrence order."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    assert java_hash("Aa") == java_hash("BB") and java_hash("AaBB") == java_hash("BBAa")
    words = [b"Aa", b"BB", b"AaBB", b"BBAa", b"AaAa", b"BBBB", b"", b"A", b"Aa\x00", b"TopicTest", b"TopicTes",
             b"%RETRY%group", "t\u00e9".encode(), b"\xff\xfe"]
    words += [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 12))) for _ in range(200)]
    picks = [rng.choice(words) for _ in range(5000)]
    data = bytearray()
    starts = []
    for w in picks:
        data += bytes(rng.randrange(3))  # gaps between spans
        starts.append(len(data))
        data += w
    u8 = np.frombuffer(bytes(data), np.uint8)
    group, firsts = propscan.group_spans(u8, np.array(starts), np.array([len(w) for w in picks]))
    want_group, want_firsts = _reference_groups(bytes(data), starts, [len(w) for w in picks])
    assert group.tolist() == want_group and firsts.tolist() == want_firsts


@pytest.mark.parametrize("name", STORE_NAMES)
def test_topic_ids_name_every_record_by_its_topic(name):
    """stats' / the predicted dispatch's topic ids and dispatch's interner on every broker-written record."""
    from rmqstore_cli.engine.derived.dispatchcolumns import TopicInterner, topic_ids

    root = shared_store(name) / "commitlog"
    for seg in sorted(root.iterdir()):
        data = seg.read_bytes()
        w = fast.walk(data)
        if not len(w.offsets):
            continue
        h = fast.decode_headers(data, w.offsets)
        u8 = np.frombuffer(data, np.uint8)
        names = [decode_utf8(data[s:s + n]) for s, n in zip(h.topicStart.tolist(), h.topicLength.tolist())]
        registry: dict[str, int] = {"already-there": 0}
        ids = topic_ids(data, h, registry)
        by_id = {v: k for k, v in registry.items()}
        assert [by_id[i] for i in ids.tolist()] == names
        interner = TopicInterner()
        tids = interner.intern_chunk(u8, data, h)
        topics = interner.topics()
        assert [topics[i] for i in tids.tolist()] == names
