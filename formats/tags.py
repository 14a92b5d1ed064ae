"""tagsCode rules (FORMAT.md §5) and the delay-level table."""

from __future__ import annotations

from functools import lru_cache

from .hashing import java_hash

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@lru_cache(maxsize=16)  # StoreConfig.delay_table is read once per record by verify; treat the dict as read-only
def parse_delay_levels(text: str = DEFAULT_DELAY_LEVELS) -> dict[int, int]:
    """``messageDelayLevel`` -> {level: millis}, levels starting at 1."""
    table = {}
    for i, item in enumerate(text.split(), start=1):
        table[i] = int(item[:-1]) * _UNITS[item[-1]]
    return table


DEFAULT_DELAY_TABLE = parse_delay_levels()


class TagsCodeError(ValueError):
    """A DELAY property that does not parse as an int: the broker rejects the whole record."""


_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


def java_parse_int(text: str) -> int | None:
    """Java's ``Integer.parseInt(text)`` (radix 10), None where it throws: an optional sign, then at least one
    digit, nothing else (no blanks, no underscores, unlike Python's ``int``); a digit is any Unicode decimal digit
    of one UTF-16 unit (``Character.digit`` per ``char``: a digit past U+FFFF is two units and no digit); the value
    must fit in an int."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not all(c.isdecimal() and ord(c) < 0x10000 for c in digits):
        return None
    value = int(text)
    return value if _INT_MIN <= value <= _INT_MAX else None


def tags_code(topic: str, props: dict | None, store_timestamp: int, delay_table: dict[int, int] = DEFAULT_DELAY_TABLE) -> int:
    code = 0
    if props:
        tags = props.get("TAGS")
        if tags:
            code = java_hash(tags)
        if topic == SCHEDULE_TOPIC:
            delay = props.get("DELAY")
            if delay is not None:
                level = java_parse_int(delay)  # CommitLog.checkMessageAndReturnSize: Integer.parseInt
                if level is None:
                    raise TagsCodeError(f"DELAY {delay!r} is not a number")
                level = min(level, len(delay_table))
                if level > 0:
                    code = store_timestamp + delay_table.get(level, 1000)
    return code
