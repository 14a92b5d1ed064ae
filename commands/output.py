"""The one output helper every command uses: rich tables on a terminal, JSON Lines with --json.

Also owns error reporting: every engine error becomes one line on stderr and its exit code.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
from typing import Callable, Iterable, Sequence

import typer

from rmqstore_cli.engine.errors import EXIT_CORRUPT, EXIT_USAGE, RmqStoreError

from . import tables
from .tables import PIPED_WIDTH, WIDE_COLUMNS, is_markup as _is_markup, print_fitted as _print_fitted  # noqa: F401

class LazyConsole:
    """A rich Console made on first use: rich's import (~30 ms) is paid only by a run that prints
    through it (``--json`` output and silent runs never do).

    The stderr console (soft wrap) also prints a plain line itself when rich would print exactly its
    text: stderr is not a terminal (nor forced to be one by FORCE_COLOR / TTY_COMPATIBLE), the line
    is printable text rich leaves as it is (no control or tab characters, no ``:name:`` emoji code,
    no markup bracket unless markup is off) and nothing but markup/highlight/soft_wrap is asked for.
    So `verify`'s summary or a plan's lines piped to a file do not import rich."""

    def __init__(self, plain_lines: bool = False, **options):
        self._options = options
        self._console = None
        self._plain_lines = plain_lines

    def __getattr__(self, name):
        if self._console is None:
            from rich.console import Console

            options = self._options
            if options.pop("width_when_piped", None) and not sys.stdout.isatty():
                options["width"] = 200
            self._console = Console(**options)
        return getattr(self._console, name)

    def print(self, *objects, **kwargs):
        if self._plain_lines and len(objects) == 1 and _plain_line(objects[0], kwargs):
            stream = sys.stderr
            try:
                stream.write(objects[0] + "\n")
                stream.flush()
            except BrokenPipeError:  # what rich's Console.on_broken_pipe does
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise SystemExit(1) from None
            return None
        return self.__getattr__("print")(*objects, **kwargs)


_EMOJI_CODE = re.compile(r":\S*:")  # what rich's emoji replacement could match


def _plain_line(text, kwargs: dict) -> bool:
    """rich's stderr console would print ``text`` plus a newline, nothing changed (see LazyConsole)."""
    if type(text) is not str or not set(kwargs) <= {"markup", "highlight", "soft_wrap"}:
        return False
    if kwargs.get("highlight", False) or not kwargs.get("soft_wrap", True):
        return False
    if kwargs.get("markup", True) and "[" in text:
        return False
    if not text.isprintable() or _EMOJI_CODE.search(text):
        return False
    if "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ:
        return False
    stream = sys.stderr
    try:
        if stream is None or stream.isatty() or (getattr(stream, "encoding", "") or "").lower().replace("-", "") != "utf8":
            return False
    except ValueError:  # closed
        return False
    return True


# Piped tables get a generous width instead of rich's 80-column default; cells ellipsize.
stdout = LazyConsole(soft_wrap=False, highlight=False, width_when_piped=True)
stderr = LazyConsole(plain_lines=True, stderr=True, highlight=False, soft_wrap=True)


def _default(o):
    if isinstance(o, (bytes, bytearray, memoryview)):
        return bytes(o).hex()
    if isinstance(o, set):
        return sorted(o)
    if hasattr(o, "as_json"):
        return o.as_json()
    if hasattr(o, "item"):
        return o.item()  # numpy scalars
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def json_line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False, default=_default, separators=(",", ":"))


