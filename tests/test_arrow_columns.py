"""formats/arrow.py: the export's host and property columns, built over whole batches, against the record-by-record
rules (hosts formatted one by one; properties by the broker's parser), on seeded random batches."""

import random

import numpy as np
import pyarrow as pa
import pytest

from rmqstore_cli.formats.arrow import _hosts, _property_columns, _property_columns_python
from rmqstore_cli.formats.msgid import host_to_str
from rmqstore_cli.formats.properties import parse_properties

SEEDS = range(6)


def _host_text(ip: bytes, port: int) -> str:
    s = host_to_str(ip)
    return f"[{s}]:{port}" if len(ip) == 16 else f"{s}:{port}"


def _hosts_batch(rng: random.Random, n: int, runs: bool):
    """A buffer holding ``n`` host fields (4- or 16-byte address, 4-byte port) and their starts and widths; the
    hosts drawn from a few, in runs (one producer after another) or changing at every row."""
    pool = [(bytes(rng.randrange(256) for _ in range(4)), rng.randrange(-5, 70_000)) for _ in range(3)]
    pool += [(bytes(rng.randrange(256) for _ in range(16)), rng.randrange(70_000)) for _ in range(2)]
    pool.append((pool[0][0], pool[0][1] + 1))  # same address, another port
    buf, starts, widths, want = bytearray(), [], [], []
    k = 0
    for i in range(n):
        if not runs or rng.random() < 0.05:
            k = rng.randrange(len(pool))
        ip, port = pool[k]
        buf += bytes(rng.randrange(256) for _ in range(rng.randrange(3)))  # other fields between
        starts.append(len(buf))
        widths.append(len(ip) + 4)
        buf += ip + port.to_bytes(4, "big", signed=True)
        want.append(_host_text(ip, port))
    buf += bytes(24)
    return np.frombuffer(bytes(buf), np.uint8), np.asarray(starts, np.int64), np.asarray(widths, np.int32), want


@pytest.mark.parametrize("seed", SEEDS)
def test_hosts_column_equals_each_host_formatted_alone(seed):
    print("seed", seed)
    rng = random.Random(seed)
    for runs in (True, False):
        for n in (1, 2, 37, 500):
            u8, starts, widths, want = _hosts_batch(rng, n, runs)
            assert _hosts(u8, starts, widths).to_pylist() == want, (runs, n)


