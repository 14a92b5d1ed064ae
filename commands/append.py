"""``rmqstore append STORE``: write messages exactly as the broker would (commitlog + dispatch)."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import typer

from rmqstore_cli.engine.log.appender import Appender
from rmqstore_cli.engine.config.storeconfig import StoreConfig, apply_settings, read_broker_conf
from rmqstore_cli.engine.errors import StoreInUseError, UsageError
from rmqstore_cli.engine.log.linejson import json_loads as _json_loads  # noqa: F401 (tests)
from rmqstore_cli.engine.log.linejson import line_messages as _line_messages  # noqa: F401 (tests)
from rmqstore_cli.engine.log.messages import MessageBuilder
from rmqstore_cli.engine.log.replay import DumpReplay
from rmqstore_cli.engine.store import Store, probe_lock

from .common import Geometry, JsonOpt, StoreArg, geometry_options
from .output import Output, handle_errors, stderr

COLUMNS = [("offset", "offset"), ("size", "size"), ("msgId", "msgId"), ("topic", "topic"), ("queueId", "q"),
           ("queueOffset", "queue offset"), ("storeTimestamp", "store time")]
STORE_MARKERS = ("commitlog", "consumequeue", "index", "checkpoint")


def _config(store: str, config: Optional[str], overrides: dict) -> tuple[StoreConfig, dict]:
    """Existing store: inferred geometry + explicit settings; new (missing/empty) store: settings only."""
    conf = read_broker_conf(config) if config else {}
    root = os.path.abspath(os.path.expanduser(store))
    if os.path.exists(root) and not os.path.isdir(root):
        raise UsageError(f"{root} is a file, not a store directory")
    existing = os.path.isdir(root) and any(os.path.exists(os.path.join(root, m)) for m in STORE_MARKERS)
    if os.path.isdir(root) and not existing and os.listdir(root) and os.listdir(root) != ["lock"]:
        raise UsageError(f"{root} is not empty and not a RocketMQ store; refusing to create a store there")
    if existing:
        st = Store.open(root, config_file=config, overrides=overrides)
        try:
            st.require("append", writes=True)
        finally:
            st.close()
        cfg = st.config
    else:
        cfg = apply_settings(StoreConfig(version=5), conf)
        cfg = apply_settings(cfg, {k: v for k, v in overrides.items() if v is not None})
    return cfg, conf


@handle_errors
@geometry_options
def append(
    store: str = StoreArg,
    topic: Optional[str] = typer.Option(None, "--topic", help="Topic of the message to send."),
    queue: int = typer.Option(0, "--queue", help="Queue id."),
    body: Optional[str] = typer.Option(None, "--body", help="Body text (UTF-8)."),
    body_file: Optional[str] = typer.Option(None, "--body-file", help="Read the body bytes from this file."),
    tags: Optional[str] = typer.Option(None, "--tags", help="TAGS property."),
    keys: Optional[str] = typer.Option(None, "--keys", help="KEYS property (space-separated keys)."),
    prop: Optional[List[str]] = typer.Option(None, "--property", help="User property k=v (repeatable)."),
    born_host: Optional[str] = typer.Option(None, "--born-host", help="ip:port or [v6]:port (default 127.0.0.1:0)."),
    store_host: Optional[str] = typer.Option(None, "--store-host", help="ip:port or [v6]:port (default 127.0.0.1:10911)."),
    flag: int = typer.Option(0, "--flag", help="Application flag (int32)."),
    sys_flag: int = typer.Option(0, "--sys-flag", help="SYSFLAG bits (host bits are set from the addresses)."),
    transaction: Optional[str] = typer.Option(None, "--transaction", help="prepared|commit|rollback."),
    prepared_offset: int = typer.Option(0, "--prepared-offset", help="preparedTransactionOffset (commit/rollback)."),
    delay_level: Optional[int] = typer.Option(None, "--delay-level", help="Delay level: stored in SCHEDULE_TOPIC_XXXX."),
    born_timestamp: Optional[int] = typer.Option(None, "--born-timestamp", help="Born time (epoch ms; default now)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="Broker cluster name: adds CLUSTER to sends."),
    from_: Optional[str] = typer.Option(None, "--from", help="JSON Lines of `dump commitlog --json` messages "
                                        "(or {\"batch\": [...]}); '-' = stdin."),
    keep_store_times: bool = typer.Option(False, "--keep-store-times", help="--from: write every storeTimestamp as given, "
                                          "even older than the log's newest (as a broker whose clock went back; verify "
                                          "then reports CL_STORE_TIME). Without it such a message is refused (exit 3)."),
    fsync: str = typer.Option("end", "--fsync", help="always (after every put) | end."),
    quiet: bool = typer.Option(False, "--quiet", help="Print only a summary line."),
    enable_ext: Optional[bool] = typer.Option(None, "--enable-ext/--no-ext", help="enableConsumeQueueExt (new store)."),
    ext_file_size: Optional[int] = typer.Option(None, "--ext-file-size", help="mappedFileSizeConsumeQueueExt."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Append messages like the broker: commitlog records, consume queues, ext, index, checkpoint.

    One message from options (a send: the broker adds UNIQ_KEY on 5.x, CLUSTER, WAIT rules,
    delay redirection), or many from --from (a replay: stored exactly as given). Creates the
    store if it is missing. Exit 3 on bad input (the store keeps everything before that message).
    """
    if fsync not in ("always", "end"):
        raise UsageError("--fsync must be always or end")
    g = geometry
    if g.broker_version is not None and g.broker_version not in (4, 5):
        raise UsageError("--broker-version must be 4 or 5")
    send_opts = [topic, body, body_file, tags, keys, prop, born_host, store_host, transaction, delay_level,
                 born_timestamp]
    if from_ is not None and (any(v for v in send_opts) or flag or sys_flag or prepared_offset):
        raise UsageError("--from cannot be combined with message options (--topic, --body, ...)")
    if from_ is None and topic is None:
        raise UsageError("give --topic (one message) or --from FILE.jsonl")
    overrides = {"version": g.broker_version, "mappedFileSizeCommitLog": g.commitlog_file_size,
                 "mappedFileSizeConsumeQueue": g.cq_file_size, "maxHashSlotNum": g.index_slots,
                 "maxIndexNum": g.index_entries, "enableConsumeQueueExt": enable_ext,
                 "mappedFileSizeConsumeQueueExt": ext_file_size}
    root = os.path.abspath(os.path.expanduser(store))
    lock = probe_lock(root)
    if lock.held:
        raise StoreInUseError(f"store {root} is in use: its lock file is {lock.detail or 'held'}")
    cfg, conf = _config(root, g.config, overrides)
    builder = MessageBuilder(cfg, cluster=cluster or conf.get("brokerClusterName"))
    out = Output(json_)
    rows: list = []
    app = Appender(root, cfg, fsync_always=fsync == "always", keep_store_times=keep_store_times)
    count = 0
    failed: Optional[OSError] = None

    def emit(results):
        nonlocal count
        count += len(results)
        if quiet:
            return
        if json_:
            out.lines(r.as_json() for r in results)
        elif len(rows) < TABLE_ROWS:
            # A terminal table of every record stops being useful after a screen and cost
            # 85% of a large --from run; the rest is summarised (--json lists them all).
            rows.extend(r.as_json() for r in results[: TABLE_ROWS - len(rows)])

    try:
        if from_ is None:
            msg = builder.from_options(
                topic=topic, queue_id=queue, body=_read_body(body, body_file), tags=tags, keys=keys,
                properties=_parse_props(prop), born_host=born_host, store_host=store_host, flag=flag,
                sysflag=sys_flag, transaction=transaction, prepared_offset=prepared_offset,
                delay_level=delay_level, born_timestamp=born_timestamp)
            app.open()
            emit(app.put([msg]))
        else:
            stream = sys.stdin.buffer if from_ == "-" else _open_input(from_)
            try:
                for results in DumpReplay(app, builder).feed_stream(stream):
                    emit(results)
            finally:
                if from_ != "-":
                    stream.close()
    except OSError as e:
        failed = e
        raise _write_failed(e, root) from None
    finally:
        try:
            app.close()
        except OSError as e:
            if failed is None:
                raise _write_failed(e, root) from None
        if rows and not app.rolled_back:  # rolled back: the records listed are no longer there
            shown = f" (first {len(rows)} of {count}; --json lists every record)" if count > len(rows) else ""
            out.table(rows, COLUMNS, title=f"appended to {root}{shown}")
    if quiet or (not json_ and count != len(rows)):
        stderr.print(f"appended {count} record(s) to {root}", markup=False, highlight=False)


TABLE_ROWS = 50


def _write_failed(e: OSError, root: str) -> UsageError:
    """Disk full, file too large, read-only: say what state the store is in, not only the errno."""
    return UsageError(f"cannot write {e.filename or 'the store'}: {e.strerror or e}; part of this append may be on "
                      f"disk and the store is left marked unclean (abort file): run `rmqstore recover {root}` "
                      "before using it")


def _read_body(body: Optional[str], body_file: Optional[str]) -> bytes:
    if body is not None and body_file is not None:
        raise UsageError("give --body or --body-file, not both")
    if body_file is not None:
        try:
            with open(body_file, "rb") as f:
                return f.read()
        except OSError as e:
            raise UsageError(f"cannot read {body_file}: {e.strerror}") from None
    return (body or "").encode("utf-8")


def _parse_props(items: Optional[List[str]]) -> list[tuple[str, str]]:
    out = []
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise UsageError(f"--property {it!r} must be key=value")
        out.append((k, v))
    return out


def _open_input(path: str):
    try:
        return open(path, "rb")
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.command("append", rich_help_panel=panel)(append)
