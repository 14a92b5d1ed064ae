"""``rmqstore recover STORE`` (the broker's next start, done safely) and ``rmqstore restore BACKUP``."""

from __future__ import annotations

import functools
from typing import Optional

import typer

from rmqstore_cli.engine.errors import StoreInUseError

from .common import Geometry, JsonOpt, StoreArg, geometry_options, guard_lock, open_store
from .output import Output, handle_errors, prose, say as say_line, stderr

ACTION_COLUMNS = [("action", "action"), ("path", "file"), ("offset", "offset"), ("why", "why")]
BackupOpt = typer.Option(None, "--backup-dir", help="Where removed/overwritten bytes go (default: STORE.rmqstore-backup/<time>-<command>/ beside the store; never inside it).")
DryRunOpt = typer.Option(False, "--dry-run", help="Print the plan only; change nothing. Exit 0 nothing to repair (at most housekeeping the broker does at every start) and nothing damaged, 1 repairs planned or damage found, 2 data would be lost without an explicit choice.")
ForceOpt = typer.Option(False, "--force", help="Go on even if the store's lock file is held (only when you are sure no broker runs); asks for confirmation.")
YesOpt = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation (with --force).")
JobsOpt = typer.Option(1, "-j", "--jobs", min=0, help="Processes (0: one per core). Each walks whole commitlog "
                       "segments: the broker's CRC walk, the check of consume queues and index against the log, "
                       "verify before and after, and the re-dispatch's parsing (its writes stay in one process, in "
                       "log order). Same plan, output, files and exit code as -j 1.")


def jobs_of(jobs: int) -> int:
    """``-j``'s value: 0 is one process per core."""
    from rmqstore_cli.engine.parallel import default_jobs

    return jobs or default_jobs()


def print_plan(out: Output, plan, title: str) -> None:
    if out.as_json:
        out.line(plan.as_json())
        out.line(plan.summary)
        return
    root = plan.root
    say = lambda s: say_line(s, root)  # noqa: E731
    cl = plan.commitlog
    say(f"{title}: broker {plan.summary['version']} rules, {'normal' if plan.last_exit_ok else 'abnormal (abort file present)'} recovery")
    for r in plan.refusals:
        say(f"  REFUSE  {r}")
    if cl.get("dledger"):
        say(f"  DLedger log: {cl['entries']} entries up to index {cl['lastIndex']}, entries end at {cl['endPos']} "
            f"({cl['endReason']}); after the repair: up to index {cl['lastIndexAfter']}")
        if cl["damaged"]:
            say(f"  damaged entries (message fails the CRC-checked parse; the broker serves them anyway): "
                f"{', '.join(str(i) for i in cl['damaged'][:20])}")
    elif cl:
        say(f"  commitlog: walk from {cl['startFile']} ({cl['startReason']}); CRC checked: {cl['checkCRCOnRecover']}")
        say(f"  commitlog: stops at {cl['stopOffset']}: {cl['stopReason']}; recovered end {cl['recoveredEnd']}")
    if plan.salvage:
        s = plan.salvage
        say(f"  after the bad record at {s['badOffset']}: {s['validRecordsAfter']} valid records in "
            f"[{s['firstValidAfter']}, {s['endOfValidAfter']}) -- run `rmqstore salvage` first "
            f"(or --keep-valid-after to copy them into the backup folder before the cut)")
    from .explain_view import startup_lines

    for line in startup_lines(plan.startup_cost or {}):
        say(f"  {line}")
    d = plan.dispatch
    if d:
        say(f"  re-dispatch: broker from {d['brokerFrom']} ({d['brokerRule']}); ours [{d['from']}, {d['to']}): "
            f"{d['records']} records, {d['newConsumeQueueUnits']} new consume-queue units")
    for qr in getattr(plan, "queue_repairs", []):
        br, ours = qr["broker"], qr["ours"]
        say(f"  queue {qr['topic']}/{qr['queueId']}: first bad unit {qr['firstBadOffset']} ({qr['code'] or 'missing'}); "
            f"broker leaves offsets {br['minOffset']}..{br['maxOffset']}"
            + (" keeping the lying unit" if br.get("keepsLyingUnit") else "")
            + f"; we leave {ours['minOffset']}..{ours['maxOffset']}, every unit at its record's queue offset; "
            f"{qr['recordsSaved']} records saved" + (f"; REFUSED past {qr['refused']}" if qr.get("refused") else ""))
    if plan.index_deleted:
        say(f"  index files removed and rebuilt: {', '.join(plan.index_deleted)}")
    for n in plan.notes:
        say(f"  note: {n}")
    for x in plan.data_loss:
        say(f"  DATA LOSS: {x}")
    if any(a.kind == "zero_tail" for a in plan.actions):
        say("  truncated tails are zero-filled (Java leaves the old bytes), so stale records cannot reappear after a later crash")
    for a in plan.actions:
        for t in (a.extra.get("timer") or [])[:20] if a.kind == "timer" else ():
            say(f"  timer: {t['action']} {t.get('path', '')}{'@' + str(t['offset']) if 'offset' in t else ''}: {t['why']}")
    if plan.actions:
        rows = [dict(a.as_json(), why=prose(a.why, root)) for a in plan.actions]
        out.table(rows, ACTION_COLUMNS, title="actions (every byte is copied to the backup first)", root=root,
                  wrap=("path", "why"))
        if plan.empty:
            say("  nothing to repair: only what the broker's next start does itself at every start (housekeeping)")
    elif plan.empty:
        say("  nothing to do: the store is what the broker would have after its own recovery, and verify finds nothing")
    else:
        say("  no action: the store is what the broker would have after its own recovery")
    print_findings(say, plan)
    s = plan.summary
    out.kv({"lastExitOK": s["lastExitOK"], "maxPhyOffset": s["maxPhyOffset"], "minPhyOffset": s["minPhyOffset"],
            "queues": len(s["queues"])}, title="after recovery")


