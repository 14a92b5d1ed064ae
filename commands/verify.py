"""``rmqstore verify STORE``: every check of FORMAT.md, as findings (codes: docs/findings.md)."""

from __future__ import annotations


import typer

from rmqstore_cli.engine.config.offsets import add_config_audit
from rmqstore_cli.engine.parallel import default_jobs
from rmqstore_cli.engine.verify.pipeline import verify_store_jobs

from .common import Geometry, JsonOpt, StoreArg, geometry_options, open_store
from .output import Output, handle_errors, progress, prose, stderr

COLUMNS = [("severity", "severity"), ("code", "code"), ("path", "file"), ("offset", "offset"), ("message", "what")]


@handle_errors
@geometry_options
def verify(
    store: str = StoreArg,
    no_crc: bool = typer.Option(False, "--no-crc", help="Skip body / __CRC32# checks (faster; the broker checks them on recovery)."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
    jobs: int = typer.Option(1, "-j", "--jobs", min=0, help="Worker processes (0: one per core). Each takes whole commitlog "
                             "segments and runs the walk and every per-window cross-check on them; this process merges "
                             "their results in log order. Same output as -j 1."),
):
    """Check the commitlog, consume queues, ext, index and checkpoint against each other (read-only).

    Exit 0: no error or warning (info findings allowed); 1: findings; 2: unreadable store; 3: usage.
    """
    st = open_store(store, geometry, command="verify")
    with st, progress("verifying commitlog", sum(s.size for s in st.commitlog.segments)) as advance:
        # with -j the workers' per-segment results stream in, each merged as it arrives
        result = verify_store_jobs(st, jobs or default_jobs(), check_crc=not no_crc, progress=advance)
        add_config_audit(st, result)  # config/*.json and consumer offsets
    out = Output(json_)
    rows = [f.as_json() for f in result.findings]
    if json_:
        out.lines(rows)
    elif rows:
        shown = [dict(r, message=prose(r["message"], st.root)) for r in rows]
        out.table(shown, COLUMNS, title=f"verify {st.root}", root=st.root, wrap=("path", "message"))
    c = result.summary["findings"]
    cl = result.summary["commitlog"]
    stderr.print(f"rmqstore: verify: {cl['records']} records in {cl['files']} commitlog files; "
                 f"{c['error']} errors, {c['warning']} warnings, {c['info']} info", markup=False, highlight=False)
    raise typer.Exit(result.exit_code)


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.command("verify", rich_help_panel=panel)(verify)
