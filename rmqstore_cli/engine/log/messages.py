"""Messages to append: built from options (a "send") or from ``dump commitlog --json`` objects
(a replay), validated completely before a single byte is written.

A *send* gets the broker's additions (FORMAT.md §3.4, §5.2, §19): ``WAIT`` dropped on 4.x and
kept (default ``true``) on 5.x, ``UNIQ_KEY`` generated when absent on 5.x, ``CLUSTER`` if a
cluster name is configured, delay levels redirected to ``SCHEDULE_TOPIC_XXXX`` with
``REAL_TOPIC``/``REAL_QID``; the map is serialised in Java HashMap order.  A *replay* stores
exactly the given map (or the given ``propertiesRaw``, verbatim).  Both get the IPv6 sysflag
bits from their host addresses, magic v2 for long topics on 5.x, and the ``__CRC32#`` reserve
when ``enabledAppendPropCRC`` is on (an existing ``__CRC32#`` entry is always recomputed).
"""

from __future__ import annotations

import binascii
import dataclasses
import datetime as _dt
import itertools
import os
import re
import struct
import time
from dataclasses import dataclass

from rmqstore_cli.formats.java_hashmap import broker_batch_record_properties, broker_properties_string
from rmqstore_cli.formats.message import body_from_json
from rmqstore_cli.formats.msgid import parse_host
from rmqstore_cli.formats.properties import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, parse_properties
from rmqstore_cli.formats.records import (CRC32_RESERVED_LEN, MAGIC_V1, MAGIC_V2, MAX_PROPERTIES_LENGTH, SYSFLAG_BORNHOST_V6,
                             SYSFLAG_INNER_BATCH, SYSFLAG_NEED_UNWRAP, SYSFLAG_STOREHOST_V6, SYSFLAG_TRANSACTION_MASK,
                             TRANSACTION_COMMIT, TRANSACTION_NOT, TRANSACTION_PREPARED, TRANSACTION_ROLLBACK,
                             message_total_size)
from rmqstore_cli.formats.tags import SCHEDULE_TOPIC, java_parse_int

from ..config.storeconfig import StoreConfig
from ..errors import UsageError

_I16 = struct.Struct(">h")
_I8 = struct.Struct(">b")
_HOSTS: dict[tuple[int, int], struct.Struct] = {}


def header_struct(born_ip_len: int, store_ip_len: int) -> struct.Struct:
    """TOTALSIZE .. BODYLENGTH (§2.1) in one Struct, for the host address lengths (4 or 16)."""
    st = _HOSTS.get((born_ip_len, store_ip_len))
    if st is None:
        st = _HOSTS[(born_ip_len, store_ip_len)] = struct.Struct(
            f">iiiiiqqiq{born_ip_len}siq{store_ip_len}siiqi")
    return st


def topic_length_piece(topic_b: bytes, magic: int) -> bytes:
    """TOPICLENGTH: 2 bytes in a magic v2 record, else 1."""
    return _I16.pack(len(topic_b)) if magic == MAGIC_V2 else _I8.pack(len(topic_b))


TOPIC_CHARS = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TRANSACTIONS = {"normal": TRANSACTION_NOT, "prepared": TRANSACTION_PREPARED, "commit": TRANSACTION_COMMIT,
                "rollback": TRANSACTION_ROLLBACK}
CRC_KEY = "__CRC32#"
_CRC_TAIL = re.compile("__CRC32#\x01[0-9]{10}\x02$")
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
MAX_TOPIC_4X = 127
MAX_TOPIC_5X = 255  # the broker's hard limit; above 127 UTF-16 units 5.x writes magic v2
DEFAULT_BORN_HOST = "127.0.0.1:0"
DEFAULT_STORE_HOST = "127.0.0.1:10911"

# Fields of a ``dump commitlog --json`` message object.  Those the store computes itself are
# accepted and ignored; anything else is an error.
INPUT_FIELDS = {"topic", "queueId", "flag", "sysFlag", "bornTimestamp", "bornHost", "storeTimestamp", "storeHost",
                "reconsumeTimes", "preparedTransactionOffset", "properties", "propertiesRaw", "bodyHex",
                "bodyBase64", "bodyText"}
