"""Whole commitlog records <-> Python dicts with RocketMQ's own field names.

The dict shape is the ``msg`` object of the broker's read-back (``topic``, ``queueId``,
``commitLogOffset``, ``storeSize``, ``bornHost`` {ip, ipHex, port}, ``properties``,
``propertiesRaw``, ``msgId`` ...), so ``dump --json`` output compares directly with
what operators and the broker know, and ``append --from`` reads it back.

Offsets are those of :data:`formats.records.MESSAGE` (checked in the layout tests);
this module uses ``struct`` directly because construct costs ~50 µs per record.
"""

from __future__ import annotations

import base64
import binascii
import struct

from .hashing import crc31, crc_property_digits
from .msgid import encode_offset_msgid, host_to_str
from .properties import parse_properties
from .records import (
    CRC32_RESERVED_LEN,
    MAGIC_V1,
    MAGIC_V2,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    message_total_size,
)
from .fast import PREFIX_SIZE, PREFIX_STRUCT

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
_I8 = struct.Struct(">b")
_HOST_PORT = struct.Struct(">i")


class RecordError(ValueError):
    """The bytes at this position are not a well-formed message record."""


def _host(buf, pos: int, width: int) -> tuple[bytes, int]:
    ip = bytes(buf[pos : pos + width - 4])
    (port,) = _HOST_PORT.unpack_from(buf, pos + width - 4)
    return ip, port


def host_json(ip: bytes, port: int) -> dict:
    return {"ip": host_to_str(ip), "ipHex": ip.hex(), "port": port}


def decode_utf8(raw: bytes) -> str:
    """Java decodes malformed UTF-8 with U+FFFD substitution; never fails."""
    return raw.decode("utf-8", "replace")


def decode_message(buf, pos: int = 0, *, with_body: bool = True) -> dict:
    """Decode the record at ``pos``. Raises :class:`RecordError` if its lengths do not fit."""
    limit = len(buf)
    if pos + PREFIX_SIZE > limit:
        raise RecordError("record header runs past the end of the data")
    (total, magic, body_crc, queue_id, flag, queue_offset, phy, sysflag, born_ts) = PREFIX_STRUCT.unpack_from(buf, pos)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise RecordError(f"magic code 0x{magic & 0xFFFFFFFF:08X} is not a message")
    end = pos + total
    if total <= 0 or end > limit:
        raise RecordError(f"TOTALSIZE {total} runs past the end of the data")
    bh = 20 if sysflag & SYSFLAG_BORNHOST_V6 else 8
    sh = 20 if sysflag & SYSFLAG_STOREHOST_V6 else 8
    try:
        p = pos + PREFIX_SIZE
        born_ip, born_port = _host(buf, p, bh)
        p += bh
        (store_ts,) = _I64.unpack_from(buf, p)
        p += 8
        store_ip, store_port = _host(buf, p, sh)
        p += sh
        (reconsume,) = _I32.unpack_from(buf, p)
        (prepared,) = _I64.unpack_from(buf, p + 4)
        (body_len,) = _I32.unpack_from(buf, p + 12)
        p += 16
        if body_len < 0 or p + body_len > end:
            raise RecordError(f"BODYLENGTH {body_len} runs past the record")
        body = bytes(buf[p : p + body_len]) if with_body else None
        p += body_len
        if magic == MAGIC_V2:
            (topic_len,) = _I16.unpack_from(buf, p)
            p += 2
        else:
            (topic_len,) = _I8.unpack_from(buf, p)
            p += 1
        if topic_len < 0 or p + topic_len > end:
            raise RecordError(f"TOPICLENGTH {topic_len} is invalid")
        topic = decode_utf8(bytes(buf[p : p + topic_len]))
        p += topic_len
        (props_len,) = _I16.unpack_from(buf, p)
        p += 2
        if props_len < 0 or p + props_len > end:
            raise RecordError(f"PROPERTIESLENGTH {props_len} runs past the record")
        props_raw = decode_utf8(bytes(buf[p : p + props_len]))
    except struct.error as e:
        raise RecordError(f"record truncated: {e}") from None
    msg = {
        "topic": topic,
        "queueId": queue_id,
        "flag": flag,
        "queueOffset": queue_offset,
        "commitLogOffset": phy,
        "storeSize": total,
        "bodyCRC": body_crc,
        "sysFlag": sysflag,
        "bornTimestamp": born_ts,
        "bornHost": host_json(born_ip, born_port),
        "storeTimestamp": store_ts,
        "storeHost": host_json(store_ip, store_port),
        "reconsumeTimes": reconsume,
        "preparedTransactionOffset": prepared,
        "bodyLen": body_len,
        "properties": parse_properties(props_raw),
        "propertiesRaw": props_raw,
        "msgId": encode_offset_msgid(store_ip, store_port, phy),
        "magicVersion": 2 if magic == MAGIC_V2 else 1,
    }
    if with_body:
        msg["body"] = body
    return msg


