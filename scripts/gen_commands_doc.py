"""Write docs/commands.md from the Typer app: every command, its help, arguments and options.

    python scripts/gen_commands_doc.py          # rewrite docs/commands.md
    python scripts/gen_commands_doc.py --check  # exit 1 if docs/commands.md is not what the app says

Run it after adding or changing a command or an option; tests/test_docs.py fails while the committed
file is out of date.
"""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "commands.md")

HEADER = """# Command reference

Every `rmqstore` command and option, generated from the command line itself by
`scripts/gen_commands_doc.py` (do not edit by hand: run the script after changing a command).
`rmqstore COMMAND --help` prints the same text.

Options every store command takes (geometry: inferred from the files and `broker.conf` when omitted)
are listed with each command. Exit codes: 0 clean, 1 findings, 2 corruption that stops the command,
3 usage or environment error (also: a store layout the command does not support), 4 store in use by a broker.
"""

_MARKUP = re.compile(r"\[/?(bold|italic|b|i|dim|red|green|yellow|cyan)\]")


def _plain(text: str | None) -> str:
    """Help text as Markdown: rich markup tags removed, paragraphs kept."""
    if not text:
        return ""
    text = _MARKUP.sub("", text)
    paras = [" ".join(line.strip() for line in p.splitlines()) for p in re.split(r"\n\s*\n", text.strip())]
    return "\n\n".join(p for p in paras if p)


def _cell(text: str) -> str:
    """Text for one Markdown table cell: pipes escaped, ``<name>`` not read as an HTML tag."""
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


TYPE_NAMES = {"STR": "TEXT", "INT": "INTEGER", "INT RANGE": "INTEGER", "FLOAT": "NUMBER", "BOOL": "BOOLEAN"}


def _default(param) -> str:
    if param.is_flag and not getattr(param, "secondary_opts", None):
        return ""
    d = param.default
    if d is None or d == () or callable(d) or param.required:
        return ""
    if isinstance(d, bool):
        return ("--" if d else "--no-") + param.name.replace("_", "-") if param.secondary_opts else str(d).lower()
    return f"`{d}`"


def _option_row(param) -> str:
    names = ", ".join(f"`{n}`" for n in list(param.opts) + list(param.secondary_opts))
    name = param.type.name.upper()
    kind = "" if param.is_flag else f" {TYPE_NAMES.get(name, name)}"
    return f"| {names}{_cell(kind)} | {_cell(_plain(param.help))} | {_cell(_default(param))} |"


def _commands(cmd, path: list[str]):
    """(path, click command) of every leaf command, in the order --help lists them."""
    if hasattr(cmd, "list_commands"):  # a group (typer's own copy of click, or click)
        ctx = type(cmd).context_class(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, path + [name])
    else:
        yield path, cmd


def render() -> str:
    import typer

    sys.path.insert(0, ROOT)
    from rmqstore_cli.app import app

    root = typer.main.get_command(app)
    leaves = list(_commands(root, []))
    out = [HEADER, "## Contents", ""]
    for path, _ in leaves:
        name = " ".join(path)
        out.append(f"- [`rmqstore {name}`](#rmqstore-{'-'.join(path)})")
    for path, cmd in leaves:
        name = " ".join(path)
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        opts = [p for p in cmd.params if p.param_type_name == "option" and not p.hidden and p.name != "help"]
        usage = " ".join(["rmqstore", name] + [a.human_readable_name.upper() for a in args] + (["[OPTIONS]"] if opts else []))
        out += ["", f"## rmqstore {name}", "", f"`{usage}`", "", _plain(cmd.help)]
        if cmd.epilog:
            out += ["", _plain(cmd.epilog)]
        if args:
            out += ["", "| argument | meaning |", "|---|---|"]
            for a in args:
                help_ = getattr(a, "help", None) or ""
                out.append(f"| `{a.human_readable_name.upper()}` | {_cell(_plain(help_))} |")
        if opts:
            out += ["", "| option | meaning | default |", "|---|---|---|"]
            out += [_option_row(p) for p in opts]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        current = open(OUT, encoding="utf-8").read() if os.path.exists(OUT) else ""
        if current != text:
            print(f"{os.path.relpath(OUT, ROOT)} is out of date: run python scripts/gen_commands_doc.py", file=sys.stderr)
            return 1
        return 0
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(OUT, ROOT)} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
