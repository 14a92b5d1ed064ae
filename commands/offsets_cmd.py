"""Consumer offsets and the broker's ``config/*.json``: ``dump offsets|config``, ``offsets set``, ``repair config``,
and the consumer-impact block the recover/truncate/rebuild plans print."""

from __future__ import annotations

import json
from typing import Optional

import typer

from rmqstore_cli.formats.fastjson import to_standard
from rmqstore_cli.engine.config.files import (CONFIG_FILES, LMQ_CONSUMER_OFFSETS, config_findings, read_config,
                                             read_config_file)
from rmqstore_cli.engine.errors import EXIT_CLEAN, EXIT_FINDINGS, UsageError

from .common import Geometry, JsonOpt, StoreArg, geometry_options, open_store
from .output import Output, handle_errors, iso_ms, stderr, stdout

OFFSET_COLUMNS = [("group", "group"), ("topic", "topic"), ("queueId", "q"), ("committed", "committed"),
                  ("minOffset", "min"), ("maxOffset", "max"), ("lagMessages", "lag msgs"), ("lagBytes", "lag bytes"),
                  ("nextPull", "next pull"), ("skipped", "skipped"), ("redelivered", "again")]
DELAY_COLUMNS = [("level", "delay level"), ("queueId", "q"), ("committed", "offset"), ("minOffset", "min"),
                 ("maxOffset", "max"), ("correctedAtStart", "at start"), ("pending", "pending")]
FINDING_COLUMNS = [("severity", "severity"), ("code", "code"), ("path", "file"), ("offset", "offset"), ("message", "what")]
FILE_COLUMNS = [("file", "file"), ("copy", "copy"), ("size", "bytes"), ("mtime", "modified"), ("parses", "decodes"),
                ("brokerLoads", "broker loads"), ("entries", "entries"), ("error", "problem")]
IMPACT_COLUMNS = [("group", "group"), ("topic", "topic"), ("queueId", "q"), ("committed", "committed"),
                  ("before", "min..max before"), ("after", "min..max after"), ("nextPull", "next pull"),
                  ("skipped", "skipped"), ("redelivered", "again"), ("unreadRemoved", "unread removed")]
SET_COLUMNS = [("group", "group"), ("topic", "topic"), ("queueId", "q"), ("before", "before"), ("after", "after"),
               ("minOffset", "min"), ("maxOffset", "max"), ("nextPull", "next pull")]

offsets_app = typer.Typer(help="Consumer groups' committed offsets (config/consumerOffset.json), offline.",
                          no_args_is_help=True)
repair_app = typer.Typer(help="Repair the broker's config files (config/*.json).", no_args_is_help=True)


def _say(s: str) -> None:
    stderr.print(s, markup=False, highlight=False)


def _ts(ms) -> str:
    return "" if ms is None else iso_ms(ms)


# --- read --------------------------------------------------------------------------------------------


