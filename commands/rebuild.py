"""``rmqstore rebuild consumequeue|cqext|index|all STORE``: regenerate derived files from the commitlog."""

from __future__ import annotations

from typing import Optional

import typer

from .common import Geometry, JsonOpt, StoreArg, geometry_options, guard_lock, open_store
from .output import Output, handle_errors, say as say_line, stderr
from .recover import BackupOpt, ForceOpt, YesOpt, report_verify, verify_after


@handle_errors
@geometry_options
def rebuild(
    what: str = typer.Argument(..., help="consumequeue | cqext | index | all | timer (the timer wheel from the timerlog)"),
    store: str = StoreArg,
    topic: Optional[str] = typer.Option(None, "--topic", help="Only this topic's consume queues."),
    from_offset: Optional[int] = typer.Option(None, "--from-offset", help="Keep what indexes records before PHY; rebuild from there."),
    ext: Optional[bool] = typer.Option(None, "--ext/--no-ext", help="enableConsumeQueueExt (inferred from consumequeue_ext/ when omitted)."),
    ext_file_size: Optional[int] = typer.Option(None, "--ext-file-size", help="mappedFileSizeConsumeQueueExt (bytes)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Change nothing: say which findings the rebuild fixes and which it "
                                 "keeps. Exit 0 when the folders to rebuild are verify-clean and nothing else is damaged, 1 otherwise."),
    backup_dir: Optional[str] = BackupOpt,
    force: bool = ForceOpt,
    yes: bool = YesOpt,
    json_: bool = JsonOpt,
    geometry: Geometry = None,
    jobs: int = typer.Option(1, "-j", "--jobs", min=0, help="Processes (0: one per core) parsing the commitlog, whole "
                             "segments each; the index entries are written by this process, in log order. Also for the "
                             "verify after it. Same files and output as -j 1."),
):
    """Rebuild consume queues / ext / index from the commitlog with the broker's dispatch rules.

    Built in a fresh folder beside the store, then swapped in; the old folders go to the backup
    folder (undo with `rmqstore restore`). Exit 4 if a broker holds the lock.
    """
    from rmqstore_cli.engine.repair.apply import locked_backup

    st = open_store(store, geometry, command=f"rebuild {what}", writes=True,
                    enableConsumeQueueExt=ext, mappedFileSizeConsumeQueueExt=ext_file_size)
    out = Output(json_)
    if what == "timer":
        from .rebuild_timer import rebuild_timer

        raise typer.Exit(rebuild_timer(st, out, dry_run=dry_run, backup_dir=backup_dir, force=force, yes=yes, json_=json_))
    guard_lock(st, force, yes)
    from rmqstore_cli.engine.parallel import default_jobs
    from rmqstore_cli.engine.repair.outcome import assess_rebuild
    from rmqstore_cli.engine.repair.rebuild import PARTS, rebuilt_parts

    jobs = jobs or default_jobs()
    parts = rebuilt_parts(st, what) if what in PARTS else []
    if dry_run:
        verdict = assess_rebuild(st, parts, topic)
        st.close()
        raise typer.Exit(print_rebuild_plan(out, what, parts, topic, from_offset, verdict, root=st.root))
    # Applied, no verify runs before: rebuild changes neither the commitlog nor the folders it was not
    # asked to rebuild, so the findings it keeps on purpose are the ones verify after apply sorts as
    # kept (assess_rebuild on that verify); a first verify would only predict the same list.
    from rmqstore_cli.engine.repair.backup import Backup
    from rmqstore_cli.engine.repair.rebuild import rebuild as engine_rebuild

    from .offsets_cmd import queue_bounds_now

    backup = Backup.create(st.root, backup_dir, "rebuild", {"what": what, "topic": topic, "fromOffset": from_offset})
    with locked_backup(st.root, backup, force), st:
        bounds_before = queue_bounds_now(st)  # for the consumers' side
        res = engine_rebuild(st, what, topic=topic, from_offset=from_offset, backup=backup, jobs=jobs, keep_columns=True)
    columns = res.pop("_columns")  # what the rebuild's walk kept for verify after, or None
    try:
        _report_and_verify(st, out, json_, res, backup, bounds_before, parts, topic, jobs, columns)
    finally:
        if columns is not None:
            columns.remove()


def _report_and_verify(st, out: Output, json_: bool, res: dict, backup, bounds_before, parts: list, topic, jobs: int,
                       columns) -> None:
    """The rebuild's result, then verify after it (fed what the rebuild's walk kept); exits with the contract's code."""
    from .offsets_cmd import print_consumer_impact, rebuild_impact

    if json_:
        out.line({"type": "rebuild", "backup": backup.dir, **res})
    stderr.print(f"rmqstore: rebuilt {', '.join(res['rebuilt']) or 'nothing'} from {res['records']} records "
                 f"({res['cqUnits']} units, {res['indexEntries']} index entries); old files in {backup.dir}", markup=False)
    print_consumer_impact(out, rebuild_impact(st.root, st.config, bounds_before))
    if not json_:
        for p in res.get("problems", [])[:20]:
            say_line(f"  {p['severity']} {p['code']} at {p['offset']}: {p['message']}", st.root)
        if res.get("checkpoint"):
            say_line(f"  checkpoint: {', '.join(f'{k} = {v}' for k, v in res['checkpoint'].items())}")
    result = verify_after(st.root, st.config, jobs, spill=columns)
    kept = kept_after_rebuild(st.root, parts, topic, result.findings)
    if not json_:
        for k in kept[:10]:
            say_line(f"  KEPT {k['code']} {k.get('path') or ''}@{k.get('offset')}: {k['why']}", st.root)
    else:
        out.line({"type": "rebuild-findings", "keptFindings": kept})
    raise typer.Exit(report_verify(result, st.root, out, json_, kept))


def kept_after_rebuild(root: str, parts: list, topic, findings) -> list:
    """The findings of verify after apply that rebuild keeps on purpose (the commitlog, folders it did not
    rebuild); a finding in what it rebuilt is not among them, so judge exits 1 on it."""
    from rmqstore_cli.engine.repair.outcome import sort_rebuild_findings

    return sort_rebuild_findings(root, parts, topic, findings)["kept"]


def print_rebuild_plan(out: Output, what: str, parts: list, topic, from_offset, verdict: dict, root: str | None = None) -> int:
    """``rebuild --dry-run``: the contract's plan (exit 0 only when nothing is damaged)."""
    empty = not verdict["fixed"] and not verdict["kept"]
    code = 0 if empty else 1
    if out.as_json:
        out.line({"type": "rebuild-plan", "what": what, "parts": parts, "topic": topic, "fromOffset": from_offset,
                  "empty": empty, "fixedFindings": verdict["fixed"], "keptFindings": verdict["kept"],
                  "exitCode": code, "expectedApplyExitCode": 0})
        return code
    say = lambda s: say_line(s, root)  # noqa: E731
    say(f"rebuild {what}: would regenerate {', '.join(parts) or 'nothing'}"
        + (f" (topic {topic})" if topic else "") + (f" from {from_offset}" if from_offset is not None else ""))
    if verdict["fixed"]:
        say(f"  fixes {len(verdict['fixed'])} finding(s): {', '.join(sorted({f['code'] for f in verdict['fixed']}))}")
    for k in verdict["kept"][:10]:
        say(f"  KEPT {k['code']} {k.get('path') or ''}@{k.get('offset')}: {k['why']}")
    if empty:
        say("  nothing to repair: the folders to rebuild are verify-clean (a rebuild would write the same content)")
    return code


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.command("rebuild", rich_help_panel=panel)(rebuild)
