"""The word-at-a-time property kernels (formats.propkernel through formats.propscan) against an
independent pure-Python parse of random property strings: value spans of the wanted names, the
non-ASCII flag, index key hashes, Java hashes of byte spans and span grouping.

Property strings are built from pieces that stress the 8-byte steps: names that are prefixes of one
another (KEYS / KEYSX / KEY), names of 1-11 bytes (patterns shorter and longer than a word), separators
in odd places, non-ASCII bytes, values longer than many words, and strings that end at the very end of
their buffer (where a word load would run past it). The seed is printed; any seed must pass.
"""

from __future__ import annotations

import random

import numpy as np

from rmqstore_cli.formats import propscan

NAMES = propscan.WANTED + propscan.MULTI_DISPATCH_PROPS + ("KEYSX", "K", "CLUSTER", "LONG_NAME_X")


def _spans(raw: bytes, base: int, names) -> dict:
    """Reference for scan: split at \\x02; an entry ``NAME\\x01value`` with a non-empty value sets NAME's
    span (the last one wins). Independent of the kernels (plain bytes operations)."""
    out = {k: (-1, -1) for k in names}
    pos = 0
    for entry in raw.split(b"\x02"):
        for k in names:
            pat = k.encode() + b"\x01"
            if entry.startswith(pat) and len(entry) > len(pat):
                out[k] = (base + pos + len(pat), base + pos + len(entry))
        pos += len(entry) + 1
    return out


# well-formed UTF-8 of 2-, 3- and 4-byte sequences (a code point past U+FFFF is a surrogate pair in Java's hash)
UTF8_VALUES = [v.encode() for v in ("\u952e\u503c \u6d4b\u8bd5", "\U0001f600k", "a\u00e9 \u4e2d", "\u00ff\u0100\u07ff\u0800\uffff",
                                    "\U00010000 \U0010ffff", "\u8ba2\u5355-42 \u652f\u4ed8")]
# not well-formed: truncated, a surrogate, overlong forms, past U+10FFFF, a stray continuation byte
MALFORMED_UTF8 = [b"\xe4\xb8", b"k\xed\xa0\x80", b"\xc0\x80", b"\xe0\x80\x80", b"\xf4\x90\x80\x80", b"a\x80b", b"\xf0\x9f\x98"]


def _well_formed(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")  # strict: Python refuses exactly what Java's decoder replaces with U+FFFD
        return True
    except UnicodeDecodeError:
        return False


def _java_hash_text(text: str, h: int = 0) -> int:
    """Java's String.hashCode over UTF-16 code units (plain arithmetic; unsigned)."""
    units = text.encode("utf-16-be")
    for k in range(0, len(units), 2):
        h = (31 * h + (units[k] << 8 | units[k + 1])) & 0xFFFFFFFF
    return h


def _java_hash_bytes(data: bytes, h: int = 0) -> int:
    for b in data:
        h = (31 * h + b) & 0xFFFFFFFF
    return h


def _random_props(rng: random.Random) -> bytes:
    names = [b"TAGS", b"KEYS", b"KEYSX", b"KEY", b"UNIQ_KEY", b"UNIQ_KE", b"DELAY", b"K", b"CLUSTER", b"LONG_NAME_X",
             b"LONG_NAME_", b"X", b"", b"INNER_MULTI_DISPATCH", b"INNER_MULTI_QUEUE_OFFSET", b"INNER_MULTI_DISPATCHX"]
    values = [b"", b"a", b"TagA", b"k1 k2", b"  k3   k4 ", b" ", b"\x01", b"a\x01b", b"\xc3\xa9t\xc3\xa9", b"\xff",
              b"0A0000070C3B1B6D3B2E000000000001", b"x" * 7, b"y" * 8, b"z" * 9, b"w" * 15, b"v" * 16, b"u" * 17]
    values += UTF8_VALUES + MALFORMED_UTF8
    pieces = []
    for _ in range(rng.randint(0, 7)):
        roll = rng.random()
        if roll < 0.7:
            v = rng.choice(values)
            if rng.random() < 0.05:
                v = bytes(rng.choice(b"ab \x01\x80") for _ in range(rng.randint(100, 3000)))  # a long value
            pieces.append(rng.choice(names) + b"\x01" + v)
        elif roll < 0.85:
            pieces.append(b"")  # separators side by side
        else:
            pieces.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 12))))  # any bytes at all
    raw = b"\x02".join(pieces)
    if rng.random() < 0.2:
        raw += b"\x02"
    if rng.random() < 0.1:
        raw = b"\x02" + raw
    return raw


