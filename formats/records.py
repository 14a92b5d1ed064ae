"""One construct declaration per on-disk record (FORMAT.md §2, §7–§11).

These Structs are the single source of truth for every layout. The hot paths in
:mod:`formats.fast` (numpy dtypes, ``struct`` formats, field offsets) are derived
from the field lists below, and ``tests/test_formats_structs.py`` checks they agree.

Every fixed field is a big-endian signed integer, as Java's ``ByteBuffer`` writes it: the field lists name
their widths with :class:`Int` (``Int32sb`` here is construct's ``Int32sb`` in the Structs). The Structs
themselves are assembled from the same lists when one is first used (:func:`__getattr__`): importing
construct costs ~20 ms, and a command that reads records through the derived views never needs it.
"""

from __future__ import annotations


class Int:
    """A big-endian signed integer field of ``width`` bytes: construct's ``Int{8,16,32,64}sb``, which the Structs
    put in its place; ``sizeof()`` as construct's."""

    __slots__ = ("width",)

    def __init__(self, width: int):
        self.width = width

    def sizeof(self) -> int:
        return self.width

    def __repr__(self) -> str:
        return f"Int{self.width * 8}sb"


Int8sb, Int16sb, Int32sb, Int64sb = Int(1), Int(2), Int(4), Int(8)


def fields_size(fields) -> int:
    """The bytes of a record of fixed fields, from its declaration."""
    return sum(ctype.sizeof() for _, ctype in fields)

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
# the whole record (hosts by sysFlag, body, topic, properties): MESSAGE, assembled in _declare below

# --- BLANK end-of-segment marker (§2.6) ---------------------------------------

# int totalSize (the bytes left in the file), int magicCode = MAGIC_BLANK: BLANK, in _declare below

# --- consume queue unit (§7.1) -------------------------------------------------

CQ_UNIT_FIELDS = (("phyOffset", Int64sb), ("size", Int32sb), ("tagsCode", Int64sb))
CQ_UNIT_SIZE = fields_size(CQ_UNIT_FIELDS)  # 20
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
BCQ_UNIT_SIZE = fields_size(BCQ_UNIT_FIELDS)  # 46
BCQ_INVALID_POS = -1
DEFAULT_BCQ_FILE_SIZE = 300_000 * BCQ_UNIT_SIZE  # mapperFileSizeBatchConsumeQueue

# --- consume queue ext unit (§8.1) ---------------------------------------------

CQEXT_HEADER_FIELDS = (
    ("size", Int16sb),
    ("tagsCode", Int64sb),
    ("msgStoreTime", Int64sb),
    ("bitMapSize", Int16sb),
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
INDEX_HEADER_SIZE = fields_size(INDEX_HEADER_FIELDS)  # 40
INDEX_SLOT_FIELDS = (("entry", Int32sb),)
INDEX_SLOT_SIZE = fields_size(INDEX_SLOT_FIELDS)  # 4
INDEX_ENTRY_FIELDS = (
    ("keyHash", Int32sb),
    ("phyOffset", Int64sb),
    ("timeDiff", Int32sb),
    ("prevIndex", Int32sb),
)
INDEX_ENTRY_SIZE = fields_size(INDEX_ENTRY_FIELDS)  # 20

# --- checkpoint (§11) ----------------------------------------------------------

CHECKPOINT_FIELDS = (
    ("physicMsgTimestamp", Int64sb),
    ("logicsMsgTimestamp", Int64sb),
    ("indexMsgTimestamp", Int64sb),
    ("masterFlushedOffset", Int64sb),  # 5.x
    ("confirmPhyOffset", Int64sb),  # 5.x
)
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


# --- the Structs, assembled from the declarations above when first used ------------------------------------------

STRUCT_NAMES = ("HOST_V4", "HOST_V6", "MESSAGE", "BLANK", "CQ_UNIT", "BCQ_UNIT", "CQEXT_UNIT", "INDEX_HEADER",
                "INDEX_SLOT", "INDEX_ENTRY", "CHECKPOINT")
_STRUCTS: dict = {}


def _declare() -> dict:
    from construct import Bytes, Const, IfThenElse, Int8sb, Int16sb, Int32sb, Int64sb, Struct, this

    construct_int = {1: Int8sb, 2: Int16sb, 4: Int32sb, 8: Int64sb}

    def c(ctype: Int):
        return construct_int[ctype.width]

    def fixed(fields):
        return Struct(*[name / c(ctype) for name, ctype in fields])

    host_v4 = Struct("ip" / Bytes(4), "port" / Int32sb)
    host_v6 = Struct("ip" / Bytes(16), "port" / Int32sb)
    message = Struct(
        *[name / c(ctype) for name, ctype in MESSAGE_PREFIX_FIELDS],
        "bornHost" / IfThenElse(this.sysFlag & SYSFLAG_BORNHOST_V6, host_v6, host_v4),
        "storeTimestamp" / Int64sb,
        "storeHost" / IfThenElse(this.sysFlag & SYSFLAG_STOREHOST_V6, host_v6, host_v4),
        "reconsumeTimes" / Int32sb,
        "preparedTransactionOffset" / Int64sb,
        "bodyLength" / Int32sb,
        "body" / Bytes(lambda ctx: max(ctx.bodyLength, 0)),
        "topicLength" / IfThenElse(this.magicCode == MAGIC_V2, Int16sb, Int8sb),
        "topic" / Bytes(lambda ctx: max(ctx.topicLength, 0)),
        "propertiesLength" / Int16sb,
        "properties" / Bytes(lambda ctx: max(ctx.propertiesLength, 0)),
    )
    return {
        "HOST_V4": host_v4,
        "HOST_V6": host_v6,
        "MESSAGE": message,
        "BLANK": Struct("totalSize" / Int32sb, "magicCode" / Const(MAGIC_BLANK, Int32sb)),
        "CQ_UNIT": fixed(CQ_UNIT_FIELDS),
        "BCQ_UNIT": fixed(BCQ_UNIT_FIELDS),
        "CQEXT_UNIT": Struct(
            *[name / c(ctype) for name, ctype in CQEXT_HEADER_FIELDS],
            "filterBitMap" / Bytes(lambda ctx: max(ctx.bitMapSize, 0)),
        ),
        "INDEX_HEADER": fixed(INDEX_HEADER_FIELDS),
        "INDEX_SLOT": fixed(INDEX_SLOT_FIELDS),
        "INDEX_ENTRY": fixed(INDEX_ENTRY_FIELDS),
        "CHECKPOINT": fixed(CHECKPOINT_FIELDS),
    }


def __getattr__(name: str):
    """The construct Structs (:data:`STRUCT_NAMES`), all made at the first use of one (PEP 562)."""
    if name in STRUCT_NAMES:
        if not _STRUCTS:
            _STRUCTS.update(_declare())
        return _STRUCTS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
