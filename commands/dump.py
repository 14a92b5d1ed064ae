"""``rmqstore dump commitlog|consumequeue|cqext|index|checkpoint|store``."""

from __future__ import annotations

from itertools import islice
from typing import Optional

import typer

from formats.message import BODY_MODES, render_body

from .common import (CommitLogSizeOpt, ConfigOpt, CqSizeOpt, IndexEntriesOpt, IndexSlotsOpt, JsonOpt, StoreArg,
                     VersionOpt, open_store)
from .output import Output, handle_errors

dump_app = typer.Typer(help="Print the records of one part of a store (read-only).", no_args_is_help=True)

MSG_COLUMNS = [
    ("offset", "offset"), ("storeSize", "size"), ("topic", "topic"), ("queueId", "q"), ("queueOffset", "qoff"),
    ("storeTimestamp", "store time"), ("sysFlag", "sys"), ("msgId", "msgId"), ("propertiesRaw", "properties"),
]


@dump_app.command("commitlog")
@handle_errors
def dump_commitlog(
    store: str = StoreArg,
    topic: Optional[str] = typer.Option(None, "--topic", help="Only records of this topic."),
    queue: Optional[int] = typer.Option(None, "--queue", help="Only records of this queue id."),
    from_: Optional[int] = typer.Option(None, "--from", help="First physical offset (inclusive)."),
    to: Optional[int] = typer.Option(None, "--to", help="Last physical offset (exclusive)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many records."),
    body: str = typer.Option("none", "--body", help="none|hex|text|base64"),
    json_: bool = JsonOpt,
    config: Optional[str] = ConfigOpt,
    broker_version: Optional[int] = VersionOpt,
    commitlog_file_size: Optional[int] = CommitLogSizeOpt,
    cq_file_size: Optional[int] = CqSizeOpt,
    index_slots: Optional[int] = IndexSlotsOpt,
    index_entries: Optional[int] = IndexEntriesOpt,
):
    """Every commitlog record in order, up to the end of valid data."""
    if body not in BODY_MODES:
        raise typer.BadParameter(f"--body must be one of {', '.join(BODY_MODES)}")
    st = open_store(store, config, broker_version, commitlog_file_size, cq_file_size, index_slots, index_entries)
    with st:
        recs = st.commitlog.records(start=from_, end=to, with_body=body != "none")
        if topic is not None:
            recs = (m for m in recs if m["topic"] == topic)
        if queue is not None:
            recs = (m for m in recs if m["queueId"] == queue)
        if limit is not None:
            recs = islice(recs, limit)
        out = Output(json_)
        out.table((render_body(m, body) for m in recs), MSG_COLUMNS + ([("bodyText", "body")] if body == "text" else []),
                  title=f"commitlog of {st.root}")


def register(app: typer.Typer) -> None:
    app.add_typer(dump_app, name="dump")
