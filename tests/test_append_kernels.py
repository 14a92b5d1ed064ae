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


PROP_CHARS = ["a", "b", "K", "é", "键", "😀", "\"", "\\", "/", "\t", " ", "\x7f", "\x01", "=", "\u2028"]


def _raw_entries(raw: str) -> list[tuple[str, str]]:
    """MessageDecoder.string2messageProperties, written again: entries of name \\x01 value, separated by \\x02."""
    out = []
    for piece in raw.split("\x02"):
        sep = piece.find("\x01")
        if 0 < sep < len(piece) - 1:
            out.append((piece[:sep], piece[sep + 1:]))
    return out


def _props_case(rng: random.Random) -> tuple[str, str]:
    """(propertiesRaw, the text of a properties object): usually the same entries, sometimes not."""
    def word():
        return "".join(rng.choice(PROP_CHARS) for _ in range(rng.randrange(0, 5)))

    entries = [(word(), word()) for _ in range(rng.randrange(0, 6))]
    raw = "\x02".join(f"{k}\x01{v}" for k, v in entries) + rng.choice(["", "\x02"])
    pairs = _raw_entries(raw)
    op = rng.random()
    if op < 0.15 and pairs:
        pairs[rng.randrange(len(pairs))] = (word(), word())  # an entry changed
    elif op < 0.25 and pairs:
        pairs.append(rng.choice(pairs))  # a name twice in the object
    elif op < 0.3 and pairs:
        del pairs[rng.randrange(len(pairs))]
    elif op < 0.45 and pairs:  # one character changed: the first or the last of a name or a value
        j = rng.randrange(len(pairs))
        kv = list(pairs[j])
        side = rng.randrange(2)
        kv[side] = (rng.choice(PROP_CHARS) + kv[side][1:]) if rng.random() < 0.5 else (kv[side][:-1] + rng.choice(PROP_CHARS))
        pairs[j] = (kv[0], kv[1])
    if rng.random() < 0.3:
        rng.shuffle(pairs)
    sep = rng.choice([(",", ":"), (",", ":"), (", ", ": ")])
    ascii_only = rng.random() < 0.3
    text = "{" + sep[0].join(json.dumps(k, ensure_ascii=ascii_only) + sep[1] + json.dumps(v, ensure_ascii=ascii_only)
                             for k, v in pairs) + "}"
    return raw, text


def _props_ok(raw: str, text: str) -> bool:
    """The parser's rule: the object and the raw string hold the same entries, no name twice on either side,
    names and values not empty and free of the separators."""
    got = json.loads(text, object_pairs_hook=list)
    want = _raw_entries(raw)
    if len({k for k, _ in got}) != len(got) or len({k for k, _ in want}) != len(want):
        return False
    if any(not k or not v or "\x01" in k + v or "\x02" in k + v for k, v in got):
        return False
    return dict(got) == dict(want)


def _props_line(text: str, raw_json: str) -> str:
    """A dumped line whose properties object is ``text`` and whose propertiesRaw is the JSON ``raw_json`` (with
    whatever field text follows it)."""
    line = _line("QUJD").decode().replace('"properties":{"a":"b"}', '"properties":' + text)
    return line.replace('"propertiesRaw":"a\\u0001b"', '"propertiesRaw":' + raw_json)


