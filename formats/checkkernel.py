"""Compiled passes of verify's window cross-checks (consume-queue units and index entries against the
records of one commitlog window), made on first use so that commands which never verify do not load them.

Each pass walks one block of references once: keeps those pointing into the window, finds their record
(binary search in the window's sorted offsets, started from the previous hit), and compares the fields a
finding would be about. What it returns is compact: the references that found no record, and the few that
found one but differ in some field ("flagged"). Only the flagged ones go on to the Python rules that make
the findings (``engine/verify/queues.check_found_units``, ``engine/verify/index.check_found_entries``), so
codes, messages and ranks come from one place; a reference that is not flagged is one those rules would
report nothing for. The whole-log formulation (``engine/verify/pipeline._verify_whole_log``) still applies
those rules to every reference in numpy: tests compare the two.

The passes read the consume-queue and index files' own bytes (big-endian, as Java's ByteBuffer wrote them),
so no decoded column of a file is made: :func:`queue_file_valid` reads a queue file once before the walk (where
its valid units end, fillers, the windows its units point into, samples to find a window's run of units),
:func:`queue_runs` a window's units (every queue's runs in one call); the index entries' passes are :mod:`.entrykernel`'s, with the helpers
here. Constants are literals or arguments: numba freezes globals into the cached machine code.
"""

from __future__ import annotations

import numpy as np

from . import aot
from .records import (CQ_FILLER, field_offsets, CQ_UNIT_FIELDS, CQ_UNIT_SIZE, INDEX_ENTRY_FIELDS,
                      SYSFLAG_TRANSACTION_MASK, TRANSACTION_COMMIT, TRANSACTION_NOT)


# The byte layout the passes read, taken from the records' declarations (formats.records); numba
# compiles these module globals in as constants.
_CQ = field_offsets(CQ_UNIT_FIELDS)
CQ_PHY, CQ_SIZE, CQ_TAGS = _CQ["phyOffset"], _CQ["size"], _CQ["tagsCode"]
FILLER_PHY, FILLER_SIZE, FILLER_TAGS = CQ_FILLER
_IX = field_offsets(INDEX_ENTRY_FIELDS)
IX_HASH, IX_PHY, IX_DIFF, IX_PREV = _IX["keyHash"], _IX["phyOffset"], _IX["timeDiff"], _IX["prevIndex"]
TRAN_MASK = SYSFLAG_TRANSACTION_MASK

_COMPILED: dict = {}
_HELPERS = ("_be64", "_be32", "_is_filler", "_window_of", "_find")


@aot.first(__name__)  # the ahead-of-time extension's kernel when built and current (formats/aot.py)
def _compiled(name: str):
    """The compiled pass ``name`` (numba imported and the helpers compiled on the first call)."""
    fn = _COMPILED.get(name)
    if fn is None:
        from .kernel import _jit

        g = globals()
        if not _COMPILED:
            for helper in _HELPERS:  # the passes call the compiled helpers
                g[helper] = _jit(g[helper], refcounts=False)
        fn = _COMPILED[name] = _jit(g[name], refcounts=False)  # makes no array: no reference counting (kernel._jit)
    return fn


def _be64(u8, p):
    """Big-endian int64 at ``u8[p:p+8]`` (the files are written by Java's ByteBuffer)."""
    v = np.int64(0)
    for j in range(8):
        v = (v << np.int64(8)) | np.int64(u8[p + j])
    return v


def _be32(u8, p):
    """Big-endian int32 at ``u8[p:p+4]``, as int64."""
    v = (np.int64(u8[p]) << 24) | (np.int64(u8[p + 1]) << 16) | (np.int64(u8[p + 2]) << 8) | np.int64(u8[p + 3])
    return v - (np.int64(1) << 32) if v >= (np.int64(1) << 31) else v


def _is_filler(p, size, tags):
    """The unit is the pre-blank filler (records.CQ_FILLER, §7.3)."""
    return p == FILLER_PHY and size == FILLER_SIZE and tags == FILLER_TAGS


