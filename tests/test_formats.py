"""Format layer: FORMAT.md §18 test vectors, and the fast paths equal to the construct declarations."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from rmqstore_cli.formats import extaddr, fast, records
from rmqstore_cli.formats.hashing import crc31, crc_property_digits, index_key_hash, java_hash, parse_crc_property_digits
from rmqstore_cli.formats.message import decode_message, encode_message
from rmqstore_cli.formats.msgid import decode_offset_msgid, decode_uniq_key, encode_offset_msgid, host_to_str, parse_host
from rmqstore_cli.formats.properties import parse_properties, serialize_properties
from rmqstore_cli.formats.tags import DEFAULT_DELAY_TABLE, TagsCodeError, java_parse_int, tags_code

from .conftest import STORE_NAMES, broker_read, shared_store


# --- §18.1 / 18.2 hashes ----------------------------------------------------------------

@pytest.mark.parametrize("s,expected", [
    ("", 0), ("a", 97), ("TagA", 2598919), ("TopicTest", -1902610879), ("TopicTest#KEY1", -1656969516),
    ("TopicTest#", 1148604930), ("héllo", 103094734), ("中文", 646394), ("😀", 1772899),
    ("polygenelubricants", -2147483648),
])
def test_java_hash_vectors(s, expected):
    assert java_hash(s) == expected


@pytest.mark.parametrize("key,key_hash,slot", [
    ("TopicTest#KEY1", 1656969516, 1969516), ("TopicTest#ORDER_1001", 1605611091, 611091), ("polygenelubricants", 0, 0),
])
def test_index_key_hash_vectors(key, key_hash, slot):
    assert index_key_hash(key) == key_hash
    assert key_hash % 5_000_000 == slot


# --- §18.3 CRC -----------------------------------------------------------------------------

@pytest.mark.parametrize("data,stored", [(b"", 0), (b"hello", 907060870), (b"123456789", 1274296614), (b"rocketmq", 1048239581)])
def test_crc31_vectors(data, stored):
    assert crc31(data) == stored


def test_crc_property_digits():
    assert crc_property_digits(907060870) == "0780607090"
    assert crc_property_digits(0) == "0000000000"
    assert parse_crc_property_digits("0780607090") == 907060870
    assert parse_crc_property_digits("8463847412") == -1  # 2147483648 wraps negative in Java -> absent
    assert parse_crc_property_digits("7463847412") == 2147483647  # Integer.MAX_VALUE, just below the wrap
    assert parse_crc_property_digits("12a4") == -1


# --- §18.4 a complete record ---------------------------------------------------------------

RECORD_18_4 = bytes.fromhex(
    "0000006d daa320a7 3610a686 00000001 00000000 0000000000000007 0000000000000000 00000000"
    "0000018bcfe56800 c0a80002 0000cb20 0000018bcfe5687b c0a80001 00002a9f 00000000"
    "0000000000000000 00000005 68656c6c6f 09 546f70696354657374 0004 61016202".replace(" ", ""))


def _encode_18_4(**kw):
    args = dict(topic=b"TopicTest", queue_id=1, flag=0, queue_offset=7, physical_offset=0, sysflag=0,
                born_timestamp=1700000000000, born_host=(bytes([192, 168, 0, 2]), 52000),
                store_timestamp=1700000000123, store_host=(bytes([192, 168, 0, 1]), 10911),
                reconsume_times=0, prepared_offset=0, body=b"hello", properties=b"a\x01b\x02")
    args.update(kw)
    return encode_message(**args)


def test_record_vector_encode_and_construct():
    assert _encode_18_4() == RECORD_18_4
    parsed = records.MESSAGE.parse(RECORD_18_4)
    assert parsed.totalSize == 109 and parsed.body == b"hello" and parsed.topic == b"TopicTest"
    assert records.MESSAGE.build(parsed) == RECORD_18_4


def test_record_vector_sizes():
    v6 = records.SYSFLAG_BORNHOST_V6 | records.SYSFLAG_STOREHOST_V6
    assert len(_encode_18_4(sysflag=v6, born_host=(bytes(16), 1), store_host=(bytes(16), 2))) == 133
    assert len(_encode_18_4(magic=records.MAGIC_V2)) == 110
    assert len(_encode_18_4(body=b"", properties=b"")) == 100


def test_record_vector_with_crc_property():
    rec = _encode_18_4(queue_id=0, queue_offset=7, born_host=(bytes([127, 0, 0, 1]), 0),
                       store_host=(bytes([127, 0, 0, 1]), 10911), append_crc_property=True)
    assert len(rec) == 129
    assert rec.endswith(b"a\x01b\x02__CRC32#\x010149618270\x02")
    assert fast.check_property_crc(rec, 0, 129)
    flipped = bytearray(rec)
    flipped[-25] ^= 1  # a property byte before the CRC entry
    assert not fast.check_property_crc(bytes(flipped), 0, 129)


def test_blank_vector():
    assert records.BLANK.build({"totalSize": 1000}) == bytes.fromhex("000003e8cbd43194")


# --- §18.5 properties ------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("a\x01b", {"a": "b"}), ("a\x01b\x02", {"a": "b"}),
    ("KEYS\x01k1 k2\x02TAGS\x01TagA\x02", {"KEYS": "k1 k2", "TAGS": "TagA"}),
    ("\x01x\x02ab\x02k\x01\x02", {}), ("k\x01v\x01w\x02", {"k": "v\x01w"}),
])
def test_properties_parse_vectors(text, expected):
    assert parse_properties(text) == expected


def test_properties_trailing_separator_by_version():
    assert serialize_properties([("k1", "v1"), ("k2", "v2")], 4) == "k1\x01v1\x02k2\x01v2"
    assert serialize_properties([("k1", "v1"), ("k2", "v2")], 5) == "k1\x01v1\x02k2\x01v2\x02"


# --- §18.6 ids --------------------------------------------------------------------------

def test_offset_msgid_vectors():
    ip = bytes([192, 168, 0, 1])
    assert encode_offset_msgid(ip, 10911, 0) == "C0A8000100002A9F0000000000000000"
    assert encode_offset_msgid(ip, 10911, 1073741824) == "C0A8000100002A9F0000000040000000"
    v6 = encode_offset_msgid(bytes(15) + b"\x01", 10911, 5)
    assert v6 == "0000000000000000000000000000000100002A9F0000000000000005"
    d = decode_offset_msgid(v6.lower())
    assert (d.host, d.port, d.offset) == ("0:0:0:0:0:0:0:1", 10911, 5)


def test_uniq_key_vector():
    u = decode_uniq_key("C0A8000104D21B6D3586000186A00007")
    assert (u.host, u.pid, u.class_loader_hash, u.time_in_month_ms, u.counter) == ("192.168.0.1", 1234, 0x1B6D3586, 100000, 7)


def test_hosts():
    assert parse_host("[::ffff:1.2.3.4]:80") == (bytes([1, 2, 3, 4]), 80)  # Java: an Inet4Address
    assert parse_host("10.0.0.1:50001") == (bytes([10, 0, 0, 1]), 50001)
    assert host_to_str(bytes.fromhex("20010db8000000000000000000000001")) == "2001:db8:0:0:0:0:0:1"


# --- §18.7 ext addresses, delay tagsCode -----------------------------------------------

def test_ext_address_vectors():
    assert extaddr.MAX_ADDR == -2147483649 and extaddr.MAX_REAL_OFFSET == 9223372034707292159
    assert extaddr.decorate(0) == -9223372036854775808
    assert extaddr.decorate(22) == -9223372036854775786
    assert extaddr.decorate(50331648) & 0xFFFFFFFFFFFFFFFF == 0x8000000003000000
    for v in (0, 22, 50331648):
        assert extaddr.undecorate(extaddr.decorate(v)) == v
    for v in (12345, -5, -(1 << 31)):
        assert not extaddr.is_ext_addr(v)


def test_ext_unit_vector():
    raw = bytes.fromhex("001c000000000027a8070000018bcfe5687b00080100000000000080")
    u = records.CQEXT_UNIT.parse(raw)
    assert (u.size, u.tagsCode, u.msgStoreTime, u.bitMapSize) == (28, java_hash("TagA"), 1700000000123, 8)
    assert records.CQEXT_UNIT.build(u) == raw


def test_delay_tags_code_vector():
    assert tags_code("SCHEDULE_TOPIC_XXXX", {"DELAY": "3"}, 1700000000123) == 1700000010123
    assert tags_code("T", {"TAGS": "TagA", "DELAY": "3"}, 5) == 2598919  # only the schedule topic is redirected


# --- one declaration per record: fast paths equal construct ----------------------------

@pytest.mark.parametrize("text, level", [
    ("3", 3), ("+3", 3), ("-1", None), ("0", None), ("007", 7), ("\u0663", 3),  # Arabic-Indic three: Character.digit
    ("2147483647", 18), ("-2147483648", None),  # int's range: capped at the table's last level, or no override
    (" 3", "bad"), ("3 ", "bad"), ("1_0", "bad"), ("", "bad"), ("+", "bad"), ("-", "bad"), ("3.0", "bad"),
    ("2147483648", "bad"), ("-2147483649", "bad"), ("\U0001d7d1", "bad"),  # a digit past U+FFFF: two chars, no digit
])
def test_delay_parses_as_integer_parseint(text, level):
    """CommitLog.checkMessageAndReturnSize reads DELAY with Integer.parseInt: what it throws on (blanks, underscores,
    out of int's range; all of which Python's int() takes or widens) makes the record undispatchable; the rest is the
    delay level, capped at the table's last one, an override only when > 0."""
    ts = 1_700_000_000_000
    if level == "bad":
        assert java_parse_int(text) is None
        with pytest.raises(TagsCodeError):
            tags_code("SCHEDULE_TOPIC_XXXX", {"DELAY": text}, ts)
        return
    assert java_parse_int(text) == int(text)
    want = 0 if level is None else ts + DEFAULT_DELAY_TABLE[level]
    assert tags_code("SCHEDULE_TOPIC_XXXX", {"DELAY": text}, ts) == want


