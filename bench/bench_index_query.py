"""Benchmark: `index query` on one full default-geometry index file (5 000 000 slots, 20 000 000 entries).

The file (420 000 040 bytes) is written by a vectorised numpy writer in this script, not by the
appender: entries 1 .. 19 999 999 get random key hashes, 2 000 chosen entries get the hashes of
real keys (``BenchTopic#key-<j>``, 10 entries per key spread over the file), and each slot chain
links an entry to the previous entry with the same slot (§10.4), so chains average 4 entries, like
a full broker file. Store times are one second apart per 1 000 entries.

Measured: IndexService.query (the broker's queryOffset walk) and lookup.query_index(raw=True)
(what `rmqstore index query --raw` runs; this store has no commitlog, so no record reads), per
query, warm page cache. Prints p50 / p99. Run: .venv/bin/python bench/bench_index_query.py [DIR]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

from rmqstore_cli.formats.hashing import index_key_hash
from rmqstore_cli.engine.config.storeconfig import StoreConfig
from rmqstore_cli.engine.derived.index import ENTRY_DTYPE, IndexService

SLOTS, ENTRIES = 5_000_000, 20_000_000
HEADER = 40
KEYS, PER_KEY = 200, 10
T0 = 1_700_000_000_000


def build(root: str) -> None:
    rng = np.random.default_rng(42)
    n = ENTRIES - 1  # entries 1 .. ENTRIES-1 (entry 0 unused); the file is then full
    num = np.arange(1, ENTRIES, dtype=np.int64)
    h = rng.integers(0, 2**31 - 1, size=n, dtype=np.int64)
    pos = rng.choice(n, size=KEYS * PER_KEY, replace=False)
    h[pos] = np.repeat([index_key_hash(f"BenchTopic#key-{j}") for j in range(KEYS)], PER_KEY)
    slot = h % SLOTS
    order = np.argsort(slot, kind="stable")  # entry order within a slot = insertion order
    s_sorted = slot[order]
    prev = np.zeros(n, dtype=np.int64)
    same = s_sorted[1:] == s_sorted[:-1]
    prev[order[1:][same]] = num[order[:-1][same]]
    slots = np.zeros(SLOTS, dtype=">i4")
    last = np.r_[~same, True]
    slots[s_sorted[last]] = num[order[last]]
    ent = np.zeros(ENTRIES, dtype=ENTRY_DTYPE)
    names = ENTRY_DTYPE.names  # keyHash, phyOffset, timeDiff, prevIndex (formats/records.py order)
    ent[names[0]][1:] = h
    ent[names[1]][1:] = num * 100
    ent[names[2]][1:] = (num - 1) // 1000
    ent[names[3]][1:] = prev
    end_ts = T0 + ((n - 1) // 1000) * 1000
    header = np.array([T0, end_ts, 100, n * 100], dtype=">i8").tobytes() + \
        np.array([int(np.count_nonzero(slots)), ENTRIES], dtype=">i4").tobytes()
    os.makedirs(os.path.join(root, "index"), exist_ok=True)
    with open(os.path.join(root, "index", "20240101000000000"), "wb") as f:
        f.write(header)
        f.write(slots.tobytes())
        f.write(ent.tobytes())
    os.makedirs(os.path.join(root, "commitlog"), exist_ok=True)


def pct(xs, p):
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * p / 100))]


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="rmq-bench-index-")
    path = os.path.join(root, "index", "20240101000000000")
    if not os.path.exists(path) or os.path.getsize(path) != HEADER + SLOTS * 4 + ENTRIES * 20:
        t = time.perf_counter()
        build(root)
        print(f"built {path} in {time.perf_counter() - t:.1f}s")
    from rmqstore_cli.engine.query.lookup import query_index
    from rmqstore_cli.engine.store import Store

    svc = IndexService(root, StoreConfig())
    st = Store.open(root)
    keys = [f"key-{j}" for j in range(KEYS)] + [f"absent-{j}" for j in range(KEYS)]
    for k in keys:  # warm the page cache for the touched pages
        svc.query("BenchTopic", k, 64, 0, (1 << 63) - 1)
    for label, fn in (
        ("IndexService.query (queryOffset)", lambda k: svc.query("BenchTopic", k, 1 << 62, 0, (1 << 63) - 1, cap=False)),
        ("lookup.query_index raw", lambda k: query_index(st, "BenchTopic", k, raw=True)),
        ("time-bounded query (middle 10%)", lambda k: svc.query("BenchTopic", k, 1 << 62, T0 + 9_000_000,
                                                                 T0 + 11_000_000, cap=False)),
    ):
        times, hits = [], 0
        for _ in range(5):
            for k in keys:
                t = time.perf_counter()
                r = fn(k)
                times.append((time.perf_counter() - t) * 1000)
                hits += len(r) if isinstance(r, list) else len(r.newest_first)
        print(f"{label}: {len(times)} queries, p50 {pct(times, 50):.3f} ms, p99 {pct(times, 99):.3f} ms, "
              f"hits {hits}")
    found = svc.query("BenchTopic", "key-0", 1 << 62, 0, (1 << 63) - 1, cap=False)
    assert len(found) >= PER_KEY, found  # the 10 planted entries (plus any random collisions)


if __name__ == "__main__":
    main()
