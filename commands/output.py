"""The one output helper every command uses: rich tables on a terminal, JSON Lines with --json.

Also owns error reporting: every engine error becomes one line on stderr and its exit code.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from typing import Callable, Iterable, Sequence

import typer
from rich.console import Console
from rich.table import Table

from rmqstore_cli.engine.errors import EXIT_CORRUPT, EXIT_USAGE, RmqStoreError

# Piped tables get a generous width instead of rich's 80-column default; cells ellipsize.
stdout = Console(soft_wrap=False, highlight=False, width=None if sys.stdout.isatty() else 200)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


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
        else:
            self._write(data.decode("utf-8"))

    def table(self, rows: Iterable[dict], columns: Sequence[tuple[str, str]], title: str | None = None,
              limit_note: str | None = None) -> int:
        """Rows as a rich table, or as JSON Lines when --json (then every key of the row is printed)."""
        if self.as_json:
            return self.lines(rows)
        t = Table(title=title, show_lines=False, header_style="bold")
        for k, header in columns:
            wide = k in WIDE_COLUMNS
            t.add_column(header, overflow="ellipsis", no_wrap=True, max_width=48 if wide else None)
        n = 0
        for r in rows:
            t.add_row(*[_cell(r.get(k)) for k, _ in columns])
            n += 1
        stdout.print(t)
        if limit_note:
            stderr.print(limit_note)
        return n

    def kv(self, obj: dict, title: str | None = None) -> None:
        """One object: a two-column table, or one JSON line."""
        if self.as_json:
            self.line(obj)
            return
        t = Table(title=title, show_header=False)
        t.add_column("field", style="bold")
        t.add_column("value", overflow="fold")
        for k, v in obj.items():
            t.add_row(str(k), _cell(v))
        stdout.print(t)


WIDE_COLUMNS = {"topic", "propertiesRaw", "properties", "msgId", "message", "path", "bodyText", "keys", "body"}


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