def print_findings(say, plan) -> None:
    """The plan's verdict on verify's findings (engine/repair/outcome.py): what it keeps on purpose and what it leaves."""
    if not plan.assessed:
        return
    if plan.fixed_findings:
        say(f"  fixes {len(plan.fixed_findings)} finding(s) verify reports now")
    for k in plan.kept_findings[:10]:
        say(f"  KEPT {k['code']} {k.get('path') or ''}@{k.get('offset')}: {k['why']}")
    if len(plan.kept_findings) > 10:
        say(f"  KEPT … {len(plan.kept_findings) - 10} more (see --json keptFindings)")
    for k in plan.left_findings[:10]:
        say(f"  NOT REPAIRED {k['code']} {k.get('path') or ''}@{k.get('offset')}: {k['why']}")
    if len(plan.left_findings) > 10:
        say(f"  NOT REPAIRED … {len(plan.left_findings) - 10} more (see --json leftFindings)")
    say(f"  applying this plan exits {plan.expected_exit}"
        + {0: " (verify clean, or only the kept findings left)", 1: " (findings it does not repair remain)",
           2: " (refused: data would be lost)"}.get(plan.expected_exit, ""))


def assess(st, plan, jobs: int = 1) -> None:
    """Run verify now (by ``jobs`` processes; or take the one the planning walk made) and sort its findings
    against the plan (fixed / kept on purpose / left)."""
    from rmqstore_cli.engine.repair.outcome import assess_plan

    assess_plan(st, plan, getattr(plan, "verify_findings", None), jobs)