def test_fast_dtypes_derived_from_declarations():
    assert fast.PREFIX_SIZE == sum(c.sizeof() for _, c in records.MESSAGE_PREFIX_FIELDS) == 48
    assert fast.PREFIX_STRUCT.size == fast.PREFIX_SIZE
    from rmqstore_cli.engine.derived.consumequeue import CQ_DTYPE
    from rmqstore_cli.engine.derived.index import ENTRY_DTYPE, HEADER_STRUCT

    assert CQ_DTYPE.itemsize == records.CQ_UNIT.sizeof() == 20
    assert ENTRY_DTYPE.itemsize == records.INDEX_ENTRY.sizeof() == 20
    assert HEADER_STRUCT.size == records.INDEX_HEADER.sizeof() == 40
    unit = records.CQ_UNIT.build({"phyOffset": 123456789012, "size": 777, "tagsCode": -5})
    arr = np.frombuffer(unit, dtype=CQ_DTYPE)
    assert (int(arr["phyOffset"][0]), int(arr["size"][0]), int(arr["tagsCode"][0])) == (123456789012, 777, -5)


@pytest.mark.parametrize("name", STORE_NAMES)
def test_fast_headers_equal_construct_on_broker_records(name):
    """Column gather, the struct decoder and construct agree on every record of the first segments."""
    cl = shared_store(name) / "commitlog"
    checked = 0
    for seg in sorted(cl.iterdir())[:4]:
        data = seg.read_bytes()
        w = fast.walk(data)
        h = fast.decode_headers(data, w.offsets)
        assert (h.reason == fast.R_OK).all() and fast.check_body_crc(data, h).all()
        for i, off in enumerate(w.offsets.tolist()):
            c = records.MESSAGE.parse(data[off:])
            m = decode_message(data, off)
            assert c.totalSize == int(h.totalSize[i]) == m["storeSize"] == int(h.computedSize[i])
            assert c.queueOffset == int(h.queueOffset[i]) == m["queueOffset"]
            assert c.physicalOffset == int(h.physicalOffset[i]) == m["commitLogOffset"]
            assert c.storeTimestamp == int(h.storeTimestamp[i]) == m["storeTimestamp"]
            assert c.bodyLength == int(h.bodyLength[i]) == m["bodyLen"]
            assert c.body == data[int(h.bodyStart[i]):int(h.bodyStart[i]) + c.bodyLength] == m["body"]
            assert c.topic == data[int(h.topicStart[i]):int(h.topicStart[i]) + int(h.topicLength[i])]
            assert c.properties.decode("utf-8", "replace") == m["propertiesRaw"]
            assert records.MESSAGE.build(c) == data[off:off + c.totalSize]
            checked += 1
    assert checked > 0


