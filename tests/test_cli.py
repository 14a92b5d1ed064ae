"""The command line as one tool: help panels, an example per command that parses, --version,
shell completion, shared option declarations, times shown as ISO-8601 in tables."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from datetime import datetime

import typer.main

from rmqstore_cli.app import COMMANDS, EXAMPLES, PANEL_EXAMPLES, app

from .conftest import REPO, broker_read, shared_store

CLI = [sys.executable, "-m", "rmqstore_cli"]
PANELS = ["Inspect", "Check", "Look up", "Write", "Repair", "Spark"]


def run(*args):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"})


def _commands():
    """Every leaf command as (name, click command)."""
    root = typer.main.get_command(app)
    out = []
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):  # a group (typer bundles its own click)
            out += [(f"{name} {sub}", c) for sub, c in cmd.commands.items()]
        else:
            out.append((name, cmd))
    return root, out


def test_help_groups_commands_into_panels():
    p = run("--help")
    assert p.returncode == 0
    for panel in PANELS:
        assert re.search(rf"─ {panel} ─", p.stdout), panel
    assert {panel for _, panel in COMMANDS} == set(PANELS)
    for panel, example in PANEL_EXAMPLES:
        assert example in p.stdout


def test_every_command_has_an_example_that_parses():
    root, cmds = _commands()
    assert sorted(EXAMPLES) == sorted(n for n, _ in cmds)
    for name, cmd in cmds:
        argv = shlex.split(EXAMPLES[name])
        assert argv[0] == "rmqstore" and " ".join(argv[1 : 1 + len(name.split())]) == name
        args = argv[1 + len(name.split()):]
        args = args[: args.index(">")] if ">" in args else args  # a shell redirection is not an argument
        cmd.make_context(name, args)  # raises on an unknown option or a missing value
        assert "Example:" in run(*name.split(), "--help").stdout, name


def test_version_and_completion():
    from importlib.metadata import version

    p = run("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"rmqstore {version('rmqstore')}"
    assert "--install-completion" in run("--help").stdout
    # what --install-completion writes, for the shell the command runs in: typer finds it among the process's
    # ancestors, so the command runs as a child of bash (a test runner started without a shell above it has none)
    cmd = " ".join(shlex.quote(a) for a in CLI + ["--show-completion"])
    p = subprocess.run(["bash", "-c", f"{cmd}; exit $?"], capture_output=True, text=True, timeout=60,
                       env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and "complete" in p.stdout, p.stderr


def test_no_spec_section_numbers_in_help():
    _, cmds = _commands()
    for name in [""] + [n for n, _ in cmds]:
        text = run(*name.split(), "--help").stdout
        assert "§" not in text and "FORMAT.md" not in text, name


def test_geometry_options_are_declared_once():
    """Store-geometry options live in commands/common.py only; every store command offers them."""
    for path in (REPO / "commands").glob("*.py"):
        if path.name == "common.py":
            continue
        src = path.read_text()
        assert not re.search(r'"--(commitlog-file-size|cq-file-size|index-slots|index-entries|broker-version)"', src), path
    _, cmds = _commands()
    for name, cmd in cmds:
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        if name not in ("msgid decode", "restore", "diff") and not name.startswith("spark export"):
            assert "--commitlog-file-size" in opts or name in ("dump checkpoint", "append", "dump config",
                                                                "repair config"), name


def test_tables_show_store_times_as_local_iso_with_milliseconds():
    name = "5.3.3-v2topic"
    first = broker_read(name)["clmsg"][0]
    p = run("dump", "commitlog", str(shared_store(name)), "--limit", "1")
    assert p.returncode == 0
    ts = first["msg"]["storeTimestamp"]
    iso = datetime.fromtimestamp(ts / 1000).astimezone().isoformat(timespec="milliseconds")
    assert iso in p.stdout and str(ts) not in p.stdout
    p = run("dump", "commitlog", str(shared_store(name)), "--limit", "1", "--json")
    assert json.loads(p.stdout)["storeTimestamp"] == ts  # JSON keeps epoch ms


def test_no_spec_section_numbers_in_any_message():
    """No string the program can print names a FORMAT.md section (docstrings and comments may)."""
    import ast

    offenders = []
    for pkg in ("commands", "rmqstore_cli", "formats"):
        for path in (REPO / pkg).rglob("*.py"):
            tree = ast.parse(path.read_text())
            docstrings = set()
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                    first = node.body[0]
                    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                        docstrings.add(id(first.value))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                    if "§" in node.value or "FORMAT.md" in node.value:
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value[:60]!r}")
    assert not offenders, "\n".join(offenders)


def test_importing_the_cli_and_engine_does_not_import_numba():
    """numba's import (~0.3 s) is paid only by commands that read records: importing the CLI and the
    engine modules every command loads must not pull in the compiled kernels (a module-level import of
    formats.kernel did, through the index-chain check)."""
    import subprocess
    import sys

    code = ("import sys, rmqstore_cli.app\n"
            "from rmqstore_cli.engine.verify import pipeline as verify; from rmqstore_cli.engine.repair import recovery, rebuild, apply as repair; from rmqstore_cli.engine.derived import dispatch; from rmqstore_cli.engine.query import stats, lookup\n"
            "from formats import propscan, indexchain, fast, checkkernel\n"
            "print(sorted(m for m in ('numba', 'rmqstore_cli.formats.kernel', 'rmqstore_cli.formats.propkernel') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_a_command_start_imports_no_pydantic():
    """typer is held below 0.29 in pyproject: 0.29 coerces each option through pydantic, 0.14 s more at
    every start. A command run (here `verify` on the fixture store) must not import pydantic."""
    import subprocess
    import sys

    code = ("import sys\nfrom rmqstore_cli.app import main\n"
            f"sys.argv = ['rmqstore', 'verify', {str(REPO / 'fixtures' / 'stores' / '4.9.3-clean')!r}, '--json']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
            "print('pydantic' in sys.modules, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.stderr.strip().splitlines()[-1] == "False", p.stderr[-2000:]