def apply_and_verify(st, plan, out: Output, *, backup_dir, force: bool, command: str, index_namer=None,
                     json_: bool = False, replan=None, jobs: int = 1) -> int:
    """Backup + apply + verify; returns the exit code.

    ``replan()`` -> (open store, assessed plan): with it, the plan printed is applied only if the store is
    as it was when planning began (``plan.fingerprint``, compared once the lock is held); otherwise the
    store is planned again under the lock, that plan is printed and applied instead (or refused)."""
    from rmqstore_cli.engine.repair.plan import store_fingerprint
    from rmqstore_cli.engine.repair.apply import apply_plan, open_backup, save_lock_file, take_lock

    root, config = st.root, st.config
    st.close()
    backup, resumed = open_backup(root, backup_dir, command, {"version": plan.version, "lastExitOK": plan.last_exit_ok,
                                                                "summary": plan.summary})
    if resumed:
        stderr.print(f"rmqstore: resuming the interrupted {command} journaled in {backup.dir}", markup=False)
    hook = getattr(plan, "salvage_hook", None)
    if hook is not None:
        hook(backup.dir)
    save_lock_file(root, backup)
    lock = take_lock(root, force)
    try:
        if replan is not None and plan.fingerprint is not None and store_fingerprint(root) != plan.fingerprint:
            plan, refused = _plan_again(replan, out, command, root, backup, json_)
            if refused is not None:
                backup.mark("complete")  # nothing applied: not an interrupted run to resume
                return refused
        spill = getattr(plan, "dispatch_spill", None)  # of the plan applied (it may have been planned again)
        if spill is not None:
            spill.keep = True  # read again by verify after the apply, then removed
        res = apply_plan(plan, root, config, backup, index_namer=index_namer, jobs=jobs)
        backup.mark("complete")
    finally:
        if lock is not None:
            lock.release()
    for s in res.steps:
        say_line(f"  {s}", root)
    stderr.print(f"rmqstore: {command} applied; backup and journal in {backup.dir} "
                 f"(undo with: rmqstore restore {backup.dir})", markup=False, highlight=False)
    if json_:
        out.line({"type": "applied", "backup": backup.dir, "steps": res.steps, "dispatch": res.dispatch})
    try:
        code = run_verify(root, config, out, json_, plan.kept_findings, plan.left_findings, jobs, spill)
    finally:
        if spill is not None:
            spill.remove()
    if not plan.commitlog.get("dledger"):
        from .explain_view import print_next_start

        print_next_start(out, root, plan.version, plan.startup_cost, jobs)  # what the broker's next start reads now
    return code


def _plan_again(replan, out: Output, command: str, root: str, backup, json_: bool):
    """The store changed between the printed plan and the lock (a broker ran, another repair, a copy):
    plan it again, print that plan, and pass it through the same gates. Returns (plan, exit code if refused)."""
    stderr.print(f"rmqstore: {root} changed after its plan was made; planned again under the lock",
                 markup=False, highlight=False)
    st, plan = replan()
    try:
        print_plan(out, plan, f"{command} {root} (planned again)")
        if plan.data_loss or not plan.actions:
            from rmqstore_cli.engine.repair.dispatchspill import discard

            discard(plan)  # not applied
        if plan.data_loss and not plan.keep_valid_after:
            stderr.print("rmqstore: not applied: the plan loses data (see DATA LOSS above); run `rmqstore salvage` "
                         "first, or pass --keep-valid-after", markup=False)
            return plan, 2
        if not plan.actions:
            return plan, finish_without_actions(plan, out, json_, command)
        if plan.keep_valid_after and plan.salvage:
            from rmqstore_cli.engine.repair.salvage import salvage_ranges_to_jsonl

            salvage_ranges_to_jsonl(st, plan, backup.dir)
        return plan, None
    finally:
        st.close()


def run_verify(root: str, config, out: Output, json_: bool, kept: list = (), left: list = (), jobs: int = 1,
               spill=None) -> int:
    """verify after apply; exit 0 when clean or when only the findings the plan kept on purpose remain."""
    return report_verify(verify_after(root, config, jobs, spill), root, out, json_, kept, left)


def verify_after(root: str, config, jobs: int = 1, spill=None):
    """verify of the store as the apply left it (opened afresh, with the geometry the command used);
    ``jobs`` > 1 walks the commitlog segments in that many processes, as ``verify -j``. ``spill``: the dispatch
    columns the plan's walk kept (repair/dispatchspill.py), taken for the records the apply left as they were
    instead of running the property pass over them again."""
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store_jobs

    st = Store.open(root, overrides={k: getattr(config, k) for k in (
        "version", "mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue", "mappedFileSizeConsumeQueueExt",
        "enableConsumeQueueExt", "maxHashSlotNum", "maxIndexNum", "dLegerSelfId")})
    with st:
        columns = None
        if spill is not None:
            from rmqstore_cli.engine.repair.dispatchspill import SpilledColumns

            columns = SpilledColumns(spill, st.config.delay_table)
        return verify_store_jobs(st, jobs, columns=columns)


