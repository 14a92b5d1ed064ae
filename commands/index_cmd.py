"""``rmqstore index query``: the broker's IndexService query (FORMAT.md §10.5/§10.6), read-only."""

from __future__ import annotations

from typing import Optional

import typer


from rmqstore_cli.engine.errors import EXIT_FINDINGS
from rmqstore_cli.engine.query.lookup import TIME_MAX, parse_time, query_index, scan_for_key

from .common import Geometry, JsonOpt, StoreArg, geometry_options, open_store
from .output import Output, fail, handle_errors, warn

index_app = typer.Typer(help="Message index (index/ files): queries.", no_args_is_help=True)

QUERY_COLUMNS = [
    ("offset", "offset"), ("storeTimestamp", "store time"), ("topic", "topic"), ("queueId", "q"),
    ("queueOffset", "qoff"), ("keys", "KEYS"), ("uniqKey", "UNIQ_KEY"), ("msgId", "msgId"),
]


def _row(msg: dict) -> dict:
    props = msg.get("properties") or {}
    row = {"offset": msg["offset"], "storeTimestamp": msg["storeTimestamp"], "topic": msg["topic"],
           "queueId": msg["queueId"], "queueOffset": msg["queueOffset"], "keys": props.get("KEYS"),
           "uniqKey": props.get("UNIQ_KEY"), "msgId": msg["msgId"], "storeSize": msg["storeSize"]}
    return row


@index_app.command("query")
@handle_errors
@geometry_options
def index_query(
    store: str = StoreArg,
    topic: str = typer.Option(..., "--topic", help="Topic as stored (e.g. SCHEDULE_TOPIC_XXXX for delayed messages)."),
    key: str = typer.Option(..., "--key", help="A KEYS token or a UNIQ_KEY."),
    begin: Optional[str] = typer.Option(None, "--begin", help="Earliest store time: epoch ms or ISO-8601 (local time if no zone)."),
    end: Optional[str] = typer.Option(None, "--end", help="Latest store time: epoch ms or ISO-8601."),
    max_: Optional[int] = typer.Option(None, "--max", help="At most N index hits (the broker caps at 64; we do not unless asked)."),
    raw: bool = typer.Option(False, "--raw", help="Exactly the broker's answer: offsets sorted ascending, hash collisions included."),
    scan: bool = typer.Option(False, "--scan", help="Ignore the index: scan the commitlog for records carrying the key."),
    explain: bool = typer.Option(False, "--explain", help="Say why the answer is what it is: the records carrying the key "
                                 "(index chains, then a scan of what no index file covers), index files and gaps, "
                                 "time window, collisions, the broker's cap. Exit 1 when the broker's answer holds no "
                                 "record carrying the key."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Messages whose KEYS or UNIQ_KEY is KEY, through the index like the broker (exit 1 when none)."""
    b = parse_time(begin, 0)
    e = parse_time(end, TIME_MAX)
    if b > e:
        fail("--begin is after --end")
    if max_ is not None and max_ <= 0:
        fail("--max must be positive")
    st = open_store(store, geometry, command="index query")
    out = Output(json_)
    with st:
        if explain:
            _explain(st, out, topic, key, b, e, max_)
            return
        if scan:
            msgs = scan_for_key(st, topic, key, b, e, max_)
            rows = [dict(_row(m), source="scan") for m in msgs]
            out.table(rows, QUERY_COLUMNS, title=f"commitlog scan for {topic}#{key}")
            if not rows:
                raise typer.Exit(EXIT_FINDINGS)
            return
        ans = query_index(st, topic, key, b, e, max_, raw=raw)
        if not ans.health.ok:
            for p in ans.health.problems:
                warn(f"index: {p}")
            if not ans.offsets:
                fail("the index is missing or damaged for this range and returned nothing; "
                     "use --scan to search the commitlog instead", EXIT_FINDINGS)
            warn("the answer may be incomplete; --scan searches the commitlog instead")
        if raw:
            if json_:
                out.line({"topic": topic, "key": key, "begin": b, "end": e, "maxNum": max_, "offsets": ans.offsets,
                          "newestFirst": ans.newest_first})
            else:
                out.table([{"offset": o} for o in ans.offsets], [("offset", "offset")],
                          title=f"index hits for {topic}#{key} (unfiltered, ascending)")
        else:
            out.table([dict(_row(m), source="index") for m in ans.matches], QUERY_COLUMNS,
                      title=f"messages with key {key!r} in {topic}")
            if ans.collisions and not json_:
                warn(f"{len(ans.collisions)} index hit(s) were hash collisions (other keys); --raw shows them")
        if ans.unreadable:
            warn(f"{len(ans.unreadable)} index hit(s) point to offsets with no readable record: "
                 f"{', '.join(map(str, ans.unreadable[:10]))}")
        if not (ans.offsets if raw else ans.matches):
            raise typer.Exit(EXIT_FINDINGS)


def _explain(st, out: Output, topic: str, key: str, begin: int, end: int, max_num) -> None:
    from rmqstore_cli.engine.query.explain import explain_key

    from .explain_view import print_key_explanation, scan_progress

    with scan_progress("scanning commitlog ranges no index file covers") as advance:
        ex = explain_key(st, topic, key, begin, end, max_num, progress=advance)
    print_key_explanation(out, ex)
    if not any(r["inBrokerAnswer"] for r in ex.records):
        raise typer.Exit(EXIT_FINDINGS)


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.add_typer(index_app, name="index", rich_help_panel=panel)



