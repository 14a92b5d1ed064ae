"""``rmqstore salvage STORE --to NEWSTORE | --jsonl FILE``: copy every readable record past corruption."""

from __future__ import annotations

from typing import Optional

import typer

from rmqstore_cli.engine.errors import UsageError
from rmqstore_cli.engine import salvage as engine

from .common import (CommitLogSizeOpt, ConfigOpt, CqSizeOpt, IndexEntriesOpt, IndexSlotsOpt, JsonOpt, StoreArg,
                     VersionOpt, open_store)
from .output import Output, handle_errors, stderr


@handle_errors
def salvage(
    store: str = StoreArg,
    to: Optional[str] = typer.Option(None, "--to", help="A new (empty or absent) store directory to append the rescued records to."),
    jsonl: Optional[str] = typer.Option(None, "--jsonl", help="Write the rescued records as JSON Lines (dump commitlog --json --body hex)."),
    json_: bool = JsonOpt,
    config: Optional[str] = ConfigOpt,
    broker_version: Optional[int] = VersionOpt,
    commitlog_file_size: Optional[int] = CommitLogSizeOpt,
    cq_file_size: Optional[int] = CqSizeOpt,
    index_slots: Optional[int] = IndexSlotsOpt,
    index_entries: Optional[int] = IndexEntriesOpt,
):
    """Read past corruption: after a bad record, resynchronise on the next self-consistent record
    (magic, TOTALSIZE, PHYSICALOFFSET = position, CRC) and rescue every valid record. Never writes the source.

    Prints a lost-and-found report (byte ranges skipped, records rescued per topic-queue).
    Exit 0: nothing skipped; 1: ranges were skipped.
    """
    if (to is None) == (jsonl is None):
        raise UsageError("give exactly one of --to NEWSTORE or --jsonl FILE")
    st = open_store(store, config, broker_version, commitlog_file_size, cq_file_size, index_slots, index_entries)
    with st:
        v = broker_version or st.config.version
        rep = engine.to_store(st, v, to) if to else engine.to_jsonl(st, v, jsonl)
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


def register(app: typer.Typer) -> None:
    app.command("salvage")(salvage)
