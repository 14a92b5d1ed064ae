"""The ``rmqstore`` command line: a Typer root; every ``commands`` module registers into it from
the one list below, under the help panel it belongs to.

A command run imports only the module of that command (see :class:`LazyRoot`): the others, and the
engine, numba kernels and libraries they pull in, are not loaded. ``--help``, shell completion and an
unknown command's suggestions load every module, so they list every command. ``app`` (what the tests
and scripts/gen_commands_doc.py inspect) is the root with every module registered, built on first use.
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional

import typer
from typer.core import TyperGroup

ROOT_HELP = ("Inspect, verify, append to and repair Apache RocketMQ broker store directories, offline.\n\n"
             "Every read command takes --json (JSON Lines). Exit codes: 0 clean, 1 findings, 2 corruption that "
             "stops the command, 3 usage or environment error, 4 store in use by a broker.")
RICH_MARKUP = "rich"

# (commands module, help panel), in the order --help lists them.
COMMANDS = [
    ("dump", "Inspect"),
    ("stats", "Inspect"),
    ("diff", "Inspect"),
    ("verify", "Check"),
    ("get", "Look up"),
    ("index_cmd", "Look up"),
    ("msgid", "Look up"),
    ("append", "Write"),
    ("recover", "Repair"),
    ("truncate", "Repair"),
    ("rebuild", "Repair"),
    ("salvage", "Repair"),
    ("reclaim", "Repair"),
    ("offsets_cmd", "Repair"),
    ("spark_cmd", "Spark"),
]

# The top-level names each module registers, and the groups other modules add subcommands to
# (offsets_cmd adds `dump offsets` and `dump config`): what a run imports for a command name.
PROVIDES = {
    "dump": ("dump",), "stats": ("stats",), "diff": ("diff",), "verify": ("verify",), "get": ("get",),
    "index_cmd": ("index",), "msgid": ("msgid",), "append": ("append",), "recover": ("recover", "restore"),
    "truncate": ("truncate",), "rebuild": ("rebuild",), "salvage": ("salvage",), "reclaim": ("reclaim",),
    "offsets_cmd": ("offsets", "repair"), "spark_cmd": ("spark",),
}
ADDS_TO = {"dump": ("offsets_cmd",)}


def modules_for(name: str) -> set[str]:
    """The commands modules that make up the top-level command ``name`` (none: no such command)."""
    return {m for m, names in PROVIDES.items() if name in names} | set(ADDS_TO.get(name, ()))


# One example per command, shown under its --help (kept here, beside the list, so they stay in step).
EXAMPLES = {
    "dump commitlog": "rmqstore dump commitlog /data/store --since 2026-11-24T03:00 --topic Orders --json",
    "dump consumequeue": "rmqstore dump consumequeue /data/store --topic Orders --queue 0 --msg",
    "dump cqext": "rmqstore dump cqext /data/store --topic Orders --limit 20",
    "dump index": "rmqstore dump index /data/store --entries --limit 50",
    "dump checkpoint": "rmqstore dump checkpoint /data/store --json",
    "dump store": "rmqstore dump store /data/store",
    "dump dledger": "rmqstore dump dledger /data/store --index-units --json",
    "dump timer": "rmqstore dump timer /data/store --pending --topic Orders",
    "stats": "rmqstore stats /data/store --since 2026-11-24T00:00 --until 2026-11-24T06:00",
    "diff": "rmqstore diff /data/master/store /data/slave/store",
    "verify": "rmqstore verify /data/store --json > findings.jsonl",
    "get": "rmqstore get /data/store --msg-id 0A0A0A0A00002A9F0000000000000000",
    "index query": "rmqstore index query /data/store --topic Orders --key order-42",
    "msgid decode": "rmqstore msgid decode 0A0A0A0A00002A9F0000000000000000",
    "append": "rmqstore append /data/store --topic Orders --body 'hello' --keys order-42",
    "recover": "rmqstore recover /data/store --dry-run",
    "restore": "rmqstore restore /data/store.rmqstore-backup-20261124T030000",
    "truncate": "rmqstore truncate /data/store --offset 1073741824 --dry-run",
    "rebuild": "rmqstore rebuild all /data/store --yes",
    "reclaim": "rmqstore reclaim /data/store --consumed --move-to /mnt/other/reclaimed",
    "salvage": "rmqstore salvage /data/store --jsonl rescued.jsonl",
    "dump offsets": "rmqstore dump offsets /data/store --group GID_orders",
    "dump config": "rmqstore dump config /data/store --json",
    "offsets set": "rmqstore offsets set /data/store --group GID_orders --topic Orders --to-time 2026-11-24T03:00 --dry-run",
    "repair config": "rmqstore repair config /data/store --dry-run",
    "spark export": "rmqstore spark export /data/store --to /tmp/records.parquet",
    "spark verify": "rmqstore spark verify /data/store --master spark://10.0.0.5:7077",
    "spark rebuild": "rmqstore spark rebuild /data/store --what index --out /tmp/rebuilt",
    "spark stats": "rmqstore spark stats /data/store --json",
}
PANEL_EXAMPLES = [
    ("Inspect", "rmqstore dump commitlog STORE --since 2026-11-24T03:00"),
    ("Check", "rmqstore verify STORE"),
    ("Look up", "rmqstore index query STORE --topic T --key K"),
    ("Write", "rmqstore append STORE --topic T --body hello"),
    ("Repair", "rmqstore recover STORE --dry-run"),
    ("Spark", "rmqstore spark export STORE --to out.parquet"),
]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("rmqstore")
        except PackageNotFoundError:
            v = "unknown (not installed)"
        typer.echo(f"rmqstore {v}")
        raise typer.Exit(0)


def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                           help="Print the version and exit."),
) -> None:
    """Inspect, verify, append to and repair Apache RocketMQ broker store directories, offline."""


def _new_app(cls=None) -> typer.Typer:
    root = typer.Typer(
        name="rmqstore",
        help=ROOT_HELP,
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=RICH_MARKUP,
        context_settings={"help_option_names": ["-h", "--help"]},
        cls=cls,
    )
    root.callback()(_root)
    root.info.epilog = "Examples:\n\n" + "\n\n".join(f"{panel}: [bold]{ex}[/bold]" for panel, ex in PANEL_EXAMPLES)
    return root


def _register(target: typer.Typer, modules) -> typer.Typer:
    """Register ``modules`` (commands module names) into ``target``, in COMMANDS order, with their examples."""
    for module, panel in COMMANDS:
        if module in modules:
            importlib.import_module(f"rmqstore_cli.commands.{module}").register(target, panel)
    groups = [("", target)] + [(g.name + " ", g.typer_instance) for g in target.registered_groups]
    for prefix, typer_app in groups:
        for cmd in typer_app.registered_commands:
            name = prefix + (cmd.name or cmd.callback.__name__)
            if name in EXAMPLES:
                cmd.epilog = f"Example: [bold]{EXAMPLES[name]}[/bold]"
    return target


def _click_commands(modules) -> dict:
    """{name: click command} of what ``modules`` register, built as typer builds the whole root."""
    holder = _register(typer.Typer(rich_markup_mode=RICH_MARKUP, pretty_exceptions_enable=False), modules)
    return typer.main.get_group(holder).commands


class LazyRoot(TyperGroup):
    """The root group of a run: a command's module is imported when that command is looked up."""

    _complete = False

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in self.commands and not self._complete:
            modules = modules_for(cmd_name)
            if modules:
                self.commands.update(_click_commands(modules))
        return self.commands.get(cmd_name)

    def list_commands(self, ctx) -> list[str]:
        self._load_all()
        return super().list_commands(ctx)

    def resolve_command(self, ctx, args):
        if args and not modules_for(args[0]):
            self._load_all()  # an unknown name: its "Did you mean" is drawn from every command
        return super().resolve_command(ctx, args)

    def _load_all(self) -> None:
        if not self._complete:
            self.commands = _click_commands(set(PROVIDES))  # in the order --help lists them
            self._complete = True


