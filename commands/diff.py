"""``rmqstore diff STORE_A STORE_B``: two stores of one broker pair (master/slave, or before/after)."""

from __future__ import annotations

import typer

from rmqstore_cli.engine.parallel import default_jobs
from rmqstore_cli.engine.query.diff import diff_stores

from .common import Geometry, JsonOpt, geometry_options, open_store
from .output import TIME_FIELDS, Output, handle_errors, iso_ms, progress, stdout

QUEUE_COLUMNS = [("topic", "topic"), ("queueId", "q"), ("aMin", "A min"), ("aMax", "A max"), ("bMin", "B min"),
                 ("bMax", "B max"), ("same", "same")]
INDEX_COLUMNS = [("beginPhyOffset", "first offset"), ("aName", "A file"), ("aIndexCount", "A count"),
                 ("bName", "B file"), ("bIndexCount", "B count"), ("state", "state")]
RECORD_COLUMNS = [("side", "side"), ("offset", "offset"), ("storeSize", "size"), ("byteInRecord", "byte"),
                  ("topic", "topic"), ("queueId", "q"), ("queueOffset", "qoff"), ("storeTimestamp", "store time"),
                  ("msgId", "msgId")]


def register(app: typer.Typer, panel: str | None = None) -> None:
    app.command("diff", rich_help_panel=panel)(diff)


@handle_errors
@geometry_options
def diff(
    store_a: str = typer.Argument(..., help="First store (e.g. the master's).", show_default=False),
    store_b: str = typer.Argument(..., help="Second store (e.g. the slave's, or a copy after a repair).",
                                  show_default=False),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
    jobs: int = typer.Option(1, "-j", "--jobs", min=0, help="Worker processes (0: one per core): they walk whole "
                             "commitlog segments to find each log's end, compare the logs' bytes in 64 MiB ranges and "
                             "hash the index files; this process takes the first difference in log order. Same output "
                             "as -j 1."),
):
    """Compare two stores of one broker pair (master/slave, or before/after a repair).

    Reports the first divergent commitlog byte and the record on each side there, how far each log
    reaches, per-queue min/max offsets, index files and checkpoints. Exit 0 identical or one a prefix
    of the other, 1 divergent.
    """
    a = open_store(store_a, geometry, command="diff")
    b = open_store(store_b, geometry, command="diff")
    if a.is_dledger or b.is_dledger:
        with a, b:
            _diff_dledger(a, b, json_)
    with a, b:
        total = sum(s.size for s in a.commitlog.segments)
        with progress("comparing commitlogs", total) as advance:
            d = diff_stores(a, b, advance, jobs=jobs or default_jobs())
    out = Output(json_)
    if json_:
        out.line(d.as_json())
    else:
        _render(out, d)
    raise typer.Exit(1 if d.differs else 0)


def _render(out: Output, d) -> None:
    la, lb = d.logs["a"], d.logs["b"]
    summary = {
        "relation": d.relation,
        "A": f"{d.a}: offsets {la['minOffset']}..{la['maxOffset']} ({la['records']} records, ends: {la['endKind']})",
        "B": f"{d.b}: offsets {lb['minOffset']}..{lb['maxOffset']} ({lb['records']} records, ends: {lb['endKind']})",
        "compared bytes": d.compared_bytes,
    }
    if d.first_divergence is not None:
        summary["first divergent byte"] = d.first_divergence
    if d.longer:
        other = "b" if d.longer == "a" else "a"
        summary["reaches further"] = (f"{d.longer.upper()} by {d.logs[d.longer]['maxOffset'] - d.logs[other]['maxOffset']}"
                                      f" bytes (from {d.logs[other]['maxOffset']})")
    for n in d.notes:
        summary.setdefault("note", n)
    out.kv(summary, title="diff")
    if d.records:
        out.table([dict(r or {}, side=s.upper()) for s, r in d.records.items()], RECORD_COLUMNS,
                  title="records at the first divergent byte")
    changed = [q for q in d.queues if not q["same"]]
    if changed:
        out.table(changed, QUEUE_COLUMNS, title="consume queues that differ")
    else:
        stdout.print(f"consume queues: {len(d.queues)} queues, same min/max on both sides", markup=False)
    odd = [f for f in d.index_files if f["state"] != "same"]
    if odd:
        out.table(odd, INDEX_COLUMNS, title="index files that differ (paired by the first offset they index)")
    stdout.print(f"index files: {len(d.index_files) - len(odd)} the same on both sides, {len(odd)} not", markup=False)
    ca, cb = d.checkpoints["a"], d.checkpoints["b"]
    show = lambda k, v: iso_ms(v) if k in TIME_FIELDS and isinstance(v, int) and v > 0 else v  # noqa: E731
    out.table([{"field": k, "a": show(k, ca.get(k)), "b": show(k, cb.get(k)), "same": ca.get(k) == cb.get(k)}
               for k in sorted(set(ca) | set(cb))],
              [("field", "checkpoint field"), ("a", "A"), ("b", "B"), ("same", "same")], title="checkpoints")


def _diff_dledger(a, b, json_: bool) -> None:
    """Two replicas of one DLedger group, entry by entry (index, term)."""
    from rmqstore_cli.engine.errors import UsageError
    from rmqstore_cli.engine.query.dledgerdiff import diff_replicas

    if not (a.is_dledger and b.is_dledger):
        raise UsageError("diff compares a DLedger store only with another DLedger store (a replica of its group)")
    d = diff_replicas(a, b)
    out = Output(json_)
    if json_:
        out.line(d.as_json())
        raise typer.Exit(1 if d.differs else 0)
    la, lb = d.logs["a"], d.logs["b"]
    side = lambda s, log: (f"{s}: entries {log['firstIndex']}..{log['lastIndex']} ({log['entries']}), "  # noqa: E731
                           f"last term {log['lastTerm']}, ends at {log['endPos']}")
    summary = {"relation": d.relation, "A": side(d.a, la), "B": side(d.b, lb), "compared entries": d.compared}
    if d.relation == "prefix":
        summary["behind"] = f"{d.behind.upper()} is a prefix of the other, {d.behind_by} entries behind"
    if d.relation == "divergent":
        summary["divergent from"] = (f"entry {d.diverge_at}: term {d.terms_at['a']} on A, {d.terms_at['b']} on B; a leader "
                                     f"from {'A' if d.truncated == 'b' else 'B'} (higher last term, or as high and longer) "
                                     f"would truncate {d.truncated.upper()} from entry {d.diverge_at}")
    if d.relation == "disjoint":
        summary["note"] = "the logs hold different entry indexes at the same place: not replicas of one group"
    if d.damaged_count:
        summary["damaged"] = (f"{d.damaged_count} entries with the same index and term differ in their bytes (first: "
                              f"{', '.join(str(i) for i, _ in d.damaged[:10])}): repair with recover --from-replica")
    out.kv(summary, title="diff (DLedger replicas)")
    raise typer.Exit(1 if d.differs else 0)
