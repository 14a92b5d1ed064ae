"""Offset message ids and client UNIQ_KEYs (FORMAT.md §6)."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass


def host_to_str(ip: bytes) -> str:
    """Java ``InetAddress.getHostAddress`` text: dotted IPv4, or 8 uncompressed lowercase IPv6 groups."""
    if len(ip) == 4:
        return ".".join(str(b) for b in ip)
    return ":".join(format(g, "x") for g in struct.unpack(">8H", ip))


def parse_host(text: str) -> tuple[bytes, int]:
    """``ip:port``, ``[v6]:port`` or a bare ip (port 0) -> (ip bytes, port). IPv4-mapped v6 becomes 4 bytes."""
    text = text.strip()
    port = 0
    if text.startswith("["):
        end = text.index("]")
        host, rest = text[1:end], text[end + 1 :]
        if rest.startswith(":"):
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, p = text.split(":")
        port = int(p)
    else:
        host = text
    addr = ipaddress.ip_address(host)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # Java treats ::ffff:a.b.c.d as an Inet4Address
    if not (0 <= port <= 0x7FFFFFFF):
        raise ValueError(f"port out of range: {port}")
    return addr.packed, port


def encode_offset_msgid(store_ip: bytes, store_port: int, phy_offset: int) -> str:
    return (store_ip + struct.pack(">iq", store_port, phy_offset)).hex().upper()


@dataclass(frozen=True)
class OffsetMsgId:
    """The broker's offset message id (MessageDecoder.createMessageId): store host, port and commitlog offset."""

    ip: bytes
    port: int
    offset: int

    @property
    def host(self) -> str:
        return host_to_str(self.ip)


def decode_offset_msgid(msgid: str) -> OffsetMsgId:
    """32 hex chars -> IPv4, 56 -> IPv6 (any other length is rejected)."""
    raw = bytes.fromhex(msgid)
    if len(raw) == 16:
        ip_len = 4
    elif len(raw) == 28:
        ip_len = 16
    else:
        raise ValueError(f"an offset msgId has 32 or 56 hex digits, not {len(msgid)}")
    port, offset = struct.unpack_from(">iq", raw, ip_len)
    return OffsetMsgId(raw[:ip_len], port, offset)


@dataclass(frozen=True)
class UniqKey:
    """The client's unique key (MessageClientIDSetter): ip, pid, class-loader hash, time in the month, counter."""

    ip: bytes
    pid: int
    class_loader_hash: int
    time_in_month_ms: int
    counter: int

    @property
    def host(self) -> str:
        return host_to_str(self.ip)


def decode_uniq_key(key: str) -> UniqKey:
    raw = bytes.fromhex(key)
    if len(raw) == 16:
        ip_len = 4
    elif len(raw) == 28:
        ip_len = 16
    else:
        raise ValueError(f"a UNIQ_KEY has 32 or 56 hex digits, not {len(key)}")
    # Java's decoder (getNearlyTimeFromID) reads the time unsigned: a producer's int that wrapped
    # negative late in a month (§6.2) still decodes to the right time.
    pid, clh, t, counter = struct.unpack_from(">HiIH", raw, ip_len)
    return UniqKey(raw[:ip_len], pid, clh & 0xFFFFFFFF, t, counter)
