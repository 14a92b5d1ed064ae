"""The 5.x timer store's records (FORMAT.md appendix C): timerlog units and blanks, timerwheel slots,
``config/timercheck``. Declared once here as construct Structs; the numpy dtypes the engine reads
whole files with are derived from the same field lists (``tests/test_timer_format.py`` checks they agree).

Everything is big-endian and signed, as Java's ``ByteBuffer`` writes it.
"""

from __future__ import annotations

import struct

from construct import Int32sb, Int64sb, Struct

from .records import MAGIC_BLANK, fields_dtype, struct_format

TIMER_TOPIC = "rmq_sys_wheel_timer"  # TimerMessageStore.TIMER_TOPIC: the queue the timer reads (queue 0)

# --- timerlog unit (TimerLog.UNIT_SIZE, written by TimerMessageStore.doEnqueue) ---------------------

TIMER_UNIT_FIELDS = (
    ("size", Int32sb),  # always 52
    ("prevPos", Int64sb),  # previous unit of the same wheel slot, -1 for the first
    ("magic", Int32sb),  # MAGIC_* flags
    ("currWriteTime", Int64sb),  # ms, a multiple of the precision
    ("delay", Int32sb),  # ms after currWriteTime: the unit's slot time
    ("offsetPy", Int64sb),  # commitlog offset of the rmq_sys_wheel_timer record
    ("sizePy", Int32sb),  # its size
    ("realTopicHash", Int32sb),  # String.hashCode of REAL_TOPIC
    ("reserved", Int64sb),
)
TIMER_UNIT = Struct(*[name / ctype for name, ctype in TIMER_UNIT_FIELDS])
TIMER_UNIT_SIZE = TIMER_UNIT.sizeof()  # 52

MAGIC_DEFAULT, MAGIC_ROLL, MAGIC_DELETE = 1, 2, 4

# End-of-file blank (TimerLog.append): a unit that does not fit (unit + MIN_BLANK_LEN > bytes left)
# is preceded by int bytes-left, long 0, int BLANK magic, zeros to the end of the file.
TIMER_BLANK_FIELDS = (("size", Int32sb), ("zero", Int64sb), ("magic", Int32sb))
TIMER_BLANK = Struct(*[name / ctype for name, ctype in TIMER_BLANK_FIELDS])
TIMER_BLANK_MIN = TIMER_BLANK.sizeof()  # 16 = TimerLog.MIN_BLANK_LEN
TIMER_BLANK_MAGIC = MAGIC_BLANK  # 0xBBCCDDEE ^ (1880681586 + 8), the commitlog's BLANK code

# --- timerwheel slot (TimerWheel.putSlot / getRawSlot) ---------------------------------------------

TIMER_SLOT_FIELDS = (
    ("timeUnits", Int64sb),  # slot time / precisionMs (seconds at the default precision)
    ("firstPos", Int64sb),
    ("lastPos", Int64sb),
    ("num", Int32sb),
    ("magic", Int32sb),  # 0, unused
)
TIMER_SLOT = Struct(*[name / ctype for name, ctype in TIMER_SLOT_FIELDS])
TIMER_SLOT_SIZE = TIMER_SLOT.sizeof()  # 32
WHEEL_TTL_DAYS = 7  # TimerMessageStore.TIMER_WHEEL_TTL_DAY: not configurable
WHEEL_SLOTS_TOTAL = WHEEL_TTL_DAYS * 86400  # slotsTotal, whatever the precision
WHEEL_SLOTS = 2 * WHEEL_SLOTS_TOTAL  # slots in the file
WHEEL_FILE_SIZE = WHEEL_SLOTS * TIMER_SLOT_SIZE  # 38 707 200

# --- config/timercheck (TimerCheckpoint) ------------------------------------------------------------

TIMER_CHECKPOINT_FIELDS = (
    ("lastReadTimeMs", Int64sb),
    ("lastTimerLogFlushPos", Int64sb),
    ("lastTimerQueueOffset", Int64sb),
    ("masterTimerQueueOffset", Int64sb),
    ("stateVersion", Int64sb),  # dataVersion
    ("timestamp", Int64sb),
    ("counter", Int64sb),
)
TIMER_CHECKPOINT = Struct(*[name / ctype for name, ctype in TIMER_CHECKPOINT_FIELDS])
TIMER_CHECKPOINT_FILE_SIZE = 4096


# One unit with the struct module (chain walks read a unit at a time), derived from the Struct.
TIMER_UNIT_STRUCT = struct.Struct(struct_format(TIMER_UNIT_FIELDS))

# Big-endian views of whole files (np.frombuffer(..., TIMER_UNIT_DTYPE)), derived from the Structs.
TIMER_UNIT_DTYPE = fields_dtype(TIMER_UNIT_FIELDS)
TIMER_SLOT_DTYPE = fields_dtype(TIMER_SLOT_FIELDS)
TIMER_CHECKPOINT_DTYPE = fields_dtype(TIMER_CHECKPOINT_FIELDS)


def magic_ok(magic: int) -> bool:
    """TimerMessageStore.isMagicOK: only the four low flag bits may be set."""
    return (magic | 0xF) == 0xF


def magic_text(magic: int) -> str:
    """What a unit's magic means, e.g. ``default+roll``."""
    if magic == TIMER_BLANK_MAGIC:
        return "blank"
    if not magic_ok(magic):
        return "invalid"
    names = [n for bit, n in ((MAGIC_DEFAULT, "default"), (MAGIC_ROLL, "roll"), (MAGIC_DELETE, "delete")) if magic & bit]
    if magic & 8:
        names.append("0x8")
    return "+".join(names) or "none"


def slot_index(time_ms: int, precision_ms: int) -> int:
    """TimerWheel.getSlotIndex."""
    return (time_ms // precision_ms) % WHEEL_SLOTS


def encode_unit(**fields) -> bytes:
    return TIMER_UNIT.build({name: fields.get(name, 0) for name, _ in TIMER_UNIT_FIELDS})


def encode_slot(**fields) -> bytes:
    return TIMER_SLOT.build({name: fields.get(name, 0) for name, _ in TIMER_SLOT_FIELDS})


def encode_blank(size: int) -> bytes:
    """The end-of-file blank for ``size`` bytes left (the rest stays zero)."""
    return TIMER_BLANK.build({"size": size, "zero": 0, "magic": TIMER_BLANK_MAGIC})


def encode_checkpoint(**fields) -> bytes:
    """A whole 4096-byte timercheck file."""
    head = TIMER_CHECKPOINT.build({name: fields.get(name, 0) for name, _ in TIMER_CHECKPOINT_FIELDS})
    return head + bytes(TIMER_CHECKPOINT_FILE_SIZE - len(head))
