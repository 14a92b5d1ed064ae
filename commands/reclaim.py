"""``rmqstore reclaim STORE``: what the broker's cleaner deletes on its next start, and freeing space offline
under a chosen policy (delete with --yes, or move the files out with --move-to and put them back with
``rmqstore restore``)."""

from __future__ import annotations

from typing import Optional

import typer

from rmqstore_cli.engine.errors import UsageError

from .cleanup_view import cleanup_inputs, parse_size
from .common import Geometry, JsonOpt, StoreArg, geometry_options, open_store, parse_time_option
from .output import Output, handle_errors, iso_ms, stderr

FILE_COLUMNS = [("name", "file"), ("size", "size"), ("mtime", "modified"), ("reason", "why")]
DERIVED_COLUMNS = [("kind", "kind"), ("topic", "topic"), ("queueId", "q"), ("name", "file"), ("why", "why")]
QUEUE_COLUMNS = [("topic", "topic"), ("queueId", "q"), ("minOffsetBefore", "min before"), ("minOffsetAfter", "min after"),
                 ("maxOffset", "max"), ("messagesRemoved", "removed")]
LOSS_COLUMNS = [("group", "group"), ("topic", "topic"), ("queueId", "q"), ("committed", "committed"),
                ("minOffsetAfter", "new min"), ("nextOffset", "next pull at"), ("unconsumedLost", "unconsumed lost")]


def print_reclaim_plan(out: Output, plan, title: str) -> None:
    s = plan.summary()
    if out.as_json:
        out.line(s)
        return
    say = lambda x: stderr.print(x, markup=False, highlight=False)  # noqa: E731
    say(f"{title}: policy {plan.policy}, broker {plan.version} rules")
    p = plan.prediction
    if p is not None:
        _print_prediction(say, p, plan.version)
    for n in plan.notes:
        say(f"  note: {n}")
    rows = [{"name": x["name"], "size": x["size"], "mtime": iso_ms(x["mtime"]), "reason": x["reason"]}
            for x in s["commitlogFiles"]]
    if rows:
        out.table(rows, FILE_COLUMNS, title=("DLedger data" if plan.dledger else "commitlog") + " files removed (oldest first)")
    if s["derivedFiles"]:
        out.table(s["derivedFiles"], DERIVED_COLUMNS, title=("DLedger index, " if plan.dledger else "")
                  + "consume-queue, ext and index files removed after them")
    if plan.empty:
        say("  nothing to remove")
        return
    say(f"  min offset {plan.min_before} -> {plan.min_after}; {s['commitlogFilesKept']} {'DLedger data' if plan.dledger else 'commitlog'} file(s) kept; "
        f"{plan.freed} bytes freed")
    say("  freed space cannot be backed up in place: --yes deletes these files for good; --move-to DIR moves them "
        "to another folder or disk instead (`rmqstore restore DIR` puts them back)")
    if s["queues"]:
        out.table(s["queues"], QUEUE_COLUMNS, title="consume queues whose min offset moves")
    lost = [r for r in s["consumerLoss"] if r["unconsumedLost"]]
    if lost:
        out.table(lost, LOSS_COLUMNS, title="unconsumed messages each reader loses")
    elif s["consumerLoss"]:
        say("  consumers: no reader loses an unconsumed message")
    else:
        say("  consumers: no committed offset on the queues that move (config/consumerOffset.json)")


def _print_prediction(say, p, version: int) -> None:
    if p.dledger:
        d = p.dledger
        say(f"  DLedger's cleaner: fileReservedHours {d['fileReservedHours']} (fileReservedTime + 1), deleteWhen "
            f"{d['deleteWhen']}, diskSpaceRatioToCheckExpired {d['diskSpaceRatioToCheckExpired']:.2f}, "
            f"diskSpaceRatioToForceClean {d['diskSpaceRatioToForceClean']:.2f}, enableDiskForceClean "
            f"{str(d['enableDiskForceClean']).lower()}, batch {d['deleteFilesBatchMax']}; then the broker's consume-queue "
            "cleaner behind the new min offset")
    else:
        st = p.settings
        say(f"  cleaner: fileReservedTime {st.fileReservedTime} h, deleteWhen {st.deleteWhen}, diskMaxUsedSpaceRatio "
            f"{st.diskMaxUsedSpaceRatio} %, cleanFileForciblyEnable {str(st.cleanFileForciblyEnable).lower()}, forcibly "
            f"{st.diskSpaceCleanForciblyRatio:.2f}, warning {st.diskSpaceWarningLevelRatio:.2f}, batch {st.batch_max(version)}")
    d = p.disk
    say(f"  broker start {iso_ms(p.start_ms)}; disk ({d['source']}): commitlog {d['commitlogRatio'] * 100:.1f} % used, "
        f"consume queue {d['consumeQueueRatio'] * 100:.1f} % used")
    files = "data" if p.dledger else "commitlog"
    for r in p.rounds:
        if not (r.commitlog or r.derived):
            continue
        say(f"  round {r.number}{' (' + r.cleaner + ')' if p.dledger else ''} at {iso_ms(r.time_ms)} "
            f"({', '.join(r.trigger) or 'min offset moved'}{'; ' + r.why if r.why else ''}): {len(r.commitlog)} {files} "
            f"file(s), {len(r.derived)} derived file(s); min offset -> {r.min_offset}")
    if p.commitlog or p.derived:
        a = p.disk_after
        say(f"  after the cleanup: commitlog disk {a['commitlogRatio'] * 100:.1f} % used, consume queue "
            f"{a['consumeQueueRatio'] * 100:.1f} % used")