def report_verify(result, root: str, out: Output, json_: bool, kept: list = (), left: list = ()) -> int:
    """Judge and print verify after apply (``result``): the contract's exit code."""
    from rmqstore_cli.engine.repair.outcome import judge

    outcome = judge(list(kept), root, result.findings, list(left))
    bad = [f for f in result.findings if f.severity in ("error", "warning")]
    if json_:
        out.line({"type": "verify", "findings": [f.as_json() for f in bad], "summary": result.summary["findings"],
                  "outcome": outcome.line, "exitCode": outcome.exit_code})
    else:
        c = result.summary["findings"]
        stderr.print(f"rmqstore: verify after apply: {c['error']} errors, {c['warning']} warnings", markup=False)
        for f in [d for d in outcome.unexpected][:20]:
            say_line(f"  {f['severity']} {f['code']} {f.get('path') or ''} {f['message']}", root)
    stderr.print(f"rmqstore: {outcome.line}", markup=False, highlight=False)
    return outcome.exit_code


def finish_without_actions(plan, out: Output, json_: bool, command: str) -> int:
    """Nothing to apply: the exit the plan predicted, said in one line."""
    if plan.empty:
        line = "nothing to apply; verify clean"
    elif not plan.left_findings:
        line = (f"nothing to apply; only the {len(plan.kept_findings)} finding(s) the plan keeps on purpose are in the "
                f"store ({', '.join(sorted({k['code'] for k in plan.kept_findings}))})")
    else:
        line = (f"nothing to apply; {len(plan.left_findings)} finding(s) this plan does not repair remain "
                f"({', '.join(sorted({k['code'] for k in plan.left_findings}))})")
    if json_:
        out.line({"type": "applied", "steps": [], "outcome": line, "exitCode": plan.expected_exit})
    stderr.print(f"rmqstore: {command}: {line}", markup=False, highlight=False)
    return plan.expected_exit


