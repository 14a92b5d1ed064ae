"""The ``rmqstore`` command line: a Typer root; every ``commands`` module registers into it from
the one list below, under the help panel it belongs to."""

from __future__ import annotations

import importlib
from typing import Optional

import typer

app = typer.Typer(
    name="rmqstore",
    help="Inspect, verify, append to and repair Apache RocketMQ broker store directories, offline.\n\n"
         "Every read command takes --json (JSON Lines). Exit codes: 0 clean, 1 findings, 2 corruption that "
         "stops the command, 3 usage or environment error, 4 store in use by a broker.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

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


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                           help="Print the version and exit."),
) -> None:
    """Inspect, verify, append to and repair Apache RocketMQ broker store directories, offline."""


def _register() -> None:
    for module, panel in COMMANDS:
        importlib.import_module(f"rmqstore_cli.commands.{module}").register(app, panel)
    app.info.epilog = "Examples:\n\n" + "\n\n".join(f"{panel}: [bold]{ex}[/bold]" for panel, ex in PANEL_EXAMPLES)
    groups = [("", app)] + [(g.name + " ", g.typer_instance) for g in app.registered_groups]
    for prefix, typer_app in groups:
        for cmd in typer_app.registered_commands:
            name = prefix + (cmd.name or cmd.callback.__name__)
            if name in EXAMPLES:
                cmd.epilog = f"Example: [bold]{EXAMPLES[name]}[/bold]"


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
