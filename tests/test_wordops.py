"""The word-at-a-time intrinsics the JSON writer and append's encoder use (formats/wordops.py,
formats/wordstore.py), against plain Python: which bytes JSON must escape, 32 at a time; short copies eight bytes
a step (and byte by byte at a buffer's end); one memcpy; an unaligned word store read back. The seed is printed;
any seed must pass."""

from __future__ import annotations

import random

import numba
import numpy as np

from rmqstore_cli.formats.wordops import _json_special32, _word
from rmqstore_cli.formats.wordstore import _copy, _copy_words, _store_word


@numba.njit
def _masks(u8):
    out = np.empty(len(u8) - 31, np.uint64)
    for i in range(len(out)):
        out[i] = _json_special32(u8, i)
    return out


@numba.njit
def _copy_short(out, p, u8, a, n):
    _copy_words(out, p, u8, a, n)


@numba.njit
def _memcpy(out, p, u8, a, n):
    _copy(out, p, u8, a, n)


@numba.njit
def _store_then_load(out, i, w):
    _store_word(out, i, w)
    return _word(out, i)


def _special(c: int) -> bool:
    return c < 0x20 or c >= 0x80 or c in (0x22, 0x5C)


def _rng():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    return random.Random(seed), seed


def test_json_special_mask_flags_exactly_the_bytes_json_escapes():
    rng, seed = _rng()
    # every byte value, in random order and with plain runs between them
    data = bytearray(range(256)) * 2 + bytes(rng.choice(b"abcXYZ019 ~\x7f") for _ in range(300))
    rng.shuffle(data)
    u8 = np.frombuffer(bytes(data), np.uint8)
    masks = _masks(u8)
    for i, m in enumerate(masks.tolist()):
        want = sum(1 << t for t in range(32) if _special(data[i + t]))
        assert m == want, (seed, i)


def test_short_copies_equal_the_span_and_touch_nothing_before_it():
    rng, seed = _rng()
    src = np.frombuffer(bytes(rng.randrange(256) for _ in range(200)), np.uint8)
    for _ in range(500):
        n = rng.randrange(0, 40)
        a = rng.randrange(0, len(src) - n + 1)  # near the end too: the byte-by-byte path
        out = np.full(120, 0xEE, np.uint8)
        p = rng.randrange(0, len(out) - n + 1)
        _copy_short(out, p, src, a, n)
        assert bytes(out[p:p + n]) == bytes(src[a:a + n]), (seed, a, n, p)
        assert bytes(out[:p]) == b"\xee" * p, (seed, a, n, p)
        assert len(out) - (p + n) < 8 or bytes(out[p + n + 8:]) == b"\xee" * (len(out) - p - n - 8), (seed, a, n, p)
        if a + n + 8 > len(src) or p + n + 8 > len(out):  # no room for a whole word: nothing written past the span
            assert bytes(out[p + n:]) == b"\xee" * (len(out) - p - n), (seed, a, n, p)


def test_memcpy_and_word_store():
    rng, seed = _rng()
    src = np.frombuffer(bytes(rng.randrange(256) for _ in range(300)), np.uint8)
    for _ in range(200):
        n = rng.randrange(0, 100)
        a, p = rng.randrange(0, len(src) - n + 1), rng.randrange(0, 200 - n + 1)
        out = np.zeros(200, np.uint8)
        _memcpy(out, p, src, a, n)
        assert bytes(out[p:p + n]) == bytes(src[a:a + n]) and not out[:p].any() and not out[p + n:].any(), seed
    out = np.zeros(16, np.uint8)
    w = rng.randrange(1 << 64)
    assert _store_then_load(out, 3, np.uint64(w)) == w, seed
    assert bytes(out[3:11]) == w.to_bytes(8, "little") and not out[:3].any() and not out[11:].any(), seed