_full_app: typer.Typer | None = None


def __getattr__(name: str):
    if name == "app":  # the root with every command registered (what --help shows)
        global _full_app
        if _full_app is None:
            _full_app = _register(_new_app(), set(PROVIDES))
        return _full_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Run the command line (raises SystemExit with the exit code, as any click program)."""
    _new_app(cls=LazyRoot)()


def load_on_first_use(name: str) -> None:
    """Make the standard-library module ``name`` load when something first reads from it (the import
    system's own LazyLoader), not when it is imported. For ``importlib.metadata``: numba imports it at
    its own import for the extension entry points, which only compiling runs (formats/numbastart.py),
    so a command that loads cached kernels would pay its import (~10 ms) for nothing. Anything that
    uses it (``--version``, numba when it compiles) loads it then, unchanged."""
    import importlib.util

    if name in sys.modules:
        return
    parent_name, _, child = name.rpartition(".")
    parent = importlib.import_module(parent_name) if parent_name else None
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if parent is not None:
        setattr(parent, child, module)


def _raise_open_file_limit() -> None:
    """Let this process open as many files as its hard limit allows (the soft limit raised to it), as the JVM
    does for the broker at its start (HotSpot's MaxFDLimit, on by default): the command can then map every file
    the broker itself kept mapped under the same account. Nothing is done where the limits cannot be set."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, OSError, ValueError):
        pass


# young objects allocated before the cyclic collector runs (Python's default: 700). A command's walk makes no reference
# cycles (a whole verify or recover leaves ~600 objects to the collector, from the imports), but a store of tens of
# thousands of queue files keeps hundreds of thousands of objects alive, and every older-generation collection went
# through all of them: 12-14 % of `verify` and 8 % of `recover --dry-run` on 20,000 queue files (docs/benchmarks.md).
COLLECT_AFTER = 10_000


def _fewer_collections() -> None:
    """Run the cyclic garbage collector less often (:data:`COLLECT_AFTER`); the older generations keep their ratios."""
    import gc

    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(COLLECT_AFTER, young), older, oldest)


def run() -> None:
    """The process entry (the ``rmqstore`` script, ``python -m rmqstore_cli``): :func:`main`, then leave
    without the interpreter's teardown. Tearing down the modules a record-reading command loaded (numba,
    llvmlite's JIT-ed code, numpy) takes 0.05-0.15 s after the work is done; the exit handlers still run
    and the standard streams are flushed first. When that cannot be done cleanly (a flush fails, e.g. a
    closed pipe, or a thread is still running) the exit is the ordinary one.

    numpy's OpenBLAS starts a thread per core when numpy is imported (50 ms of a start on a busy 2-core
    machine, more on a big one); nothing here calls BLAS, so one thread is asked for unless the user
    chose a number. The limit on open files is raised to the hard limit, as the broker's JVM raises it: each
    mapped queue file holds one (engine/log/openfiles.py). The cyclic garbage collector runs less often
    (:func:`_fewer_collections`)."""
    import atexit
    import os
    import threading

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    load_on_first_use("importlib.metadata")
    _raise_open_file_limit()
    _fewer_collections()
    try:
        main()
        code = 0
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            raise
        code = e.code or 0
    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":
    run()
