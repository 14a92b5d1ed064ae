"""``rmqstore msgid decode ID``: offset msgIds and client UNIQ_KEYs (FORMAT.md §6), no store needed."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Optional

import typer

from rmqstore_cli.formats.msgid import decode_offset_msgid, decode_uniq_key
from rmqstore_cli.engine.query.lookup import parse_time

from .common import JsonOpt
from .output import Output, fail, handle_errors

msgid_app = typer.Typer(help="Message ids.", no_args_is_help=True)


def uniq_key_time(time_in_month_ms: int, ref_ms: int) -> int:
    """Java's approximation (getNearlyTimeFromID): the start of the reference month in local time plus
    the offset, or the previous month's start plus the offset when that is not before the reference."""
    ref = datetime.fromtimestamp(ref_ms / 1000)
    start = ref.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    t = int(start.timestamp() * 1000) + time_in_month_ms
    if t >= ref_ms:
        prev_month = (start - timedelta(days=1)).replace(day=1)
        t = int(prev_month.timestamp() * 1000) + time_in_month_ms
    return t


def decode(text: str, kind: str, ref_ms: int) -> dict:
    s = text.strip()
    if not re.fullmatch(r"[0-9A-Fa-f]+", s) or len(s) not in (32, 56):
        raise ValueError(f"{text!r} is not a message id: 32 or 56 hex digits expected")
    out: dict = {"id": s.upper(), "ipVersion": 4 if len(s) == 32 else 6}
    if kind in ("auto", "offset"):
        o = decode_offset_msgid(s)
        out["asOffsetMsgId"] = {"storeHost": o.host, "storePort": o.port, "commitLogOffset": o.offset}
    if kind in ("auto", "uniq"):
        u = decode_uniq_key(s)
        out["asUniqKey"] = {
            "ip": u.host, "pid": u.pid, "classLoaderHash": f"0x{u.class_loader_hash:08X}",
            "timeInMonthMs": u.time_in_month_ms, "counter": u.counter,
            "approxBornTime": datetime.fromtimestamp(uniq_key_time(u.time_in_month_ms, ref_ms) / 1000)
            .astimezone().isoformat(timespec="milliseconds"),
        }
    if kind == "auto":
        o = out["asOffsetMsgId"]
        # Offset ids carry a TCP port and a non-negative offset; a UNIQ_KEY read that way rarely does.
        out["likely"] = "offset" if 0 < o["storePort"] <= 65535 and o["commitLogOffset"] >= 0 else "uniq"
    return out


@msgid_app.command("decode")
@handle_errors
def msgid_decode(
    ids: list[str] = typer.Argument(..., help="One or more ids (offset msgId or UNIQ_KEY, 32 or 56 hex digits)."),
    kind: str = typer.Option("auto", "--kind", help="auto|offset|uniq (auto shows both readings)."),
    ref: Optional[str] = typer.Option(None, "--ref-time", help="UNIQ_KEY month reference (default now): epoch ms or ISO-8601."),
    json_: bool = JsonOpt,
):
    """Decode ids without a store: store host + commitlog offset, or producer ip/pid/time/counter."""
    if kind not in ("auto", "offset", "uniq"):
        fail("--kind must be auto, offset or uniq")
    ref_ms = parse_time(ref, int(datetime.now().timestamp() * 1000))
    out = Output(json_)
    for text in ids:
        try:
            d = decode(text, kind, ref_ms)
        except ValueError as e:
            fail(str(e))
        if json_:
            out.line(d)
            continue
        flat = {"id": d["id"]}
        if "likely" in d:
            flat["likely"] = d["likely"]
        for part in ("asOffsetMsgId", "asUniqKey"):
            for k, v in d.get(part, {}).items():
                flat[f"{part[2:]}.{k}"] = v
        out.kv(flat)


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.add_typer(msgid_app, name="msgid", rich_help_panel=panel)


