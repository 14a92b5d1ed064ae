"""ConsumeQueueExt address decoration in a consume queue's tagsCode field (FORMAT.md §8.2)."""

LONG_MIN = -(1 << 63)
MAX_ADDR = -2147483649  # Integer.MIN_VALUE - 1
MAX_REAL_OFFSET = MAX_ADDR - LONG_MIN  # 9223372034707292159


def is_ext_addr(value: int) -> bool:
    return value <= MAX_ADDR


def decorate(offset: int) -> int:
    return offset + LONG_MIN if not is_ext_addr(offset) else offset


def undecorate(address: int) -> int:
    return address - LONG_MIN if is_ext_addr(address) else address