def _window_of(starts, p):
    """Window of offset ``p``: the last start at or before it, -1 before the first (``Windows.of``)."""
    lo, hi = 0, len(starts)
    while lo < hi:
        mid = (lo + hi) >> 1
        if starts[mid] <= p:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def _find(rphy, x, hint):
    """Index of the record at offset ``x`` in the increasing ``rphy``, or -1; ``hint`` is where the last
    search ended (references are mostly increasing: galloping from it costs a few steps)."""
    n = len(rphy)
    if n == 0:
        return -1
    if 0 <= hint < n:  # the same record as the last reference (an index entry per key) or the next one
        if rphy[hint] == x:
            return hint
        if hint + 1 < n and rphy[hint + 1] == x:
            return hint + 1
    lo, hi = 0, n
    if 0 <= hint < n and rphy[hint] <= x:
        lo = hint
        step = 1
        hi = hint + 1
        while hi < n and rphy[hi] <= x:
            lo = hi
            hi = hi + step
            step *= 2
        if hi > n:
            hi = n
    while lo < hi:  # first index with rphy >= x
        mid = (lo + hi) >> 1
        if rphy[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    if lo < n and rphy[lo] == x:
        return lo
    return -1


# A run of consume-queue units handed to :func:`_queue_runs`: one row of int64 per run
RUN_BYTE, RUN_UNITS, RUN_FIRST, RUN_QBASE, RUN_TOPIC, RUN_QID, RUN_FLAGS, RUN_LMQ = range(8)
RUN_FIELDS = 8
# RUN_LMQ: the run's queue as a multi-dispatch target key (name number << 32 | queue id as uint32, the numbering of
# the window's targets handed over with it), or -1: a unit of such a queue that points at a record naming this queue
# at the unit's offset among its targets agrees on topic, queue id and offset (an LMQ queue's units point at other
# topics' records, FORMAT.md §14.3)
# RUN_FLAGS bits: the queue has an ext file; its finds go to ``others`` (an LMQ queue); the file's real units point
# into windows that never go down (queue_file's ``ordered``), so the first one past the window ends the run
RUN_EXT, RUN_OTHERS, RUN_ORDERED = 1, 2, 4


def _queue_runs(u8, runs, ws, we, rphy, rsize, rtopic, rqid, rqoff, rsys, rtags, rtags_bad, max_addr, marks, others,
                tfirst, tkey, tqo, not_found, flagged, found, counts):
    """Runs of consume-queue units pointing into ``[ws, we]`` (``we`` inclusive: see :func:`_last_offset`). Run ``k``
    (``runs[k]``, fields ``RUN_*``) is ``RUN_UNITS`` units (20 bytes each, big-endian) at byte ``RUN_BYTE`` of
    ``u8``, units ``RUN_FIRST ..`` of one queue file whose unit ``i`` has queue offset ``RUN_QBASE + i``. Sets
    ``marks`` (``others`` for an LMQ queue's runs) of the records found. ``not_found`` gets (run, unit) of the units
    that found no record, ``flagged`` (run, unit, record) of those whose record differs in some field;
    ``found[k]`` = (highest queue offset that found its record, end of the furthest record found, -1 for none;
    position of the first real unit past the window, or the run's end if none); ``counts`` = [not found, flagged].
    Record ``r``'s multi-dispatch targets are ``tfirst[r] .. tfirst[r + 1] - 1`` of ``tkey``/``tqo`` (key as
    ``RUN_LMQ``, queue offset); read only for a run whose ``RUN_LMQ`` is not -1.
    One call takes every queue reaching a window: a broker's thousands of queues hold a few units each per window,
    and a call apiece cost more than their units."""
    nnf = 0
    nfl = 0
    nrec = len(rphy)
    for k in range(runs.shape[0]):
        off = runs[k, RUN_BYTE]
        first = runs[k, RUN_FIRST]
        qbase = runs[k, RUN_QBASE]
        topic_id = runs[k, RUN_TOPIC]
        qid = runs[k, RUN_QID]
        ext_on = (runs[k, RUN_FLAGS] & RUN_EXT) != 0
        to_others = (runs[k, RUN_FLAGS] & RUN_OTHERS) != 0
        ordered = (runs[k, RUN_FLAGS] & RUN_ORDERED) != 0
        lmq_key = runs[k, RUN_LMQ]
        last_q = np.int64(-1)
        far = np.int64(-1)
        end_run = first + runs[k, RUN_UNITS]
        past = end_run
        hint = 0
        step = 0
        for j in range(runs[k, RUN_UNITS]):
            u = off + j * CQ_UNIT_SIZE
            p = _be64(u8, u + CQ_PHY)
            if p < ws:
                continue
            size = _be32(u8, u + CQ_SIZE)
            tags = _be64(u8, u + CQ_TAGS)
            if p > we:
                if past == end_run and not _is_filler(p, size, tags):
                    past = first + j
                    if ordered:
                        break  # every later real unit points past the window too
                continue
            if _is_filler(p, size, tags):
                continue
            i = first + j
            g = hint + step  # a queue's units mostly point a steady number of records apart (producers take turns)
            r = g if 0 <= g < nrec and rphy[g] == p else _find(rphy, p, hint)
            if r < 0:
                not_found[0, nnf] = k
                not_found[1, nnf] = i
                nnf += 1
                continue
            step = r - hint
            hint = r
            if to_others:
                others[r] = True
            else:
                marks[r] = True
            q = qbase + i
            if q > last_q:
                last_q = q
            end = p + rsize[r]
            if end > far:
                far = end
            tran = rsys[r] & TRAN_MASK
            other = rtopic[r] != topic_id or rqid[r] != qid or rqoff[r] != q
            if other and lmq_key >= 0:
                for t in range(tfirst[r], tfirst[r + 1]):
                    if tkey[t] == lmq_key and tqo[t] == q:
                        other = False  # the record names this queue at this offset
                        break
            bad = rsize[r] != size or other or (tran != TRANSACTION_NOT and tran != TRANSACTION_COMMIT)
            if not bad and not rtags_bad[r]:
                if ext_on and tags <= max_addr:
                    bad = True  # the tagsCode is an ext address: the ext unit is read in Python
                elif tags != rtags[r]:
                    bad = True
            if bad:
                flagged[0, nfl] = k
                flagged[1, nfl] = i
                flagged[2, nfl] = r
                nfl += 1
        found[k, 0] = last_q
        found[k, 1] = far
        found[k, 2] = past
    counts[0] = nnf
    counts[1] = nfl


def queue_runs(u8, runs: np.ndarray, ws: int, we: int, recs, max_addr: int, marks, others, targets=None) -> tuple:
    """:func:`_queue_runs` over ``runs`` (int64, ``RUN_FIELDS`` per row) of ``u8``: (not found as (run, unit) rows,
    flagged as (run, unit, record) rows, ``found`` (one (highest queue offset, furthest end, first position past the
    window) row per run)). ``targets``: (first, key, queue offset), int64, the records' multi-dispatch targets as
    :func:`_queue_runs` reads them; needed when a run's ``RUN_LMQ`` is not -1."""
    n = int(runs[:, RUN_UNITS].sum()) if len(runs) else 0
    # int32: runs, unit positions (a file's units) and records (a window's) are all below 2**31
    not_found = np.empty((2, n), np.int32)
    flagged = np.empty((3, n), np.int32)
    found = np.empty((len(runs), 3), np.int64)
    counts = np.zeros(2, np.int64)
    c = recs.c
    if targets is None:
        assert not len(runs) or (runs[:, RUN_LMQ] < 0).all(), "runs of multi-dispatch queues need the targets"
        targets = _NO_TARGETS
    _compiled("_queue_runs")(u8, runs, np.int64(ws), _last_offset(we), recs.phy, c["size"], c["topic"], c["queueId"],
                             c["queueOffset"], c["sysFlag"], c["tagsCode"], c["tagsBad"], np.int64(max_addr), marks, others,
                             *targets, not_found, flagged, found, counts)
    # copies: the few units reported, not the room made for every unit of the runs
    return not_found[:, :counts[0]].copy(), flagged[:, :counts[1]].copy(), found


def queue_window(u8, first: int, stop: int, qbase: int, ws: int, we: int, recs, topic_id: int, qid: int, ext_on: bool,
                 max_addr: int, marks) -> tuple:
    """Units ``first .. stop-1`` of one consume-queue file (``u8``: its bytes; unit ``i`` has queue offset
    ``qbase + i``) against the window's records, the one-run case of :func:`queue_runs`: (file positions of the
    units that found no record, of the flagged units, the flagged units' records, highest queue offset found or -1,
    end of the furthest record found or -1)."""
    runs = np.array([[first * CQ_UNIT_SIZE, max(stop - first, 0), first, qbase, topic_id, qid, RUN_EXT if ext_on else 0, -1]],
                    np.int64)
    nf, fl, found = queue_runs(u8, runs, ws, we, recs, max_addr, marks, marks)
    return nf[1], fl[1], fl[2], int(found[0, 0]), int(found[0, 1])


_NO_TARGETS = (np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))  # no run reads them


