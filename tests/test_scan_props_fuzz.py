"""The walk that also locates properties (``propscan.scan_records``, one compiled pass per record)
against the plain walk and an independent parse of each record's property bytes.

Random records (v1/v2 magic, IPv4/IPv6 hosts, property strings from the property fuzz test's pieces: prefixes of
the wanted names, separators in odd places, non-ASCII bytes, long values), some damaged (a body CRC, a length), then
a random tail; walked in chunks of random size with every CRC policy. Each chunk must give the plain walk's headers,
stop and reason, and for every record the value spans the plain split of its property bytes gives (the last
non-empty ``NAME\\x01value`` entry wins) and whether they are all ASCII. The seed is printed; any seed must pass.
"""

from __future__ import annotations

import random
import struct

import numpy as np

from rmqstore_cli.formats import fast, propscan
from rmqstore_cli.formats.message import encode_message
from rmqstore_cli.formats.records import MAGIC_BLANK, MAGIC_V1, MAGIC_V2, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6
from tests.test_propkernel_fuzz import NAMES, _random_props, _spans

BOTH = (MAGIC_V1, MAGIC_V2)


def _records(rng: random.Random, n: int) -> tuple[bytes, list]:
    """``n`` records end to end, some damaged, then a random tail; (bytes, (start, properties start, properties) each)."""
    out = bytearray()
    where = []
    for _ in range(n):
        props = _random_props(rng)
        if rng.random() < 0.1:
            props = props[:0x7FFF]
        v6 = rng.random() < 0.2
        host = (bytes(16), 7) if v6 else (bytes([10, 0, 0, 1]), 7)
        body = rng.randbytes(rng.choice([0, 1, 9, 100, 1000, rng.randint(0, 3000)]))
        rec = bytearray(encode_message(
            topic=b"Topic" * rng.randint(0, 3), queue_id=rng.randint(0, 7), flag=0, queue_offset=rng.randint(0, 99),
            physical_offset=len(out), sysflag=(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6) if v6 else 0,
            born_timestamp=1, born_host=host, store_timestamp=2, store_host=host, reconsume_times=0, prepared_offset=0,
            body=body, properties=props, magic=MAGIC_V2 if rng.random() < 0.3 else MAGIC_V1))
        roll = rng.random()
        if roll < 0.01 and body:
            rec[8] ^= 1  # body CRC
        elif roll < 0.02:
            struct.pack_into(">i", rec, 0, len(rec) + rng.choice((-3, 5)))  # TOTALSIZE off the computed size
        where.append((len(out), len(out) + len(rec) - len(props), props))
        out += rec
    tail = rng.choice(["blank", "zeros", "garbage", "torn", "eof"])
    if tail == "blank":
        out += struct.pack(">ii", 4096, MAGIC_BLANK) + bytes(4088)
    elif tail == "zeros":
        out += bytes(rng.randint(8, 300))
    elif tail == "garbage":
        out += rng.randbytes(40)
    elif tail == "torn" and where:
        out += out[where[-1][0]:where[-1][0] + 30]
    return bytes(out), where


def test_the_walk_with_properties_equals_the_walk_and_a_plain_parse():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    names = NAMES + ("KEYS",)  # a name twice is located once
    for _ in range(12):
        buf, where = _records(rng, rng.randint(0, 400))
        by_start = {s: (ps, p) for s, ps, p in where}
        u8 = fast.kernel_view(buf)
        check_crc = rng.random() < 0.8
        prop_crc = rng.choice((fast.PROP_NONE, fast.PROP_IF_PRESENT, fast.PROP_REQUIRED))
        pos, seen = 0, 0
        while True:
            chunk = rng.choice((1, 3, 64, 1000))
            plain = fast.scan_records(buf, pos, len(buf), max_records=chunk, check_crc=check_crc, prop_crc=prop_crc)
            got = propscan.scan_records(buf, pos, len(buf), BOTH, chunk, check_crc, prop_crc, u8, names)
            assert (got.stop, got.kind, got.size, got.magic, got.reason) == (plain.stop, plain.kind, plain.size, plain.magic,
                                                                             plain.reason)
            for col in fast.Headers.__slots__:
                assert np.array_equal(getattr(got.headers, col), getattr(plain.headers, col)), col
            pv = got.props
            assert set(pv.start) == set(NAMES)
            for i, start in enumerate(got.headers.offsets.tolist()):
                ps, raw = by_start[start]
                want = _spans(raw, ps, NAMES)
                assert {k: (int(pv.start[k][i]), int(pv.end[k][i])) for k in NAMES} == want, raw
                assert bool(pv.ascii[i]) == all(b < 0x80 for b in raw), raw
            seen += len(got.headers)
            if got.kind != fast.STOP_CHUNK:
                break
            pos = got.stop
        assert seen <= len(where)
