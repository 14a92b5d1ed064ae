"""One construct declaration per on-disk record (FORMAT.md §2, §7–§11).

These Structs are the single source of truth for every layout. The hot paths in
:mod:`formats.fast` (numpy dtypes, ``struct`` formats, field offsets) are derived
from the field lists below, and ``tests/test_formats_layout.py`` checks they agree.

Everything is big-endian and signed, as Java's ``ByteBuffer`` writes it.
"""

from __future__ import annotations

from construct import (
    Bytes,
    Const,
    IfThenElse,
    Int8sb,
    Int16sb,
    Int32sb,
    Int64sb,
    Struct,
    this,
)

MAGIC_V1 = -626843481  # 0xDAA320A7
MAGIC_V2 = -626843477  # 0xDAA320AB (5.x, 2-byte topic length)
MAGIC_BLANK = -875286124  # 0xCBD43194 end-of-segment marker
MESSAGE_MAGICS = (MAGIC_V1, MAGIC_V2)

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
SYSFLAG_NEED_UNWRAP = 0x40
SYSFLAG_INNER_BATCH = 0x80

TRANSACTION_NOT = 0x0
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
TRANSACTION_NAMES = {0x0: "normal", 0x4: "prepared", 0x8: "commit", 0xC: "rollback"}

BLANK_MIN_LENGTH = 8  # END_FILE_MIN_BLANK_LENGTH
CRC32_RESERVED_LEN = 20  # len("__CRC32#") + 1 + 10 + 1
MAX_PROPERTIES_LENGTH = 32767

# --- commitlog message (§2.1) ------------------------------------------------

HOST_V4 = Struct("ip" / Bytes(4), "port" / Int32sb)
HOST_V6 = Struct("ip" / Bytes(16), "port" / Int32sb)

# The fixed prefix every record shares, up to (not including) the born host.
# Field order, names and widths here drive formats.fast.
MESSAGE_PREFIX_FIELDS = (
    ("totalSize", Int32sb),
    ("magicCode", Int32sb),
    ("bodyCRC", Int32sb),
    ("queueId", Int32sb),
    ("flag", Int32sb),
    ("queueOffset", Int64sb),
    ("physicalOffset", Int64sb),
    ("sysFlag", Int32sb),
    ("bornTimestamp", Int64sb),
)

# Fields between the born host and the body, in order (store host width varies).
MESSAGE_MIDDLE_FIELDS = (
    ("storeTimestamp", Int64sb),
    ("storeHost", None),  # HOST_V4 / HOST_V6 by sysflag
    ("reconsumeTimes", Int32sb),
    ("preparedTransactionOffset", Int64sb),
    ("bodyLength", Int32sb),
)

MESSAGE = Struct(
    *[name / ctype for name, ctype in MESSAGE_PREFIX_FIELDS],
    "bornHost" / IfThenElse(this.sysFlag & SYSFLAG_BORNHOST_V6, HOST_V6, HOST_V4),
    "storeTimestamp" / Int64sb,
    "storeHost" / IfThenElse(this.sysFlag & SYSFLAG_STOREHOST_V6, HOST_V6, HOST_V4),
    "reconsumeTimes" / Int32sb,
    "preparedTransactionOffset" / Int64sb,
    "bodyLength" / Int32sb,
    "body" / Bytes(lambda ctx: max(ctx.bodyLength, 0)),
    "topicLength" / IfThenElse(this.magicCode == MAGIC_V2, Int16sb, Int8sb),
    "topic" / Bytes(lambda ctx: max(ctx.topicLength, 0)),
    "propertiesLength" / Int16sb,
    "properties" / Bytes(lambda ctx: max(ctx.propertiesLength, 0)),
)

# --- BLANK end-of-segment marker (§2.6) ---------------------------------------

BLANK = Struct("totalSize" / Int32sb, "magicCode" / Const(MAGIC_BLANK, Int32sb))

# --- consume queue unit (§7.1) -------------------------------------------------

CQ_UNIT_FIELDS = (("phyOffset", Int64sb), ("size", Int32sb), ("tagsCode", Int64sb))
CQ_UNIT = Struct(*[name / ctype for name, ctype in CQ_UNIT_FIELDS])
CQ_UNIT_SIZE = CQ_UNIT.sizeof()  # 20
CQ_FILLER = (0, 0x7FFFFFFF, 0)  # pre-blank filling unit (§7.3)

# --- batch consume queue unit (§9.2) -------------------------------------------