class Output:
    """Render records as a table (terminal) or JSON Lines (``--json``)."""

    def __init__(self, as_json: bool):
        self.as_json = as_json
        self._write = sys.stdout.write

    def line(self, obj: dict) -> None:
        self._write(json_line(obj) + "\n")

    def lines(self, objs: Iterable[dict]) -> int:
        n = 0
        write = self._write
        for o in objs:
            write(json_line(o) + "\n")
            n += 1
        return n

    def write_encoded(self, data: bytes) -> None:
        """JSON Lines already encoded as UTF-8 (formats.jsonl), written as they are."""
        out = sys.stdout
        buffer = getattr(out, "buffer", None)
        if buffer is not None and (getattr(out, "encoding", "") or "").lower().replace("-", "") == "utf8":
            out.flush()
            buffer.write(data)
        else:  # line by line, as lines() writes: an unencodable character fails on its own line
            write = self._write
            for line in data.decode("utf-8").split("\n")[:-1]:
                write(line + "\n")

    def table(self, rows: Iterable[dict], columns: Sequence[tuple[str, str]], title: str | None = None,
              limit_note: str | None = None, *, root: str | None = None, wrap: Sequence[str] = ()) -> int:
        """Rows as a rich table, or as JSON Lines when --json (then every key of the row is printed).

        ``root``: ``path`` cells are shown relative to this store root (JSON keeps them absolute).
        ``wrap``: the columns whose text wraps instead of being cut (plans and findings); such a table
        keeps every other column at its full width, and becomes a list when the terminal is too narrow."""
        if self.as_json:
            return self.lines(rows)
        cells = [[_time_cell(r.get(k)) if k in TIME_FIELDS else _cell(r.get(k)) for k, _ in columns] for r in rows]
        if root is not None:
            keys = [k for k, _ in columns]
            if "path" in keys:
                j = keys.index("path")
                for row in cells:
                    row[j] = relative(row[j], root)
        n = len(cells)
        text = _plain_table(title, columns, cells, () if wrap else WIDE_COLUMNS)
        if text is not None:
            sys.stdout.write(text)
            if limit_note:
                stderr.print(limit_note)
            return n
        if wrap or not tables.fits(stdout, columns, cells):
            shown = cells[:FITTED_ROWS] if wrap else cells  # a plan's or findings' rows; a dump's stay a table
            _print_fitted(stdout, title, columns, shown, set(wrap))
            if len(shown) < n:  # rich lays a wrapped row out in ~2 ms: a plan over 100,000 queues took minutes
                stdout.print(f"… {n - FITTED_ROWS} more, one per line ({' | '.join(h for _, h in columns)}; --json: "
                             "each as a JSON object):", markup=False, highlight=False, soft_wrap=True)
                sys.stdout.flush()
                sys.stdout.write("".join(" | ".join(row) + "\n" for row in cells[FITTED_ROWS:]))
            if limit_note:
                stderr.print(limit_note)
            return n
        from rich.table import Table
        from rich.text import Text

        t = Table(title=title, show_lines=False, header_style="bold")
        for k, header in columns:
            wide = k in WIDE_COLUMNS
            t.add_column(header, overflow="ellipsis", no_wrap=True, max_width=48 if wide else None)
        for row in cells:
            t.add_row(*(Text(c) for c in row))  # plain text: store data like "[/x]" is not markup
        stdout.print(t)
        if limit_note:
            stderr.print(limit_note)
        return n

    def kv(self, obj: dict, title: str | None = None) -> None:
        """One object: a two-column table, or one JSON line."""
        if self.as_json:
            self.line(obj)
            return
        rows = [(str(k), _time_cell(v) if k in TIME_FIELDS else _cell(v)) for k, v in obj.items()]
        text = _plain_kv(title, rows)
        if text is not None:
            sys.stdout.write(text)
            return
        from rich.table import Table
        from rich.text import Text

        t = Table(title=title, show_header=False)
        t.add_column("field", style="bold")
        t.add_column("value", overflow="fold")
        for k, v in rows:
            t.add_row(Text(k), Text(v))
        stdout.print(t)


def _stdout_piped() -> bool:
    """The stdout console (``stdout`` above) would draw for a file or pipe: no terminal, so no styles,
    the piped width, UTF-8. Decided without making the console (rich's import, ~20 ms)."""
    if "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ:
        return False
    con = stdout._console if isinstance(stdout, LazyConsole) else stdout
    if con is not None:  # made already (or a console put in its place): ask it
        return not con.is_terminal and con.color_system is None and con.width == PIPED_WIDTH and \
            con.encoding.lower().replace("-", "") == "utf8"
    out = sys.stdout
    try:
        if out is None or out.isatty():
            return False
    except ValueError:  # closed
        return False
    return (getattr(out, "encoding", "") or "").lower().replace("-", "") == "utf8"


def _plain_kv(title: str | None, rows: list[tuple[str, str]]) -> str | None:
    """:meth:`Output.kv`'s table as rich prints it on a piped stdout, or None (:func:`.tables.plain_kv`)."""
    return tables.plain_kv(title, rows) if _stdout_piped() else None


FITTED_ROWS = 200  # rows of a wrapped table laid out as a table; the rest are printed one per line


def _plain_table(title: str | None, columns: Sequence[tuple[str, str]], cells: list[list[str]],
                 capped=WIDE_COLUMNS) -> str | None:
    """:meth:`Output.table`'s table as rich prints it on stdout, or None (:func:`.tables.plain_table`)."""
    return tables.plain_table(stdout, title, columns, cells, capped)


def relative(path: str, root: str | None) -> str:
    """A path inside the store root as ``commitlog/00000000000001703936``; others as they are."""
    if not path or not root:
        return path
    base = root.rstrip(os.sep) + os.sep
    return path[len(base):] if path.startswith(base) else path


