"""The compiled pieces of ``append --from`` (formats/replaykernel.py, formats/replayencode.py, formats/wordstore.py)
against independent pure-Python computations on seeded random inputs (the seed is printed)."""

from __future__ import annotations

import base64
import binascii
import json
import random
import re

import numpy as np

from rmqstore_cli.formats import replaykernel

B64_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
# what the parser takes as a body: whole quads, the last one may end in "x=" + "=" or "xx" + "="
STRICT_B64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def _line(body_field: str) -> bytes:
    m = {"topic": "T", "queueId": 1, "flag": 0, "sysFlag": 0, "bornTimestamp": 5,
         "bornHost": {"ip": "10.0.0.7", "ipHex": "0A000007", "port": 1}, "storeTimestamp": 6,
         "storeHost": {"ip": "10.0.0.1", "ipHex": "0a000001", "port": 2}, "reconsumeTimes": 0,
         "preparedTransactionOffset": 0, "properties": {"a": "b"}, "propertiesRaw": "a\u0001b"}
    return (json.dumps(m, separators=(",", ":"))[:-1] + ',"bodyBase64":"' + body_field + '"}').encode()


def _b64_case(rng: random.Random) -> str:
    data = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 2, 3, 5, 6, 7, 8, 11, 12, 13, 47, 48, 100])))
    text = base64.b64encode(data).decode()
    op = rng.random()
    if op < 0.4 or not text:
        return text
    chars = list(text)
    at = rng.randrange(len(chars))
    if op < 0.6:
        chars[at] = rng.choice("=-_ .!~\x7f" + B64_DIGITS)  # a character that is not a digit, or another digit
    elif op < 0.75:
        del chars[at]
    elif op < 0.9:
        chars.insert(at, rng.choice("=" + B64_DIGITS))
    else:
        chars = chars[: rng.randrange(len(chars))]
    return "".join(chars)


def test_base64_bodies_equal_python(capsys):
    """Each body decoded by the parser (8 characters a step, then 4, then the padding) equals ``binascii``'s
    decoding of a strict base64 string, and every other string makes the line SLOW."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    cases = [_b64_case(rng) for _ in range(4000)]
    data = b"\n".join(_line(c) for c in cases) + b"\n"
    u8 = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(u8 == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    cols, status, side = replaykernel.parse(u8, starts, ends, True)
    taken = 0
    for i, text in enumerate(cases):
        if STRICT_B64.fullmatch(text):
            assert status[i] == replaykernel.OK, (seed, text)
            s, n = int(cols[i, replaykernel.I_BODY]), int(cols[i, replaykernel.I_BODYLEN])
            assert bytes(side[s:s + n]) == binascii.a2b_base64(text), (seed, text)
            taken += 1
        else:
            assert status[i] == replaykernel.SLOW, (seed, text)
    assert taken > 1000
