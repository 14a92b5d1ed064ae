"""Index query latency on a benchmark store, in process (what `rmqstore index query` runs after start-up).

    python -m bench.index_query STORE RECORDS  ->  one JSON object: p50_ms, p99_ms, queries, misses, peak_rss_MB
"""

from __future__ import annotations

import json
import resource
import sys
import time

import numpy as np

from bench import gen
from rmqstore_cli.engine.store import Store


def main() -> None:
    root, records = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(6)
    picks = rng.integers(0, records, size=2000).tolist()
    st = Store.open(root)
    svc = st.index
    lat, misses = [], 0
    for n, i in enumerate(picks):
        topic = gen._fields(i)[0].decode()
        key = f"key{i:0{gen.KEY_DIGITS}d}" if n % 2 else f"0A0000070C3B1B6D3B2E{i:0{gen.KEY_DIGITS}X}"
        t = time.perf_counter()
        offs = svc.query(topic, key, 32, 0, 1 << 62)
        lat.append(time.perf_counter() - t)
        misses += not offs
    lat_ms = np.array(lat) * 1e3
    print(json.dumps({"queries": len(picks), "misses": misses, "p50_ms": round(float(np.percentile(lat_ms, 50)), 3),
                      "p99_ms": round(float(np.percentile(lat_ms, 99)), 3),
                      "peak_rss_MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6, 1)}))


if __name__ == "__main__":
    main()