def _last_offset(we: int) -> np.int64:
    """The last offset a window ``[ws, we)`` owns. The last window owns everything after its start
    (``Windows.bounds`` gives it ``we`` = 2**63 - 1), that offset included: a unit pointing at 2**63 - 1
    must reach the checks, which report it as pointing where no record starts."""
    return np.int64(we if we >= (1 << 63) - 1 else we - 1)


def _queue_file(u8, n, find_end, starts, step, max_addr, before, sample_w, sample_u, state):
    """The valid units of one consume-queue file, before the walk. With ``find_end`` the file's valid units
    end at the first invalid one (phyOffset < 0 or size <= 0, §7.4) among its ``n``, else all ``n`` are valid.
    ``state`` = [fillers, first filler's position, real units, highest offset, lowest window, highest window,
    1 if the windows never go down, units before the first window, samples, valid units, 1 if some valid unit's
    tagsCode is at most ``max_addr``, the largest such]. ``before`` gets the positions of the units pointing
    before the first window, ``sample_w``/``sample_u`` the window and position of every ``step``-th real unit."""
    fillers = 0
    first_filler = -1
    real = 0
    phy_max = np.int64(-1) << 62
    lo = len(starts)
    hi = -1
    ordered = 1
    prev = -2
    nb = 0
    ns = 0
    valid = n
    low_tags = 0
    low_max = np.int64(0)
    cur = -1  # window of the previous unit: consecutive units mostly point into the same one
    cur_lo = np.int64(1)
    cur_hi = np.int64(0)
    for i in range(n):
        u = i * CQ_UNIT_SIZE
        p = _be64(u8, u + CQ_PHY)
        size = _be32(u8, u + CQ_SIZE)
        if find_end and (p < 0 or size <= 0):
            valid = i
            break
        tags = _be64(u8, u + CQ_TAGS)
        if tags <= max_addr:
            if low_tags == 0 or tags > low_max:
                low_max = tags
            low_tags = 1
        if _is_filler(p, size, tags):
            if first_filler < 0:
                first_filler = i
            fillers += 1
            continue
        if cur_lo <= p < cur_hi:
            k = cur
        else:
            k = _window_of(starts, p)
            if k >= 0:
                cur = k
                cur_lo = starts[k]
                cur_hi = starts[k + 1] if k + 1 < len(starts) else np.int64(9223372036854775807)
        if real % step == 0:
            sample_w[ns] = k
            sample_u[ns] = i
            ns += 1
        real += 1
        if k < prev:
            ordered = 0
        prev = k
        if p > phy_max:
            phy_max = p
        if k < 0:
            before[nb] = i
            nb += 1
        else:
            if k < lo:
                lo = k
            if k > hi:
                hi = k
    state[0] = fillers
    state[1] = first_filler
    state[2] = real
    state[3] = phy_max
    state[4] = lo
    state[5] = hi
    state[6] = ordered
    state[7] = nb
    state[8] = ns
    state[9] = valid
    state[10] = low_tags
    state[11] = low_max


