"""``rmqstore stats STORE``: per topic/queue counts, dead space, index fullness, queue lag, charts."""

from __future__ import annotations

from typing import Optional

import typer

from rmqstore_cli.engine.config.offsets import offsets_for_stats
from rmqstore_cli.engine.parallel import default_jobs
from rmqstore_cli.engine.query.stats import compute_stats

from .common import (Geometry, JsonOpt, SinceOpt, StoreArg, UntilOpt, geometry_options, open_store,
                     parse_time_option)
from .output import Output, handle_errors, iso_ms, stdout
from .offsets_cmd import print_offsets_audit

QUEUE_COLUMNS = [
    ("topic", "topic"), ("queueId", "q"), ("count", "records"), ("messages", "msgs"), ("bytes", "bytes"),
    ("minQueueOffset", "min qoff"),
    ("maxQueueOffset", "max qoff"), ("first", "first store time"), ("last", "last store time"),
    ("retry%", "retry%"), ("dlq%", "dlq%"), ("scheduled%", "sched%"), ("transactional%", "tx%"),
]
INDEX_COLUMNS = [("name", "index file"), ("entries", "entries"), ("fullness%", "full%"), ("hashSlotCount", "slots used"),
                 ("slot%", "slot%"), ("begin", "begin"), ("end", "end")]
LAG_COLUMNS = [("topic", "topic"), ("queueId", "q"), ("cqMaxOffset", "cq max"),
               ("commitlogMaxQueueOffset", "commitlog max"), ("lagMessages", "lag")]
LMQ_COLUMNS = [("topic", "LMQ queue"), ("queueId", "q"), ("cqMinOffset", "min"), ("cqMaxOffset", "max"),
               ("cqMaxPhysicOffset", "max physic offset")]
BAR = 40


def _ts(ms) -> str:
    return "" if ms is None else iso_ms(ms)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.command("stats", rich_help_panel=panel)(stats)


@handle_errors
@geometry_options
def stats(
    store: str = StoreArg,
    since: Optional[str] = SinceOpt,
    until: Optional[str] = UntilOpt,
    json_: bool = JsonOpt,
    geometry: Geometry = None,
    jobs: int = typer.Option(1, "-j", "--jobs", min=0, help="Worker processes for the commitlog walk of the whole store "
                             "(0: one per core): each walks whole segments, this process adds up their per-queue totals "
                             "in log order. Same output as -j 1; --since/--until walk in one process."),
):
    """Statistics of the whole store (or of a time range) from one commitlog walk (--json: one JSON object)."""
    since_ms, until_ms = parse_time_option(since, "--since"), parse_time_option(until, "--until")
    st = open_store(store, geometry, command="stats")
    with st:
        s = compute_stats(st, since_ms, until_ms, jobs=jobs or default_jobs())
        offsets = offsets_for_stats(st)  # consumer offsets audit
        from .cleanup_view import cleanup_lines, next_cleanup

        s["nextCleanup"] = next_cleanup(st, geometry)
    s.update(offsets)
    out = Output(json_)
    if json_:
        out.line(s)
        return
    cl = s["commitlog"]
    out.kv({
        "records": s["records"], "messages (inner batches counted whole)": s["messages"], "bytes": s["bytes"],
        "topics": s["topics"], "queues": len(s["queues"]), "LMQ queues": len(s.get("lmqQueues", [])),
        "first store time": _ts(s["firstStoreTimestamp"]), "last store time": _ts(s["lastStoreTimestamp"]),
        "commitlog": f"{cl['files']} files of {cl['fileSize']} B, offsets {cl['minOffset']}..{cl['maxOffset']} "
                     f"(ends: {cl['stop']})",
        "dead space (BLANK tails)": f"{cl['blankBytes']} B in {cl['blankCount']} markers",
    }, title=f"store {st.root}")
    rows = [dict(r, first=_ts(r["firstStoreTimestamp"]), last=_ts(r["lastStoreTimestamp"]),
                 **{f"{c}%": _pct(r[c + "Share"]) for c in ("retry", "dlq", "scheduled", "transactional")})
            for r in s["queues"]]
    out.table(rows, QUEUE_COLUMNS, title="per topic and queue")
    out.table([dict(r, **{"fullness%": _pct(r["fullness"]), "slot%": _pct(r["slotFullness"]),
                          "begin": _ts(r["beginTimestamp"]), "end": _ts(r["endTimestamp"])}) for r in s["index"]],
              INDEX_COLUMNS, title="index files")
    if s.get("lmqQueues"):
        out.table(s["lmqQueues"], LMQ_COLUMNS, title="LMQ queues (multi-dispatch: units of other topics' records)")
    lagging = [r for r in s["consumeQueueLag"] if r["lagMessages"]]
    if lagging:
        out.table(lagging, LAG_COLUMNS, title="consume queues behind the commitlog")
    else:
        stdout.print("consume queues: none behind the commitlog", markup=False)
    if "rocksdbConsumeQueue" in s:
        r = s["rocksdbConsumeQueue"]
        out.kv({"queues": r["queues"], "dispatch checkpoint": r["checkpoint"],
                "log ahead of the checkpoint": f"{r['dispatchBehindBytes']} B"}, title=f"RocksDB consume queue {r['directory']}")
    print_offsets_audit(out, offsets)
    _histogram(s["sizeHistogram"])
    _timeline(s["timeline"])
    for line in cleanup_lines(s["nextCleanup"]):
        stdout.print(line, markup=False, highlight=False, soft_wrap=True)
    if "timer" in s:
        _timer(out, s["timer"])