@handle_errors
@geometry_options
def reclaim(
    store: str = StoreArg,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan only; change nothing (exit 0 nothing to "
                                 "remove, 1 files would be removed). Without a policy: the broker's next cleanup."),
    as_broker: bool = typer.Option(False, "--as-broker", help="Exactly what the broker's cleaner deletes on its next start."),
    consumed: bool = typer.Option(False, "--consumed", help="Only the oldest files whose every message every group "
                                  "(consumerOffset.json) and the schedule service (delayOffset.json) has consumed."),
    ignore_unread: bool = typer.Option(False, "--ignore-unread-queues", help="With --consumed: a queue no group reads "
                                       "counts as consumed."),
    before: Optional[str] = typer.Option(None, "--before", help="The oldest files whose every record was stored "
                                         "before this time (ISO-8601 or epoch ms)."),
    keep_files: Optional[int] = typer.Option(None, "--keep-files", help="Keep the newest N commitlog files."),
    free: Optional[str] = typer.Option(None, "--free", help="The oldest files until this much is freed (e.g. 20G)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete the files (freed space cannot be backed up in place)."),
    move_to: Optional[str] = typer.Option(None, "--move-to", help="Move the files into this folder (outside the "
                                          "store; another disk) instead of deleting; `rmqstore restore DIR` puts them back."),
    at: Optional[str] = typer.Option(None, "--at", help="The broker's start time for --as-broker (default: now)."),
    assume_disk: Optional[str] = typer.Option(None, "--assume-disk", help="Disk usage for --as-broker as USED/TOTAL "
                                              "(e.g. 900G/1T or 91%/1T; add ,USED/TOTAL when the consume queues are on "
                                              "another disk) instead of statvfs of the store's partitions."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Free disk space: the broker's next cleanup predicted, or a chosen policy applied (oldest commitlog files
    first, never the newest, then the consume-queue, ext and index files behind them, as the broker's cleaner).

    Deleted files cannot be backed up in place: --yes deletes, --move-to DIR moves them out (undo with
    `rmqstore restore DIR`). Exit 4 if a broker holds the lock.
    """
    from rmqstore_cli.engine.repair.reclaim import apply_reclaim, plan_reclaim, same_filesystem

    chosen = [n for n, v in (("as-broker", as_broker), ("consumed", consumed), ("before", before is not None),
                             ("keep-files", keep_files is not None), ("free", free is not None)) if v]
    if len(chosen) > 1:
        raise UsageError(f"choose one policy, not {', '.join('--' + c for c in chosen)}")
    if not chosen and not dry_run:
        raise UsageError("choose a policy: --as-broker, --consumed, --before TIME, --keep-files N or --free SIZE "
                         "(or --dry-run to see the broker's next cleanup)")
    if yes and move_to:
        raise UsageError("--yes deletes and --move-to moves: choose one")
    policy = chosen[0] if chosen else "as-broker"
    before_ms = parse_time_option(before, "--before")
    free_bytes = parse_size(free, "--free") if free is not None else None
    st = open_store(store, geometry, command="reclaim", writes=not dry_run)
    out = Output(json_)
    try:
        if not dry_run and st.lock_state().held:
            from rmqstore_cli.engine.errors import StoreInUseError

            raise StoreInUseError(f"store {st.root} is in use: its lock file is held (a running broker?); stop it first")
        settings = now = disk = None
        if policy == "as-broker":
            settings, now, disk = cleanup_inputs(st, geometry, at, assume_disk)
        plan = plan_reclaim(st, policy, settings=settings, now_ms=now, disk=disk, before_ms=before_ms,
                            keep_files=keep_files, free_bytes=free_bytes, ignore_unread=ignore_unread)
    finally:
        config = st.config
        st.close()
    print_reclaim_plan(out, plan, f"reclaim {plan.root}")
    if dry_run:
        raise typer.Exit(plan.exit_code)
    if plan.empty:
        stderr.print("rmqstore: reclaim: nothing to remove", markup=False)
        raise typer.Exit(0)
    if not yes and not move_to:
        stderr.print(f"rmqstore: not applied: removing {len(plan.paths)} files frees space that cannot be backed up in "
                     "place; pass --yes to delete them, or --move-to DIR to move them to another folder or disk "
                     "(`rmqstore restore DIR` puts them back)", markup=False, highlight=False)
        raise typer.Exit(2)
    if move_to and same_filesystem(plan.root, move_to):
        stderr.print(f"rmqstore: warning: {move_to} is on the store's filesystem: moving the files there frees no "
                     "space on it (choose a folder on another disk to free space)", markup=False, highlight=False)
    res = apply_reclaim(plan, move_to=move_to, delete=yes)
    for line in res.steps[:20]:
        stderr.print(f"  {line}", markup=False, highlight=False)
    if len(res.steps) > 20:
        stderr.print(f"  … {len(res.steps) - 20} more", markup=False)
    where = f"; moved to {res.moved_to} (put back with: rmqstore restore {res.moved_to})" if res.moved_to else "; deleted"
    stderr.print(f"rmqstore: reclaim applied: {len(res.steps)} files, {plan.freed} bytes freed{where}",
                 markup=False, highlight=False)
    if json_:
        out.line({"type": "applied", "steps": res.steps, "movedTo": res.moved_to, "freedBytes": plan.freed})
    from .recover import run_verify

    raise typer.Exit(run_verify(plan.root, config, out, json_))


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.command("reclaim", rich_help_panel=panel)(reclaim)
