"""Piped tables are drawn by commands.output._plain_table, not rich (rich spends ~1 ms a row):
the text must be exactly what rich prints for the same table, else rich must draw it."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from rmqstore_cli.commands import output
from rmqstore_cli.commands.output import WIDE_COLUMNS, _cell, _plain_table

from .conftest import REPO, shared_store


def rich_text(title, columns, rows) -> str:
    con = Console(file=io.StringIO(), soft_wrap=False, highlight=False, width=200)
    t = Table(title=title, show_lines=False, header_style="bold")
    for k, header in columns:
        t.add_column(header, overflow="ellipsis", no_wrap=True, max_width=48 if k in WIDE_COLUMNS else None)
    for r in rows:
        t.add_row(*[_cell(r.get(k)) for k, _ in columns])
    con.print(t)
    return con.file.getvalue()


def plain_text(title, columns, rows):
    return _plain_table(title, columns, [[_cell(r.get(k)) for k, _ in columns] for r in rows])


CELL = st.lists(st.sampled_from(list("ab 09:_-.") + ["漢", "é", "e\u0301", "\u200b", ":smile:", "[", "[b]", "\x01", "\t",
                                                    "😀", "ﬁ", "x" * 30]), max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(CELL, CELL, CELL), min_size=1, max_size=6), st.sampled_from([None, "t", "a title: [x]",
                                                                                      "long title " * 6]))
def test_random_cells_equal_rich_or_fall_back(rows, title):
    columns = [("topic", "topic"), ("n", "n"), ("x", "a header")]
    dict_rows = [dict(zip(("topic", "n", "x"), r)) for r in rows]
    got = plain_text(title, columns, dict_rows)
    if got is not None:
        assert got == rich_text(title, columns, dict_rows)


def test_plain_cells_take_the_fast_path():
    rows = [{"a": i, "b": "x" * (i % 70), "topic": "t" * i, "c": None, "d": {"ip": "::1", "port": 3}} for i in range(80)]
    cols = [("a", "a"), ("b", "b"), ("topic", "topic"), ("c", "c"), ("d", "host")]
    got = plain_text("title", cols, rows)
    assert got is not None and got == rich_text("title", cols, rows)
    too_wide = [("b", "b%d" % i) for i in range(5)]  # 5 x 71 columns: rich shrinks them
    assert plain_text(None, too_wide, rows) is None


def _cli(*args) -> bytes:
    p = subprocess.run([sys.executable, "-m", "rmqstore_cli", *args], capture_output=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("args,columns,title", [
    (["dump", "index", "{s}", "--entries"], "ENTRY_COLUMNS", "index files of {s}"),
    (["dump", "index", "{s}"], "INDEX_COLUMNS", "index files of {s}"),
    (["dump", "consumequeue", "{s}"], "CQ_COLUMNS", "consume queues of {s}"),
    # (with --body text, binary bodies hold "[/..." which rich reads as a bad closing tag: that
    # table fails the same way with or without the plain renderer)
    (["dump", "commitlog", "{s}"], "MSG_COLUMNS", "commitlog of {s}"),
])
@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-v2topic", "4.9.3-ext"])
def test_cli_tables_are_what_rich_prints(name, args, columns, title, monkeypatch, capsys):
    from rmqstore_cli.commands import dump

    s = str(shared_store(name))
    args = [a.format(s=s) for a in args]
    rows = [json.loads(line) for line in _cli(*args, "--json").splitlines()]
    cols = getattr(dump, columns)
    monkeypatch.setattr(output, "_plain_table", lambda *a: None)  # the rich path, in process
    capsys.readouterr()
    output.Output(False).table(iter(rows), cols, title=title.format(s=s))
    want = capsys.readouterr().out
    assert _cli(*args).decode() == want


PLAIN_CELL = st.lists(st.sampled_from(["a", "b", " ", ":", "[", "]", "漢", "é", "e\u0301", "\u200b", "😀", ":smile:",
                                       ":+1:", "x" * 30]), max_size=10).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(PLAIN_CELL, PLAIN_CELL), min_size=1, max_size=5), st.sampled_from([None, "t", "漢 title"]))
def test_wide_characters_emoji_and_ellipsis_equal_rich(rows, title):
    columns = [("topic", "topic"), ("x", "x")]
    dict_rows = [dict(zip(("topic", "x"), r)) for r in rows]
    got = plain_text(title, columns, dict_rows)
    cells = [c for r in rows for c in r]
    if not any(c.endswith(" ") or output._is_markup(c) for c in cells) and sum(map(len, cells)) < 60:
        assert got is not None  # only trailing spaces, tags and over-wide tables go to rich here
    if got is not None:
        assert got == rich_text(title, columns, dict_rows)


def test_cells_that_look_like_markup_are_printed_as_text(capsys):
    """Binary bodies rendered as text can contain "[/..." (once a MarkupError, exit 2)."""
    from rmqstore_cli.commands.output import Output

    rows = [{"a": "[/bold] closing tag", "b": "[red]x[/red]" + "\x07" * 3}]
    Output(False).table(rows, [("a", "a"), ("b", "b")], title="t")
    out = capsys.readouterr().out
    assert "[/bold] closing tag" in out and "[red]x[/red]" in out


def test_a_long_wrapped_table_prints_every_row(capsys):
    """A plan or findings table (wrapped columns) of thousands of rows: the first FITTED_ROWS laid out as a table,
    every other row on a line of its own, none left out (rich took ~2 ms a row: a plan over 100,000 queues took
    minutes to print)."""
    n = output.FITTED_ROWS + 57
    rows = [{"action": "zero_tail", "path": f"/s/consumequeue/T{i:05d}/0/00000000000000000000", "offset": 280 + i,
             "why": f"queue {i}: bytes after the last valid unit zeroed " + "so they cannot reappear " * 3}
            for i in range(n)]
    cols = [("action", "action"), ("path", "file"), ("offset", "offset"), ("why", "why")]
    capsys.readouterr()
    assert output.Output(False).table(rows, cols, title="actions", root="/s", wrap=("path", "why")) == n
    out = capsys.readouterr().out
    for i in range(n):
        assert f"T{i:05d}/0/" in out, i
    lines = out.splitlines()
    head = next(k for k, line in enumerate(lines) if line.startswith(f"… {n - output.FITTED_ROWS} more, one per line"))
    assert all(f"T{i:05d}/0/" not in "".join(lines[head:]) for i in range(output.FITTED_ROWS))
    rest = lines[head + 1:]
    assert rest == [f"zero_tail | consumequeue/T{i:05d}/0/00000000000000000000 | {280 + i} | {rows[i]['why']}"
                    for i in range(output.FITTED_ROWS, n)]
