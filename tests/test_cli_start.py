"""A command's start loads only what that command uses (what keeps `verify`, `recover --dry-run`,
`rebuild all --dry-run` and `dump commitlog --limit 1 --json` starting fast on a small store). Checked by
the modules a real run has imported when it exits, never by a timing: the other commands' modules, the
libraries only other commands need, the numba kernels it does not call, numba's array module (which
loading a cached kernel imports when the kernel makes an array itself), what only numba's compiling
needs (importlib.metadata, loaded on first use: formats/numbastart.py) and numpy.ma must not be among them;
nor rich, when nothing is printed to a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import REPO

STORE = str(REPO / "fixtures" / "stores" / "4.9.3-clean")

# every commands module, as registered by rmqstore_cli.app.COMMANDS, plus the helpers only some commands use
COMMAND_MODULES = {"dump", "stats", "diff", "verify", "get", "index_cmd", "msgid", "append", "recover", "truncate",
                   "rebuild", "salvage", "reclaim", "offsets_cmd", "spark_cmd", "dump_timer", "dledger_cmd",
                   "explain_view", "cleanup_view", "rebuild_timer"}
KERNEL_MODULES = {"kernel", "checkkernel", "entrykernel", "propkernel", "indexchain", "jsonkernel", "timerkernel",
                  "dledgerkernel", "wordops", "warmup"}
# libraries no start below needs: Spark, Arrow, msgspec, RocksDB bindings, pydantic (typer >= 0.29)
NEVER = ("pyspark", "pyarrow", "msgspec", "rocksdict", "pydantic", "rmqstore_cli.spark", "rich.progress")

# a record-reading start loads cached kernels only: what numba needs to compile, and numpy's masked arrays
# (numba's ndarray typing asks for them), stay unloaded (formats/numbastart.py); importlib.metadata is in
# sys.modules as a module loaded on first use (rmqstore_cli.app.load_on_first_use), its parts only if used
NOT_FOR_CACHED_LOADS = ("numpy.ma", "importlib.metadata._meta", "importlib.metadata._adapters")

# (argv, commands modules it may load, kernel modules it may load, rich allowed: none here, as the
# plain lines and recover's summary table need no rich when stdout/stderr are not terminals)
CASES = {
    "verify": (["verify", STORE], {"verify"}, {"kernel", "checkkernel", "entrykernel", "propkernel", "indexchain", "wordops"}, False),
    "recover": (["recover", STORE, "--dry-run"], {"recover", "explain_view", "offsets_cmd"},
                {"kernel", "checkkernel", "entrykernel", "propkernel", "indexchain", "wordops"}, False),
    "rebuild": (["rebuild", "all", STORE, "--dry-run"], {"rebuild", "recover"},
                {"kernel", "checkkernel", "entrykernel", "propkernel", "indexchain", "wordops"}, False),
    "dump": (["dump", "commitlog", STORE, "--limit", "1", "--json"], {"dump", "dump_timer", "dledger_cmd", "offsets_cmd"},
             {"kernel", "jsonkernel", "wordops"}, False),  # wordops: the span comparison
    "version": (["--version"], set(), set(), False),
}

# The real process entry (rmqstore_cli.app.run, as `python -m rmqstore_cli` and the script): the exit
# handler it runs before leaving writes the imported modules to a file.
PROBE = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "rmqstore"
from rmqstore_cli.app import run
run()
"""


def imported(tmp_path, argv, aot: bool = False) -> tuple[set, subprocess.CompletedProcess]:
    """The modules a run of ``argv`` has imported when it exits; ``aot``: with the ahead-of-time kernels when they
    are built (formats/aot.py), else through numba (RMQSTORE_AOT=0)."""
    out = tmp_path / "modules.json"
    env = dict(os.environ, RMQSTORE_AOT="1" if aot else "0")
    p = subprocess.run([sys.executable, "-c", PROBE, str(out)] + argv, capture_output=True, text=True, cwd=REPO,
                       timeout=300, env=env)
    return set(json.loads(out.read_text())), p