@handle_errors
@geometry_options
def dump_offsets(
    store: str = StoreArg,
    group: Optional[str] = typer.Option(None, "--group", help="Only this consumer group."),
    topic: Optional[str] = typer.Option(None, "--topic", help="Only this topic."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Committed offsets (consumerOffset.json, and lmqConsumerOffset.json for LMQ groups) and delay offsets
    (delayOffset.json) against the consume queues (batch queues in messages).

    Per group/topic/queue: the offset, the queue's min/max, lag in messages and bytes, and what the group's
    next pull does (nothing / move to min / move to max / reset to 0). Exit 1 if a config file is damaged.
    """
    from rmqstore_cli.engine.config.offsets import audit_offsets

    st = open_store(store, geometry, command="dump offsets")
    with st:
        files = read_config(st.root)
        files[LMQ_CONSUMER_OFFSETS] = read_config_file(st.root, LMQ_CONSUMER_OFFSETS)
        audit = audit_offsets(st, files)
    found = config_findings(files)
    rows = [r for r in audit.rows if (group is None or r["group"] == group) and (topic is None or r["topic"] == topic)]
    out = Output(json_)
    if json_:
        out.lines({"type": "offset", **r} for r in rows)
        out.lines({"type": "delay-offset", **r} for r in audit.delay_rows)
        out.lines(f.as_json() for f in found)
    else:
        if rows:
            out.table(rows, OFFSET_COLUMNS, title=f"consumer offsets ({audit.offsets_source or 'no consumerOffset.json'})")
        else:
            _say(f"rmqstore: no committed offsets ({audit.offsets_source or 'no usable config/consumerOffset.json'})")
        if audit.delay_rows:
            out.table(audit.delay_rows, DELAY_COLUMNS, title="delay offsets (delayOffset.json)")
        if found:
            out.table([f.as_json() for f in found], FINDING_COLUMNS, title="config files", root=st.root, wrap=("path", "message"))
    raise typer.Exit(EXIT_FINDINGS if any(f.severity in ("error", "warning") for f in found) else EXIT_CLEAN)


@handle_errors
def dump_config(
    store: str = StoreArg,
    file: Optional[str] = typer.Option(None, "--file", help=f"Only this file ({', '.join(CONFIG_FILES)})."),
    json_: bool = JsonOpt,
):
    """The broker's config/*.json files and their .bak: which copy the broker loads, and its content.

    --json: one line per file with both copies' state and the loaded content as standard JSON
    (integer map keys become strings). Exit 1 if a file is damaged.
    """
    st = open_store(store, command="dump config")
    with st:
        files = read_config(st.root)
    if file is not None:
        if file not in files:
            raise UsageError(f"unknown config file {file!r}; one of {', '.join(CONFIG_FILES)}")
        files = {file: files[file]}
    found = config_findings(files)
    out = Output(json_)
    if json_:
        for cf in files.values():
            out.line({"type": "config-file", **cf.as_json(), "content": to_standard(cf.value)})
        out.lines(f.as_json() for f in found)
    else:
        rows = []
        for cf in files.values():
            for copy, c in (("main", cf.main), ("bak", cf.bak), ("tmp", cf.tmp)):
                if c is None or not c.exists:
                    continue
                j = c.as_json()
                err = j.get("error")
                if err and "line" in j:
                    err = f"{err} at line {j['line']} column {j['column']} (byte {j['offset']})"
                rows.append({"file": cf.name, "copy": copy, "size": c.size, "mtime": _ts(c.mtime_ms), "parses": c.usable,
                             "brokerLoads": (cf.broker_outcome == copy) if c.usable else "",
                             "entries": len(cf.table()) if cf.source == copy else "", "error": err or ""})
        if rows:
            out.table(rows, FILE_COLUMNS, title=f"config files of {st.root}")
        else:
            _say(f"rmqstore: {st.root} has no config/*.json files")
        for cf in files.values():
            if cf.value is not None:
                stdout.print(f"{cf.name} (as loaded, standard JSON):", markup=False, highlight=False)
                stdout.print(json.dumps(to_standard(cf.value), indent=2, ensure_ascii=False), markup=False, highlight=False)
        if found:
            out.table([f.as_json() for f in found], FINDING_COLUMNS, title="findings", root=st.root, wrap=("path", "message"))
    raise typer.Exit(EXIT_FINDINGS if any(f.severity in ("error", "warning") for f in found) else EXIT_CLEAN)


# --- consumer impact of repairs (hooks for recover / truncate / rebuild) -----------------------------


def print_consumer_impact(out: Output, impact: dict) -> None:
    """The consumers' side of a repair plan: every group whose committed offset the change puts out of range."""
    if out.as_json:
        out.line(impact)
        return
    groups = impact["groups"]
    if impact.get("error"):
        _say(f"  consumers: {impact['error']}")
        return
    if impact["offsetsFile"] is None:
        _say("  consumers: no config/consumerOffset.json, committed offsets unknown")
        return
    if not groups:
        _say("  consumers: no group's committed offset goes out of range")
        return
    rows = [dict(g, before=f"{g['before'][0]}..{g['before'][1]}", after=f"{g['after'][0]}..{g['after'][1]}") for g in groups]
    out.table(rows, IMPACT_COLUMNS, title="consumer groups whose committed offset goes out of range",
              wrap=("group", "topic"))


def _guarded(compute) -> dict:
    """The consumer impact never stops a repair: a failure to compute it is said, not raised."""
    import os

    try:
        return compute()
    except Exception as e:  # noqa: BLE001
        if os.environ.get("RMQSTORE_DEBUG"):
            raise
        return {"type": "consumer-impact", "offsetsFile": None, "groups": [],
                "error": f"consumer offsets not checked: {type(e).__name__}: {e}"}


def plan_impact(st, plan) -> dict:
    from rmqstore_cli.engine.config.offsets import plan_consumer_impact

    return _guarded(lambda: plan_consumer_impact(st, plan))


# --- writes ------------------------------------------------------------------------------------------


def _apply(st, plan, command: str, *, backup_dir, force: bool, out: Output) -> list[str]:
    from rmqstore_cli.engine.repair.backup import Backup
    from rmqstore_cli.engine.repair.config_plan import apply_config_plan
    from rmqstore_cli.engine.repair.apply import check_backup_location, locked_backup

    root = st.root
    check_backup_location(root, backup_dir)
    backup = Backup.create(root, backup_dir, command, {"files": [c.name for c in plan.changes]})
    with locked_backup(root, backup, force):
        steps = apply_config_plan(root, plan, backup)
    for s in steps:
        _say(f"  {s}")
    _say(f"rmqstore: {command} applied; previous files in {backup.dir} (undo with: rmqstore restore {backup.dir})")
    if out.as_json:
        out.line({"type": "applied", "backup": backup.dir, "steps": steps})
    return steps


def _print_config_plan(out: Output, plan, title: str) -> None:
    if out.as_json:
        out.line(plan.as_json())
        return
    _say(title)
    for c in plan.changes:
        _say(f"  {c.name}: {c.action}: {c.why}")
        for d in c.details[:50]:
            _say(f"    {d}")
        if len(c.details) > 50:
            _say(f"    ... {len(c.details) - 50} more")
    for n in plan.notes:
        _say(f"  note: {n}")
    if not plan.changes:
        _say("  nothing to do: every config file present decodes")


BackupOpt = typer.Option(None, "--backup-dir", help="Where the previous files go (default: STORE.rmqstore-backup/<time>-<command>/).")
DryRunOpt = typer.Option(False, "--dry-run", help="Print the plan only; change nothing. Exit 0 nothing to do, 1 changes planned.")
ForceOpt = typer.Option(False, "--force", help="Go on even if the store's lock file is held; asks for confirmation.")
YesOpt = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation (with --force).")


@handle_errors
@geometry_options(only=("config", "broker_version"))
def repair_config(
    store: str = StoreArg,
    clamp_offsets: bool = typer.Option(False, "--clamp-offsets", help="Also move committed offsets outside their queue's "
                                       "[min, max] into it (the broker would do it lazily at the next pull)."),
    dry_run: bool = DryRunOpt,
    backup_dir: Optional[str] = BackupOpt,
    force: bool = ForceOpt,
    yes: bool = YesOpt,
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Repair empty, cut-off or garbage config/*.json files (from .bak, else from the store).

    A main file that does not decode is restored from a .bak that does; where neither decodes, rebuild the file from what is left of both copies and from the store (topics and retry groups from
    consumequeue/, delay offsets from the schedule queues), in the broker's own format.

    The previous files go to a backup folder first (undo with `rmqstore restore`). Exit 4 if a broker holds the lock.
    """
    from rmqstore_cli.engine.repair.config_plan import plan_config_repair

    from .common import guard_lock

    st = open_store(store, geometry, command="repair config", writes=True)
    out = Output(json_)
    guard_lock(st, force, yes)
    with st:
        plan = plan_config_repair(st, clamp_offsets=clamp_offsets)
    _print_config_plan(out, plan, f"repair config {st.root}")
    if dry_run or not plan.changes:
        raise typer.Exit(EXIT_FINDINGS if (dry_run and plan.changes) else EXIT_CLEAN)
    _apply(st, plan, "repair-config", backup_dir=backup_dir, force=force, out=out)
    raise typer.Exit(EXIT_CLEAN)


@handle_errors
@geometry_options
def offsets_set(
    store: str = StoreArg,
    group: str = typer.Option(..., "--group", help="Consumer group."),
    topic: str = typer.Option(..., "--topic", help="Topic."),
    queue: Optional[int] = typer.Option(None, "--queue", help="Only this queue (default: every queue of the topic)."),
    to_offset: Optional[int] = typer.Option(None, "--to-offset", help="This queue offset."),
    to_time: Optional[str] = typer.Option(None, "--to-time", help="Epoch ms or ISO-8601: the broker's getOffsetInQueueByTime."),
    to_min: bool = typer.Option(False, "--to-min", help="The queue's min offset (re-consume everything kept)."),
    to_max: bool = typer.Option(False, "--to-max", help="The queue's max offset (skip everything stored)."),
    dry_run: bool = DryRunOpt,
    backup_dir: Optional[str] = BackupOpt,
    force: bool = ForceOpt,
    yes: bool = YesOpt,
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Rewrite a group's committed offsets offline (config/consumerOffset.json, written like the broker persists it).

    --to-time uses the broker's own search (4.9.3: nearest store time in the file picked by modification time;
    5.3.3: first message stored at or after the time, clamped into [min, max]). Exit 4 if a broker holds the lock.
    """
    from rmqstore_cli.engine.repair.config_plan import plan_offsets_set
    from rmqstore_cli.engine.query.lookup import parse_time

    from .common import guard_lock

    st = open_store(store, geometry, command="offsets set", writes=True)
    out = Output(json_)
    guard_lock(st, force, yes)
    ts = parse_time(to_time, 0) if to_time is not None else None
    with st:
        plan = plan_offsets_set(st, group, topic, queue, to_offset=to_offset, to_time=ts, to_min=to_min, to_max=to_max)
    if json_:
        out.line(plan.as_json())
    else:
        out.table(plan.offsets, SET_COLUMNS, title=f"offsets set {st.root}")
        for n in plan.notes:
            _say(f"  note: {n}")
    changed = any(r["before"] != r["after"] for r in plan.offsets)
    if dry_run or not changed:
        raise typer.Exit(EXIT_FINDINGS if (dry_run and changed) else EXIT_CLEAN)
    _apply(st, plan, "offsets-set", backup_dir=backup_dir, force=force, out=out)
    raise typer.Exit(EXIT_CLEAN)


def register(app: typer.Typer, panel: str | None = None) -> None:
    from .dump import dump_app

    if not offsets_app.registered_commands:  # once, however many roots register this module
        dump_app.command("offsets")(dump_offsets)
        dump_app.command("config")(dump_config)
        offsets_app.command("set")(offsets_set)
        repair_app.command("config")(repair_config)
    app.add_typer(offsets_app, name="offsets", rich_help_panel=panel)
    app.add_typer(repair_app, name="repair", rich_help_panel=panel)


def print_offsets_audit(out: Output, offsets: dict) -> None:
    """The consumer-offset tables of ``stats`` (JSON output carries them in the stats object)."""
    rows = offsets["consumerOffsets"]
    if rows:
        out.table(rows, OFFSET_COLUMNS, title=f"consumer offsets ({offsets['consumerOffsetsFile']})")
    else:
        stdout.print("consumer offsets: none (no usable config/consumerOffset.json)", markup=False)
    if offsets["delayOffsets"]:
        out.table(offsets["delayOffsets"], DELAY_COLUMNS, title="delay offsets (delayOffset.json)")


def queue_bounds_now(st) -> dict | None:
    """Queue bounds before a rebuild, read only when there are committed offsets to compare (None: none)."""
    from rmqstore_cli.engine.config.files import CONSUMER_OFFSETS, read_config_file
    from rmqstore_cli.engine.config.offsets import all_bounds

    try:
        if read_config_file(st.root, CONSUMER_OFFSETS).source is None:
            return None
        return all_bounds(st)
    except Exception:  # noqa: BLE001 - the rebuild goes on; the impact then says it was not checked
        return None


def rebuild_impact(root: str, config, before: dict) -> dict:
    """After a rebuild: the groups whose committed offset the rebuilt queues put out of range."""
    from rmqstore_cli.engine.config.offsets import measured_after, plan_consumer_impact
    from rmqstore_cli.engine.store import Store

    def compute():
        if before is None:
            return {"type": "consumer-impact", "offsetsFile": None, "groups": []}
        st = Store.open(root, overrides={"version": config.version,
                                         "mappedFileSizeConsumeQueue": config.mappedFileSizeConsumeQueue})
        with st:
            return plan_consumer_impact(st, measured_after(st), before=before)

    return _guarded(compute)
