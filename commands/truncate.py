"""``rmqstore truncate STORE --offset PHY``: cut the commitlog at a record boundary and cascade."""

from __future__ import annotations

from typing import Optional

import typer

from rmqstore_cli.engine.errors import StoreCorruptError, UsageError
from rmqstore_cli.engine.repair.recovery import plan_truncate

from .common import Geometry, JsonOpt, StoreArg, geometry_options, guard_lock, open_store
from .offsets_cmd import plan_impact, print_consumer_impact
from .output import Output, handle_errors
from .recover import (BackupOpt, DryRunOpt, ForceOpt, YesOpt, apply_and_verify, assess, finish_without_actions,
                      jobs_of, print_plan)

JobsOpt = typer.Option(1, "-j", "--jobs", min=0, help="Processes (0: one per core). Each walks whole commitlog "
                       "segments: the check of consume queues and index against the log, verify before and after, and "
                       "the re-dispatch's parsing (its writes stay in one process, in log order). Same plan, output, "
                       "files and exit code as -j 1.")


@handle_errors
@geometry_options
def truncate(
    store: str = StoreArg,
    offset: Optional[int] = typer.Option(None, "--offset", help="Physical offset to cut at: the start of a record (or the end of the data); on a DLedger store a message's offset or its entry's pos."),
    index: Optional[int] = typer.Option(None, "--index", help="DLedger store: the first entry index to remove."),
    dry_run: bool = DryRunOpt,
    backup_dir: Optional[str] = BackupOpt,
    force: bool = ForceOpt,
    yes: bool = YesOpt,
    json_: bool = JsonOpt,
    jobs: int = JobsOpt,
    geometry: Geometry = None,
):
    """Cut the commitlog at a record boundary; consume queues, ext and index follow (as the broker truncates dirty files).

    Everything cut goes to a backup folder first (undo with `rmqstore restore`). A non-boundary
    offset is refused with the nearest boundaries. Exit 4 if a broker holds the lock.
    """
    if (offset is None) == (index is None):
        raise UsageError("give --offset or --index (one of them)")
    jobs = jobs_of(jobs)
    st = open_store(store, geometry, command="truncate", writes=True)
    out = Output(json_)
    guard_lock(st, force, yes)
    if st.abort_exists:
        st.close()
        raise StoreCorruptError(f"store {st.root} was not shut down cleanly (abort file present); run `rmqstore recover` first")
    if st.is_dledger:
        from rmqstore_cli.engine.repair.dledgerrepair import entry_index_at, plan_dledger_recovery

        try:
            at = index if index is not None else entry_index_at(st, offset)
            plan = plan_dledger_recovery(st, truncate_at=at)
        except BaseException:
            st.close()
            raise
        print_plan(out, plan, f"truncate {st.root} at entry {at}")
    else:
        if index is not None:
            st.close()
            raise UsageError("--index is for DLedger stores (entry index); give --offset")
        plan = plan_truncate(st, offset, geometry.broker_version, jobs)
        assess(st, plan, jobs)
        print_plan(out, plan, f"truncate {st.root} at {offset}")
        print_consumer_impact(out, plan_impact(st, plan))  # the consumers' side
    if dry_run:
        st.close()
        raise typer.Exit(plan.exit_code)
    if not plan.actions:
        st.close()
        raise typer.Exit(finish_without_actions(plan, out, json_, "truncate"))
    raise typer.Exit(apply_and_verify(st, plan, out, backup_dir=backup_dir, force=force, command="truncate", json_=json_,
                                     jobs=jobs))


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.command("truncate", rich_help_panel=panel)(truncate)