def _parsed(lines: list[bytes]) -> tuple:
    """replaykernel.parse of the lines, one after the other: (columns, status, side buffer)."""
    u8 = np.frombuffer(b"\n".join(lines) + b"\n", np.uint8)
    ends = np.flatnonzero(u8 == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    return replaykernel.parse(u8, starts, ends, True)


def test_properties_object_compared_like_python():
    """The properties object is taken (OK) exactly when it holds the raw string's entries (the one-pass path for
    entries in order without escapes, the general one for the rest), else the line is SLOW."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    cases = [_props_case(rng) for _ in range(3000)]
    lines = [_props_line(text, json.dumps(raw, ensure_ascii=False)).encode() for raw, text in cases]
    _, status, _ = _parsed(lines)
    ok = 0
    for i, (raw, text) in enumerate(cases):
        want = _props_ok(raw, text)
        assert (status[i] == replaykernel.OK) == want, (seed, raw, text, int(status[i]))
        ok += want
    assert 500 < ok < len(cases) - 300, ok


def test_line_ends_equal_numpy():
    """line_ends (8 bytes a step) finds every \\n, tells whether a \\r or a byte >= 0x80 is anywhere, and says -1
    when its room is short, on seeded blocks of every length modulo 8 and bytes at word edges."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    for trial in range(3000):
        n = int(rng.integers(0, 200))
        alphabet = [np.array([10, 13, 65, 200, 0, 127, 128, 255, 9], np.uint8), np.array([65, 66, 10], np.uint8),
                    np.array([65, 10, 13], np.uint8), np.array([65, 66], np.uint8)][int(rng.integers(4))]
        u8 = rng.choice(alphabet, n).astype(np.uint8)
        room = int(rng.integers(0, 40))
        ends = np.full(room, -7, np.int64)
        count, cr, wide = replaykernel.line_ends(u8, ends)
        want = np.flatnonzero(u8 == 10)
        if len(want) > room:
            assert count == -1, (seed, trial)
            continue
        assert count == len(want) and (ends[:count] == want).all(), (seed, trial)
        assert cr == bool((u8 == 13).any()) and wide == bool((u8 >= 128).any()), (seed, trial)


def test_blocks_are_whole_lines_of_the_input(monkeypatch):
    """The input read in blocks (straight into arrays, the end of a line carried over, a line longer than a block
    kept whole), through streams that return short reads: the blocks put together are the input, each ends a
    line (the last may lack its newline), none is empty."""
    import io

    from rmqstore_cli.engine.log import replay as replay_mod

    class Trickle(io.BytesIO):
        def __init__(self, data, rng):
            super().__init__(data)
            self.rng = rng

        def readinto(self, b):
            return super().readinto(memoryview(b)[: self.rng.randrange(1, len(b) + 1)])

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    for trial in range(400):
        lines = [b"x" * rng.choice([0, 1, 5, 30, 200, 3000]) for _ in range(rng.randrange(0, 30))]
        data = b"\n".join(lines) + rng.choice([b"", b"\n"])
        monkeypatch.setattr(replay_mod, "BLOCK_BYTES", rng.choice([1, 2, 7, 64, 1000, 1 << 16]))
        stream = Trickle(data, rng) if rng.random() < 0.5 else io.BytesIO(data)
        blocks = [bytes(b) for b in replay_mod._blocks(stream)]
        assert b"".join(blocks) == data, (seed, trial)
        assert all(blocks) and all(b.endswith(b"\n") for b in blocks[:-1]), (seed, trial)


LONG_CHARS = ["a", "Z", "0", "é", "键", "😀", "\"", "\\", "/", "\t", "\x1f", "\x7f", "\x01", "\x02", "\u2028", " "]


def _long_word(rng: random.Random) -> str:
    """Runs of plain letters (whole 32-byte steps) broken by characters JSON escapes or UTF-8 widens."""
    out = []
    for _ in range(rng.randrange(0, 4)):
        out.append("x" * rng.choice([0, 1, 7, 8, 31, 32, 33, 64]))
        out.append("".join(rng.choice(LONG_CHARS) for _ in range(rng.randrange(0, 4))))
    return "".join(out)


def test_long_strings_decoded_like_python():
    """Long property strings and ids (32 bytes tested and copied at once, ``\\u00XX`` below 0x80 decoded in one
    step, ``INNER_MULTI_`` / ``__CRC32#`` looked for a word at a time): the decoded propertiesRaw equals Python's
    UTF-8 of the string, and a line is OK exactly when its JSON is valid, its object holds the raw string's
    entries and neither special key is in the raw string."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    cases, lines = [], []
    for _ in range(3000):
        raw = "\x02".join(f"{_long_word(rng)}\x01{_long_word(rng)}" for _ in range(rng.randrange(1, 4)))
        if rng.random() < 0.15:  # a special key at any offset
            at = rng.randrange(len(raw) + 1)
            raw = raw[:at] + rng.choice(["INNER_MULTI_", "__CRC32#", "INNER_MULTJ_", "__CRC32"]) + raw[at:]
        entries = _raw_entries(raw)
        ascii_only = rng.random() < 0.5
        text = "{" + ",".join(json.dumps(k, ensure_ascii=ascii_only) + ":" + json.dumps(v, ensure_ascii=ascii_only)
                              for k, v in entries) + "}"
        msg_id = _long_word(rng)
        id_text = json.dumps(msg_id, ensure_ascii=ascii_only)
        broken = rng.random() < 0.1 and len(id_text) > 2
        if broken:  # a raw control character inside a string: not JSON
            at = rng.randrange(1, len(id_text) - 1)
            id_text = id_text[:at] + "\x03" + id_text[at:]
        line = _props_line(text, json.dumps(raw, ensure_ascii=ascii_only) + ',"msgId":' + id_text)
        want = not broken and _props_ok(raw, text) and "INNER_MULTI_" not in raw and "__CRC32#" not in raw
        cases.append((raw, want))
        lines.append(line.encode())
    cols, status, side = _parsed(lines)
    ok = 0
    for i, (raw, want) in enumerate(cases):
        assert (status[i] == replaykernel.OK) == want, (seed, i, raw, int(status[i]))
        if want:
            s, n = int(cols[i, replaykernel.I_RAW]), int(cols[i, replaykernel.I_RAWLEN])
            assert bytes(side[s:s + n]) == raw.encode("utf-8"), (seed, i, raw)
            ok += 1
    assert 1000 < ok < len(cases) - 200, ok


def test_integers_read_in_one_pass_like_json():
    """_int_read (and _int_end, its end) gives what Python's JSON reads for an integer of at most 18 digits (no
    leading zero, no fraction or exponent); anything else is -1."""
    from rmqstore_cli.formats.jsonscan import _int_end, _int_read

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    good = 0
    for trial in range(3000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 1, 2, 5, 13, 17, 18, 19, 20])))
        text = rng.choice(["", "-"]) + digits + rng.choice(["", ",", "}", ".5", "e3", "E", " ", "x"])
        u8 = np.frombuffer(text.encode() + b"!", np.uint8)
        e = len(text)
        q, v = _int_read(u8, 0, e)
        m = re.match(r"-?(0|[1-9][0-9]{0,17})(?![0-9.eE])", text)
        if m:
            assert (q, v) == (m.end(), int(m.group())), (seed, text)
            good += 1
        else:
            assert q == -1, (seed, text)
        assert _int_end(u8, 0, e) == q, (seed, text)
    assert good > 500


def test_base64_decode32_equals_python():
    """32 base64 digits decoded at once equal binascii's 24 bytes; a character that is not a digit at any of the
    32 places gives False."""
    import numba

    from rmqstore_cli.formats.wordstore import _base64_decode32

    @numba.njit
    def decode(dst, di, src, si):
        return _base64_decode32(dst, di, src, si)

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    for trial in range(2000):
        text = bytearray(rng.choice(B64_DIGITS.encode()) for _ in range(32))
        bad = rng.random() < 0.4
        if bad:
            text[rng.randrange(32)] = rng.choice(b"=-_ .!~\"\x00\x7f\x80\xff@[`{:")
        lead = rng.randrange(8)
        src = np.frombuffer(b"#" * lead + bytes(text) + b"#" * rng.randrange(3), np.uint8)
        dst = np.zeros(40, np.uint8)
        at = rng.randrange(16)
        got = decode(dst, at, src, lead)
        assert got == (not bad), (seed, bytes(text))
        if not bad:
            assert bytes(dst[at:at + 24]) == binascii.a2b_base64(bytes(text)), (seed, bytes(text))
            assert not dst[:at].any() and not dst[at + 24:].any(), (seed, bytes(text))
