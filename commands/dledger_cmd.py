"""``rmqstore dump dledger STORE``: a DLedger log entry by entry (header, the message inside), its blanks,
the index file's units, the DLedger checkpoint and currterm."""

from __future__ import annotations

from typing import Optional

import typer

from .common import Geometry, JsonOpt, StoreArg, geometry_options, open_store
from .output import Output, handle_errors, stdout

ENTRY_COLUMNS = [("index", "index"), ("term", "term"), ("pos", "pos"), ("size", "size"), ("magic", "magic"),
                 ("channel", "ch"), ("chainCrc", "chainCrc"), ("bodyCrc", "bodyCrc"), ("bodyLen", "body"),
                 ("topic", "topic"), ("queueId", "q"), ("queueOffset", "qoff"), ("messageOk", "msg ok")]
BLANK_COLUMNS = [("pos", "pos"), ("magic", "magic"), ("size", "size"), ("nextEntryPos", "next entry")]
UNIT_COLUMNS = [("unit", "unit"), ("magic", "magic"), ("pos", "pos"), ("size", "size"), ("index", "index"),
                ("term", "term")]


def register(dump_app: typer.Typer) -> None:
    dump_app.command("dledger")(dump_dledger)


@handle_errors
@geometry_options
def dump_dledger(
    store: str = StoreArg,
    index_units: bool = typer.Option(False, "--index-units", help="Also list the index file's 32-byte units."),
    from_index: Optional[int] = typer.Option(None, "--from-index", help="First entry index to list."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many entries (and units)."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Every DLedger entry (index, term, pos, size, magic, channel, chainCrc, bodyCrc, body length and the
    message's topic/queue/queue offset), the blanks at file ends, the DLedger checkpoint and currterm."""
    st = open_store(store, geometry, command="dump dledger")
    out = Output(json_)
    with st:
        from rmqstore_cli.engine.log.dledger import EntryWalk  # the DLedger modules load only for this command
        from rmqstore_cli.engine.query.dledger import end_row, entry_rows, state_rows, unit_rows

        head = state_rows(st)
        walk = EntryWalk()
        rows = entry_rows(st, start_index=from_index, limit=limit, walk=walk)
        if json_:
            for r in head:
                out.line(r)
            out.lines(rows)
            out.line(end_row(walk))
            if index_units:
                out.lines(unit_rows(st, start_index=from_index or 0, limit=limit))
            return
        info, cp, ct = head
        out.kv({"folder": info["directory"], "data files": f"{info['dataFiles']} of {info['dataFileSize']} B",
                "index files": f"{info['indexFiles']} of {info['indexFileSize']} B",
                "checkpoint": f"committedIndex={cp['committedIndex']} endIndex={cp['endIndex']} ({cp['file']})",
                "currterm": f"currTerm={ct['currTerm']} voteLeader={ct['voteLeader']}"}, title=f"DLedger store {st.root}")
        entries, blanks = [], []
        for r in rows:
            (entries if r["type"] == "entry" else blanks).append(r)
        out.table(entries, ENTRY_COLUMNS, title="entries")
        if blanks:
            out.table(blanks, BLANK_COLUMNS, title="blanks (end of file)")
        e = end_row(walk)
        if e["endPos"] is None:
            stdout.print(f"{len(entries)} entries listed; {e['why']}", markup=False, highlight=False)
        else:
            stdout.print(f"{e['entries']} entries, last index {e['lastIndex']} term {e['lastTerm']}; entries end at "
                         f"{e['endPos']}: {e['why']}", markup=False, highlight=False)
        if index_units:
            out.table(list(unit_rows(st, start_index=from_index or 0, limit=limit)), UNIT_COLUMNS, title="index units")