def _under(modules: set, package: str) -> set:
    return {m.split(".")[len(package.split("."))] for m in modules if m.startswith(package + ".")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_command_start_loads_only_what_the_command_uses(tmp_path, case):
    argv, commands, kernels, rich_ok = CASES[case]
    mods, p = imported(tmp_path, argv)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout or p.stderr  # it ran (and printed) before the modules were listed
    assert _under(mods, "rmqstore_cli.commands") & COMMAND_MODULES <= commands, "another command's module"
    assert _under(mods, "rmqstore_cli.formats") & KERNEL_MODULES <= kernels, "a kernel module it does not call"
    assert not [m for m in mods if any(m == n or m.startswith(n + ".") for n in NEVER)]
    assert "numba.np.arrayobj" not in mods  # a kernel that makes its own array makes its cached load import this
    if not rich_ok:
        assert not [m for m in mods if m == "rich" or m.startswith("rich.")]
    if case == "version":
        assert not {"numpy", "numba", "construct"} & mods and not _under(mods, "rmqstore_cli.engine")
        assert p.stdout.startswith("rmqstore ")  # importlib.metadata, loaded on first use, works
    else:
        assert "numba" in mods and kernels & _under(mods, "rmqstore_cli.formats")  # the probe sees a real run
        # recover's plan calls np.unique, which imports numpy.ma itself (numpy 2.x)
        not_loaded = [n for n in NOT_FOR_CACHED_LOADS if not (case == "recover" and n == "numpy.ma")]
        assert not [m for m in mods if any(m == n or m.startswith(n + ".") for n in not_loaded)]
        assert "rmqstore_cli.formats.numbastart" in mods


AOT_EXTENSION = "rmqstore_cli.formats._aotkernels"


@pytest.mark.parametrize("case", sorted(set(CASES) - {"version"}))
def test_with_the_ahead_of_time_kernels_a_start_imports_no_numba(tmp_path, case):
    """verify, recover --dry-run, rebuild all --dry-run and dump --limit 1 on the demo store, with the extension
    built (scripts/setup.sh): its kernels, and neither numba nor llvmlite, nor the numba kernel modules."""
    from rmqstore_cli.formats import aot

    if not aot.loaded():
        pytest.skip("the AOT kernel extension is not built or not current (python -m rmqstore_cli.formats.aotbuild)")
    argv, _, kernels, _ = CASES[case]
    mods, p = imported(tmp_path, argv, aot=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert AOT_EXTENSION in mods  # the probe sees a real run, with the extension's kernels
    assert not [m for m in mods if m.split(".")[0] in ("numba", "llvmlite")]
    assert not {"kernel", "propkernel", "javatext", "jsonkernel", "wordops", "numbastart"} & _under(mods, "rmqstore_cli.formats")
    assert _under(mods, "rmqstore_cli.formats") & KERNEL_MODULES <= kernels


def test_the_probe_sees_what_a_run_imports(tmp_path):
    """The check above can fail: a run that imports other commands' modules is seen doing so."""
    mods, p = imported(tmp_path, ["--help"])  # --help lists every command, so it loads every module
    assert p.returncode == 0
    assert {"verify", "dump", "append", "spark_cmd", "offsets_cmd"} <= _under(mods, "rmqstore_cli.commands")
    mods, p = imported(tmp_path, ["--version"])  # reads the installed version: importlib.metadata loads then
    assert p.returncode == 0 and "importlib.metadata._meta" in mods


def test_every_commands_module_is_known_here():
    """COMMAND_MODULES above names every module of commands/ (a new one is checked too)."""
    files = {f.stem for f in (REPO / "commands").glob("*.py")} - {"__init__", "common", "output", "tables"}
    assert files == COMMAND_MODULES


def _shape(cmd):
    """A command's subcommands (recursively) or its option names: what must not differ between roots."""
    subs = getattr(cmd, "commands", None)
    if subs is not None:
        return {name: _shape(c) for name, c in subs.items()}
    return sorted(o for p in cmd.params for o in getattr(p, "opts", []))


# Each top-level command built from rmqstore_cli.app.modules_for(name) alone, in a forked child that has
# imported no commands module (modules add subcommands to shared groups, so one process would hide a gap).
SHAPES = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from tests.test_cli_start import _shape
from rmqstore_cli.app import PROVIDES, _click_commands, modules_for
out = {}
for name in sorted(set().union(*PROVIDES.values())):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, json.dumps(_shape(_click_commands(modules_for(name))[name])).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out[name] = json.loads(data)
print(json.dumps(out))
"""


def test_the_lazy_root_knows_which_modules_make_each_command():
    """rmqstore_cli.app.modules_for (what a run imports for a command name) gives the whole command: built
    from those modules alone, it has the same subcommands and options as in the root --help lists."""
    import typer.main

    from rmqstore_cli.app import COMMANDS, PROVIDES, app, modules_for

    assert sorted(PROVIDES) == sorted(m for m, _ in COMMANDS)
    assert modules_for("no-such-command") == set()
    full = typer.main.get_command(app).commands
    assert set(full) == set().union(*PROVIDES.values())
    p = subprocess.run([sys.executable, "-c", SHAPES, str(REPO)], capture_output=True, text=True, cwd=REPO,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    alone = json.loads(p.stdout)
    assert alone == {name: json.loads(json.dumps(_shape(cmd))) for name, cmd in full.items()}


def test_plain_lines_on_stderr_are_what_rich_prints(monkeypatch):
    """The stderr console's own plain-line path (commands/output.py LazyConsole) prints exactly what rich's
    Console would, and takes over only lines rich leaves as they are."""
    import io
    import random

    from rich.console import Console

    from rmqstore_cli.commands import output

    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    lines = ["rmqstore: verify: 2080 records in 56 commitlog files; 0 errors, 0 warnings, 0 info", "x" * 300,
             "  lead", "trail  ", "→ … ✓ é 漢字" * 20, "[bold]x[/bold] [/y]", "tab\there", "::1", ":smile: face",
             "bell\x07", "cr\rx", "two\nlines", "", "\x1b[31mred", "zero\u200bwidth", "😀 e\u0301"]
    lines += ["".join(rnd.choice("ab :;[]/\\-_.,09 éü→漢\t") for _ in range(rnd.randint(0, 120))) for _ in range(300)]
    for kwargs in ({"markup": False, "highlight": False}, {}, {"markup": False, "highlight": False, "soft_wrap": True}):
        for line in lines:
            want = io.StringIO()
            try:
                Console(file=want, stderr=True, highlight=False, soft_wrap=True).print(line, **kwargs)
            except Exception as e:  # noqa: BLE001 - e.g. a stray closing tag when markup is on
                want = type(e)
            got = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
            monkeypatch.setattr(sys, "stderr", got)
            console = output.LazyConsole(plain_lines=True, stderr=True, highlight=False, soft_wrap=True)
            try:
                console.print(line, **kwargs)
            except Exception as e:  # noqa: BLE001
                assert want is type(e), (seed, line, kwargs)
                continue
            finally:
                got.flush()
                monkeypatch.undo()
            assert got.buffer.getvalue().decode() == want.getvalue(), (seed, line, kwargs)
    plain = [line for line in lines if output._plain_line(line, {"markup": False})]
    assert lines[0] in plain and "x" * 300 in plain and "::1" not in plain and "tab\there" not in plain


def test_a_piped_key_value_table_is_what_rich_prints(monkeypatch):
    """Output.kv on a piped stdout draws its table itself (commands/output.py _plain_kv): exactly what rich's
    Console would print for it, and it does so for the plain ASCII tables a plan's summary is."""
    import io
    import random

    from rich.console import Console

    from rmqstore_cli.commands import output

    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    alphabet = "ab :;[]/\\-_.,09 éü→漢\t"
    drawn = 0
    for trial in range(400):
        n = rnd.randint(1, 6)
        obj = {("".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 12))) if rnd.random() < 0.3 else
                rnd.choice(["lastExitOK", "maxPhyOffset", "queues", "k"]) + str(i)):
               rnd.choice([True, 3658653, -1, None, "x" * rnd.randint(0, 250), "a b", "ab  ", "",
                           "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 30)))]) for i in range(n)}
        title = rnd.choice([None, "", "after recovery", "x" * 90, "[b]t[/b]", ":smile:", "tab\tt", "é"])
        got = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
        monkeypatch.setattr(sys, "stdout", got)
        monkeypatch.setattr(output, "stdout", output.LazyConsole(soft_wrap=False, highlight=False, width_when_piped=True))
        rows = [(str(k), output._cell(v)) for k, v in obj.items()]
        plain = output._plain_kv(title, rows)
        output.Output(False).kv(obj, title=title)
        got.flush()
        monkeypatch.undo()
        want = io.StringIO()
        Console(file=want, soft_wrap=False, highlight=False, width=output.PIPED_WIDTH).print(
            _rich_kv(obj, title))
        assert got.buffer.getvalue().decode() == want.getvalue(), (seed, trial, obj, title)
        if plain is not None:
            assert plain == want.getvalue(), (seed, trial, obj, title)
            drawn += 1
    assert drawn > 10, seed  # the plain path is taken (~1 in 12 of these), not only rich's
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
    monkeypatch.setattr(output, "stdout", output.LazyConsole(soft_wrap=False, highlight=False, width_when_piped=True))
    assert output._plain_kv("after recovery", [("lastExitOK", "True"), ("queues", "13")])  # recover's summary
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich would style it: rich draws it
    assert output._plain_kv("after recovery", [("lastExitOK", "True"), ("queues", "13")]) is None


def _rich_kv(obj: dict, title):
    """The table Output.kv gives rich (its code before the plain path), built here independently."""
    from rich.table import Table
    from rich.text import Text

    from rmqstore_cli.commands import output

    t = Table(title=title, show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    for k, v in obj.items():
        t.add_row(Text(str(k)), Text(output._cell(v)))
    return t


# Every process of the run (the main one and forked ones: verify -j 1 walks a DLedger log's entries in a background
# process beside the window walk) writes its imported modules when it leaves through os._exit.
PROBE_EVERY_PROCESS = """
import json, os, sys
out = sys.argv.pop(1)
real_exit = os._exit
def leave(code):
    with open(f"{out}-partial-{os.getpid()}", "w") as f:
        f.write(json.dumps(sorted(sys.modules)))
    os.rename(f"{out}-partial-{os.getpid()}", f"{out}.{os.getpid()}")  # whole or absent, should the process be killed
    real_exit(code)
os._exit = leave
sys.argv[0] = "rmqstore"
from rmqstore_cli.app import run
run()
"""


def test_with_the_ahead_of_time_kernels_dledger_verify_imports_no_numba(tmp_path):
    """verify of a broker-written DLedger store (its entry walk, formats.dledgerkernel, routed through formats.aot),
    with the extension built: no process of the run imports numba, llvmlite or the numba kernel module."""
    from rmqstore_cli.formats import aot

    from .conftest import STORES

    if not aot.loaded():
        pytest.skip("the AOT kernel extension is not built or not current (python -m rmqstore_cli.formats.aotbuild)")
    out = tmp_path / "modules"
    env = dict(os.environ, RMQSTORE_AOT="1")
    p = subprocess.run([sys.executable, "-c", PROBE_EVERY_PROCESS, str(out), "verify",
                        str(STORES / "dledger-4.9.3-clean" / "store")], capture_output=True, text=True, cwd=REPO,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "records in" in p.stderr
    runs = [set(json.loads(f.read_text())) for f in tmp_path.glob("modules.*")]
    assert runs and any(AOT_EXTENSION in mods for mods in runs)  # the probe sees the run, with the extension
    assert any("rmqstore_cli.engine.verify.dledger" in mods for mods in runs)  # ...and the DLedger checks
    for mods in runs:
        assert not [m for m in mods if m.split(".")[0] in ("numba", "llvmlite")]
        assert not {"dledgerkernel", "kernel", "propkernel", "javatext", "wordops", "numbastart"} & _under(mods, "rmqstore_cli.formats")


def test_with_the_ahead_of_time_kernels_an_index_rebuild_imports_no_numba(tmp_path):
    """rebuild index on a copy of a broker-written store writes its index entries (formats.indexbuild) through the
    extension: the run imports neither numba nor llvmlite, and the rebuilt files verify clean."""
    from rmqstore_cli.formats import aot

    from .conftest import copy_store

    if not aot.loaded():
        pytest.skip("the AOT kernel extension is not built or not current (python -m rmqstore_cli.formats.aotbuild)")
    root = copy_store("4.9.3-clean", tmp_path / "store")
    argv = ["rebuild", "index", str(root), "--backup-dir", str(tmp_path / "bk")]
    mods, p = imported(tmp_path, argv, aot=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "rmqstore_cli.formats.indexbuild" in mods and AOT_EXTENSION in mods  # the probe sees the index written
    assert not [m for m in mods if m.split(".")[0] in ("numba", "llvmlite")]
    assert not {"kernel", "wordops", "numbastart"} & _under(mods, "rmqstore_cli.formats")
