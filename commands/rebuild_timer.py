"""``rmqstore rebuild timer STORE``: the timer wheel written again from the timerlog (what the broker's
TimerMessageStore.recover does to the slots it re-reads, over the whole timerlog)."""

from __future__ import annotations

from rmqstore_cli.engine.errors import UsageError
from rmqstore_cli.engine.repair.backup import Backup
from rmqstore_cli.engine.repair.timerfix import apply_timer_repair, plan_timer_repair, timer_verdict

from .output import Output, stderr
from .recover import guard_lock, report_verify, verify_after


def rebuild_timer(st, out: Output, *, dry_run: bool, backup_dir, force: bool, yes: bool, json_: bool) -> int:
    """Plan (and unless ``dry_run`` apply, backed up) the wheel's rewrite; the contract's exit code."""
    from rmqstore_cli.engine.repair.apply import locked_backup
    from rmqstore_cli.engine.timer.check import check_timer_store

    guard_lock(st, force, yes)
    with st:
        findings: list = []
        if not check_timer_store(st, findings):
            raise UsageError(f"{st.root} has no timer store (no timerlog/, timerwheel or config/timercheck)")
        rep = plan_timer_repair(st, wheel_only=True)
    root, config = st.root, st.config
    from rmqstore_cli.engine.repair.outcome import entry

    severe = [entry(f, root, "") for f in findings if f.severity in ("error", "warning")]
    verdicts = [(e, *timer_verdict(rep, e, wheel_only=True)) for e in severe]
    fixed = [e for e, v, _ in verdicts if v == "fixed"]
    left = [dict(e, why=why) for e, v, why in verdicts if v != "fixed"]
    say = lambda s: stderr.print(s, markup=False, highlight=False)  # noqa: E731
    actions = rep.actions()
    if json_:
        out.line({"type": "rebuild-plan", "what": "timer", "actions": actions, "fixedFindings": fixed,
                  "leftFindings": left, "empty": rep.empty})
    else:
        say(f"rebuild timer: {len(rep.edits)} wheel slot write(s)" + (", a new timerwheel file" if rep.new_wheel else ""))
        for a in actions[:20]:
            say(f"  {a['action']} {a.get('path', '')}@{a.get('offset', '')}: {a['why']}")
        if fixed:
            say(f"  fixes {len(fixed)} finding(s): {', '.join(sorted({f['code'] for f in fixed}))}")
        for k in left[:10]:
            say(f"  LEFT {k['code']} {k.get('path') or ''}@{k.get('offset')}: {k['why']}")
    stops = [e for e in severe if e["code"] in ("TM_UNIT_SIZE", "TM_UNIT_MAGIC", "TM_NO_BLANK")]
    if stops:  # the walk ends early: a wheel built from it would drop the slots of every later unit
        say(f"rmqstore: rebuild timer: not applied: the timerlog walk stops at {stops[0]['code']} "
            f"{stops[0].get('path') or ''}@{stops[0].get('offset')}; run `rmqstore recover` (it restores or cuts "
            "that unit and writes the wheel)")
        return 1
    if dry_run:
        return 0 if rep.empty and not left else 1
    if rep.empty:
        say("rmqstore: rebuild timer: the wheel already is what the timerlog builds; nothing written")
        return 0 if not left else 1
    backup = Backup.create(root, backup_dir, "rebuild-timer", {"what": "timer"})
    with locked_backup(root, backup, force):
        steps = apply_timer_repair(rep, root, backup)
    if json_:
        out.line({"type": "rebuild", "what": "timer", "backup": backup.dir, "steps": steps})
    say(f"rmqstore: rebuilt the timer wheel ({'; '.join(steps)}); old bytes in {backup.dir} "
        f"(undo with: rmqstore restore {backup.dir})")
    result = verify_after(root, config)
    return report_verify(result, root, out, json_, kept=[], left=left)