def keeping_mappings(fn):
    """The command's passes over the log share their commitlog mappings (engine/log/segments.kept_mappings):
    recover walks the log four times (the broker's walk, verify before, the re-dispatch, verify after)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from rmqstore_cli.engine.log.segments import kept_mappings

        with kept_mappings():
            return fn(*args, **kwargs)

    return wrapper


@handle_errors
@keeping_mappings
@geometry_options
def recover(
    store: str = StoreArg,
    dry_run: bool = DryRunOpt,
    stop_at_first_error: bool = typer.Option(
        True, "--stop-at-first-error/--keep-valid-after",
        help="--stop-at-first-error (default, the broker's behaviour): the log ends at the first invalid record and "
             "everything after it is cut (the cut bytes go to the backup folder). --keep-valid-after: the valid "
             "records found after the bad one are first written to BACKUP/salvaged.jsonl (dump --json format, "
             "bodies in hex) so they can be appended again; prefer `rmqstore salvage` for a complete copy."),
    backup_dir: Optional[str] = BackupOpt,
    force: bool = ForceOpt,
    yes: bool = YesOpt,
    from_replica: Optional[str] = typer.Option(
        None, "--from-replica", help="DLedger store: another replica of the group (its store root); the damaged "
        "entries are copied from it after checking that index, term, pos and size agree."),
    cut_damaged: bool = typer.Option(
        False, "--cut-damaged", help="DLedger store without a replica: cut the log before the first damaged entry "
        "(it and every later entry are lost; the plan says how many)."),
    json_: bool = JsonOpt,
    jobs: int = JobsOpt,
    geometry: Geometry = None,
):
    """Do what the broker's next start would do (crash or normal recovery), without its data loss.

    Prints the plan, then (unless --dry-run) copies every byte it removes or overwrites into a backup
    folder, applies the plan with fsync, and runs verify. Exit 4 if a broker holds the lock.
    """
    jobs = jobs_of(jobs)

    def make_plan(st=None):
        st = st or open_store(store, geometry, command="recover", writes=True)
        if st.is_dledger:
            return st, _dledger_plan(st, from_replica, cut_damaged)
        if from_replica or cut_damaged:
            from rmqstore_cli.engine.errors import UsageError

            st.close()
            raise UsageError("--from-replica and --cut-damaged are for DLedger stores")
        from rmqstore_cli.engine.repair.recovery import plan_recovery

        plan = plan_recovery(st, geometry.broker_version, keep_valid_after=not stop_at_first_error, with_verify=True,
                             jobs=jobs, spill_dispatch=not dry_run)
        assess(st, plan, jobs)
        return st, plan

    st = open_store(store, geometry, command="recover", writes=True)
    out = Output(json_)
    guard_lock(st, force, yes)
    st, plan = make_plan(st)
    try:
        _print_and_apply(st, plan, out, dry_run, stop_at_first_error, backup_dir, force, json_, jobs, make_plan)
    finally:
        from rmqstore_cli.engine.repair.dispatchspill import discard

        discard(plan)  # the re-dispatch's columns the plan's walk kept (removed by the apply when it read them)


def _print_and_apply(st, plan, out, dry_run: bool, stop_at_first_error: bool, backup_dir, force: bool, json_: bool,
                     jobs: int, make_plan) -> None:
    print_plan(out, plan, f"recover {st.root}")
    if not st.is_dledger:
        from .offsets_cmd import plan_impact, print_consumer_impact

        print_consumer_impact(out, plan_impact(st, plan))  # the consumers' side
    if dry_run:
        st.close()
        raise typer.Exit(max(plan.exit_code, 2 if (st.is_dledger and plan.refusals) else 0))
    if st.is_dledger and plan.refusals:
        st.close()
        stderr.print("rmqstore: not applied: the replica cannot repair this store (see REFUSE above)", markup=False)
        raise typer.Exit(2)
    if plan.data_loss and stop_at_first_error and not plan.keep_valid_after:
        st.close()
        stderr.print("rmqstore: not applied: the plan loses data (see DATA LOSS above); run `rmqstore salvage` first, "
                     "or pass --keep-valid-after", markup=False)
        raise typer.Exit(2)
    if not plan.actions:
        st.close()
        raise typer.Exit(finish_without_actions(plan, out, json_, "recover"))
    if not stop_at_first_error and plan.salvage:
        from rmqstore_cli.engine.repair.salvage import salvage_ranges_to_jsonl

        plan.salvage_hook = lambda bdir: salvage_ranges_to_jsonl(st, plan, bdir)  # type: ignore[attr-defined]
    code = apply_and_verify(st, plan, out, backup_dir=backup_dir, force=force, command="recover", json_=json_,
                            replan=make_plan, jobs=jobs)
    raise typer.Exit(code)


def _dledger_plan(st, from_replica, cut_damaged: bool):
    """recover on a DLedger store: DLedger's recovery and the store's over its log (engine/repair/dledgerrepair.py)."""
    from rmqstore_cli.engine.repair.dledgerrepair import plan_dledger_recovery
    from rmqstore_cli.engine.store import Store

    if from_replica is None:
        return plan_dledger_recovery(st, cut_damaged=cut_damaged)
    with Store.open(from_replica) as rep:
        return plan_dledger_recovery(st, replica=rep, cut_damaged=cut_damaged)


@handle_errors
def restore(
    backup: str = typer.Argument(..., help="A backup folder written by recover/truncate/rebuild, or the folder "
                                            "`reclaim --move-to` moved files into."),
    store: Optional[str] = typer.Option(None, "--store", help="Store root (default: the one the journal names)."),
    json_: bool = JsonOpt,
):
    """Put back every byte a recover/truncate/rebuild removed or overwrote, and every file `reclaim --move-to`
    moved out (journal played in reverse)."""
    import os

    from rmqstore_cli.engine.repair.backup import read_manifest, restore as do_restore
    from rmqstore_cli.engine.store import probe_lock

    entries = read_manifest(backup)
    root = store or (entries[0].get("store") if entries else None)
    if root and os.path.isdir(root) and probe_lock(root).held:
        raise StoreInUseError(f"store {root} is in use: its lock file is held; stop the broker first")
    root, done = do_restore(backup, store)
    out = Output(json_)
    if json_:
        out.line({"type": "restored", "store": root, "steps": done})
    else:
        for s in done:
            stderr.print(f"  {s}", markup=False, highlight=False)
        stderr.print(f"rmqstore: restored {root} from {backup}", markup=False)


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.command("recover", rich_help_panel=panel)(recover)
    app.command("restore", rich_help_panel=panel)(restore)