def _packed(strings: list, before, after=lambda: b"") -> tuple[bytes, list, list]:
    """(buffer, starts, lengths): each string in one buffer, ``before()`` bytes ahead of it and ``after()`` past it."""
    buf = bytearray()
    starts, lengths = [], []
    for c in strings:
        buf += before()
        starts.append(len(buf))
        lengths.append(len(c))
        buf += c
        buf += after()
    return bytes(buf), starts, lengths


def _check(buf: bytes, starts: list, lengths: list, topic: str = "TopicF") -> None:
    u8 = np.frombuffer(buf, np.uint8)
    pv = propscan.scan(u8, np.asarray(starts, np.int64), np.asarray(lengths, np.int64), names=NAMES)
    use = np.zeros(len(starts), bool)
    want_counts, want_keys = [], []
    for i, (s, n) in enumerate(zip(starts, lengths)):
        raw = buf[s:s + max(n, 0)]
        want = _spans(raw, s, NAMES)
        got = {k: (int(pv.start[k][i]), int(pv.end[k][i])) for k in NAMES}
        assert got == want, (raw, got, want)
        assert bool(pv.ascii[i]) == all(b < 0x80 for b in raw), raw
        use[i] = _well_formed(raw) and i % 5 != 2  # some records left to the one-at-a-time rules
        if not use[i]:
            want_counts.append(0)
            continue
        keys = []
        us, ue = want["UNIQ_KEY"]
        if us >= 0:
            keys.append(buf[us:ue])
        ks, ke = want["KEYS"]
        if ks >= 0:
            keys += [t for t in buf[ks:ke].split(b" ") if t]
        want_counts.append(len(keys))
        want_keys += [_key_hash(_java_hash_text(topic + "#" + k.decode())) for k in keys]
    prefix = np.full(len(starts), _java_hash_bytes(f"{topic}#".encode()), np.uint32)
    counts, kh = propscan.key_hashes(u8, use, prefix, pv)
    assert counts.tolist() == want_counts
    assert kh.tolist() == want_keys
    # the well-formedness and TAGS hash of the non-ASCII ones (the re-dispatch's form of the one pass below)
    wide = np.flatnonzero(~pv.ascii)
    codes = np.full(len(starts), 7, np.int64)
    ok = propscan.utf8_tags(u8, wide, np.asarray(starts, np.int64), np.asarray(lengths, np.int64), pv, codes)
    for k, i in enumerate(wide.tolist()):
        raw = buf[starts[i]:starts[i] + max(lengths[i], 0)]
        assert bool(ok[k]) == _well_formed(raw), raw
        ts, te = pv.start["TAGS"][i], pv.end["TAGS"][i]
        want_code = 7 if not ok[k] or ts < 0 else _java_hash_text(buf[ts:te].decode())
        assert int(codes[i]) == (want_code - (1 << 32) if want_code >= 1 << 31 else want_code), raw
    # the one-pass form (topic grouping, scan, TAGS hash and key hashes together): record i of topic i % 4 (of
    # ASCII, non-ASCII and SCHEDULE_TOPIC_XXXX topics), each topic's bytes written again at its records
    _check_one_pass(buf, starts, lengths, [topic, "SCHEDULE_TOPIC_XXXX", "T\u00e9", "SCHEDULE_TOPIC_XXX"])


