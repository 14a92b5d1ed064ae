"""Compiled timer-store passes (numba, nopython): the timerlog walk and the wheel replay.

:func:`walk_units` reads one timerlog file's units into columns the way ``TimerMessageStore.
recoverAndRevise`` reads them: 52-byte steps from the file start, stopping at the end-of-file blank,
at zeros (end of data) or at the first unit whose size or magic is wrong. :func:`replay_wheel` replays
``doEnqueue``'s wheel bookkeeping over units in timerlog order: for each unit the slot's previous
``lastPos`` (what its prevPos must be), and the slot's firstPos / lastPos / num afterwards; the result
is the wheel the broker wrote, from the timerlog alone.

Imported lazily (numba loads on first use); constants come in as arguments or literals derived from
:mod:`formats.timer` (numba freezes globals into the cached machine code).
"""

from __future__ import annotations

import numba

from .kernel import _i32, _i64, _jit
from .records import field_offsets
from .timer import TIMER_BLANK_MAGIC, TIMER_UNIT_FIELDS, TIMER_UNIT_SIZE, WHEEL_SLOTS

_OFF = field_offsets(TIMER_UNIT_FIELDS)
U_SIZE, U_PREV, U_MAGIC, U_CWT, U_DELAY = _OFF["size"], _OFF["prevPos"], _OFF["magic"], _OFF["currWriteTime"], _OFF["delay"]
U_OFFPY, U_SIZEPY, U_HASH, U_RESERVED = _OFF["offsetPy"], _OFF["sizePy"], _OFF["realTopicHash"], _OFF["reserved"]
UNIT = TIMER_UNIT_SIZE
BLANK = TIMER_BLANK_MAGIC
SLOTS = WHEEL_SLOTS

# How a walk of one file ended (the engine names them in timer/files.py).
END_LIMIT, END_BLANK, END_ZERO, END_BAD_SIZE, END_BAD_MAGIC, END_FILE = 0, 1, 2, 3, 4, 5


@numba.njit(inline="always")
def _all_zero(u8, p, n):
    for j in range(p, min(p + n, u8.shape[0])):
        if u8[j] != 0:
            return False
    return True


def _walk_units(u8, start, limit, prev, magic, cwt, delay, offpy, sizepy, thash, reserved):
    """Units from byte ``start`` of a file (``u8``) while fewer than ``limit`` were taken; returns
    (units taken, position after them, END_* kind)."""
    n = 0
    p = start
    size_all = u8.shape[0]
    while True:
        if n >= limit:
            return n, p, END_LIMIT
        if p + UNIT > size_all:
            if p + 16 <= size_all and _i32(u8, p + U_MAGIC) == BLANK:
                return n, p, END_BLANK
            return n, p, END_FILE
        m = _i32(u8, p + U_MAGIC)
        if m == BLANK:
            return n, p, END_BLANK
        s = _i32(u8, p)
        if s == 0 and m == 0 and _all_zero(u8, p, UNIT):
            return n, p, END_ZERO
        if s != UNIT:
            return n, p, END_BAD_SIZE
        if (m | 0xF) != 0xF:
            return n, p, END_BAD_MAGIC
        prev[n] = _i64(u8, p + U_PREV)
        magic[n] = m
        cwt[n] = _i64(u8, p + U_CWT)
        delay[n] = _i32(u8, p + U_DELAY)
        offpy[n] = _i64(u8, p + U_OFFPY)
        sizepy[n] = _i32(u8, p + U_SIZEPY)
        thash[n] = _i32(u8, p + U_HASH)
        reserved[n] = _i64(u8, p + U_RESERVED)
        n += 1
        p += UNIT


def _replay_wheel(pos, prev, magic, slot_units, floor, w_time, w_first, w_last, w_num, w_cut, expected_prev):
    """doEnqueue's slot bookkeeping over units in timerlog order (``w_*``: the wheel so far, one entry
    per slot index, ``w_time`` -1 where empty). ``w_cut`` marks slots whose chain starts before the
    timerlog's first file (``floor``: its start), whose num and firstPos cannot be checked."""
    for i in range(pos.shape[0]):
        t = slot_units[i]
        idx = t % SLOTS
        if w_time[idx] != t:  # getSlot: another time in this slot counts as empty
            exp = -1
            w_time[idx] = t
            w_first[idx] = pos[i]
            w_num[idx] = 0
            w_cut[idx] = 1 if (0 <= prev[i] < floor) else 0
        else:
            exp = w_last[idx]
        expected_prev[i] = exp
        w_last[idx] = pos[i]
        w_num[idx] += -1 if (magic[i] & 4) else 1


def _late_slots(slot_units, prev, magic, l_time, l_prev, l_delta):
    """Per slot index, what units written after the checkpoint's flush position did to the slot: the
    prevPos of the first of them (the slot's lastPos before them) and their num change. A unit of
    another time restarts the slot, as getSlot does."""
    for i in range(slot_units.shape[0]):
        t = slot_units[i]
        idx = t % SLOTS
        if l_time[idx] != t:
            l_time[idx] = t
            l_prev[idx] = prev[i]
            l_delta[idx] = 0
        l_delta[idx] += -1 if (magic[i] & 4) else 1


def _hash_spans64(u8, starts, ends, out):
    """FNV-1a (64-bit) of each byte span ``u8[starts[i]:ends[i]]`` (0 where start < 0): a key that
    stands for a property's text in a join (a match is confirmed on the text itself)."""
    for i in range(starts.shape[0]):
        s = starts[i]
        if s < 0:
            out[i] = 0
            continue
        h = numba.uint64(0xCBF29CE484222325)
        for j in range(s, ends[i]):
            h = (h ^ numba.uint64(u8[j])) * numba.uint64(0x100000001B3)
        out[i] = numba.int64(h | numba.uint64(1))  # never 0


# How a chain walk inside one file stopped (timer/report.py names them).
CHAIN_END, CHAIN_LIMIT, CHAIN_LOOP, CHAIN_HISTORY, CHAIN_OTHER_FILE, CHAIN_OUTSIDE, CHAIN_OTHER_SLOT = 0, 1, 2, 3, 4, 5, 6


def _chain_in_file(u8, file_start, pos, slot_units, precision, floor, out, n):
    """A slot's chain from ``pos`` back through prevPos while it stays in this file (``u8`` from
    ``file_start``), appending positions to ``out`` from ``n``; returns (n, next pos, CHAIN_*)."""
    limit = out.shape[0]
    while pos != -1:
        if n >= limit:
            return n, pos, CHAIN_LIMIT
        if n > 0 and pos >= out[n - 1]:
            return n, pos, CHAIN_LOOP
        if 0 <= pos < floor:
            return n, pos, CHAIN_HISTORY
        rel = pos - file_start
        if rel < 0 or rel + UNIT > u8.shape[0]:
            return n, pos, CHAIN_OTHER_FILE
        if _i32(u8, rel + U_SIZE) != UNIT:
            return n, pos, CHAIN_OUTSIDE
        if (_i64(u8, rel + U_CWT) + _i32(u8, rel + U_DELAY)) // precision != slot_units:
            return n, pos, CHAIN_OTHER_SLOT
        out[n] = pos
        n += 1
        pos = _i64(u8, rel + U_PREV)
    return n, pos, CHAIN_END


walk_units = _jit(_walk_units)
chain_in_file = _jit(_chain_in_file)
replay_wheel = _jit(_replay_wheel)
late_slots = _jit(_late_slots)
hash_spans64 = _jit(_hash_spans64)
