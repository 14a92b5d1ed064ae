"""The JSON dialect of the broker's ``config/*.json`` files (fastjson 1.2.x, FORMAT.md §15): text <-> values.

fastjson writes map keys that are not strings without quotes (``{0:123,1:456}``) and map keys that are
whole objects as objects (``{{"queueId":0,"topic":"T"}:5}``); Python's ``json`` rejects both. The parser
here accepts what fastjson's own reader accepts by default as well: single-quoted strings and bare
identifier keys. Values map to Python as JSON does, except keys: a bare integer key becomes an ``int``,
an object key an :class:`ObjectKey`.

The writer reproduces ``JSON.toJSONString(obj, prettyFormat=true)`` as ConfigManager.persist calls it (checked
against fastjson 1.2.76 / 1.2.83, the versions of broker 4.9.3 / 5.3.3: JavaBeanSerializer, MapSerializer,
JSONSerializer.println; SortField is a default feature, MapSortField is not):
tab indentation; a line break before every string key (bean fields and string-keyed maps alike) and
before the closing brace of a non-empty object; non-string keys written bare with no line break; no
space after ``:``; no trailing newline. Bean fields come out in the order of the dict given (fastjson
sorts them alphabetically: build dicts in that order). A ``List`` (ListSerializer) puts each element on
its own line; any other ``Collection`` (a ``Set``: CollectionCodec) is written on one line
(``["a","b"]``): pass those as :class:`JavaSet`.

No files, no printing: bytes/str in, values out (and back).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

__all__ = ["ObjectKey", "JavaSet", "FastjsonError", "loads", "dumps", "position_of"]


class JavaSet(list):
    """A Java ``Set`` (any non-``List`` collection) to write: fastjson's CollectionCodec puts it on one line,
    in the order given (the set's own iteration order)."""


@dataclass(frozen=True)
class ObjectKey:
    """A map key that is an object (fastjson writes a bean key as an object); hashable, kept in its text form."""

    text: str  # compact standard-JSON rendering of the key object: its identity and its display form
    value: dict = field(compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return self.text


class FastjsonError(ValueError):
    """The text does not parse; ``pos`` is the character offset where parsing failed."""

    def __init__(self, message: str, text: str, pos: int):
        self.pos = pos
        self.line, self.column = position_of(text, pos)
        self.reason = message
        super().__init__(f"{message} at line {self.line} column {self.column} (character {pos})")


def position_of(text: str, pos: int) -> tuple[int, int]:
    """1-based (line, column) of character offset ``pos``."""
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return line, col


_WS = " \t\r\n\f\b"
_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
            "v": "\v", "0": "\0"}
_IDENT_START = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_$%")
_IDENT_PART = _IDENT_START | set("0123456789-|@.")


MAX_DEPTH = 256  # config files nest 4 deep; deeper is damage, refused before Python's recursion limit


class _Parser:
    def __init__(self, text: str):
        self.s = text
        self.n = len(text)
        self.i = 0
        self.depth = 0

    def fail(self, msg: str, pos: int | None = None):
        raise FastjsonError(msg, self.s, self.i if pos is None else pos)

    def ws(self) -> None:
        s, n, i = self.s, self.n, self.i
        while i < n and s[i] in _WS:
            i += 1
        self.i = i

    def peek(self) -> str:
        self.ws()
        if self.i >= self.n:
            self.fail("unexpected end of text (the file is cut off)")
        return self.s[self.i]

    def value(self):
        c = self.peek()
        if c in "{[":
            if self.depth >= MAX_DEPTH:
                self.fail(f"nested more than {MAX_DEPTH} levels deep")
            self.depth += 1
            try:
                return self.obj() if c == "{" else self.arr()
            finally:
                self.depth -= 1
        if c in "\"'":
            return self.string()
        if c == "-" or c.isdigit():
            return self.number()
        for word, val in (("true", True), ("false", False), ("null", None)):
            if self.s.startswith(word, self.i):
                self.i += len(word)
                return val
        self.fail(f"unexpected character {c!r}")

    def obj(self) -> dict:
        self.i += 1  # {
        out: dict = {}
        with self._keeping(out):
            if self.peek() == "}":
                self.i += 1
                return out
            while True:
                key = self.key()
                if self.peek() != ":":
                    self.fail(f"expected ':' after key {key!r}")
                self.i += 1
                v = self._member(out, lambda partial: out.__setitem__(key, partial))
                c = self.peek()
                if c not in ",}":
                    self.fail(f"expected ',' or '}}' after the value of key {key!r}")
                out[key] = v
                self.i += 1
                if c == "}":
                    return out
                if self.peek() == "}":  # fastjson accepts a trailing comma
                    self.i += 1
                    return out

    def key(self):
        c = self.peek()
        if c in "\"'":
            return self.string()
        if c == "-" or c.isdigit():
            return self.number()
        if c == "{":
            if self.depth >= MAX_DEPTH:
                self.fail(f"nested more than {MAX_DEPTH} levels deep")
            self.depth += 1
            try:
                v = self.obj()
            finally:
                self.depth -= 1
            return ObjectKey(_compact(v), v)
        if c in _IDENT_START:
            start = self.i
            while self.i < self.n and self.s[self.i] in _IDENT_PART:
                self.i += 1
            return self.s[start:self.i]
        self.fail(f"unexpected character {c!r} where a key should start")

    def arr(self) -> list:
        self.i += 1
        out: list = []
        with self._keeping(out):
            if self.peek() == "]":
                self.i += 1
                return out
            while True:
                v = self._member(out, out.append)
                c = self.peek()
                if c not in ",]":
                    self.fail("expected ',' or ']' in an array")
                out.append(v)
                self.i += 1
                if c == "]":
                    return out
                if self.peek() == "]":  # a trailing comma
                    self.i += 1
                    return out

    def _keeping(self, out):
        """Context of one object or array: a strict parse keeps nothing when it fails."""
        return nullcontext()

    def _member(self, out, keep):
        """The value of one member; ``keep(partial)`` is how :class:`_PartialParser` keeps a cut one."""
        return self.value()

    def string(self) -> str:
        s, n = self.s, self.n
        quote = s[self.i]
        start = self.i
        i = self.i + 1
        parts = []
        run = i
        while True:
            if i >= n:
                self.fail("unterminated string (the file is cut off)", start)
            c = s[i]
            if c == quote:
                parts.append(s[run:i])
                self.i = i + 1
                return "".join(parts)
            if c == "\\":
                parts.append(s[run:i])
                if i + 1 >= n:
                    self.fail("unterminated string (the file is cut off)", start)
                e = s[i + 1]
                if e == "u":
                    h = s[i + 2:i + 6]
                    if len(h) != 4 or any(x not in "0123456789abcdefABCDEF" for x in h):
                        self.fail("bad \\u escape", i)
                    parts.append(chr(int(h, 16)))
                    i += 6
                elif e == "x":
                    h = s[i + 2:i + 4]
                    if len(h) != 2 or any(x not in "0123456789abcdefABCDEF" for x in h):
                        self.fail("bad \\x escape", i)
                    parts.append(chr(int(h, 16)))
                    i += 4
                elif e in _ESCAPES:
                    parts.append(_ESCAPES[e])
                    i += 2
                else:
                    self.fail(f"bad escape \\{e}", i)
                run = i
                continue
            i += 1

    def number(self):
        s, n = self.s, self.n
        start = i = self.i
        if i < n and s[i] == "-":
            i += 1
        d0 = i
        while i < n and s[i].isdigit():
            i += 1
        if i == d0:
            self.fail("a number needs digits", start)
        is_float = False
        if i < n and s[i] == ".":
            is_float = True
            i += 1
            while i < n and s[i].isdigit():
                i += 1
        if i < n and s[i] in "eE":
            is_float = True
            i += 1
            if i < n and s[i] in "+-":
                i += 1
            while i < n and s[i].isdigit():
                i += 1
        text = s[start:i]
        if i < n and s[i] in "LSBFD":  # fastjson's type suffixes (WriteClassName output)
            is_float = is_float or s[i] in "FD"
            i += 1
        self.i = i
        try:
            return float(text) if is_float else int(text)
        except ValueError:
            self.fail(f"bad number {text!r}", start)


def loads(text: str | bytes):
    """Parse fastjson output (bare int keys, object keys, single quotes tolerated); the whole text must be one value.

    Raises :class:`FastjsonError` (a ``ValueError``) with the position of the first problem.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FastjsonError("not UTF-8 text", bytes(text)[:e.start].decode("utf-8", "replace"), e.start) from None
    p = _Parser(text)
    p.ws()
    if p.i >= p.n:
        p.fail("empty text (only whitespace)")
    v = p.value()
    p.ws()
    if p.i < p.n:
        p.fail(f"unexpected {text[p.i]!r} after the end of the value")
    return v


def byte_offset(text: str, pos: int) -> int:
    """Character offset -> byte offset in the UTF-8 encoding of ``text``."""
    return len(text[:pos].encode("utf-8"))


# --- writing ---------------------------------------------------------------------------------------


def _escape(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F:
            out.append({"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, "\\u%04x" % o))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _scalar(v) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return _escape(v)
    raise TypeError(f"cannot write {type(v).__name__} as fastjson")


def _write(v, indent: int, out: list) -> None:
    if isinstance(v, dict):
        out.append("{")
        inner = indent + 1
        first = True
        for k, x in v.items():
            if not first:
                out.append(",")
            first = False
            if isinstance(k, str):
                out.append("\n" + "\t" * inner)
                out.append(_escape(k))
            elif isinstance(k, ObjectKey):
                _write(k.value, inner, out)
            elif isinstance(k, bool) or not isinstance(k, int):
                raise TypeError(f"unsupported map key {k!r}")
            else:
                out.append(str(k))
            out.append(":")
            _write(x, inner, out)
        if v:
            out.append("\n" + "\t" * indent)
        out.append("}")
    elif isinstance(v, JavaSet):
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _write(x, indent, out)
        out.append("]")
    elif isinstance(v, (list, tuple)):
        if not v:
            out.append("[]")
            return
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            out.append("\n" + "\t" * (indent + 1))
            _write(x, indent + 1, out)
        out.append("\n" + "\t" * indent + "]")
    else:
        out.append(_scalar(v))


def dumps(value) -> str:
    """``value`` as fastjson's pretty format writes it (the bytes ConfigManager.persist puts on disk, as text)."""
    out: list[str] = []
    _write(value, 0, out)
    return "".join(out)


def _compact(v) -> str:
    """Standard compact JSON of a parsed value (object keys in their text form) — for ObjectKey identity."""
    if isinstance(v, dict):
        return "{" + ",".join(f"{_escape(str(k)) if not isinstance(k, ObjectKey) else _escape(k.text)}:{_compact(x)}"
                              for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_compact(x) for x in v) + "]"
    return _scalar(v)


def to_standard(v):
    """A parsed value made standard-JSON-ready: every map key a string (ints in decimal, object keys as their text)."""
    if isinstance(v, dict):
        return {(k if isinstance(k, str) else str(k)): to_standard(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_standard(x) for x in v]
    return v


class _Incomplete(Exception):
    def __init__(self, partial):
        self.partial = partial


class _PartialParser(_Parser):
    """Keeps what was complete before the first error: an object or array keeps its entries whose value was
    followed by ',' or the closing bracket (the last value before a cut may itself be cut: ``12`` of ``1234``),
    and an unfinished inner object or array that holds complete entries."""

    @contextmanager
    def _keeping(self, out):
        try:
            yield
        except FastjsonError:
            raise _Incomplete(out) from None

    def _member(self, out, keep):
        try:
            return self.value()
        except _Incomplete as inc:
            if inc.partial:
                keep(inc.partial)
            raise _Incomplete(out) from None


def loads_partial(text: str):
    """``(value, complete)``: the whole value when the text parses, else what was complete before the first
    error (None when not even the outer object started)."""
    try:
        return loads(text), True
    except FastjsonError:
        pass
    p = _PartialParser(text)
    p.ws()
    if p.i >= p.n or p.s[p.i] not in "{[":
        return None, False
    try:
        return p.value(), False
    except _Incomplete as inc:
        return inc.partial, False
    except FastjsonError:
        return None, False


def as_long(v) -> int | None:
    """A Java long as fastjson reads one (a number, or a numeric string)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -(1 << 63) <= v < (1 << 63) else None
    if isinstance(v, str):
        try:
            return as_long(int(v.strip()))
        except ValueError:
            return None
    return None