BODY_MODES = ("none", "hex", "text", "base64")


def render_body(msg: dict, mode: str) -> dict:
    """Replace the raw ``body`` bytes by ``bodyHex`` / ``bodyText`` / ``bodyBase64`` (or nothing)."""
    body = msg.pop("body", None)
    if body is None or mode == "none":
        return msg
    if mode == "hex":
        msg["bodyHex"] = body.hex()
    elif mode == "text":
        msg["bodyText"] = body.decode("utf-8", "replace")
    elif mode == "base64":
        msg["bodyBase64"] = base64.b64encode(body).decode("ascii")
    else:
        raise ValueError(f"unknown body mode {mode!r}")
    return msg


def body_from_json(obj: dict) -> bytes | None:
    """Body bytes from the bodyHex / bodyBase64 / bodyText field ``dump --json`` writes (the first present),
    None when there is none; ValueError (or binascii.Error) when its text does not decode."""
    if "bodyHex" in obj:
        return bytes.fromhex(obj["bodyHex"])
    if "bodyBase64" in obj:
        text = obj["bodyBase64"]
        try:  # canonical base64 (what dump writes): one C call; anything else gets b64decode's verdict
            return binascii.a2b_base64(text, strict_mode=True)
        except (ValueError, TypeError):
            return base64.b64decode(text, validate=True)
    if "bodyText" in obj:
        return obj["bodyText"].encode("utf-8")
    return None


def encode_message(
    *,
    topic: bytes,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sysflag: int,
    born_timestamp: int,
    born_host: tuple[bytes, int],
    store_timestamp: int,
    store_host: tuple[bytes, int],
    reconsume_times: int,
    prepared_offset: int,
    body: bytes,
    properties: bytes,
    magic: int = MAGIC_V1,
    append_crc_property: bool = False,
) -> bytes:
    """Encode one record exactly as the broker lays it out (§2.1), BODYCRC computed here.

    With ``append_crc_property`` the 20 reserved bytes of §4.2 are added to PROPERTIES and
    filled with the whole-record CRC (the caller has already removed any old ``__CRC32#``
    and appended the separator if needed).
    """
    born_ip, born_port = born_host
    store_ip, store_port = store_host
    props_len = len(properties) + (CRC32_RESERVED_LEN if append_crc_property else 0)
    total = message_total_size(sysflag, magic, len(body), len(topic), props_len)
    parts = [
        PREFIX_STRUCT.pack(total, magic, crc31(body) if body else 0, queue_id, flag, queue_offset,
                           physical_offset, sysflag, born_timestamp),
        born_ip, _I32.pack(born_port),
        _I64.pack(store_timestamp),
        store_ip, _I32.pack(store_port),
        _I32.pack(reconsume_times), _I64.pack(prepared_offset),
        _I32.pack(len(body)), body,
        (_I16.pack(len(topic)) if magic == MAGIC_V2 else _I8.pack(len(topic))), topic,
        _I16.pack(props_len), properties,
    ]
    record = b"".join(parts)
    if append_crc_property:
        crc = crc31(record)
        record += b"__CRC32#\x01" + crc_property_digits(crc).encode("ascii") + b"\x02"
    assert len(record) == total
    return record