NAMES = ["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "a", "τ"]


def _property_text(rng: random.Random, duplicates: bool) -> str:
    """A property string of entries and of pieces that are not entries; each name once unless ``duplicates``."""
    entries = []
    unused = rng.sample(NAMES, len(NAMES))
    for _ in range(rng.randrange(7)):
        r = rng.random()
        if r < 0.08:
            entries.append("")  # two separators in a row
        elif r < 0.14:
            entries.append(rng.choice(NAMES))  # no \x01: not an entry
        elif r < 0.2:
            entries.append("\x01" + rng.choice(["v", "w"]))  # empty name
        else:
            name = unused.pop()
            value = rng.choice(["", "v", "k1 k2", " k3  ", "\x01x", "ß", "U" * rng.randrange(1, 40)])
            entries.append(f"{name}\x01{value}")
    if duplicates and entries:
        entries.append(f"{rng.choice(NAMES)}\x01again")
    return "\x02".join(entries)


def _arrow_route_follows_the_parser(texts: list) -> list:
    """Arrow's property columns of ``texts`` equal the record-by-record ones and the broker parser's maps; returns
    them (tags, keys, uniqKey, map) as lists."""
    props = pa.array(texts, pa.string())
    ok = np.ones(len(texts), bool)
    fast_cols = _property_columns(props, ok)
    slow_cols = _property_columns_python(props, ok)
    assert [c.to_pylist() for c in fast_cols] == [c.to_pylist() for c in slow_cols]
    assert [dict(m) for m in fast_cols[3].to_pylist()] == [parse_properties(t) for t in texts]
    return [c.to_pylist() for c in fast_cols]


def test_arrow_property_columns_follow_the_broker_parser():
    texts = ["", "TAGS\x01a\x02KEYS\x01k1  k2 \x02UNIQ_KEY\x01U1", "KEYS\x01\x02TAGS\x01\x01x\x02\x01v\x02ab",
             "a\x01b\x01c\x02\x02\x02TAGS\x01τ-ß\x02", "KEYS\x01 \x02UNIQ_KEY\x01\x02", "x\x01y\x02"]
    tags, keys, _, _ = _arrow_route_follows_the_parser(texts)
    assert tags == [None, "a", "\x01x", "τ-ß", None, None]
    assert keys == [[], ["k1", "k2"], [], [], [], []]
    # A name given twice: the map keeps the last value, as Java's HashMap does.
    dup = pa.array(["TAGS\x01a\x02TAGS\x01b"], pa.string())
    assert _property_columns(dup, np.ones(1, bool))[0].to_pylist() == ["b"]
    assert dict(_property_columns(dup, np.ones(1, bool))[3].to_pylist()[0]) == {"TAGS": "b"}


@pytest.mark.parametrize("seed", SEEDS)
def test_property_columns_follow_the_broker_parser_on_random_batches(seed):
    print("seed", seed)
    rng = random.Random(seed)
    for duplicates in (False, True):
        _arrow_route_follows_the_parser([_property_text(rng, duplicates and rng.random() < 0.02) for _ in range(400)])


@pytest.mark.parametrize("seed", SEEDS)
def test_host_bytes_read_past_either_end_as_the_nearest_byte(seed):
    from rmqstore_cli.formats.arrow import _host_bytes

    print("seed", seed)
    rng = np.random.default_rng(seed)
    for size in (1, 20, 21, 22, 300):
        u8 = rng.integers(0, 256, size).astype(np.uint8)
        starts = rng.integers(-30, size + 30, 200).astype(np.int64)
        want = np.asarray([[u8[min(max(s + j, 0), size - 1)] for j in range(21)] for s in starts.tolist()], np.uint8)
        assert (_host_bytes(u8, starts) == want).all(), size


@pytest.mark.parametrize("seed", SEEDS)
def test_property_columns_of_the_bytes_follow_the_broker_parser(seed):
    """The compiled pass over the property strings where they lie (between other bytes) gives the columns of the
    broker's parser, or None exactly when a record names a key twice."""
    from rmqstore_cli.formats.arrow import _property_columns_of_bytes

    print("seed", seed)
    rng = random.Random(seed)
    for duplicates in (False, True):
        texts = [_property_text(rng, duplicates and rng.random() < 0.02) for _ in range(400)]
        buf, starts, lengths = bytearray(b"\x02\x01"), [], []
        for t in texts:
            buf += bytes(rng.choice((1, 2, 32, 65)) for _ in range(rng.randrange(4)))  # other fields between
            raw = t.encode()
            starts.append(len(buf))
            lengths.append(len(raw))
            buf += raw
        buf += b"\x02KEYS\x01tail"
        u8 = np.frombuffer(bytes(buf), np.uint8)
        got = _property_columns_of_bytes(u8, np.asarray(starts, np.int64), np.asarray(lengths, np.int64))
        repeated = any(len(parse_properties(t)) < len([e for e in t.split("\x02") if "\x01" in e and
                                                       e.split("\x01", 1)[0] and e.split("\x01", 1)[1]]) for t in texts)
        if repeated:
            assert got is None
            continue
        want = _property_columns_python(pa.array(texts, pa.string()), np.ones(len(texts), bool))
        assert [c.to_pylist() for c in got] == [c.to_pylist() for c in want]
        assert [c.type for c in got] == [c.type for c in want]


def test_columns_written_without_a_dictionary_are_columns():
    from rmqstore_cli.formats.arrow import COLUMNS
    from rmqstore_cli.spark.arrow_export import NO_DICTIONARY

    assert set(NO_DICTIONARY) <= {name for name, _ in COLUMNS}  # a renamed column would be dictionary-encoded again


def test_batches_with_malformed_or_repeated_properties_follow_the_broker_parser(store_copy):
    """The three routes of a batch's property columns on a broker-written segment: records whose property strings are
    well-formed (the compiled pass), one with a byte that is not UTF-8 (the batch split as Java decodes it), and one
    naming a key twice (the parser, record by record); each record's map, tags, keys and uniqKey as the broker's
    parser reads its property string."""
    from rmqstore_cli.formats import fast
    from rmqstore_cli.formats.arrow import arrow_schema
    from rmqstore_cli.spark.datasource import group_batches, plan

    root = store_copy("4.9.3-clean")
    seg = sorted((root / "commitlog").iterdir())[0]
    data = bytearray(seg.read_bytes())
    w = fast.walk(bytes(data), 0, len(data))
    h = fast.decode_headers(bytes(data), w.offsets)
    starts, lengths = h.propsStart.tolist(), h.propsLength.tolist()

    def props_of(i: int) -> bytes:
        return bytes(data[starts[i]:starts[i] + lengths[i]])

    def batch_columns():
        got = {}
        for b in group_batches([r for r in plan([str(root)], {}) if r.path == str(seg)], arrow_schema(False),
                               with_body=False, check_crc=True, batch_rows=1 << 20, failfast=False):
            for row in b.select(["commitLogOffset", "tags", "keys", "uniqKey", "properties"]).to_pylist():
                got[row["commitLogOffset"]] = row
        return got

    def check(got):
        for i, off in enumerate(h.offsets.tolist()):
            want = parse_properties(props_of(i).decode("utf-8", "replace"))
            row = got[int(off)]
            assert row["properties"] == list(want.items()), i  # each name once, in the parser's order
            assert row["tags"] == want.get("TAGS") and row["uniqKey"] == want.get("UNIQ_KEY"), i
            assert row["keys"] == [k for k in want.get("KEYS", "").split(" ") if k], i

    check(batch_columns())  # well-formed
    i = next(i for i in range(len(starts)) if b"TAGS\x01" in props_of(i))
    at = starts[i] + props_of(i).index(b"TAGS\x01") + 5
    data[at] = 0xFF  # the first byte of the TAGS value: not UTF-8 (the body CRC does not cover it)
    seg.write_bytes(bytes(data))
    got = batch_columns()
    check(got)
    assert "\ufffd" in got[int(h.offsets[i])]["tags"]
    data[at] = ord("x")
    j = next(j for j in range(len(starts)) if b"TAGS\x01" in props_of(j) and b"KEYS\x01" in props_of(j))
    keys_at = starts[j] + props_of(j).index(b"KEYS\x01")
    data[keys_at:keys_at + 4] = b"TAGS"  # TAGS given twice: the last one's value stays
    seg.write_bytes(bytes(data))
    got = batch_columns()
    check(got)
    assert props_of(j).count(b"TAGS\x01") == 2  # the record does name TAGS twice
