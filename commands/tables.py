"""Tables drawn for people: the text rich would print, built directly where that is exact (rich spends ~1 ms
a row), and tables fitted to a narrow terminal. :mod:`.output` decides which console and when."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from rich.console import Console

# The width of the stdout console when stdout is not a terminal (LazyConsole's width_when_piped).
PIPED_WIDTH = 200


def _ascii_cell(text: str) -> bool:
    """Printable ASCII rich shows as it is in a cell (one column per character, nothing to reshape)."""
    return text.isascii() and text.isprintable() and not text[-1:].isspace()


def plain_kv(title: str | None, rows: list[tuple[str, str]]) -> str | None:
    """The text rich prints for a two-column table (:meth:`.output.Output.kv`) on a piped console of
    PIPED_WIDTH, built directly (without importing rich), or None when rich must draw it: a table wider
    than the console, non-ASCII or control characters, a title rich would read as markup or emoji codes."""
    if not rows:
        return None
    if not all(_ascii_cell(k) and _ascii_cell(v) for k, v in rows):
        return None
    widths = [max(len(r[j]) for r in rows) + 2 for j in (0, 1)]
    table_width = sum(widths) + 3
    if table_width > PIPED_WIDTH:
        return None
    out = []
    if title:
        if not _ascii_cell(title) or "[" in title or ":" in title or len(title) > table_width:
            return None
        excess = table_width - len(title)
        out.append(" " * (excess // 2) + title + " " * (excess - excess // 2))
    out.append("┌" + "┬".join("─" * w for w in widths) + "┐")
    for k, v in rows:
        out.append(f"│ {k.ljust(widths[0] - 2)} │ {v.ljust(widths[1] - 2)} │")
    out.append("└" + "┴".join("─" * w for w in widths) + "┘")
    out.append("")
    return "\n".join(out)


# Columns cut at 48 characters in the dump tables (they hold store data of any length).
WIDE_COLUMNS = {"topic", "propertiesRaw", "properties", "msgId", "message", "path", "bodyText", "keys", "body"}

_NOT_PLAIN = re.compile(r"[\x00-\x1f\x7f]|\s$")


def is_markup(text: str) -> bool:
    """rich reads this cell as markup (a tag or an escaped bracket), not as plain text."""
    if "[" not in text:
        return False
    from rich.markup import RE_TAGS

    return RE_TAGS.search(text) is not None or "\\[" in text


def plain_table(con, title: str | None, columns: Sequence[tuple[str, str]], cells: list[list[str]],
                capped=WIDE_COLUMNS) -> str | None:
    """The text rich prints on console ``con`` for :meth:`.output.Output.table`'s table, built directly (rich
    spends ~1 ms per row), or None when rich must draw it: a terminal (styles), no rows, a table wider than
    the console (rich then shrinks columns), a title that would wrap, cells with markup
    tags, control characters or trailing whitespace (rich reshapes those)."""
    from rich._emoji_replace import _emoji_replace
    from rich.cells import cell_len

    if not cells or con.is_terminal or con.color_system is not None or not con.encoding.lower().startswith("utf"):
        return None
    heads = [h for _, h in columns]
    if any(_NOT_PLAIN.search(c) or is_markup(c) for c in heads):
        return None
    widths = []
    for j, (key, header) in enumerate(columns):
        col = [row[j] for row in cells]
        if any(_NOT_PLAIN.search(c) or is_markup(c) for c in col if c):
            return None
        if any(":" in c for c in col):  # rich replaces :emoji: codes in cells
            col = [_emoji_replace(c) if ":" in c else c for c in col]
            for row, c in zip(cells, col):
                row[j] = c
        w = max(cell_len(header), max(map(cell_len, col))) + 2
        if key in capped:
            w = min(w, 48 + 2)
        widths.append(w)
    table_width = sum(widths) + len(widths) + 1
    if table_width > con.width:
        return None
    out = []
    if title:
        title = _emoji_replace(title) if ":" in title else title
        if _NOT_PLAIN.search(title) or is_markup(title) or cell_len(title) > table_width:
            return None
        excess = table_width - cell_len(title)
        out.append(" " * (excess // 2) + title + " " * (excess - excess // 2))
    out.append("┏" + "┳".join("━" * w for w in widths) + "┓")
    out.append("┃" + "┃".join(_fit(h, w) for h, w in zip(heads, widths)) + "┃")
    out.append("┡" + "╇".join("━" * w for w in widths) + "┩")
    inner = [w - 2 for w in widths]
    for row in cells:
        parts = []
        for c, w in zip(row, inner):
            if len(c) <= w and c.isascii():
                parts.append(" " + c + " " * (w - len(c)) + " ")
            else:
                parts.append(_fit(c, w + 2))
        out.append("│" + "│".join(parts) + "│")
    out.append("└" + "┴".join("─" * w for w in widths) + "┘")
    out.append("")
    return "\n".join(out)


# Wide columns a reader copies whole (never shortened to fit a terminal; still capped at 48).
WHOLE_COLUMNS = {"msgId"}
# The narrowest a wrapping or shrinking column gets before a table turns into a list.
WRAP_MIN = 16
# Cells up to this wide stay whole when the other flexible columns can still have their minimum.
SHORT_WHOLE = 40


def _width(text: str) -> int:
    from rich.cells import cell_len

    return max(map(cell_len, text.split("\n"))) if "\n" in text else cell_len(text)


def _natural(columns: Sequence[tuple[str, str]], cells: list[list[str]], capped) -> list[int]:
    """Each column's width without padding as rich measures it (wide store-data columns capped at 48)."""
    out = []
    for j, (key, header) in enumerate(columns):
        w = max([_width(header)] + [_width(r[j]) for r in cells])
        out.append(min(w, 48) if key in capped else w)
    return out


