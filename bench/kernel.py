"""The bare compiled read kernel: walk + header gather + body CRC over every commitlog segment of a
store, timed inside the process (numba import, kernel load and mapping excluded).

    python -m bench.kernel STORE [--repeat 5]   -> one JSON line: seconds (median), records, bytes, ...

This is the ceiling every command's commitlog phase is measured against: the same
:func:`formats.kernel.scan_records` call ``CommitLog.scan`` makes per chunk, into reused columns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from rmqstore_cli.formats import fast
from rmqstore_cli.engine.log.commitlog import CHUNK_RECORDS
from rmqstore_cli.engine.store import Store


def scan_all(k, views, v1: int, v2: int, prop: int, cols) -> tuple[int, int]:
    h, c32, c64 = cols
    records = nbytes = 0
    for u8 in views:
        pos = 0
        while True:
            n, stop, kind, _, _, _ = k.scan_records(u8, pos, len(u8), v1, v2, CHUNK_RECORDS, True, prop, c32, c64,
                                                    h.reason)
            records += n
            nbytes += stop - pos
            pos = stop
            if kind != k.K_CHUNK:
                break
    return records, nbytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with Store.open(args.store) as st:
        cl = st.commitlog
        views = [fast.kernel_view(s.buffer()) for s in cl.segments.segments if s.size]
        for u8 in views:
            u8.sum()  # fault every page in before timing
        k = fast._kernel()
        v1, v2 = fast._magic_pair(cl.magics(False))
        prop = cl.prop_crc_policy(True)
        cols = fast.new_headers(CHUNK_RECORDS)
        scan_all(k, views[:1], v1, v2, prop, cols)  # load the cached kernel
        times, cpu = [], []
        for _ in range(args.repeat):
            t, c = time.perf_counter(), time.process_time()
            records, nbytes = scan_all(k, views, v1, v2, prop, cols)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    med = statistics.median(times)
    # CPU time as well: on a shared machine the wall clock includes waiting for a core
    cpu_med = statistics.median(cpu)
    print(json.dumps({"seconds": round(med, 4), "runs": [round(t, 4) for t in times], "records": records,
                      "bytes": nbytes, "MB_s": round(nbytes / med / 1e6, 1), "msg_s": round(records / med),
                      "cpu_MB_s": round(nbytes / cpu_med / 1e6, 1), "cpu_msg_s": round(records / cpu_med),
                      "crc": k.CRC_IMPLEMENTATION, "rss_anon_MB": _rss_anon_mb()}))


def _rss_anon_mb() -> float | None:
    """Anonymous memory now (the mapped store pages would dominate ru_maxrss; NOTES-performance)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return round(int(line.split()[1]) * 1024 / 1e6, 1)
    except OSError:
        pass
    return None


if __name__ == "__main__":
    main()
