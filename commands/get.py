"""``rmqstore get STORE``: one message by offset, offset msgId, UNIQ_KEY or queue position (read-only)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from rmqstore_cli.formats.message import render_body
from rmqstore_cli.engine.errors import NotFoundError
from rmqstore_cli.engine.query.lookup import get_by_msgid, get_by_offset, get_by_queue, get_by_uniq_key
from rmqstore_cli.engine.query.timesearch import offset_by_time

from .common import Geometry, JsonOpt, StoreArg, geometry_options, open_store, parse_time_option
from .output import Output, fail, handle_errors, stdout, warn

GET_BODY_MODES = ("hex", "text", "base64", "raw", "none")
HEADER_FIELDS = ("offset", "topic", "queueId", "queueOffset", "commitLogOffset", "storeSize", "msgId", "sysFlag",
                 "flag", "bodyCRC", "bornTimestamp", "bornHost", "storeTimestamp", "storeHost", "reconsumeTimes",
                 "preparedTransactionOffset", "magicVersion", "bodyLen")


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.command("get", rich_help_panel=panel)(get)


@handle_errors
@geometry_options
def get(
    store: str = StoreArg,
    offset: Optional[int] = typer.Option(None, "--offset", help="Commitlog physical offset of the record."),
    msg_id: Optional[str] = typer.Option(None, "--msg-id", help="Offset msgId (store host + offset; host is checked)."),
    uniq_key: Optional[str] = typer.Option(None, "--uniq-key", help="Client id (UNIQ_KEY), through the index; scan if absent."),
    topic: Optional[str] = typer.Option(None, "--topic", help="Topic (with --queue/--queue-offset, or to narrow --uniq-key)."),
    queue: Optional[int] = typer.Option(None, "--queue", help="Queue id."),
    queue_offset: Optional[int] = typer.Option(None, "--queue-offset", help="Logical offset in the consume queue."),
    time: Optional[str] = typer.Option(None, "--time", help="With --topic/--queue: the message at the queue offset the "
                                       "broker returns for this store time (getOffsetInQueueByTime; ISO-8601 or epoch ms)."),
    body: str = typer.Option("text", "--body", help="hex|text|base64|raw|none (raw: the bytes on stdout)."),
    out_file: Optional[str] = typer.Option(None, "--out", help="Write the raw body bytes to FILE."),
    no_scan: bool = typer.Option(False, "--no-scan", help="--uniq-key: do not fall back to a commitlog scan."),
    explain: bool = typer.Option(False, "--explain", help="With --msg-id or --uniq-key: say why the message is (not) "
                                 "found: the offset a msgId decodes to (expired, past the end, not a record), or "
                                 "for a UNIQ_KEY the index evidence as `index query --explain` shows it."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Print one whole message: header fields, properties and body (exit 1 when not found)."""
    if body not in GET_BODY_MODES:
        fail(f"--body must be one of {', '.join(GET_BODY_MODES)}")
    by_queue = queue is not None or queue_offset is not None or time is not None
    chosen = [n for n, v in (("--offset", offset), ("--msg-id", msg_id), ("--uniq-key", uniq_key)) if v is not None]
    if by_queue:
        chosen.append("--topic/--queue/--queue-offset")
    if len(chosen) != 1:
        fail("give exactly one of --offset, --msg-id, --uniq-key or --topic T --queue Q --queue-offset N|--time T")
    if by_queue and (topic is None or queue is None or (queue_offset is None) == (time is None)):
        fail("--topic and --queue go with one of --queue-offset or --time")
    if explain and msg_id is None and uniq_key is None:
        fail("--explain goes with --msg-id or --uniq-key")
    time_ms = parse_time_option(time, "--time")
    st = open_store(store, geometry, command="get")
    with st:
        if explain:
            _explain(st, Output(json_), msg_id, uniq_key, topic)
            return
        if offset is not None:
            msgs = [get_by_offset(st, offset)]
        elif msg_id is not None:
            msgs = [get_by_msgid(st, msg_id.strip())]
        elif uniq_key is not None:
            msgs, source = get_by_uniq_key(st, uniq_key.strip(), topic, allow_scan=not no_scan)
            if not msgs:
                where = f" in topic {topic}" if topic else ""
                raise NotFoundError(f"no message with UNIQ_KEY {uniq_key}{where} "
                                    f"({'index' if no_scan else 'index and commitlog scan'})")
            if source == "scan":
                warn("found by a commitlog scan: the index does not list this UNIQ_KEY")
            if len(msgs) > 1:
                warn(f"{len(msgs)} records carry this UNIQ_KEY (e.g. a transaction half message and its commit)")
        else:
            if time_ms is not None:
                queue_offset = offset_by_time(st, topic, queue, time_ms)
                warn(f"store time {time_ms}: the broker ({st.config.version}.x rules) answers queue offset {queue_offset}")
            msgs = [get_by_queue(st, topic, queue, queue_offset)]
        if out_file is not None:
            with open(out_file, "wb") as f:
                for m in msgs:
                    f.write(m.get("body") or b"")
        if body == "raw":
            for m in msgs:
                sys.stdout.buffer.write(m.get("body") or b"")
            sys.stdout.buffer.flush()
            return
        out = Output(json_)
        for m in msgs:
            _print(out, m, body, json_)


def _explain(st, out: Output, msg_id: Optional[str], uniq_key: Optional[str], topic: Optional[str]) -> None:
    """Exit 0 when the message is there (and, for a UNIQ_KEY, answered by the index), else 1."""
    from rmqstore_cli.engine.errors import EXIT_FINDINGS
    from rmqstore_cli.engine.query.explain import explain_key, explain_msgid

    from .explain_view import print_key_explanation, print_msgid_explanation, scan_progress

    if msg_id is not None:
        d = explain_msgid(st, msg_id.strip())
        print_msgid_explanation(out, d)
        found = d["status"] == "found"
    else:
        with scan_progress("scanning commitlog ranges no index file covers") as advance:
            ex = explain_key(st, topic, uniq_key.strip(), uniq_only=True, progress=advance)
        print_key_explanation(out, ex)
        found = any(r["inBrokerAnswer"] for r in ex.records)
    if not found:
        raise typer.Exit(EXIT_FINDINGS)


def _print(out: Output, msg: dict, body: str, as_json: bool) -> None:
    if as_json:
        out.line(render_body(msg, body))
        return
    props = msg.get("properties") or {}
    raw_body = msg.get("body")
    header = {k: msg[k] for k in HEADER_FIELDS if k in msg}
    if "cqUnit" in msg:
        header["cqUnit"] = msg["cqUnit"]
    if msg.get("sysFlag", 0) & 0x1:
        header["compressed"] = "yes (body shown as stored)"
    out.kv(header, title=f"message at {msg['offset']}")
    out.kv(props or {"(none)": ""}, title="properties")
    rendered = render_body(dict(msg), body)
    text = rendered.get("bodyHex") or rendered.get("bodyText") or rendered.get("bodyBase64")
    if body != "none":
        stdout.print(f"body ({len(raw_body or b'')} bytes, {body}):", markup=False)
        stdout.print(text or "", markup=False, soft_wrap=True)
