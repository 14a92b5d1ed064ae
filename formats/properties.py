"""Property string codec (FORMAT.md §3, Appendix A).

Parse like the Java decoder; serialise in Java ``HashMap`` iteration order with the
version's trailing separator (4.9: none, 5.x: ``\\x02`` after every entry).
"""

from __future__ import annotations

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


def parse_properties(text: str) -> dict[str, str]:
    """Decode a property string exactly as ``MessageDecoder.string2messageProperties`` does."""
    result: dict[str, str] = {}
    if not text:
        return result
    n = len(text)
    start = 0
    while start < n:
        end = text.find(PROPERTY_SEPARATOR, start)
        if end < 0:
            end = n
        if end - start >= 3:
            sep = text.find(NAME_VALUE_SEPARATOR, start, end)
            if start < sep < end - 1:
                result[text[start:sep]] = text[sep + 1 : end]
        start = end + 1
    return result


def serialize_properties(ordered: list[tuple[str, str]] | dict[str, str], version: int) -> str:
    """Join entries in the given order; 5.x keeps the trailing separator, 4.x drops it."""
    items = ordered.items() if isinstance(ordered, dict) else ordered
    parts = [f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in items if v is not None]
    text = "".join(parts)
    if version < 5 and text:
        text = text[:-1]
    return text
