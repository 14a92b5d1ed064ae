"""``rmqstore dump timer``: the 5.x timer store (timerlog units, wheel slots, timercheck, timermetrics),
or with ``--pending`` the messages still waiting for their delivery time."""

from __future__ import annotations

from itertools import islice
from typing import Optional

import typer

from .common import Geometry, JsonOpt, StoreArg, geometry_options, open_store, parse_time_option
from .output import Output, handle_errors, warn

UNIT_COLUMNS = [("pos", "pos"), ("prevPos", "prevPos"), ("magicText", "magic"), ("slotTimeMs", "slot time"),
                ("deliverTimeMs", "delivery"), ("offsetPy", "offsetPy"), ("sizePy", "sizePy"), ("realTopic", "real topic"),
                ("realQueueId", "q"), ("keys", "keys"), ("uniqKey", "uniq key"), ("pending", "pending")]
SLOT_COLUMNS = [("slotIndex", "slot"), ("slotTimeMs", "time"), ("firstPos", "firstPos"), ("lastPos", "lastPos"),
                ("num", "num"), ("chainText", "chain")]
TABLE_ROWS = 5000  # rows per printed table
PENDING_COLUMNS = [("realTopic", "real topic"), ("realQueueId", "q"), ("keys", "keys"), ("uniqKey", "uniq key"),
                   ("deliverTimeMs", "delivery"), ("source", "from"), ("pos", "timerlog pos"), ("roll", "roll")]


@handle_errors
@geometry_options
def dump_timer(
    store: str = StoreArg,
    pending: bool = typer.Option(False, "--pending", help="One row per message not yet delivered (a rolled message "
                                 "once), with its real topic, queue, keys, uniq key and delivery time."),
    since: Optional[str] = typer.Option(None, "--since", help="Only delivery times at or after this (ISO-8601 or epoch ms)."),
    until: Optional[str] = typer.Option(None, "--until", help="Only delivery times at or before this (ISO-8601 or epoch ms)."),
    topic: Optional[str] = typer.Option(None, "--topic", help="Only messages of this real topic."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many units (or pending rows)."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """The timer store: timerlog units with the message each points at, the wheel's non-empty slots
    with their chains, timercheck and timermetrics (read-only). Delivery time is the message's
    TIMER_OUT_MS (a rolled unit's slot is only a stop on the way)."""
    since_ms, until_ms = parse_time_option(since, "--since"), parse_time_option(until, "--until")
    st = open_store(store, geometry, command="dump timer")
    with st:
        # the timer modules load only for this command (the dump group's other commands share this module)
        from rmqstore_cli.engine.timer.lines import pending_lines, unit_lines
        from rmqstore_cli.engine.timer.report import pending_rows, slot_rows, unit_rows
        from rmqstore_cli.engine.timer.store import TimerStore

        ts = TimerStore(st)
        try:
            if not ts.present:
                warn(f"{st.root} has no timer store (no timerlog/, timerwheel or config/timercheck)")
                return
            out = Output(json_)
            if pending and json_:  # encoded a chunk of units at a time
                for data in pending_lines(ts, since=since_ms, until=until_ms, topic=topic, limit=limit):
                    out.write_encoded(data)
                return
            if pending:
                rows = pending_rows(ts, since=since_ms, until=until_ms, topic=topic)
                if limit is not None:
                    rows = islice(rows, limit)
                _tables(out, rows, PENDING_COLUMNS, f"pending timer messages of {st.root}")
                return
            filtered = since_ms is not None or until_ms is not None or topic is not None
            if json_:
                for data in unit_lines(ts, since=since_ms, until=until_ms, topic=topic, limit=limit):
                    out.write_encoded(data)
                if not filtered:
                    out.lines({"type": "timerwheel_slot", **r} for r in slot_rows(ts))
                    out.line({"type": "timercheck", **ts.checkpoint.as_json()})
                    out.line({"type": "timermetrics", **ts.metrics.as_json()})
                return
            units = unit_rows(ts, since=since_ms, until=until_ms, topic=topic)
            if limit is not None:
                units = islice(units, limit)
            _tables(out, units, UNIT_COLUMNS, f"timerlog of {st.root} (precision {ts.precision_ms} ms)")
            if filtered:
                return
            _tables(out, (_slot_cells(r) for r in slot_rows(ts)), SLOT_COLUMNS, "timer wheel (non-empty slots)")
            out.kv(ts.checkpoint.as_json(), title="config/timercheck")
            m = ts.metrics.as_json()
            out.kv({"source": m["source"], "error": m["error"], "dataVersion": m["dataVersion"],
                    **{t: v["count"] for t, v in m["timingCount"].items()}}, title="config/timermetrics (pending per topic)")
        finally:
            ts.close()


def _tables(out: Output, rows, columns, title: str) -> None:
    """Rows as tables of TABLE_ROWS rows each (the title on the first): a terminal listing of millions of
    units streams instead of being held whole."""
    rows = iter(rows)
    first = True
    while True:
        part = list(islice(rows, TABLE_ROWS))
        if part or first:
            out.table(part, columns, title=title if first else None)
        first = False
        if len(part) < TABLE_ROWS:
            return


def _slot_cells(row: dict) -> dict:
    chain = row["chain"]
    shown = " <- ".join(str(p) for p in chain[:6]) + (" ..." if len(chain) > 6 else "")
    return {**row, "slotTimeMs": row["timeMs"], "chainText": f"{shown} ({len(chain)}, ends {row['chainEnd']})"}
