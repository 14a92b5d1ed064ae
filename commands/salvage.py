"""``rmqstore salvage STORE --to NEWSTORE | --jsonl FILE``: copy every readable record past corruption."""

from __future__ import annotations

from typing import Optional

import typer

from rmqstore_cli.engine.errors import UsageError
from rmqstore_cli.engine.parallel import default_jobs
from rmqstore_cli.engine.repair import salvage as engine
from rmqstore_cli.engine.repair.salvagejobs import to_jsonl_jobs

from .common import (Geometry, JsonOpt, StoreArg, geometry_options, open_store,
                     parse_time_option)
from .output import Output, handle_errors, stderr


@handle_errors
@geometry_options
def salvage(
    store: str = StoreArg,
    to: Optional[str] = typer.Option(None, "--to", help="A new (empty or absent) store directory to append the rescued records to."),
    jsonl: Optional[str] = typer.Option(None, "--jsonl", help="Write the rescued records as JSON Lines (dump commitlog --json --body hex)."),
    since: Optional[str] = typer.Option(None, "--since", help="With --jsonl: only records stored at or after this "
                                        "time (ISO-8601 or epoch ms; binary search, not a full scan)."),
    until: Optional[str] = typer.Option(None, "--until", help="With --jsonl: only records stored at or before this time."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
    jobs: int = typer.Option(1, "-j", "--jobs", min=0, help="Worker processes for --jsonl (0: one per core): each "
                             "walks, decodes and renders 4 MiB parts of the commitlog segments (DLedger: whole data "
                             "files), this process writes their lines in log order. Same file and report as -j 1. "
                             "--to runs in one process."),
):
    """Rescue every valid record past corruption into a new store or JSON Lines (source untouched).

    After a bad record the walk resynchronises on the next self-consistent record (magic, TOTALSIZE,
    PHYSICALOFFSET = position, CRC).

    Prints a lost-and-found report (byte ranges skipped, records rescued per topic-queue).
    Exit 0: nothing skipped; 1: ranges were skipped.
    """
    if (to is None) == (jsonl is None):
        raise UsageError("give exactly one of --to NEWSTORE or --jsonl FILE")
    if to and (since or until):
        raise UsageError("--since/--until go with --jsonl (a new store keeps every rescued record)")
    since_ms, until_ms = parse_time_option(since, "--since"), parse_time_option(until, "--until")
    # --jsonl reads the commitlog only; --to builds a store (refused where the layout is not writable)
    st = open_store(store, geometry, command="salvage --jsonl" if jsonl else "salvage --to")
    with st:
        v = geometry.broker_version or st.config.version
        if to:
            rep = engine.to_store(st, v, to)
        else:
            rep = to_jsonl_jobs(st, v, jsonl, since=since_ms, until=until_ms, jobs=jobs or default_jobs())
    out = Output(json_)
    d = rep.as_json()
    if json_:
        out.line(d)
    else:
        stderr.print(f"rmqstore: salvage: {rep.records} records rescued into {to or jsonl}; "
                     f"{len(rep.skipped)} ranges ({d['skippedBytes']} bytes) skipped", markup=False)
        out.table([{"start": s, "end": e, "reason": r} for s, e, r in rep.skipped],
                  [("start", "from"), ("end", "to"), ("reason", "why")], title="skipped byte ranges")
        out.table([{"queue": k, "records": n} for k, n in sorted(rep.rescued.items())],
                  [("queue", "topic-queueId"), ("records", "rescued")], title="rescued records")
        if rep.renumbered:
            stderr.print(f"rmqstore: {rep.renumbered} records got a new queue offset (a gap in their queue)", markup=False)
    raise typer.Exit(1 if rep.skipped else 0)


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.command("salvage", rich_help_panel=panel)(salvage)