def _queue_file_call(u8, n: int, find_end: bool, starts, step: int, max_addr: int):
    before = np.empty(n, np.int64)
    sample_w = np.empty(n // step + 1, np.int64)
    sample_u = np.empty(n // step + 1, np.int64)
    state = np.zeros(12, np.int64)
    _compiled("_queue_file")(u8, np.int64(n), bool(find_end), starts, np.int64(step), np.int64(max_addr), before, sample_w,
                             sample_u, state)
    fillers, first_filler, real, phy_max, lo, hi, ordered, nb, ns, valid, low_tags, low_max = (int(v) for v in state)
    samples = (sample_w[:ns].copy(), sample_u[:ns].copy()) if ordered else None
    return ((fillers, first_filler, real, phy_max if real else None, (lo, hi) if hi >= 0 else (None, None),
             before[:nb].copy(), samples), valid, low_max if low_tags else None)


def queue_file(u8, n: int, starts, step: int) -> tuple:
    """(fillers, first filler's position, real units, highest real offset or None, lowest and highest window
    (None, None when every real unit points before the first window), positions of those that do, the
    (window, position) samples when the windows never go down, else None) of units ``0 .. n-1``."""
    return _queue_file_call(u8, n, False, starts, step, -1)[0]


def queue_file_valid(u8, n: int, starts, step: int, max_addr: int) -> tuple:
    """(valid units: those before the first invalid one among ``n``, :func:`queue_file` of them, the largest
    tagsCode at most ``max_addr`` among them or None): the valid-unit rule and the walk's routing in one pass."""
    got, valid, low_max = _queue_file_call(u8, n, True, starts, step, max_addr)
    return valid, got, low_max


def warm_up():
    """Compile (or load from the cache) every pass once, with the argument types verify uses; returns the tiny
    stand-in for a window's records it used (:func:`.entrykernel.warm_up` takes it)."""
    from types import SimpleNamespace

    n = 2
    z = np.zeros(n, np.int64)
    cols = {"size": np.zeros(n, np.int32), "topic": np.zeros(n, np.int32), "queueId": np.zeros(n, np.int32),
            "queueOffset": z, "sysFlag": np.zeros(n, np.int32), "tagsCode": z, "tagsBad": np.zeros(n, bool),
            "storeTimestamp": z, "keyCount": np.zeros(n, np.int16)}
    recs = SimpleNamespace(phy=np.arange(n, dtype=np.int64), c=cols, keys=np.zeros(n, np.int32), key_start=np.zeros(n, np.int32))
    for writable in (True, False):  # files are mapped read-only; tests and copies hand over writable bytes
        u8 = np.zeros(60, np.uint8)
        u8.flags.writeable = writable
        queue_file(u8, 2, z, 1024)
        queue_file_valid(u8, 2, z, 1024, -1)
        queue_window(u8, 0, 2, 0, 0, 1, recs, 0, 0, False, -1, np.zeros(n, bool))
    return recs