DUE_LABELS = {"overdue": "overdue", "nextMinute": "next minute", "nextHour": "next hour", "nextDay": "next day",
              "later": "later"}


def _timer(out: Output, t: dict) -> None:
    q = t["timerQueue"]
    stdout.print(f"timer store: {t['pending']} pending messages ({q['topic']} holds {q['records']} timer records: "
                 f"scheduled messages and their rolls, read up to offset {q['readOffset']})", markup=False)
    rows = [{"topic": k, "pending": v, "metrics": t["metrics"].get(k)}
            for k, v in sorted(set(t["pendingByTopic"].items()) | {(k, 0) for k in t["metrics"] if k not in t["pendingByTopic"]})]
    out.table(rows, [("topic", "real topic"), ("pending", "pending"), ("metrics", "timermetrics")],
              title="pending timer messages per real topic")
    _bars([DUE_LABELS[k] for k in t["dueIn"]], list(t["dueIn"].values()),
          f"pending timer messages by delivery time (from the timer's read time {_ts(t['referenceTimeMs'])})")


def _bars(labels: list[str], counts: list[int], title: str) -> None:
    stdout.print(title, markup=False)
    top = max(counts, default=0) or 1
    w = max((len(x) for x in labels), default=0)
    for label, c in zip(labels, counts):
        stdout.print(f"  {label.rjust(w)} {'█' * max(1 if c else 0, round(BAR * c / top)):<{BAR}} {c}", markup=False)


def _histogram(h: dict) -> None:
    counts = h["counts"]
    nz = [i for i, c in enumerate(counts) if c]
    if not nz:
        return
    idx = range(nz[0], nz[-1] + 1)
    _bars([f"{_size(1 << i)}-{_size((1 << (i + 1)) - 1)}" for i in idx], [counts[i] for i in idx],
          "record size histogram (bytes)")


def _size(n: int) -> str:
    for unit in ("", "K", "M", "G"):
        if n < 1024:
            return f"{n}{unit}"
        n //= 1024
    return f"{n}T"


def _timeline(t: dict) -> None:
    if not t["counts"]:
        return
    labels = [_ts(t["startMs"] + i * t["bucketMs"]) for i in range(len(t["counts"]))]
    _bars(labels, t["counts"], f"messages over time ({t['bucketMs']} ms per bar)")
