"""The RocksDB consume queue's keys and values (5.3 ``storeType=defaultRocksDB``), declared once.

The broker keeps its consume queues in one RocksDB database (``consumequeue/``) with two column
families (RocksDBConsumeQueueTable, RocksDBConsumeQueueOffsetTable):

* ``default``: one entry per unit. Key ``topicLen | 0x01 | topic | 0x01 | queueId | 0x01 |
  queueOffset``, value ``phyOffset | size | tagsCode | storeTimestamp`` (28 bytes: the file unit's
  fields plus the store time).
* ``offset``: per queue its ``max`` (and, once the broker corrected it, ``min``) unit as ``phyOffset |
  cqOffset``, and under topic ``CHECKPOINT_TOPIC`` / ``max`` / queue 0 a single int64: the highest
  commitlog offset dispatched into the database.

Integers are big-endian (Java's ByteBuffer), topics UTF-8. Keys sort by topic length, topic, queue id,
then queue offset, so one queue's units are one contiguous, ordered key range. The numpy dtypes and
``struct`` formats below are derived from these Structs; nothing else spells the widths again.
"""

from __future__ import annotations

import struct

import numpy as np
from construct import Bytes, Const, Int32sb, Int64sb, Struct, this

from .records import fields_dtype

CTRL_0, CTRL_1, CTRL_2 = b"\x00", b"\x01", b"\x02"  # AbstractRocksDBStorage.CTRL_0/1/2

DEFAULT_CF = "default"
OFFSET_CF = "offset"
CHECKPOINT_TOPIC = "CHECKPOINT_TOPIC"  # TopicValidator.RMQ_SYS_ROCKSDB_OFFSET_TOPIC
MAX_KIND, MIN_KIND = b"max", b"min"

# --- default column family: the units -------------------------------------------------------

CQ_KEY = Struct(
    "topicLength" / Int32sb,
    Const(CTRL_1),
    "topic" / Bytes(this.topicLength),
    Const(CTRL_1),
    "queueId" / Int32sb,
    Const(CTRL_1),
    "queueOffset" / Int64sb,
)
CQ_VALUE_FIELDS = (("phyOffset", Int64sb), ("size", Int32sb), ("tagsCode", Int64sb), ("storeTime", Int64sb))
CQ_VALUE = Struct(*[name / ctype for name, ctype in CQ_VALUE_FIELDS])
CQ_VALUE_SIZE = CQ_VALUE.sizeof()  # 28 (CQ_UNIT_SIZE of RocksDBConsumeQueueTable)
CQ_VALUE_DTYPE = fields_dtype(CQ_VALUE_FIELDS)
assert CQ_VALUE_DTYPE.itemsize == CQ_VALUE_SIZE

_QUEUE_OFFSET = CQ_KEY.subcons[-1].subcon  # the key's last field
QUEUE_OFFSET_SIZE = _QUEUE_OFFSET.sizeof()  # 8: a unit key ends with its queue offset
_QOFF = struct.Struct(">q")
assert _QOFF.size == QUEUE_OFFSET_SIZE

# --- offset column family: per-queue max/min and the dispatch checkpoint ---------------------

OFFSET_KEY = Struct(
    "topicLength" / Int32sb,
    Const(CTRL_1),
    "topic" / Bytes(this.topicLength),
    Const(CTRL_1),
    "kind" / Bytes(3),  # b"max" or b"min"
    Const(CTRL_1),
    "queueId" / Int32sb,
)
OFFSET_VALUE = Struct("phyOffset" / Int64sb, "cqOffset" / Int64sb)
OFFSET_VALUE_SIZE = OFFSET_VALUE.sizeof()  # 16
CHECKPOINT_VALUE = Struct("maxPhyOffset" / Int64sb)
CHECKPOINT_VALUE_SIZE = CHECKPOINT_VALUE.sizeof()  # 8


def _topic_bytes(topic: str | bytes) -> bytes:
    return topic.encode("utf-8") if isinstance(topic, str) else topic


def queue_prefix(topic: str | bytes, queue_id: int) -> bytes:
    """Every unit key of one queue starts with these bytes (the key up to its queue offset)."""
    key = unit_key(topic, queue_id, 0)
    return key[: len(key) - QUEUE_OFFSET_SIZE]


def unit_key(topic: str | bytes, queue_id: int, queue_offset: int) -> bytes:
    t = _topic_bytes(topic)
    return CQ_KEY.build({"topicLength": len(t), "topic": t, "queueId": queue_id, "queueOffset": queue_offset})


def queue_range(topic: str | bytes, queue_id: int) -> tuple[bytes, bytes]:
    """[start, end) of one queue's keys, as the broker's range delete spans them (``buildDeleteCQKey``)."""
    p = queue_prefix(topic, queue_id)
    return p[:-1] + CTRL_0, p[:-1] + CTRL_2


def offset_key(topic: str | bytes, queue_id: int, kind: bytes = MAX_KIND) -> bytes:
    t = _topic_bytes(topic)
    return OFFSET_KEY.build({"topicLength": len(t), "topic": t, "kind": kind, "queueId": queue_id})


CHECKPOINT_KEY = offset_key(CHECKPOINT_TOPIC, 0, MAX_KIND)
CQ_KEY_LENGTH_WITHOUT_TOPIC = len(unit_key(b"", 0, 0))  # 19
OFFSET_KEY_LENGTH_WITHOUT_TOPIC = len(offset_key(b"", 0))  # 14


def parse_unit_key(key: bytes):
    """(topic, queueId, queueOffset) of a unit key, or None when the key is not one."""
    try:
        k = CQ_KEY.parse(key)
    except Exception:  # construct raises its own errors on any malformed key
        return None
    if len(key) != CQ_KEY_LENGTH_WITHOUT_TOPIC + k.topicLength:
        return None
    try:
        topic = k.topic.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return topic, k.queueId, k.queueOffset


def parse_offset_key(key: bytes):
    """(topic, kind ``"max"``/``"min"``, queueId) of an offset-table key, or None."""
    try:
        k = OFFSET_KEY.parse(key)
    except Exception:
        return None
    if len(key) != OFFSET_KEY_LENGTH_WITHOUT_TOPIC + k.topicLength:
        return None
    try:
        return k.topic.decode("utf-8"), k.kind.decode("ascii"), k.queueId
    except UnicodeDecodeError:
        return None


def parse_offset_value(value: bytes) -> tuple[int, int] | None:
    """(phyOffset, cqOffset) of a max/min entry, or None when the value is not 16 bytes."""
    if len(value) != OFFSET_VALUE_SIZE:
        return None
    v = OFFSET_VALUE.parse(value)
    return v.phyOffset, v.cqOffset


def parse_checkpoint_value(value: bytes) -> int | None:
    if len(value) != CHECKPOINT_VALUE_SIZE:
        return None
    return CHECKPOINT_VALUE.parse(value).maxPhyOffset


def queue_offset_of(key: bytes) -> int:
    """The queue offset a unit key ends with (hot path: no construct parse)."""
    return _QOFF.unpack_from(key, len(key) - QUEUE_OFFSET_SIZE)[0]


def decode_values(joined: bytes, n: int) -> np.ndarray:
    """``n`` unit values concatenated (28 bytes each) -> a CQ_VALUE_DTYPE array (a view, no copy)."""
    return np.frombuffer(joined, dtype=CQ_VALUE_DTYPE, count=n)
