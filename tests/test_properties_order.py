"""Property order: reproduce every stored ``propertiesRaw`` of the shared broker stores byte-for-byte."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rmqstore_cli.formats.java_hashmap import (
    JavaHashMapOrder,
    broker_batch_record_properties,
    broker_properties_string,
    hashmap_order,
    parse_properties_lossless,
    property_insertion_order,
    spread_hash,
    split_batch_group,
    split_batch_record_properties,
    table_size_for,
)
from rmqstore_cli.formats.properties import parse_properties

STORES = Path(__file__).resolve().parents[1].parent / "shared" / "stores"
STORE_NAMES = ["4.9.3-clean", "4.9.3-crash", "4.9.3-ext", "5.3.3-clean", "5.3.3-v2topic"]
EXPECTED_RECORDS = {"4.9.3-clean": 2080, "4.9.3-crash": 2080, "4.9.3-ext": 2080, "5.3.3-clean": 2080, "5.3.3-v2topic": 60}
BATCH_KEYS = frozenset({"CLUSTER"})


# ------------------------------------------------------------------ hashmap_order, hand-computed
# Single-character keys have hashCode == code point < 65536, so spread_hash == code point.


def test_spread_and_table_size():
    assert spread_hash("a") == 97
    assert [table_size_for(n) for n in (0, 1, 2, 3, 16, 17, 100, 128)] == [1, 1, 2, 4, 16, 32, 128, 128]
    # property keys at capacity 16 (java hashCode checked via formats.hashing)
    buckets = {k: spread_hash(k) & 15 for k in ("KEYS", "CLUSTER", "UNIQ_KEY", "WAIT", "DELAY", "TAGS", "REAL_QID")}
    assert buckets == {"KEYS": 7, "CLUSTER": 12, "UNIQ_KEY": 12, "WAIT": 13, "DELAY": 13, "TAGS": 14, "REAL_QID": 15}


def test_same_bucket_keeps_insertion_order():
    # 'Q'=81, 'A'=65, 'a'=97: all bucket 1 of 16
    assert hashmap_order(["Q", "A", "a"]) == ["Q", "A", "a"]
    assert hashmap_order(["a", "Q", "A"]) == ["a", "Q", "A"]
    # at 32: Q -> 17, A and a -> 1
    assert hashmap_order(["Q", "A", "a"], 32) == ["A", "a", "Q"]


def test_ascending_buckets_and_duplicates():
    # 'd'=100 -> 4, 'b'=98 -> 2, 'p'=112 -> 0 (cap 16)
    assert hashmap_order(["d", "b", "p"]) == ["p", "b", "d"]
    assert hashmap_order(["d", "b", "d", "p", "b"]) == ["p", "b", "d"]


def test_resize_changes_order():
    # cap 4, threshold 3: d=100->0, a=97->1, b=98->2, e=101->1; 4th put resizes to 8:
    # d->4, a->1, b->2, e->5
    assert hashmap_order(["d", "a", "b"], 4) == ["d", "a", "b"]
    assert hashmap_order(["d", "a", "b", "e"], 4) == ["a", "b", "d", "e"]


def test_resize_split_preserves_relative_order():
    # cap 4: m=109, i=105, e=101, a=97 all in bucket 1; resize to 8 splits into lo (1) = [i, a]
    # and hi (5) = [m, e], each keeping insertion order
    assert hashmap_order(["m", "i", "e", "a"], 4) == ["i", "a", "m", "e"]
    # a later insert goes to the end of its (new) bucket
    assert hashmap_order(["m", "i", "e", "a", "q"], 4) == ["i", "a", "q", "m", "e"]  # q=113 -> 1 of 8


def test_default_resize_at_13th_key():
    # 13 keys in a HashMap(16): size 13 > 12 -> capacity 32
    keys = [chr(c) for c in range(ord("A"), ord("A") + 13)]  # 65..77
    m = JavaHashMapOrder()
    for k in keys[:12]:
        m.put(k)
    assert m.capacity == 16
    assert m.keys() == sorted(keys[:12], key=lambda k: (ord(k) & 15))
    m.put(keys[12])
    assert m.capacity == 32
    # 65..77 at 32 -> buckets 1..13 in code point order
    assert m.keys() == keys


def test_long_bucket_grows_table_below_64():
    # 9 keys all in bucket 1 of 16 (33, 49, ..., 161): the 9th would treeify, so Java resizes to 32
    keys = [chr(c) for c in range(33, 162, 16)]
    assert len(keys) == 9
    assert hashmap_order(keys[:8]) == keys[:8]
    lo = [k for k in keys if ord(k) & 31 == 1]
    hi = [k for k in keys if ord(k) & 31 == 17]
    assert hashmap_order(keys) == lo + hi


def test_remove_and_reinsert_moves_to_end():
    m = JavaHashMapOrder()
    for k in ("Q", "A", "a"):
        m.put(k)
    m.remove("Q")
    m.put("Q")
    assert m.keys() == ["A", "a", "Q"]


def test_insertion_order_rule():
    keys = ["REAL_QID", "UNIQ_KEY", "a", "DELAY", "CLUSTER", "REAL_TOPIC", "WAIT", "zz"]
    assert property_insertion_order(keys) == ["WAIT", "CLUSTER", "a", "zz", "UNIQ_KEY", "DELAY", "REAL_TOPIC", "REAL_QID"]


def test_versions_trailing_separator():
    props = {"KEYS": "k", "WAIT": "true"}
    assert broker_properties_string(props, 4) == "KEYS\x01k\x02WAIT\x01true"
    assert broker_properties_string(props, 5) == "KEYS\x01k\x02WAIT\x01true\x02"
    assert broker_properties_string({}, 4) == broker_properties_string({}, 5) == ""
    b = broker_batch_record_properties({"WAIT": "true"}, {"CLUSTER": "C"}, 4)
    assert b == "WAIT\x01true\x02CLUSTER\x01C"
    assert broker_batch_record_properties({"WAIT": "true"}, {"CLUSTER": "C"}, 5) == "WAIT\x01true\x02CLUSTER\x01C\x02"
    assert split_batch_record_properties(b) == ({"WAIT": "true"}, {"CLUSTER": "C"})


# ------------------------------------------------------------------ the shared broker stores


def _load(store: str):
    d = STORES / store
    puts = []
    with gzip.open(d / "puts.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            o = json.loads(line)
            if o.get("type") == "put":
                puts.append(o)
    recs = []
    with gzip.open(d / "broker-read.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            o = json.loads(line)
            if o.get("type") == "clmsg":
                recs.append(o)
    return puts, recs


def _describe(rec, got):
    return f"offset={rec['offset']} raw={rec['msg']['propertiesRaw']!r} got={got!r}"


def _batch_groups(puts, recs):
    """{put idx: records of that classic batch}, a put covering [wroteOffset, wroteOffset + wroteBytes)."""
    offsets = sorted(r["offset"] for r in recs)
    by_offset = {r["offset"]: r for r in recs}
    groups = {}
    for p in puts:
        if p.get("msgNum", 1) > 1:
            lo, hi = p["wroteOffset"], p["wroteOffset"] + p["wroteBytes"]
            members = [by_offset[o] for o in offsets if lo <= o < hi]
            assert len(members) == p["msgNum"], f"put {p['idx']}: {len(members)} records, msgNum {p['msgNum']}"
            groups[p["idx"]] = members
    return groups


def _reproduce(props, version, in_batch):
    if in_batch:
        entry = {k: v for k, v in props.items() if k not in BATCH_KEYS}
        batch = {k: v for k, v in props.items() if k in BATCH_KEYS}
        return broker_batch_record_properties(entry, batch, version)
    return broker_properties_string(props, version)


def _java_drops_something(raw):
    """True if the Java decoder drops a segment of ``raw`` (empty value, empty key, fragment)."""
    return parse_properties_lossless(raw) != parse_properties(raw)


# records per store whose raw holds an entry the Java decoder drops (all are user property a="")
LOSSY_RECORDS = {"4.9.3-clean": 195, "4.9.3-crash": 195, "4.9.3-ext": 195, "5.3.3-clean": 195, "5.3.3-v2topic": 0}


@pytest.mark.parametrize("store", STORE_NAMES)
def test_store_properties_reproduced(store):
    """Every record, from its full (lossless) property map: byte-identical, batches included."""
    version = int(store.split(".")[0])
    puts, recs = _load(store)
    assert len(recs) == EXPECTED_RECORDS[store]
    groups = _batch_groups(puts, recs)
    in_batch = {r["offset"] for members in groups.values() for r in members}

    failures = []
    for r in recs:
        raw = r["msg"]["propertiesRaw"]
        props = parse_properties_lossless(raw)
        # the lossless map only adds the entries the Java decoder drops
        java = r["msg"]["properties"]
        assert parse_properties(raw) == java
        assert {k: v for k, v in props.items() if v != ""} == java
        got = _reproduce(props, version, r["offset"] in in_batch)
        if got != raw:
            failures.append(_describe(r, got))
        if r["offset"] in in_batch:
            entry, batch = split_batch_record_properties(raw, BATCH_KEYS)
            if batch != {"CLUSTER": props["CLUSTER"]} or broker_batch_record_properties(entry, batch, version) != raw:
                failures.append("batch split " + _describe(r, (entry, batch)))

    for idx, members in groups.items():
        entries, batch = split_batch_group([m["msg"]["propertiesRaw"] for m in members], BATCH_KEYS)
        for m, e in zip(members, entries):
            assert broker_batch_record_properties(e, batch, version) == m["msg"]["propertiesRaw"]

    print(f"{store}: {len(recs) - len(failures)}/{len(recs)} reproduced ({len(in_batch)} in {len(groups)} batches)")
    assert not failures, f"{len(failures)} of {len(recs)} records not reproduced:\n" + "\n".join(failures[:50])


@pytest.mark.parametrize("store", STORE_NAMES)
def test_store_properties_from_java_decoded_dict(store):
    """From the broker's decoded ``properties`` dict alone: exactly the records holding an entry the
    Java decoder drops (``a\\x01`` = empty value) are NOT reproducible -- the information is gone.
    All others reproduce byte-for-byte.  This pins and reports that set precisely."""
    version = int(store.split(".")[0])
    puts, recs = _load(store)
    groups = _batch_groups(puts, recs)
    in_batch = {r["offset"] for members in groups.values() for r in members}

    unreproducible = []
    unexpected = []
    for r in recs:
        raw = r["msg"]["propertiesRaw"]
        got = _reproduce(r["msg"]["properties"], version, r["offset"] in in_batch)
        lossy = _java_drops_something(raw)
        if got != raw:
            (unreproducible if lossy else unexpected).append(r)
            if lossy:  # the only difference is the dropped empty-valued entry
                assert _reproduce(parse_properties_lossless(raw), version, r["offset"] in in_batch) == raw
        elif lossy:
            unexpected.append(r)
    print(
        f"{store}: {len(recs) - len(unreproducible)}/{len(recs)} reproduced from the decoded dict; "
        f"not reproducible (empty-valued entry dropped by the Java decoder) at offsets "
        f"{[r['offset'] for r in unreproducible]}"
    )
    assert not unexpected, [_describe(r, None) for r in unexpected[:20]]
    assert len(unreproducible) == LOSSY_RECORDS[store]
    for r in unreproducible:
        dropped = set(parse_properties_lossless(r["msg"]["propertiesRaw"]).items()) - set(r["msg"]["properties"].items())
        assert dropped == {("a", "")}, (r["offset"], dropped)