COMPUTED_FIELDS = {"queueOffset", "commitLogOffset", "storeSize", "bodyCRC", "bodyLen", "msgId", "magicVersion",
                   "offset"}


class InputError(UsageError):
    """A message that cannot be stored as given (exit 3)."""


@dataclass(slots=True)
class OutMessage:
    """One record to write, complete except for the offsets and (maybe) the store time."""

    topic: str
    topic_b: bytes
    queue_id: int
    flag: int
    sysflag: int
    born_timestamp: int
    born_host: tuple
    store_host: tuple
    reconsume_times: int
    prepared_offset: int
    body: bytes
    props_b: bytes  # stored properties, without the 20-byte CRC reserve
    crc_prop: bool
    magic: int
    store_timestamp: int | None
    props_map: dict  # what the broker's decoder sees (dispatch: TAGS, KEYS, UNIQ_KEY, DELAY)
    total_size: int


def with_properties(m: OutMessage, props_str: str, config: StoreConfig) -> OutMessage:
    """``m`` with another stored properties string (the broker re-serialised them at append), size re-checked."""
    props_b = props_str.encode("utf-8", "replace")
    plen = len(props_b) + (CRC32_RESERVED_LEN if m.crc_prop else 0)
    if plen > MAX_PROPERTIES_LENGTH:
        raise InputError(f"properties are {plen} bytes; at most {MAX_PROPERTIES_LENGTH} allowed")
    total = message_total_size(m.sysflag, m.magic, len(m.body), len(m.topic_b), plen)
    if total + 8 > config.mappedFileSizeCommitLog:
        raise InputError(f"message is {total} bytes; it cannot fit in a {config.mappedFileSizeCommitLog}-byte "
                         "commitlog file")
    return dataclasses.replace(m, props_b=props_b, props_map=parse_properties(props_str), total_size=total)


def now_ms() -> int:
    return int(time.time() * 1000)


_uniq_counter = itertools.count(int.from_bytes(os.urandom(2), "big"))


def uniq_key_time_field(now_ms: int) -> int:
    """The 4-byte time of a client id made at ``now_ms`` (MessageClientIDSetter, §6.2).

    Java keeps the start of the current month (local time) and stores ``(int) (now - start)``:
    a long narrowed to int, which wraps to a negative number once 2^31 ms (about 24.9 days) of
    the month have passed. Only a small negative difference (a clock that went back, down to
    -1 000 000 ms) is clamped to 0. Decoders read the four bytes unsigned, so the wrapped value
    still gives the right time.
    """
    now = _dt.datetime.fromtimestamp(now_ms / 1000)
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    diff = now_ms - int(month_start.timestamp() * 1000)
    diff = ((diff + 2**31) % 2**32) - 2**31  # Java's (int) narrowing of a long
    if -1_000_000 < diff < 0:
        diff = 0
    return diff


def new_uniq_key(ip: bytes, now: int | None = None) -> str:
    """A client id in MessageClientIDSetter's layout (§6.2): ip, pid, class-loader hash, ms in month, counter."""
    in_month = uniq_key_time_field(now_ms() if now is None else now)
    raw = (ip + (os.getpid() & 0xFFFF).to_bytes(2, "big") + (0x524D5153).to_bytes(4, "big")
           + in_month.to_bytes(4, "big", signed=True) + (next(_uniq_counter) & 0xFFFF).to_bytes(2, "big"))
    return raw.hex().upper()


def check_topic(topic, version: int, *, strict_chars: bool, auto_v2: bool = True) -> tuple[bytes, int]:
    """Broker topic rules; returns (UTF-8 bytes, magic)."""
    if not isinstance(topic, str) or not topic:
        raise InputError("topic is missing or empty")
    if "/" in topic or "\x00" in topic or ".." in topic or topic == ".":
        raise InputError(f"topic {topic!r} contains '/', '..' or NUL (it names a directory)")
    if strict_chars and not TOPIC_CHARS.match(topic):
        raise InputError(f"topic {topic!r} has characters outside [%|a-zA-Z0-9_-]")
    try:
        raw = topic.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"topic {topic!r} is not valid Unicode") from None
    units = len(topic.encode("utf-16-le", "surrogatepass")) // 2
    if version < 5:
        if units > MAX_TOPIC_4X or len(raw) > MAX_TOPIC_4X:
            raise InputError(f"topic is {len(raw)} bytes; 4.x stores at most {MAX_TOPIC_4X}")
        return raw, MAGIC_V1
    limit = MAX_TOPIC_5X if auto_v2 else MAX_TOPIC_4X
    if len(raw) > limit:
        raise InputError(f"topic is {len(raw)} bytes; at most {limit} allowed")
    if auto_v2 and units > MAX_TOPIC_4X:
        return raw, MAGIC_V2
    if len(raw) > MAX_TOPIC_4X:
        raise InputError(f"topic is {len(raw)} bytes: too long for a magic v1 record")
    return raw, MAGIC_V1


