"""The ``rmqstore`` command line: a Typer root that each ``commands`` module registers into."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="rmqstore",
    help="Inspect, verify, append to and repair Apache RocketMQ broker store directories, offline.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _register() -> None:
    from commands import dump

    for module in (dump,):
        module.register(app)
    from commands import get, index_cmd, msgid, stats; [m.register(app) for m in (get, index_cmd, msgid, stats)]  # noqa: E702 lookups (#4)
    from commands import verify; verify.register(app)  # noqa: E702 verify (#2)
    from commands import append; append.register(app)  # noqa: E702 append (#3)
    from commands import recover; recover.register(app)  # noqa: E702 recover/restore (#8)
    from commands import salvage; salvage.register(app)  # noqa: E702 salvage (#8)
    from commands import truncate; truncate.register(app)  # noqa: E702 truncate (#8)
    from commands import rebuild; rebuild.register(app)  # noqa: E702 rebuild (#8)
    from commands import spark_cmd; spark_cmd.register(app)  # noqa: E702 spark (#5)
    from commands import offsets_cmd; offsets_cmd.register(app)  # noqa: E702 consumer offsets, config/*.json (#16)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