def _check_one_pass(buf: bytes, starts: list, lengths: list, topics: list) -> None:
    """propscan.dispatch_hashes against a plain computation: topics grouped by their bytes in first-occurrence order
    (group hash: Java hash of the bytes), records whose properties or topic hold a non-ASCII byte or whose topic is
    SCHEDULE_TOPIC_XXXX left slow, the others' TAGS hash and ``topic#key`` index key hashes."""
    raw_topics = [t.encode("utf-8") for t in topics]
    blob = bytearray()  # the topics, before the property strings (which may end at the buffer's very end)
    tstarts, tlens = [], []
    for i in range(len(starts)):
        t = raw_topics[(i * 7 // 3) % len(raw_topics)]  # runs of one topic, and changes
        tstarts.append(len(blob))
        tlens.append(len(t))
        blob += t
    tbuf = bytes(blob) + buf
    starts = [s + len(blob) for s in starts]
    buf = tbuf
    u8 = np.frombuffer(tbuf, np.uint8)
    store_ts = [1_700_000_000_000 + 7 * i for i in range(len(starts))]
    d = propscan.dispatch_hashes(u8, np.asarray(starts, np.int64), np.asarray(lengths, np.int64),
                                 np.asarray(tstarts, np.int64), np.asarray(tlens, np.int64), np.asarray(store_ts, np.int64),
                                 propscan.delay_millis(DELAYS))
    seen: dict = {}
    want_group = [seen.setdefault(tbuf[s:s + n], len(seen)) for s, n in zip(tstarts, tlens)]
    assert d.group.tolist() == want_group
    assert [tbuf[tstarts[f]:tstarts[f] + tlens[f]] for f in d.firsts.tolist()] == list(seen)
    assert d.group_hash.tolist() == [_java_hash_bytes(t) for t in seen]
    want_slow, want_codes, want_counts, want_keys, want_multi = [], [], [], [], []
    for i, (s, n) in enumerate(zip(starts, lengths)):
        raw = buf[s:s + max(n, 0)]
        t = tbuf[tstarts[i]:tstarts[i] + tlens[i]]
        want = _spans(raw, s, NAMES)
        multi = _spans(raw, s, propscan.MULTI_DISPATCH_PROPS)
        want_multi.append(all(a >= 0 for a, _ in multi.values()))
        ds, de = want["DELAY"]
        level = _plain_int(buf[ds:de]) if ds >= 0 else 0
        sched = t == b"SCHEDULE_TOPIC_XXXX" and ds >= 0
        is_slow = not _well_formed(raw) or not all(b < 0x80 for b in t) or (sched and level is None)
        want_slow.append(is_slow)
        ts, te = want["TAGS"]
        code = _java_hash_text(buf[ts:te].decode()) if ts >= 0 and not is_slow else 0
        code = code - (1 << 32) if code >= 1 << 31 else code
        if sched and not is_slow and min(level, len(DELAYS)) > 0:  # FORMAT.md §5.2: the delivery time
            code = store_ts[i] + DELAYS[min(level, len(DELAYS))]
        want_codes.append(code)
        keys = []
        if not is_slow:
            us, ue = want["UNIQ_KEY"]
            keys += [buf[us:ue]] if us >= 0 else []
            ks, ke = want["KEYS"]
            keys += [k for k in buf[ks:ke].split(b" ") if k] if ks >= 0 else []
        want_counts.append(len(keys))
        want_keys += [_key_hash(_java_hash_text(t.decode("ascii") + "#" + k.decode())) for k in keys]
    assert d.slow.tolist() == want_slow
    assert d.multi.tolist() == want_multi
    assert d.codes.tolist() == want_codes
    assert d.counts.tolist() == want_counts
    assert d.key_hashes.tolist() == want_keys


DELAYS = {1: 1000, 2: 5000, 3: 60_000, 4: 7_200_000}  # a short delay table: levels past it are capped


def _plain_int(raw: bytes) -> int | None:
    """A DELAY value the one pass takes itself: an optional sign and 1-10 ASCII digits inside int's range (None:
    left to the one-at-a-time rules, whatever Integer.parseInt makes of it)."""
    digits = raw[1:] if raw[:1] in (b"+", b"-") else raw
    if not 1 <= len(digits) <= 10 or not all(0x30 <= b <= 0x39 for b in digits):
        return None
    v = int(raw)
    return v if -(1 << 31) <= v < 1 << 31 else None


def test_one_pass_computes_delay_level_tags_codes():
    """SCHEDULE_TOPIC_XXXX records: a plain DELAY gives the delivery time (capped at the table's last level; none at
    0 or below: the TAGS hash), anything else goes to the one-at-a-time rules; other topics ignore DELAY."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    delays = [b"1", b"3", b"4", b"5", b"99", b"+2", b"-1", b"0", b"00", b"2147483647", b"-2147483648", b"2147483648",
              b"0000000003", b"00000000003", b" 3", b"3 ", b"3a", b"", b"+", b"-", "\u0663".encode(), b"1_0", b"9" * 12]
    props = []
    for _ in range(3000):
        entries = []
        for _ in range(rng.randint(0, 3)):
            entries.append(rng.choice([b"DELAY\x01" + rng.choice(delays), b"TAGS\x01" + rng.choice([b"TagA", b"x"]),
                                       b"KEYS\x01k1 k2", b"DELAYX\x015", b"DELA\x017"]))
        props.append(b"\x02".join(entries))
    _check_one_pass(*_packed(props, lambda: bytes(rng.randint(0, 3))), ["SCHEDULE_TOPIC_XXXX", "TopicT", "SCHEDULE_TOPIC_XXXY"])


def _key_hash(h: int) -> int:
    """§10.3's keyHash of an unsigned 32-bit hash: abs of the int32, Integer.MIN_VALUE -> 0."""
    v = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if v == -(1 << 31) else abs(v)


def test_one_pass_hashes_well_formed_utf8_as_java_does():
    """Non-ASCII property values that are well-formed UTF-8 (Chinese keys and tags, a character past U+FFFF) are
    hashed in the one pass over their UTF-16 code units; malformed ones are left to the one-at-a-time rules."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    pieces = UTF8_VALUES + MALFORMED_UTF8 + [b"k1", b"TagA"]
    props = []
    for _ in range(2000):
        entries = [rng.choice([b"TAGS", b"KEYS", b"UNIQ_KEY", b"OTHER"]) + b"\x01" + b" ".join(
            rng.choice(pieces) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 4))]
        props.append(b"\x02".join(entries))
    _check_one_pass(*_packed(props, lambda: bytes(rng.randint(0, 3))), ["TopicTest", "%RETRY%g"])
    d = propscan.dispatch_hashes(np.frombuffer("KEYS\x01\u952e1 \u952e2\x02TAGS\u00e9".encode(), np.uint8),
                                 np.array([0]), np.array([len("KEYS\x01\u952e1 \u952e2\x02TAGS\u00e9".encode())]),
                                 np.array([0]), np.array([0]))
    assert not d.slow[0] and d.counts.tolist() == [2]  # a plain check that the fast path took it


def test_one_pass_groups_many_topics():
    """The one-pass form over many topics (more than the grouping table's first probe finds: collisions and long
    probe runs), topics that are prefixes of one another, empty ones and ones that differ only in their last byte."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    topics = ["", "A", "Aa", "BB", "TopicTest", "TopicTesu", "SCHEDULE_TOPIC_XXXX", "%RETRY%group", "caf\u00e9", "x" * 70]
    topics += ["".join(rng.choice("abcXYZ_%-0189") for _ in range(rng.randint(1, 30))) for _ in range(200)]
    picks = [rng.choice(topics) for _ in range(3000)]
    props = [rng.choice([b"", b"TAGS\x01t", b"KEYS\x01a b\x02UNIQ_KEY\x01u", b"TAGS\x01\xe9"]) for _ in picks]
    _check_one_pass(*_packed(props, lambda: bytes(rng.randint(0, 3))), picks)


def test_property_kernels_equal_a_plain_parse():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    edge = [b"", b"TAGS\x01a", b"TAGS\x01", b"KEYS\x01k", b"KEYSX\x01k", b"KEY\x01k", b"UNIQ_KEY\x01u", b"\x02", b"\x02\x02",
            b"TAGS\x01" + b"\xe9" * 40, b"KEYS\x01 " * 3, b"\x01\x02\x01", b"LONG_NAME_X\x01v\x02LONG_NAME_\x01w",
            b"TAGS\x01a\x02TAGS\x01", b"TAGS\x01a\x02TAGS\x01b", b"K\x01\x01", b"CLUSTER\x01c" + b"\x02" * 9,
            b"UNIQ_KEY\x01" + b"u" * 5000 + b"\x02TAGS\x01" + b"t" * 777,
            b"KEYS\x01" + b" ".join(b"k%d" % i for i in range(60))]  # more keys than key_hashes' first room
    cases = edge + [_random_props(rng) for _ in range(3000)]
    # one buffer, each string after 0-9 bytes of other data (every alignment of the 8-byte steps)
    _check(*_packed(cases, lambda: bytes(rng.choice(b"\x01\x02 TAGS\xff") for _ in range(rng.randint(0, 9)))))
    # strings that end exactly where their buffer ends (no byte may be read past it), some said to be
    # longer than what is left (read as the bytes that are there)
    for c in edge + cases[len(edge):len(edge) + 300]:
        pad = rng.randint(0, 3)
        _check(b"\x02" * pad + c, [pad], [len(c) + rng.choice((0, 0, 0, 5))])


def test_java_hash_spans_and_groups_equal_plain_computations():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    words = [b"", b"a", b"Aa", b"BB", b"TopicTest", b"BenchTopicA", b"%RETRY%g", b"\xc3\xa9", b"\x00" * 9, b"x" * 64]
    words += [bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))) for _ in range(300)]
    picks = [rng.choice(words) for _ in range(4000)]
    data = bytearray()
    starts = []
    for w in picks:
        data += bytes(rng.randint(0, 3))
        starts.append(len(data))
        data += w
    u8 = np.frombuffer(bytes(data), np.uint8)
    s = np.asarray(starts, np.int64)
    n = np.asarray([len(w) for w in picks], np.int64)
    assert propscan.java_hash_spans(u8, s, s + n).tolist() == [_java_hash_bytes(w) for w in picks]
    group, firsts = propscan.group_spans(u8, s, n)
    seen: dict = {}
    want = [seen.setdefault(w, len(seen)) for w in picks]
    assert group.tolist() == want
    assert [picks[f] for f in firsts.tolist()] == list(seen)
    # the last span ends at the buffer's end
    tail = np.frombuffer(b"ab" + picks[-1], np.uint8)
    assert propscan.java_hash_spans(tail, np.array([2]), np.array([len(tail)])).tolist() == [_java_hash_bytes(picks[-1])]