def _int(obj: dict, name: str, default: int, rng=INT32) -> int:
    v = obj.get(name, default)
    if type(v) is int and rng[0] <= v <= rng[1]:  # the usual case; bool is not int here
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"{name} must be an integer, not {v!r}")
    if not rng[0] <= v <= rng[1]:
        raise InputError(f"{name} {v} is out of range")
    return v


def host_from_json(v, name: str) -> tuple[bytes, int]:
    try:
        if isinstance(v, str):
            return parse_host(v)
        if isinstance(v, dict):
            unknown = set(v) - {"ip", "ipHex", "port"}
            if unknown:
                raise InputError(f"{name} has unknown field(s) {', '.join(sorted(unknown))}")
            port = v.get("port", 0)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= INT32[1]:
                raise InputError(f"{name}.port {port!r} is not a port number")
            if "ipHex" in v:
                ip = bytes.fromhex(v["ipHex"])
                if len(ip) not in (4, 16):
                    raise InputError(f"{name}.ipHex must be 4 or 16 bytes")
                return ip, port
            ip, _ = parse_host(str(v["ip"]))
            return ip, port
    except InputError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{name} {v!r} is not an address: {e}") from None
    raise InputError(f"{name} must be an object {{ip, port}} or 'ip:port'")


def _check_props_map(props) -> dict:
    if not isinstance(props, dict):
        raise InputError("properties must be an object of strings")
    out = {}
    for k, v in props.items():
        if v is None:
            continue  # Java skips null values
        if not isinstance(v, str):
            raise InputError(f"property {k!r} must be a string, not {v!r}")
        if not k or NAME_VALUE_SEPARATOR in k or PROPERTY_SEPARATOR in k or NAME_VALUE_SEPARATOR in v \
                or PROPERTY_SEPARATOR in v:
            raise InputError(f"property {k!r} is empty or contains a \\x01/\\x02 separator")
        out[k] = v
    return out


def _body(obj: dict, decoded: bytes | None = None) -> bytes:
    """``decoded``: the bytes of ``obj["bodyBase64"]``, already decoded by the caller's parser."""
    given = [k for k in ("bodyHex", "bodyBase64", "bodyText") if k in obj]
    if len(given) > 1:
        raise InputError(f"give one body field, not {', '.join(given)}")
    if decoded is not None and given == ["bodyBase64"]:
        return decoded
    try:
        body = body_from_json(obj)
    except (ValueError, TypeError, AttributeError, binascii.Error) as e:
        raise InputError(f"{given[0]} is not valid: {e}") from None
    if body is not None:
        return body
    n = obj.get("bodyLen")
    if isinstance(n, int) and n > 0:
        raise InputError(f"bodyLen is {n} but no body was given (dump with --body hex)")
    return b""


_KNOWN_FIELDS = frozenset(INPUT_FIELDS | COMPUTED_FIELDS)
_CACHE_LIMIT = 4096  # distinct topics / host objects remembered per builder


