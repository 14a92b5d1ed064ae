"""DLedger commitlog records (FORMAT.md appendix D): the entry header, the end-of-file blank, the
index unit and the two Properties files (``checkpoint``, ``currterm``), declared once here.

With ``enableDLegerCommitLog=true`` every RocketMQ message (§2.1) is the body of one DLedger (Raft)
log entry; the message starts :data:`ENTRY_HEADER_SIZE` bytes after its entry, and the broker's
physical offsets (consume queue, index, msgId, the message's own PHYSICALOFFSET) are the entry's
pos + 48. The numpy dtypes the hot paths use are derived from these declarations.
"""

from __future__ import annotations

from construct import Bytes, Const, Int32sb, Int64sb, Struct

from .records import field_offsets, fields_dtype

ENTRY_MAGIC = 1  # DLedgerMmapFileStore.MAGIC_1 (CURRENT_MAGIC in 0.2.3 and 0.3.1.2)
BLANK_MAGIC = -1  # MmapFileList.BLANK_MAGIC_CODE
BLANK_MIN_LENGTH = 8  # MmapFileList.MIN_BLANK_LEN: an entry needs size + 8 bytes left in its file

ENTRY_HEADER_FIELDS = (
    ("magic", Int32sb),
    ("size", Int32sb),  # the whole entry: header + body
    ("index", Int64sb),  # 0-based, contiguous
    ("term", Int64sb),
    ("pos", Int64sb),  # the entry's own absolute offset in the data files
    ("channel", Int32sb),
    ("chainCrc", Int32sb),  # 0 in 0.2.3 (never computed)
    ("bodyCrc", Int32sb),  # 0 in 0.2.3 (never computed)
    ("bodyLength", Int32sb),
)
ENTRY_HEADER = Struct(*[name / ctype for name, ctype in ENTRY_HEADER_FIELDS])
ENTRY_HEADER_SIZE = ENTRY_HEADER.sizeof()  # 48 = DLedgerEntry.BODY_OFFSET
# DLedgerEntry.HEADER_SIZE: the header without the body length; recovery requires size > this.
ENTRY_FIXED_SIZE = ENTRY_HEADER_SIZE - 4
# The header rules of DLedger's recovery walk (formats.dledgerkernel applies them in this order); an entry
# that breaks one ends the log.
E_OK, E_POS, E_BODYLEN, E_SIZE, E_INDEX, E_TERM = range(6)
E_TEXT = {
    E_OK: "ok",
    E_POS: "the entry's pos field is not its own offset",
    E_BODYLEN: "size is not body length + 48",
    E_SIZE: "size is not larger than the 44-byte header",
    E_INDEX: "index does not follow the previous entry's",
    E_TERM: "term is lower than the previous entry's",
}
ENTRY = Struct(*[name / ctype for name, ctype in ENTRY_HEADER_FIELDS],
               "body" / Bytes(lambda ctx: max(ctx.bodyLength, 0)))

# The rest of a data file an entry does not fit in: magic -1, the bytes left (this marker
# included), zeros.
BLANK = Struct("magic" / Const(BLANK_MAGIC, Int32sb), "size" / Int32sb)

INDEX_UNIT_FIELDS = (
    ("magic", Int32sb),
    ("pos", Int64sb),
    ("size", Int32sb),
    ("index", Int64sb),
    ("term", Int64sb),
)
INDEX_UNIT = Struct(*[name / ctype for name, ctype in INDEX_UNIT_FIELDS])
INDEX_UNIT_SIZE = INDEX_UNIT.sizeof()  # 32 (DLedgerMmapFileStore.INDEX_UNIT_SIZE): entry i at byte i * 32

# The two java.util.Properties files beside data/ and index/.
CHECKPOINT_KEYS = ("committedIndex", "endIndex")  # DLedgerMmapFileStore.persistCheckPoint
CURRTERM_KEYS = ("currTerm", "voteLeader")  # MemberState.persistTerm
CHECKPOINT_FILE, CURRTERM_FILE = "checkpoint", "currterm"
DATA_DIR, INDEX_DIR = "data", "index"
# DLedger 0.2.3 fixes the index files at 160 MiB (the broker has no setting; files tell otherwise).
DEFAULT_INDEX_FILE_SIZE = 160 * 1024 * 1024


ENTRY_HEADER_DTYPE = fields_dtype(ENTRY_HEADER_FIELDS)
INDEX_UNIT_DTYPE = fields_dtype(INDEX_UNIT_FIELDS)


ENTRY_OFFSETS = field_offsets(ENTRY_HEADER_FIELDS)
INDEX_OFFSETS = field_offsets(INDEX_UNIT_FIELDS)


def parse_properties(text: str) -> dict[str, str]:
    """The ``key=value`` lines of a java.util.Properties file DLedger wrote (comments and blank lines
    skipped; DLedger's keys and values need no escapes)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        for sep in ("=", ":"):
            if sep in line:
                k, v = line.split(sep, 1)
                out[k.strip()] = v.strip()
                break
    return out


def format_properties(values: dict) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


def encode_index_unit(magic: int, pos: int, size: int, index: int, term: int) -> bytes:
    return INDEX_UNIT.build(dict(magic=magic, pos=pos, size=size, index=index, term=term))


def encode_blank(length: int) -> bytes:
    """The blank that fills the last ``length`` bytes of a data file."""
    return BLANK.build(dict(size=length)) + bytes(length - BLANK_MIN_LENGTH)