def test_property_scan_steps_of_32_bytes():
    """The scan takes 32 bytes per step (a vector compare finds the step's separators and bytes >= 0x80): separators
    and non-ASCII bytes at every position of a step and on both sides of a step boundary, and bytes just past the
    string (a separator or a byte >= 0x80 there must not count), from every start alignment, also at the buffer's
    end (the last 31 bytes are read one by one)."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    cases = []
    for length in (31, 32, 33, 63, 64, 65, 95, 96, 97):
        for at in sorted({0, 1, 7, 8, 30, 31, 32, 33, length - 2, length - 1} & set(range(length))):
            body = bytearray(rng.choice(b"abTAGSKEY\x01") for _ in range(length))
            body[at] = 2
            cases.append(bytes(body))
            tagged = bytearray(b"TAGS\x01" + bytes(body[5:])) if length > 6 else bytearray(body)
            tagged[at] = 0x80 | rng.randrange(128)  # one non-ASCII byte somewhere in the string
            cases.append(bytes(tagged))
        cases.append(b"KEYS\x01" + b"k" * (length - 15) + b" k2\x02TAGS\x01tg")  # entries across step boundaries
        cases.append(b"\x02".join([b"UNIQ_KEY\x01" + b"u" * (length % 40 + 1)] * 3))
    # right after each string, bytes that are not part of it
    tails = (b"\x02TAGS\x01zz", b"\xff\xfe", b"\x02", b"")
    _check(*_packed(cases, lambda: bytes(rng.randint(0, 40)), lambda: rng.choice(tails)))
    for c in cases:  # the string ends at the buffer's end; 0-40 bytes before it
        pad = rng.randint(0, 40)
        _check(b"TAGS\x01p\x02"[:pad] + bytes(max(pad - 7, 0)) + c, [pad], [len(c)])