class MessageBuilder:
    """Turns options or JSON objects into validated :class:`OutMessage` lists for one store."""

    def __init__(self, config: StoreConfig, *, cluster: str | None = None):
        self.config = config
        self.version = config.version
        self.cluster = cluster
        self.crc_on = config.version >= 5 and config.enabledAppendPropCRC
        self.max_level = len(config.delay_table)
        # A replay repeats a few topics and hosts: their checks are pure functions of the value
        self._topics: dict = {}
        self._hosts: dict = {}

    # --- shared ------------------------------------------------------------------------------

    def _finish(self, *, topic: str, strict_topic: bool, queue_id: int, flag: int, sysflag: int, born_ts: int,
                born_host, store_host, reconsume: int, prepared: int, body: bytes, props_str: str,
                crc_prop: bool, store_ts: int | None, props_map: dict | None = None) -> OutMessage:
        """``props_map``: parse_properties(props_str) when the caller already has it."""
        key = (topic, strict_topic)
        checked = self._topics.get(key) if isinstance(topic, str) else None
        if checked is None:
            checked = check_topic(topic, self.version, strict_chars=strict_topic,
                                  auto_v2=self.config.autoMessageVersionOnTopicLen)
            if len(self._topics) < _CACHE_LIMIT:
                self._topics[key] = checked
        topic_b, magic = checked
        if queue_id < 0:
            raise InputError(f"queueId {queue_id} is negative")
        if sysflag & (SYSFLAG_INNER_BATCH | SYSFLAG_NEED_UNWRAP):
            raise InputError("inner-batch records (sysFlag 0x40/0x80) are not supported")
        sysflag &= ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
        if len(born_host[0]) == 16:
            sysflag |= SYSFLAG_BORNHOST_V6
        if len(store_host[0]) == 16:
            sysflag |= SYSFLAG_STOREHOST_V6
        crc_prop = crc_prop or self.crc_on
        if crc_prop and props_str and not props_str.endswith(PROPERTY_SEPARATOR):
            props_str += PROPERTY_SEPARATOR
        try:
            props_b = props_str.encode("utf-8")
        except UnicodeEncodeError:
            props_b = props_str.encode("utf-8", "replace")  # Java writes '?' for lone surrogates
        plen = len(props_b) + (CRC32_RESERVED_LEN if crc_prop else 0)
        if plen > MAX_PROPERTIES_LENGTH:
            raise InputError(f"properties are {plen} bytes; at most {MAX_PROPERTIES_LENGTH} allowed")
        if props_map is None:
            props_map = parse_properties(props_str)
        if topic == SCHEDULE_TOPIC and "DELAY" in props_map and java_parse_int(props_map["DELAY"]) is None:
            raise InputError(f"DELAY {props_map['DELAY']!r} is not a number")  # the broker's dispatch would reject it
        total = message_total_size(sysflag, magic, len(body), len(topic_b), plen)
        cfg = self.config
        if self.version < 5 and total > cfg.maxMessageSize:
            raise InputError(f"message is {total} bytes; maxMessageSize is {cfg.maxMessageSize}")
        if self.version >= 5 and (len(body) > cfg.maxMessageSize or total > cfg.maxMessageSize + 65536):
            raise InputError(f"body is {len(body)} bytes; maxMessageSize is {cfg.maxMessageSize}")
        if total + 8 > cfg.mappedFileSizeCommitLog:
            raise InputError(f"message is {total} bytes; it cannot fit in a {cfg.mappedFileSizeCommitLog}-byte "
                             "commitlog file")
        return OutMessage(topic, topic_b, queue_id, flag, sysflag, born_ts, born_host, store_host, reconsume, prepared,
                          body, props_b, crc_prop, magic, store_ts, props_map, total)

    def replay_topic(self, topic: str) -> tuple[bytes, int]:
        """(UTF-8 bytes, magic) of a replayed message's topic, or the InputError ``from_json`` gives."""
        key = (topic, False)
        checked = self._topics.get(key)
        if checked is None:
            checked = check_topic(topic, self.version, strict_chars=False,
                                  auto_v2=self.config.autoMessageVersionOnTopicLen)
            if len(self._topics) < _CACHE_LIMIT:
                self._topics[key] = checked
        return checked

    # --- a send from options -----------------------------------------------------------------

    def from_options(self, *, topic: str, queue_id: int = 0, body: bytes = b"", tags: str | None = None,
                     keys: str | None = None, properties: list[tuple[str, str]] | None = None,
                     born_host: str | None = None, store_host: str | None = None, flag: int = 0,
                     sysflag: int = 0, transaction: str | None = None, prepared_offset: int = 0,
                     delay_level: int | None = None, born_timestamp: int | None = None,
                     reconsume_times: int = 0) -> OutMessage:
        props = _check_props_map(dict(properties or []))
        if tags:
            props["TAGS"] = tags
        if keys:
            props["KEYS"] = keys
        crc_prop = props.pop(CRC_KEY, None) is not None and self.version >= 5
        try:
            bh = parse_host(born_host or DEFAULT_BORN_HOST)
            sh = parse_host(store_host or DEFAULT_STORE_HOST)
        except ValueError as e:
            raise InputError(f"bad host address: {e}") from None
        if transaction is not None:
            if transaction not in TRANSACTIONS:
                raise InputError(f"--transaction must be one of {', '.join(TRANSACTIONS)}")
            sysflag = (sysflag & ~SYSFLAG_TRANSACTION_MASK) | TRANSACTIONS[transaction]
        if not INT32[0] <= sysflag <= INT32[1] or not INT32[0] <= flag <= INT32[1]:
            raise InputError("flag/sys-flag must be 32-bit integers")
        if self.version < 5:
            props.pop("WAIT", None)  # 4.9 SendMessageProcessor strips it
        else:
            props.setdefault("WAIT", "true")  # producers set it; 5.x stores it
            if "UNIQ_KEY" not in props:  # a key given by the caller is kept, and none is computed then
                props["UNIQ_KEY"] = new_uniq_key(sh[0])
        if self.cluster:
            props["CLUSTER"] = self.cluster
        check_topic(topic, self.version, strict_chars=True, auto_v2=self.config.autoMessageVersionOnTopicLen)
        if delay_level is not None and delay_level < 0:
            raise InputError("--delay-level must be 0 (none) or a level from the delay table")
        if delay_level:
            level = min(delay_level, self.max_level)
            props["DELAY"] = str(level)
            if (sysflag & SYSFLAG_TRANSACTION_MASK) in (TRANSACTION_NOT, TRANSACTION_COMMIT):
                props["REAL_TOPIC"] = topic
                props["REAL_QID"] = str(queue_id)
                topic, queue_id = SCHEDULE_TOPIC, level - 1
        props_str = broker_properties_string(props, self.version)
        return self._finish(topic=topic, strict_topic=topic != SCHEDULE_TOPIC or not delay_level, queue_id=queue_id,
                            flag=flag, sysflag=sysflag,
                            born_ts=now_ms() if born_timestamp is None else born_timestamp, born_host=bh,
                            store_host=sh, reconsume=reconsume_times, prepared=prepared_offset, body=body,
                            props_str=props_str, crc_prop=crc_prop, store_ts=None)

    # --- a replay from JSON --------------------------------------------------------------------

    def from_json(self, obj, *, in_batch: bool = False, body_base64: bytes | None = None) -> OutMessage:
        """``body_base64``: the decoded ``bodyBase64`` when the JSON parser has decoded it."""
        if not isinstance(obj, dict):
            raise InputError("a message must be a JSON object")
        unknown = obj.keys() - _KNOWN_FIELDS
        if unknown:
            raise InputError(f"unknown field(s) {', '.join(sorted(unknown))}")
        body = _body(obj, body_base64)
        raw = obj.get("propertiesRaw")
        crc_prop = False
        props_map = None
        if raw is not None:
            if not isinstance(raw, str):
                raise InputError("propertiesRaw must be a string")
            props_map = parse_properties(raw)
            if "properties" in obj and _check_props_map(obj["properties"]) != props_map:
                raise InputError("propertiesRaw does not match properties")
            if self.version >= 5 and _CRC_TAIL.search(raw):
                raw = raw[:-CRC32_RESERVED_LEN]  # recomputed for the new position
                crc_prop = True
                props_map = None
            props_str = raw
        else:
            props = _check_props_map(obj.get("properties", {}))
            if props.pop(CRC_KEY, None) is not None and self.version >= 5:
                crc_prop = True
            if in_batch and "CLUSTER" in props:
                cluster = {"CLUSTER": props.pop("CLUSTER")}
                props_str = broker_batch_record_properties(props, cluster, self.version)
            else:
                props_str = broker_properties_string(props, self.version)
        store_ts = obj.get("storeTimestamp")
        if store_ts is not None:
            store_ts = _int(obj, "storeTimestamp", 0, INT64)
        return self._finish(
            topic=obj.get("topic"), strict_topic=False, queue_id=_int(obj, "queueId", 0), flag=_int(obj, "flag", 0),
            sysflag=_int(obj, "sysFlag", 0), born_ts=_int(obj, "bornTimestamp", now_ms(), INT64),
            born_host=self._host(obj.get("bornHost", DEFAULT_BORN_HOST), "bornHost"),
            store_host=self._host(obj.get("storeHost", DEFAULT_STORE_HOST), "storeHost"),
            reconsume=_int(obj, "reconsumeTimes", 0),
            prepared=_int(obj, "preparedTransactionOffset", 0, INT64), body=body, props_str=props_str,
            crc_prop=crc_prop, store_ts=store_ts, props_map=props_map)

    def _host(self, v, name: str) -> tuple[bytes, int]:
        """host_from_json, remembered for the {ip, ipHex, port} objects a dump writes (str, str,
        int exactly: True == 1 but is not a port)."""
        if type(v) is not dict or len(v) != 3:
            return host_from_json(v, name)
        ip, ip_hex, port = v.get("ip"), v.get("ipHex"), v.get("port")
        if type(ip) is not str or type(ip_hex) is not str or type(port) is not int:
            return host_from_json(v, name)
        key = (name, ip, ip_hex, port)
        hit = self._hosts.get(key)
        if hit is None:
            hit = host_from_json(v, name)
            if len(self._hosts) < _CACHE_LIMIT:
                self._hosts[key] = hit
        return hit

    def from_json_line(self, obj) -> tuple[list[OutMessage], bool]:
        """One input line: a message object, or ``{"batch": [msg, ...]}`` (a classic batch)."""
        if isinstance(obj, dict) and "batch" in obj:
            if set(obj) != {"batch"}:
                raise InputError(f"a batch line has only the field 'batch', not {', '.join(sorted(set(obj) - {'batch'}))}")
            items = obj["batch"]
            if not isinstance(items, list) or not items:
                raise InputError("batch must be a non-empty list of messages")
            msgs = []
            for i, o in enumerate(items):
                try:
                    msgs.append(self.from_json(o, in_batch=True))
                except InputError as e:
                    raise InputError(f"batch message {i}: {e}") from None
            self.check_batch(msgs)
            return msgs, True
        return [self.from_json(obj)], False

    def check_batch(self, msgs: list[OutMessage]) -> None:
        """Classic batch rules (§2.7): one topic/queue/header, no transaction, no delay; size limits."""
        first = msgs[0]
        for m in msgs[1:]:
            if (m.topic, m.queue_id, m.sysflag, m.born_timestamp, m.born_host, m.store_host, m.reconsume_times) != \
                    (first.topic, first.queue_id, first.sysflag, first.born_timestamp, first.born_host,
                     first.store_host, first.reconsume_times):
                raise InputError("batch messages must share topic, queueId, sysFlag, bornTimestamp, hosts and "
                                 "reconsumeTimes")
            if m.store_timestamp != first.store_timestamp:
                raise InputError("batch messages share one storeTimestamp")
        for m in msgs:
            if m.sysflag & SYSFLAG_TRANSACTION_MASK:
                raise InputError("a batch cannot carry a transaction type")
            if "DELAY" in m.props_map or m.topic == SCHEDULE_TOPIC:
                raise InputError("a batch cannot carry a delay level")
            if m.prepared_offset:
                raise InputError("batch records have preparedTransactionOffset 0")
        total = sum(m.total_size for m in msgs)
        cfg = self.config
        if self.version < 5 and total > cfg.maxMessageSize:
            raise InputError(f"batch is {total} bytes; maxMessageSize is {cfg.maxMessageSize}")
        if self.version >= 5:
            wire = sum(20 + len(m.body) + 2 + len(m.props_b) for m in msgs)
            if wire > cfg.maxMessageSize:
                raise InputError(f"batch body is {wire} bytes; maxMessageSize is {cfg.maxMessageSize}")
        if total + 8 > cfg.mappedFileSizeCommitLog:
            raise InputError(f"batch is {total} bytes; it cannot fit in one commitlog file")
