"""Plans and findings as a terminal of 80 and 120 columns shows them: every column's header and every
cell's whole text are on the screen (nothing squeezed to nothing, nothing cut), paths are relative to
the store root, and times in the prose are ISO-8601."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from datetime import datetime

import pytest
from rich.console import Console

from rmqstore_cli.commands import output
from rmqstore_cli.commands.output import prose, relative

from .conftest import STORES, broker_read

BORDERS = "│┃|"
SEPARATOR = re.compile(r"^[┏┡├└┌╞╘━─┳╇┼┴┯┷┬┻ ]+[┓┩┤┘┐╡╛]?$")


@pytest.fixture
def utc(monkeypatch):
    """Times print in the local zone: fix it, so the expected ISO strings do not depend on the machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def screen(monkeypatch, width: int) -> io.StringIO:
    """Every console of the commands writes to one buffer, as a terminal of ``width`` columns (no colours)."""
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=True, color_system=None, highlight=False)
    for name, mod in list(sys.modules.items()):
        if name == "rmqstore_cli.commands" or name.startswith("rmqstore_cli.commands."):
            for attr in ("stdout", "stderr"):
                if isinstance(getattr(mod, attr, None), (Console, output.LazyConsole)):
                    monkeypatch.setattr(mod, attr, con)
    return buf


def invoke(args: list[str]) -> int:
    from typer.testing import CliRunner

    from rmqstore_cli.app import app

    return CliRunner().invoke(app, args, catch_exceptions=False).exit_code


def squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def table_cells(text: str, title_word: str) -> tuple[list[str], list[list[str]]] | None:
    """(headers, rows of cells) of the box table under the title containing ``title_word``, each cell's
    wrapped lines joined; None if that table is not drawn as a box (the list form)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if title_word in line)
    i = start + 1
    while i < len(lines) and not lines[i].startswith(("┏", "┌")):
        if lines[i].strip() and not lines[i].startswith(("┏", "┌")) and i > start + 2:
            return None
        i += 1
    if i >= len(lines):
        return None
    blocks: list[list[str]] = []
    current: list[list[str]] | None = None
    headers = None
    body = []
    for line in lines[i + 1:]:
        if line.startswith(("└", "┘")):
            break
        body.append(line)
    row_lines = any(line.startswith("├") for line in body)  # else one line per row (nothing wrapped)
    for line in body:
        if SEPARATOR.match(line) or (headers is not None and not row_lines and current is not None):
            if current is not None:
                if headers is None:
                    headers = ["".join(p) for p in current]
                else:
                    blocks.append(["".join(p) for p in current])
            current = None
            if SEPARATOR.match(line):
                continue
        parts = re.split(r"[│┃]", line)[1:-1]
        if current is None:
            current = [[] for _ in parts]
        for j, p in enumerate(parts):
            current[j].append(p.strip() + " ")
    if current is not None:
        blocks.append(["".join(p) for p in current])
    return headers, blocks


def assert_all_visible(text: str, title_word: str, columns: list[tuple[str, str]], rows: list[dict], width: int):
    assert all(len(line) <= width for line in text.splitlines()), "a line wider than the terminal"
    drawn = table_cells(text, title_word)
    if drawn is None:  # the list form: every header and every whole cell, in order
        body = squash(text[text.index(title_word):])
        pos = 0
        for r in rows:
            for k, h in columns:
                want = squash(h + str(r.get(k) if r.get(k) is not None else ""))
                pos = body.index(want, pos) + len(want)
        return
    headers, cells = drawn
    assert [squash(h) for h in headers] == [squash(h) for _, h in columns]
    assert len(cells) == len(rows)
    for got, r in zip(cells, rows):
        want = [squash(str(r.get(k)) if r.get(k) is not None else "") for k, _ in columns]
        assert [squash(c) for c in got] == want


@pytest.mark.parametrize("width", [80, 120])
def test_recover_plan_fits(width, store_copy, monkeypatch, utc):
    from rmqstore_cli.commands.recover import ACTION_COLUMNS
    from rmqstore_cli.engine.repair.recovery import plan_recovery
    from rmqstore_cli.engine.store import Store

    root = str(store_copy("4.9.3-crash"))
    with Store.open(root) as st:
        plan = plan_recovery(st)
    buf = screen(monkeypatch, width)
    assert invoke(["recover", root, "--dry-run"]) in (0, 1)
    text = buf.getvalue()
    rows = [dict(a.as_json(), path=os.path.relpath(a.path, root) if a.path else None, why=prose(a.why, root)) for a in plan.actions]
    assert rows and any(r["path"] for r in rows)
    assert_all_visible(text, "actions", ACTION_COLUMNS, rows, width)
    assert root + os.sep not in text.replace("\n", ""), "a store path not relative to the root"
    # times in the prose are ISO-8601: the checkpoint's times as a reader sees them
    cp = broker_read("4.9.3-crash")["store"][0]["checkpointBeforeOpen"]
    iso = datetime.fromtimestamp(cp["physicMsgTimestamp"] / 1000).astimezone().isoformat(timespec="milliseconds")
    assert iso in text.replace("\n", "")
    assert str(cp["physicMsgTimestamp"]) not in text.replace("\n", "")


@pytest.mark.parametrize("width", [80, 120])
def test_truncate_plan_fits(width, store_copy, monkeypatch):
    from rmqstore_cli.commands.recover import ACTION_COLUMNS
    from rmqstore_cli.engine.repair.recovery import plan_truncate
    from rmqstore_cli.engine.store import Store

    root = str(store_copy("4.9.3-clean"))
    offsets = sorted(m["offset"] for m in broker_read("4.9.3-clean")["clmsg"])
    cut = offsets[len(offsets) // 2]
    with Store.open(root) as st:
        plan = plan_truncate(st, cut)
    buf = screen(monkeypatch, width)
    assert invoke(["truncate", root, "--offset", str(cut), "--dry-run"]) in (0, 1)
    text = buf.getvalue()
    rows = [dict(a.as_json(), path=os.path.relpath(a.path, root) if a.path else None, why=prose(a.why, root)) for a in plan.actions]
    assert any(r.get("offset") is not None for r in rows), "a truncate plan has actions at an offset"
    assert_all_visible(text, "actions", ACTION_COLUMNS, rows, width)


def garbage_unit(root: str) -> str:
    """A consume-queue unit of garbage (offset far past the log, size 16, tags 0) in the first queue file."""
    qdir = os.path.join(root, "consumequeue")
    topic = sorted(os.listdir(qdir))[0]
    f = os.path.join(qdir, topic, "0", sorted(os.listdir(os.path.join(qdir, topic, "0")))[0])
    with open(f, "r+b") as fh:
        fh.seek(20 * 3)
        fh.write(b"\xff\xff\xff\xff\xff\xff\xff\x00" + (16).to_bytes(4, "big") + bytes(8))
    return f


@pytest.mark.parametrize("width", [80, 120])
def test_verify_findings_fit(width, store_copy, monkeypatch):
    from rmqstore_cli.commands.verify import COLUMNS
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import verify_store

    root = str(store_copy("4.9.3-clean"))
    garbage_unit(root)
    with Store.open(root) as st:
        found = [f.as_json() for f in verify_store(st).findings]
    assert found
    buf = screen(monkeypatch, width)
    assert invoke(["verify", root]) == 1
    rows = [dict(f, path=relative(f["path"], root), message=prose(f["message"], root)) for f in found]
    assert any(r["path"].startswith("consumequeue/") for r in rows)
    assert_all_visible(buf.getvalue(), "verify", COLUMNS, rows, width)


@pytest.mark.parametrize("width", [80, 120])
def test_rebuild_plan_fits(width, store_copy, monkeypatch):
    root = str(store_copy("4.9.3-clean"))
    garbage_unit(root)
    buf = screen(monkeypatch, width)
    assert invoke(["rebuild", "consumequeue", root, "--dry-run"]) == 1
    text = buf.getvalue()
    assert all(len(line) <= width for line in text.splitlines())
    flat = text.replace("\n", " ")
    assert "fixes" in flat and "CQ_" in flat and root + os.sep not in flat


def test_narrow_terminal_prints_a_list(monkeypatch):
    """Columns that cannot wrap and do not fit: each row becomes ``header value`` lines, nothing cut."""
    cols = [("a", "alpha"), ("b", "beta"), ("why", "why")]
    rows = [{"a": "x" * 30, "b": "y" * 30, "why": "a long reason " * 8}]
    buf = screen(monkeypatch, 50)
    output.Output(False).table(rows, cols, title="things", wrap=("why",))
    text = buf.getvalue()
    assert "┏" not in text and all(len(line) <= 50 for line in text.splitlines())
    assert_all_visible(text, "things", cols, rows, 50)


def test_prose_times_and_paths(utc):
    line = ("newest file whose first store time 1795315520405 <= checkpoint physicMsgTimestamp = 1795315520602; "
            "cut at 1795315520405 bytes; store times 1795315520405..1795315520602 in /s/commitlog/00000000000000000000")
    assert prose(line, "/s") == (
        "newest file whose first store time 2026-11-22T02:45:20.405+00:00 <= checkpoint physicMsgTimestamp = "
        "2026-11-22T02:45:20.602+00:00; cut at 1795315520405 bytes; store times 2026-11-22T02:45:20.405+00:00.."
        "2026-11-22T02:45:20.602+00:00 in commitlog/00000000000000000000")
    assert relative("/s/x/y", "/s/") == "x/y" and relative("/other/x", "/s") == "/other/x"


def test_fitting_table_piped_is_what_rich_prints(monkeypatch):
    """A wrapping table that fits is drawn by the plain renderer exactly as rich draws it."""
    cols = [("a", "action"), ("path", "file"), ("why", "why")]
    rows = [{"a": "move", "path": "commitlog/0001", "why": "because " * 5 + "so"}, {"a": "cut", "path": None, "why": "x"}]
    cells = [[output._cell(r.get(k)) for k, _ in cols] for r in rows]
    plain = output._plain_table("t", cols, [list(c) for c in cells], capped=())
    buf = io.StringIO()
    con = Console(file=buf, width=200, soft_wrap=False, highlight=False)
    output._print_fitted(con, "t", cols, cells, {"why"})
    assert plain == buf.getvalue()


@pytest.mark.parametrize("width", [80, 120])
def test_offsets_table_fits(width, store_copy, monkeypatch):
    """A table without wrapping columns (dump offsets): every column at its full width, or a list."""
    from rmqstore_cli.commands.offsets_cmd import OFFSET_COLUMNS

    root = store_copy("4.9.3-clean")
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "consumerOffset.json").write_text(
        (STORES / "config-samples" / "consumerOffset-4.9.3.json").read_text())
    found = [json.loads(line) for line in _cli_json("dump", "offsets", str(root), "--json")
             if json.loads(line).get("type") == "offset"]
    assert len(found) == 5
    buf = screen(monkeypatch, width)
    assert invoke(["dump", "offsets", str(root)]) == 0
    rows = [{k: ("" if r.get(k) is None else str(r[k])) for k, _ in OFFSET_COLUMNS} for r in found]
    assert_all_visible(buf.getvalue(), "consumer offsets", OFFSET_COLUMNS, rows, width)


def _cli_json(*args) -> list[str]:
    import subprocess

    from .conftest import REPO

    p = subprocess.run([sys.executable, "-m", "rmqstore_cli", *args], capture_output=True, cwd=REPO, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()