BCQ_UNIT_FIELDS = (
    ("phyOffset", Int64sb),
    ("size", Int32sb),
    ("tagsCode", Int64sb),
    ("storeTime", Int64sb),
    ("msgBaseOffset", Int64sb),
    ("batchSize", Int16sb),
    ("compactedOffset", Int32sb),  # written as INVALID_POS (-1)
    ("reserved", Int32sb),  # written as 0
)
BCQ_UNIT = Struct(*[name / ctype for name, ctype in BCQ_UNIT_FIELDS])
BCQ_UNIT_SIZE = BCQ_UNIT.sizeof()  # 46
BCQ_INVALID_POS = -1
DEFAULT_BCQ_FILE_SIZE = 300_000 * BCQ_UNIT_SIZE  # mapperFileSizeBatchConsumeQueue

# --- consume queue ext unit (§8.1) ---------------------------------------------

CQEXT_HEADER_FIELDS = (
    ("size", Int16sb),
    ("tagsCode", Int64sb),
    ("msgStoreTime", Int64sb),
    ("bitMapSize", Int16sb),
)
CQEXT_UNIT = Struct(
    *[name / ctype for name, ctype in CQEXT_HEADER_FIELDS],
    "filterBitMap" / Bytes(lambda ctx: max(ctx.bitMapSize, 0)),
)
CQEXT_MIN_UNIT_SIZE = 20
CQEXT_MAX_UNIT_SIZE = 32767
CQEXT_END_BLANK = 4  # END_BLANK_DATA_LENGTH kept free at the end of every file

# --- index file (§10.1) --------------------------------------------------------

INDEX_HEADER_FIELDS = (
    ("beginTimestamp", Int64sb),
    ("endTimestamp", Int64sb),
    ("beginPhyOffset", Int64sb),
    ("endPhyOffset", Int64sb),
    ("hashSlotCount", Int32sb),
    ("indexCount", Int32sb),
)
INDEX_HEADER = Struct(*[name / ctype for name, ctype in INDEX_HEADER_FIELDS])
INDEX_HEADER_SIZE = INDEX_HEADER.sizeof()  # 40
INDEX_SLOT = Struct("entry" / Int32sb)
INDEX_SLOT_SIZE = INDEX_SLOT.sizeof()  # 4
INDEX_ENTRY_FIELDS = (
    ("keyHash", Int32sb),
    ("phyOffset", Int64sb),
    ("timeDiff", Int32sb),
    ("prevIndex", Int32sb),
)
INDEX_ENTRY = Struct(*[name / ctype for name, ctype in INDEX_ENTRY_FIELDS])
INDEX_ENTRY_SIZE = INDEX_ENTRY.sizeof()  # 20

# --- checkpoint (§11) ----------------------------------------------------------

CHECKPOINT_FIELDS = (
    ("physicMsgTimestamp", Int64sb),
    ("logicsMsgTimestamp", Int64sb),
    ("indexMsgTimestamp", Int64sb),
    ("masterFlushedOffset", Int64sb),  # 5.x
    ("confirmPhyOffset", Int64sb),  # 5.x
)
CHECKPOINT = Struct(*[name / ctype for name, ctype in CHECKPOINT_FIELDS])
CHECKPOINT_FILE_SIZE = 4096
CHECKPOINT_USED_4X = 24
CHECKPOINT_USED_5X = 40


def host_width(sysflag: int, bit: int) -> int:
    """Width of a host field (ip + port): 20 for IPv6, 8 for IPv4."""
    return 20 if sysflag & bit else 8


def message_total_size(sysflag: int, magic: int, body_len: int, topic_len: int, props_len: int) -> int:
    """TOTALSIZE formula of §2.2: 74 + BH + SH + TW + B + T + P."""
    bh = host_width(sysflag, SYSFLAG_BORNHOST_V6)
    sh = host_width(sysflag, SYSFLAG_STOREHOST_V6)
    tw = 2 if magic == MAGIC_V2 else 1
    return 74 + bh + sh + tw + max(body_len, 0) + topic_len + max(props_len, 0)


MIN_MESSAGE_SIZE = message_total_size(0, MAGIC_V1, 0, 0, 0)  # 91


# --- views derived from a declaration (hot paths: numpy dtypes, struct formats, field offsets) -------------------


def field_offsets(fields) -> dict[str, int]:
    """Byte offset of each field of a declared record (name -> offset), in declaration order."""
    out, at = {}, 0
    for name, ctype in fields:
        out[name] = at
        at += ctype.sizeof()
    return out


def struct_format(fields) -> str:
    """The ``struct`` format of a record of big-endian signed integers, from its declaration."""
    return ">" + "".join({1: "b", 2: "h", 4: "i", 8: "q"}[ctype.sizeof()] for _, ctype in fields)


def fields_dtype(fields):
    """The big-endian numpy dtype of a record of signed integers, from its declaration (numpy imported here, so
    modules that only parse records do not pay for it)."""
    import numpy as np

    return np.dtype([(name, f">i{ctype.sizeof()}") for name, ctype in fields])