def fits(con: Console, columns: Sequence[tuple[str, str]], cells: list[list[str]]) -> bool:
    """The table fits the console with every column at its natural width (rich then shrinks nothing)."""
    return sum(_natural(columns, cells, WIDE_COLUMNS)) + 3 * len(columns) + 1 <= con.width


def _fit_widths(natural: list[int], headers: list[int], flexible: list[bool], width: int) -> list[int] | None:
    """Column widths (without padding) for a table of ``width`` columns: the fixed columns keep their
    natural width, the flexible ones share the rest (none below WRAP_MIN or its header), or None when
    that does not fit."""
    room = width - (3 * len(natural) + 1) - sum(n for n, f in zip(natural, flexible) if not f)
    flex = sorted((n, j) for j, (n, f) in enumerate(zip(natural, flexible)) if f)
    if room < sum(max(headers[j], min(n, WRAP_MIN)) for n, j in flex):
        return None
    out = list(natural)
    mins = [max(headers[j], min(n, WRAP_MIN)) for n, j in flex]
    for i, (n, j) in enumerate(flex):  # narrowest first: what one does not need goes to the others
        share = max(room // (len(flex) - i), min(n, SHORT_WHOLE))  # a short cell (a file name) stays whole
        out[j] = max(mins[i], min(n, share, room - sum(mins[i + 1:])))
        room -= out[j]
    return out


def print_fitted(con: Console, title: str | None, columns: Sequence[tuple[str, str]], cells: list[list[str]],
                  wrap: set[str]) -> None:
    """A table in which no column is squeezed below its header or its content: the ``wrap`` columns
    wrap their text (nothing cut); without them, wide store-data columns (WIDE_COLUMNS: topic,
    properties, msgId...) are shortened with an ellipsis, down to WRAP_MIN. On a terminal too narrow
    for that, each row is printed as a list of ``header value`` lines."""
    headers = [_width(h) for _, h in columns]
    natural = _natural(columns, cells, () if wrap else WIDE_COLUMNS)
    flexible = [(k in wrap) if wrap else (k in WIDE_COLUMNS and k not in WHOLE_COLUMNS) for k, _ in columns]
    from rich.table import Table
    from rich.text import Text

    widths = _fit_widths(natural, headers, flexible, con.width)
    if widths is None:
        if title:
            con.print(Text(title, style="italic"))
        for row in cells:
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True, style="bold")
            grid.add_column(overflow="fold")
            for (_, h), c in zip(columns, row):
                grid.add_row(Text(h), Text(c))
            con.print(grid)
            con.print()
        return
    folded = bool(wrap) and any(w < n for w, n in zip(widths, natural))
    t = Table(title=title, show_lines=folded, header_style="bold")
    for (k, header), w, flex in zip(columns, widths, flexible):
        if flex and not wrap:
            t.add_column(header, width=w, no_wrap=True, overflow="ellipsis")
        else:
            t.add_column(header, width=w, no_wrap=not flex, overflow="fold")
    for row in cells:
        t.add_row(*(Text(c) for c in row))
    con.print(t)


def _fit(text: str, width: int) -> str:
    """One padded cell of ``width`` columns: rich's ellipsis overflow and left justification."""
    from rich.cells import cell_len, set_cell_size

    inner = width - 2
    if cell_len(text) > inner:
        text = set_cell_size(text, inner - 1) + "…"
    return " " + set_cell_size(text, inner) + " "
