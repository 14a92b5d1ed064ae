"""Issue #6 targets, checked against bench.run results (medians, single process unless stated)."""

from __future__ import annotations

RSS_LIMIT_MB = 300

# (target label, workload, store, metric, minimum) -- metric "ratio:<workload>" compares MB/s with that workload
TARGETS = [
    ("bare walk+CRC kernel >= 6 GB/s at 1 KiB", "commitlog kernel (walk+CRC)", "1KiB", "MB_s", 6000),  # issue #11
    ("bare walk+CRC kernel >= 10 M rec/s at 100 B", "commitlog kernel (walk+CRC)", "100B", "msg_s", 10_000_000),
    ("verify >= 1.5 GB/s at 1 KiB", "verify", "1KiB", "MB_s", 1500),
    ("verify >= 3.5 GB/s at 4 KiB", "verify", "4KiB", "MB_s", 3500),
    ("verify >= 2.5 M msg/s at 100 B", "verify", "100B", "msg_s", 2_500_000),
    ("rebuild all >= 400 MB/s at 1 KiB", "rebuild all", "1KiB", "MB_s", 400),
    ("recover (crash) >= 1 GB/s at 1 KiB", "recover (crash)", "1KiB", "MB_s", 1000),
    ("dump --json >= 150k msg/s", "dump commitlog --json", "1KiB", "msg_s", 150_000),
    ("append with dispatch >= 150k msg/s at 1 KiB", "append --from (dispatch)", "1KiB", "msg_s", 150_000),
    ("verify -j 2 >= 1.7x single", "verify -j 2", "1KiB", "ratio:verify", 1.7),
    ("rebuild -j 2 >= 1.7x single", "rebuild all -j 2", "1KiB", "ratio:rebuild all", 1.7),
]


def _find(results, workload, store):
    for r in results:
        if r["workload"] == workload and r["store"] in (store, "*"):
            return r
    return None


def evaluate(results: list[dict]) -> list[dict]:
    rows = []
    for label, workload, store, metric, minimum in TARGETS:
        r = _find(results, workload, store)
        if r is None or "not_available" in r or "failed" in r:
            rows.append({"target": label, "measured": None, "pass": False if r and "failed" in r else None,
                         "note": (r or {}).get("not_available") or (r or {}).get("failed") or "not run"})
            continue
        if metric.startswith("ratio:"):
            base = _find(results, metric[6:], store)
            if base is None or "not_available" in base or "failed" in base:
                rows.append({"target": label, "measured": None, "pass": None, "note": "baseline not run"})
                continue
            value = round(r["MB_s"] / base["MB_s"], 2)
            shown = f"{value}x ({r['MB_s']} vs {base['MB_s']} MB/s)"
        else:
            value = r[metric]
            shown = f"{value:,} {metric.replace('_s', '/s')}"
        rows.append({"target": label, "measured": value, "shown": shown, "pass": value >= minimum})
    q = _find(results, "index query", "1KiB")
    if q is None or "not_available" in q:
        rows.append({"target": "index query p50 < 5 ms", "measured": None, "pass": None, "note": "not run"})
    else:
        rows.append({"target": "index query p50 < 5 ms", "measured": q["p50_ms"],
                     "shown": f"p50 {q['p50_ms']} ms, p99 {q['p99_ms']} ms", "pass": q["p50_ms"] < 5})
    measured = [r for r in results if "peak_rss_MB" in r]
    if measured:
        worst = max(measured, key=lambda r: r["peak_rss_MB"])
        rows.append({"target": f"peak RSS < {RSS_LIMIT_MB} MB (every workload)", "measured": worst["peak_rss_MB"],
                     "shown": f"{worst['peak_rss_MB']} MB ({worst['workload']} {worst['store']})",
                     "pass": worst["peak_rss_MB"] < RSS_LIMIT_MB})
    return rows


def render(results: list[dict], rows: list[dict]) -> str:
    out = ["", "| workload | store | median s | MB/s | msg/s | peak RSS MB |", "|---|---|---|---|---|---|"]
    for r in results:
        if "not_available" in r or "failed" in r:
            what = f"not available: {r['not_available']}" if "not_available" in r else f"FAILED: {r['failed']}"
            out.append(f"| {r['workload']} | {r['store']} | {what} | | | |")
        elif "p50_ms" in r:
            out.append(f"| {r['workload']} | {r['store']} | p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms | | | {r['peak_rss_MB']} |")
        else:
            rss = r.get("peak_rss_MB", f"RssAnon {r['rss_anon_MB']}" if r.get("rss_anon_MB") is not None else "")
            out.append(f"| {r['workload']} | {r['store']} | {r['seconds']} | {r['MB_s']:,} | {r['msg_s']:,} | {rss} |")
    out += ["", "| target | measured | result |", "|---|---|---|"]
    for t in rows:
        verdict = "not available" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
        out.append(f"| {t['target']} | {t.get('shown', t.get('note', ''))} | {verdict} |")
    return "\n".join(out)