def test_walk_stop_kinds():
    rec = _encode_18_4()
    blank = records.BLANK.build({"totalSize": 64})
    buf = rec + rec + blank + bytes(64)
    w = fast.walk(buf)
    assert w.offsets.tolist() == [0, 109] and w.kind == fast.STOP_BLANK and w.size == 64
    assert fast.walk(rec + bytes(40)).kind == fast.STOP_ZERO
    assert fast.walk(rec + rec[:50]).kind == fast.STOP_TORN
    assert fast.walk(rec + b"\xff" * 16).kind == fast.STOP_BAD_MAGIC
    bad_size = bytearray(rec)
    struct.pack_into(">i", bad_size, 0, 12)
    assert fast.walk(bytes(bad_size)).kind == fast.STOP_BAD_SIZE
    w = fast.walk(rec * 5, max_records=2)
    assert w.kind == fast.STOP_CHUNK and w.stop == 218


def test_decode_headers_flags_structural_damage():
    rec = bytearray(_encode_18_4())
    struct.pack_into(">i", rec, 84, 50)  # body length longer than the record
    h = fast.decode_headers(bytes(rec), np.array([0]))
    assert h.reason[0] == fast.R_LENGTHS
    rec = bytearray(_encode_18_4())
    rec[93] = 0x80  # topic length byte -128 (signed)
    h = fast.decode_headers(bytes(rec), np.array([0]))
    assert h.reason[0] == fast.R_TOPIC_LENGTH
    rec = bytearray(_encode_18_4() + bytes(8))
    struct.pack_into(">i", rec, 0, 117)
    h = fast.decode_headers(bytes(rec), np.array([0]))
    assert h.reason[0] == fast.R_TOTALSIZE


def test_broker_blank_markers_found():
    """BLANK positions of a broker store equal the blank lines of its read-back."""
    from rmqstore_cli.engine.store import Store

    st = Store.open(str(shared_store("4.9.3-clean")))
    res = st.commitlog.find_end()
    assert [(b["offset"], b["totalSize"]) for b in broker_read("4.9.3-clean")["blank"]] == res.blanks
    assert res.stop.offset == broker_read("4.9.3-clean")["store"][0]["maxPhyOffset"]
