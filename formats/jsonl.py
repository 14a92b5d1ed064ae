"""JSON Lines for commitlog records (``dump commitlog --json``, ``dump --follow --json``).

Produces, for a block of records given as :class:`formats.fast.Headers` columns, exactly the
bytes that ``json_line(render_body(decode_message(buf, pos), body))`` (plus the ``offset``
field) would give, UTF-8 encoded, one line per record. The lines are written by the compiled
kernel :func:`formats.jsonkernel.write_lines` into one buffer per block (no Python object per
record); the few records it leaves out go through :func:`reference_line`, the reference decoder
(:func:`formats.message.decode_message`). tests/test_jsonl_fast.py and tests/test_jsonkernel.py
compare the two on every broker-written record and on fuzzed ones.

:func:`topic_mask` (the ``--topic`` filter) groups the topic bytes of a block and decodes each
distinct topic once.
"""

from __future__ import annotations

import json

import numpy as np

from .fast import Headers
from .message import decode_message, decode_utf8, render_body

__all__ = ["encode_records", "reference_line", "topic_mask", "BLOCK_RECORDS"]

BLOCK_RECORDS = 8192  # records per block (the scan's chunk size)
_MAX_PASSES = 16


def _dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _gather_var(u8: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Bytes ``u8[start:start+len]`` of each row, left-aligned, slot padded with 0."""
    w = int(lens.max()) if len(lens) else 0
    if w == 0:
        return np.zeros((len(starts), 0), np.uint8)
    col = np.arange(w, dtype=np.int64)
    idx = starts[:, None] + col[None, :]
    np.minimum(idx, len(u8) - 1, out=idx)
    out = u8[idx]
    out[col[None, :] >= lens[:, None]] = 0
    return out


def _group_rows(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a byte matrix and each row's index among them.

    Values repeat (a few topics, one or two hosts): rows are compared as 64-bit words against
    one representative at a time; many distinct values fall back to a sort.
    """
    n, w = mat.shape
    inverse = np.zeros(n, dtype=np.int64)
    if n == 0:
        return mat[:0], inverse
    pad = (-w) % 8
    words = np.concatenate([mat, np.zeros((n, pad), np.uint8)], axis=1) if pad else np.ascontiguousarray(mat)
    words = words.view(np.uint64)
    reps: list[np.ndarray] = []
    todo = None  # all rows
    while True:
        cand = words if todo is None else words[todo]
        if len(reps) == _MAX_PASSES:
            uniq, inv = np.unique(mat[todo], axis=0, return_inverse=True)
            inverse[todo] = inv.reshape(-1) + len(reps)
            reps.extend(uniq)
            break
        first = 0 if todo is None else int(todo[0])
        eq = (cand == words[first]).all(axis=1)
        reps.append(mat[first])
        if eq.all():
            if todo is not None:
                inverse[todo] = len(reps) - 1
            break
        if todo is None:
            todo = np.flatnonzero(~eq)
        else:
            inverse[todo[eq]] = len(reps) - 1
            todo = todo[~eq]
    return np.array(reps), inverse


def _topics(u8, starts, lens):
    """A string column whose values repeat (topics) grouped by bytes: (decoded distinct values,
    each row's index among them)."""
    mat = _gather_var(u8, starts, lens)
    key = np.concatenate([mat, lens.astype(">u2").view(np.uint8).reshape(-1, 2)], axis=1)
    uniq, inverse = _group_rows(key)
    texts = [decode_utf8(bytes(r[: int.from_bytes(bytes(r[-2:]), "big")])) for r in uniq]
    return texts, inverse


def _take(h: Headers, idx) -> Headers:
    t = Headers()
    for name in Headers.__slots__:
        setattr(t, name, getattr(h, name)[idx])
    return t


BLOCK_BYTES = 32 << 20  # output bound of one kernel call (large bodies: fewer records per block)


def encode_records(buf, h: Headers, base: int, body: str = "none", idx: np.ndarray | None = None) -> bytes:
    """JSON Lines (UTF-8) of the records ``h`` (all, or those at ``idx``) of a buffer whose
    first byte is commitlog offset ``base``; body rendered as ``--body`` does."""
    return b"".join(text for text, _ in encode_blocks(buf, h, base, body, idx))


def encode_blocks(buf, h: Headers, base: int, body: str = "none", idx: np.ndarray | None = None, *,
                  block_bytes: int | None = None, as_array: bool = False):
    """:func:`encode_records` in pieces: yields (text, records in it), each piece at most
    BLOCK_RECORDS records and, unless one record alone is larger, about ``block_bytes`` (default
    BLOCK_BYTES) of text.
    With ``as_array`` a piece may come as a uint8 array over the writer's buffer (no copy)."""
    if idx is not None:
        h = _take(h, idx)
    block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes
    n = len(h)
    if n == 0:
        return
    mode = _BODY_CODES.get(body)
    if mode is None:
        raise ValueError(f"unknown body mode {body!r}")
    from .aot import kernels

    jsonkernel = kernels("jsonkernel")
    if n <= BLOCK_RECORDS and jsonkernel.capacity(h, mode) <= block_bytes:
        yield _encode_block(buf, h, base, body, as_array), n
        return
    need = np.cumsum(jsonkernel.record_capacity(h, mode))
    i = 0
    while i < n:
        done = int(need[i - 1]) if i else 0
        j = int(np.searchsorted(need, done + block_bytes, side="right"))
        j = min(max(j, i + 1), i + BLOCK_RECORDS, n)
        yield _encode_block(buf, _take(h, slice(i, j)), base, body, as_array), j - i
        i = j


_BODY_CODES = {"none": 0, "hex": 1, "base64": 2, "text": 3}  # formats.jsonkernel.BODY_*


def kernel_lines(buf, h: Headers, base: int, body: str):
    """The compiled writer's output for the records ``h``: (buffer, bytes used, end of each line,
    which records it left to the reference decoder — their lines are empty)."""
    from . import fast
    from .aot import kernels

    jsonkernel = kernels("jsonkernel")
    mode = _BODY_CODES.get(body)
    if mode is None:
        raise ValueError(f"unknown body mode {body!r}")
    n = len(h)
    out = np.empty(jsonkernel.capacity(h, mode), np.uint8)
    ends = np.empty(n, np.int64)
    fallback = np.zeros(n, np.bool_)
    size = jsonkernel.write_lines(
        fast.kernel_view(buf), np.int64(base), mode, h.offsets, h.totalSize, h.magicCode, h.bodyCRC, h.queueId,
        h.flag, h.queueOffset, h.physicalOffset, h.sysFlag, h.bornTimestamp, h.bornHostStart, h.bornHostLen,
        h.storeTimestamp, h.storeHostStart, h.storeHostLen, h.reconsumeTimes, h.preparedTransactionOffset,
        h.bodyStart, h.bodyLength, h.topicStart, h.topicLength, h.propsStart, h.propsLength, out, ends, fallback,
        np.empty((jsonkernel.MAX_ENTRIES, 5), np.int64))
    return out, size, ends, fallback


def _encode_block(buf, h: Headers, base: int, body: str, as_array: bool = False):
    """One buffer per block from the compiled writer; the records it leaves out are spliced in."""
    out, size, ends, fallback = kernel_lines(buf, h, base, body)
    if not fallback.any():
        return out[:size] if as_array else out[:size].tobytes()
    pieces, at = [], 0
    for i in np.flatnonzero(fallback).tolist():
        end = int(ends[i])
        pieces.append(out[at:end].tobytes())
        pieces.append(reference_line(buf, int(h.offsets[i]), base, body))
        at = end
    pieces.append(out[at:size].tobytes())
    return b"".join(pieces)


def reference_line(buf, pos: int, base: int, body: str) -> bytes:
    """One record's line through the reference decoder (formats.message)."""
    m = decode_message(buf, pos, with_body=body != "none")
    m["offset"] = base + pos
    return _dumps(render_body(m, body)) + b"\n"


def topic_mask(buf, h: Headers, topic: str) -> np.ndarray:
    """Records whose decoded topic equals ``topic`` (as the reference compares decoded text)."""
    u8 = np.frombuffer(buf, np.uint8)
    texts, inverse = _topics(u8, h.topicStart, h.topicLength)
    hit = np.array([t == topic for t in texts], dtype=bool)
    return hit[inverse]