# An epoch-millisecond number in prose: 12-13 digits after a word naming a time (not an offset).
_EPOCH_MS = re.compile(r"(?<![\w])(\d{12,13})(?![\w])")
_TIME_WORD = re.compile(r"(?i)time|stamp")
_NOT_TIME_WORD = re.compile(r"(?i)offset|bytes|\bat\b|size|position|\bunit")


def prose(text: str, root: str | None = None) -> str:
    """A line of a plan or report for the terminal: store paths relative to ``root`` and epoch
    milliseconds named as times (``store time 1795315520405``) in ISO-8601, as the tables show them."""
    if root:
        base = root.rstrip(os.sep) + os.sep
        text = text.replace(base, "")
    out, last, was_time = [], 0, False
    for m in _EPOCH_MS.finditer(text):
        before = text[last:m.start()]
        clause = re.split(r"[;()\[\]]", before)[-1]
        if before.strip() in ("..", "-", "to", "and"):
            is_time = was_time  # the other end of a range
        else:
            is_time = bool(_TIME_WORD.search(clause)) and not _NOT_TIME_WORD.search(clause.split(",")[-1])
        out.append(before)
        out.append(iso_ms(int(m.group(1))) if is_time else m.group(1))
        last, was_time = m.end(), is_time
    out.append(text[last:])
    return "".join(out)


def say(text: str, root: str | None = None) -> None:
    """One line of prose on stderr (plans, reports): word-wrapped on a terminal, as it is when piped."""
    line = prose(text, root)
    if isinstance(stderr, LazyConsole) and _plain_line(line, {"markup": False}):  # not a terminal: as it is
        stderr.print(line, markup=False, highlight=False)
        return
    stderr.print(line, markup=False, highlight=False, soft_wrap=not stderr.is_terminal)


# Epoch-millisecond fields shown as local ISO-8601 times in tables (JSON keeps the numbers).
TIME_FIELDS = {
    "storeTimestamp", "bornTimestamp", "beginTimestamp", "endTimestamp", "msgStoreTime", "physicMsgTimestamp",
    "logicsMsgTimestamp", "indexMsgTimestamp", "minTimestamp", "minTimestampIndex", "firstStoreTimestamp",
    "lastStoreTimestamp", "deliverTimeMs", "slotTimeMs", "lastReadTimeMs",
}


def iso_ms(ms) -> str:
    """Epoch milliseconds as ISO-8601 in the local time zone, with milliseconds and the offset."""
    from datetime import datetime

    try:
        return datetime.fromtimestamp(int(ms) / 1000).astimezone().isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _time_cell(v) -> str:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        return _cell(v)  # 0 / -1 mean "not set" in the broker's files: show them as they are
    return iso_ms(v)


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, dict):
        if set(v) >= {"ip", "port"}:
            return f"{v['ip']}:{v['port']}" if ":" not in v["ip"] else f"[{v['ip']}]:{v['port']}"
        return ", ".join(f"{k}={_printable(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(_cell(x) for x in v)
    return _printable(v)


def _printable(v) -> str:
    s = str(v)
    return s.replace("\x01", "␁").replace("\x02", "␂")


def fail(message: str, code: int = EXIT_USAGE) -> None:
    stderr.print(f"rmqstore: {message}", markup=False, highlight=False)
    raise typer.Exit(code)


def warn(message: str) -> None:
    stderr.print(f"rmqstore: warning: {message}", markup=False, highlight=False)


def handle_errors(fn: Callable) -> Callable:
    """Engine errors -> one line + exit code; a broken pipe (``| head``) ends quietly; no tracebacks."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except RmqStoreError as e:
            fail(str(e), e.exit_code)
        except BrokenPipeError:
            with contextlib.suppress(Exception):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(0)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except MemoryError:
            fail("out of memory while reading the store (is a length field corrupt?)", EXIT_CORRUPT)
        except OSError as e:
            from rmqstore_cli.engine.log.openfiles import open_files_error

            e = open_files_error(e.filename, e)
            fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), EXIT_USAGE)
        except Exception as e:  # noqa: BLE001 - the contract is "never a traceback"
            if os.environ.get("RMQSTORE_DEBUG"):
                raise
            fail(f"cannot process the store: {type(e).__name__}: {e} (set RMQSTORE_DEBUG=1 for details)", EXIT_CORRUPT)

    return wrapper


@contextlib.contextmanager
def progress(description: str, total: int | None):
    """A rich progress bar on stderr when it is a terminal; otherwise a no-op advance function."""
    if not sys.stderr.isatty() or total is None:
        yield lambda n=1: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=stderr, transient=True) as p:
        task = p.add_task(description, total=total)
        yield lambda n=1: p.advance(task, n)
