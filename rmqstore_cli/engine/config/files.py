"""The broker's ``config/*.json`` files, read offline as its ConfigManager loads them (FORMAT.md §15).

Mirrors ``ConfigManager.load``: the main file is used when it is present, not empty and decodes;
otherwise ``FILE.bak`` (``loadBak``): a missing or empty ``.bak`` leaves the manager empty and the broker
starts anyway, a ``.bak`` that does not decode makes ``load`` return false and the broker refuses to
start. Managers: ConsumerOffsetManager (``consumerOffset.json``), ScheduleMessageService
(``delayOffset.json``), TopicConfigManager (``topics.json``), SubscriptionGroupManager
(``subscriptionGroup.json``). Writing goes through :func:`write_config_file` (the broker's persist
sequence, made durable). Read-only unless a write function is called.
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass, field

from rmqstore_cli.formats import fastjson
from rmqstore_cli.formats.fastjson import as_long

from ..errors import UsageError
from ..findings import Finding

CONSUMER_OFFSETS = "consumerOffset.json"
DELAY_OFFSETS = "delayOffset.json"
TOPICS = "topics.json"
GROUPS = "subscriptionGroup.json"
# LmqConsumerOffsetManager (5.x, LMQ groups): lmqOffsetTable {"<lmq queue>@<lmq group>": offset} (queue id 0);
# read by the offsets audit, not (yet) repaired by `repair config`
LMQ_CONSUMER_OFFSETS = "lmqConsumerOffset.json"
CONFIG_FILES = (CONSUMER_OFFSETS, DELAY_OFFSETS, TOPICS, GROUPS)
MANAGER = {CONSUMER_OFFSETS: "ConsumerOffsetManager", DELAY_OFFSETS: "ScheduleMessageService",
           TOPICS: "TopicConfigManager", GROUPS: "SubscriptionGroupManager", LMQ_CONSUMER_OFFSETS: "LmqConsumerOffsetManager"}
TABLE = {CONSUMER_OFFSETS: "offsetTable", DELAY_OFFSETS: "offsetTable", TOPICS: "topicConfigTable",
         GROUPS: "subscriptionGroupTable", LMQ_CONSUMER_OFFSETS: "lmqOffsetTable"}
WHAT = {CONSUMER_OFFSETS: "every consumer group's committed offsets", DELAY_OFFSETS: "the delay levels' progress",
        TOPICS: "the topic table", GROUPS: "the subscription groups",
        LMQ_CONSUMER_OFFSETS: "the LMQ groups' committed offsets"}
TOPIC_GROUP_SEPARATOR = "@"  # ConsumerOffsetManager.TOPIC_GROUP_SEPARATOR


def config_dir(root: str) -> str:
    return os.path.join(root, "config")


def shape_problem(name: str, value) -> str | None:
    """Why the manager's ``decode`` would fail on this parsed value (None: it loads)."""
    if not isinstance(value, dict):
        return f"the top level is a {type(value).__name__}, not an object"
    table = value.get(TABLE[name])
    if table is None:
        return None  # the manager keeps its empty table
    if not isinstance(table, dict):
        return f"{TABLE[name]} is not an object"
    for k, v in table.items():
        if name in (CONSUMER_OFFSETS,):
            if not isinstance(v, dict):
                return f"{TABLE[name]}[{k!r}] is not an object of queue offsets"
            for q, off in v.items():
                if as_long(q) is None or as_long(off) is None and off is not None:
                    return f"{TABLE[name]}[{k!r}] has a non-numeric queue id or offset ({q!r}: {off!r})"
        elif name == LMQ_CONSUMER_OFFSETS:
            if not isinstance(k, str) or (as_long(v) is None and v is not None):
                return f"lmqOffsetTable has a non-numeric offset ({k!r}: {v!r})"
        elif name == DELAY_OFFSETS:
            if as_long(k) is None or (as_long(v) is None and v is not None):
                return f"offsetTable has a non-numeric delay level or offset ({k!r}: {v!r})"
        elif not isinstance(v, dict):
            return f"{TABLE[name]}[{k!r}] is not an object"
    return None


@dataclass
class FileCopy:
    """One copy of a config file (the main file or its ``.bak``) and whether the broker can decode it."""

    path: str
    exists: bool = False
    size: int = 0
    mtime_ms: int | None = None
    text: str | None = None
    value: object = None
    error: fastjson.FastjsonError | None = None
    byte_offset: int | None = None  # where parsing failed, in bytes
    problem: str | None = None  # decoded but not the manager's shape
    read_error: str | None = None

    @property
    def empty(self) -> bool:
        return self.exists and self.size == 0

    @property
    def usable(self) -> bool:
        return self.exists and self.size > 0 and self.error is None and self.problem is None and self.read_error is None

    def as_json(self) -> dict:
        d = {"path": self.path, "exists": self.exists, "size": self.size, "mtimeMs": self.mtime_ms, "parses": self.usable}
        if self.error is not None:
            d.update(error=self.error.reason, line=self.error.line, column=self.error.column, offset=self.byte_offset)
        if self.problem:
            d["error"] = self.problem
        if self.read_error:
            d["error"] = self.read_error
        return d


def read_copy(path: str) -> FileCopy:
    c = FileCopy(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return c
    except OSError as e:
        c.exists, c.read_error = True, f"cannot stat: {e.strerror}"
        return c
    c.exists, c.size, c.mtime_ms = True, st.st_size, st.st_mtime_ns // 1_000_000
    if not os.path.isfile(path):
        c.read_error = "not a regular file"
        return c
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        c.read_error = f"cannot read: {e.strerror}"
        return c
    if not data:
        return c
    try:
        c.text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        c.error = fastjson.FastjsonError("not UTF-8 text", data[:e.start].decode("utf-8", "replace"), len(data[:e.start].decode("utf-8", "replace")))
        c.byte_offset = e.start
        return c
    try:
        c.value = fastjson.loads(c.text)
    except fastjson.FastjsonError as e:
        c.error, c.byte_offset = e, fastjson.byte_offset(c.text, e.pos)
        return c
    c.problem = shape_problem(os.path.basename(path).removesuffix(".bak").removesuffix(".tmp"), c.value)
    return c


@dataclass
class ConfigFile:
    """A config file and its ``.bak``, and what the broker's ``load`` makes of the pair."""

    name: str
    main: FileCopy
    bak: FileCopy
    tmp: FileCopy | None = None  # 4.9.3 persists through FILE.tmp: left behind when a persist was interrupted

    @property
    def source(self) -> str | None:
        """'main' or 'bak': the copy the broker loads; None: it loads nothing."""
        if self.main.usable:
            return "main"
        if self.bak.usable:
            return "bak"
        return None

    @property
    def broker_outcome(self) -> str:
        """main | bak | nothing (starts with an empty table) | refuses (load() returns false) | absent."""
        if not self.main.exists and not self.bak.exists:
            return "absent"
        if self.main.usable:
            return "main"
        if not self.bak.exists or self.bak.size == 0:
            return "nothing"
        return "bak" if self.bak.usable else "refuses"

    @property
    def value(self):
        src = self.source
        return self.main.value if src == "main" else self.bak.value if src == "bak" else None

    def table(self) -> dict:
        v = self.value
        t = v.get(TABLE[self.name]) if isinstance(v, dict) else None
        return t if isinstance(t, dict) else {}

    def as_json(self) -> dict:
        d = {"file": self.name, "manager": MANAGER[self.name], "brokerLoads": self.broker_outcome,
             "main": self.main.as_json(), "bak": self.bak.as_json()}
        if self.tmp is not None and self.tmp.exists:
            d["tmp"] = self.tmp.as_json()
        return d


def read_config_file(root: str, name: str) -> ConfigFile:
    path = os.path.join(config_dir(root), name)
    return ConfigFile(name, read_copy(path), read_copy(path + ".bak"), read_copy(path + ".tmp"))


def read_config(root: str) -> dict[str, ConfigFile]:
    return {n: read_config_file(root, n) for n in CONFIG_FILES}


def _copy_problem(c: FileCopy) -> tuple[str, int | None, str] | None:
    """(code, byte offset, what) when this copy cannot be decoded."""
    if c.read_error:
        return "CFG_PARSE", None, c.read_error
    if c.empty:
        return "CFG_EMPTY", 0, "the file is empty"
    if c.error is not None:
        return "CFG_PARSE", c.byte_offset, f"does not parse: {c.error}"
    if c.problem:
        return "CFG_SHAPE", None, f"parses but the broker cannot decode it: {c.problem}"
    return None


def config_findings(files: dict[str, ConfigFile]) -> list[Finding]:
    """CFG_* findings: copies the broker cannot decode, and what its load then does."""
    out = []
    for name, cf in files.items():
        if not cf.main.exists and not cf.bak.exists:
            continue
        mp = _copy_problem(cf.main) if cf.main.exists else None
        bp = _copy_problem(cf.bak) if cf.bak.exists else None
        outcome = cf.broker_outcome
        if mp is not None:
            code, off, what = mp
            if outcome == "bak":
                sev, then = "warning", (f"the broker loads {name}.bak instead (written {_age(cf.bak, cf.main)}); "
                                        "`rmqstore repair config` restores it")
            elif outcome == "nothing":
                sev, then = "error", f"no usable {name}.bak: the broker starts without {WHAT[name]}"
            else:
                sev, then = "error", f"{name}.bak does not decode either: the broker's load fails and it refuses to start"
            out.append(Finding(code, sev, cf.main.path, off, f"{name} {what}; {then}",
                               _pos_extra(cf.main) | {"file": name, "brokerLoads": outcome}))
        elif not cf.main.exists and cf.bak.exists:
            sev = "warning" if outcome == "bak" else "error"
            out.append(Finding("CFG_MISSING", sev, cf.main.path, None,
                               f"{name} is missing; the broker " + ("loads its .bak" if outcome == "bak" else
                                                                     f"starts without {WHAT[name]}" if outcome == "nothing"
                                                                     else "refuses to start (.bak does not decode)"),
                               {"file": name, "brokerLoads": outcome}))
        if bp is not None and (mp is None or outcome == "refuses"):
            code, off, what = bp
            if mp is None:
                out.append(Finding(code, "warning", cf.bak.path, off, f"{name}.bak {what}; the main file is fine, but the "
                                   "broker has no fallback if it is damaged", _pos_extra(cf.bak) | {"file": name}))
            else:
                out.append(Finding(code, "error", cf.bak.path, off, f"{name}.bak {what}",
                                   _pos_extra(cf.bak) | {"file": name}))
    return out


def _pos_extra(c: FileCopy) -> dict:
    if c.error is None:
        return {}
    return {"line": c.error.line, "column": c.error.column}


def _age(bak: FileCopy, main: FileCopy) -> str:
    if bak.mtime_ms is None:
        return "at an unknown time"
    if main.mtime_ms is None:
        return f"at {bak.mtime_ms} ms"
    d = (main.mtime_ms - bak.mtime_ms) / 1000
    if abs(d) < 1:
        return "within a second of the main file"
    if d > 0:
        return f"{d:.0f} s before the main file: offsets committed after it are lost"
    return f"{-d:.0f} s after the main file"


# --- the decoded tables ----------------------------------------------------------------------------


@dataclass
class OffsetEntry:
    """One committed offset: ``offsetTable["topic@group"][queueId]`` (the next queue offset to consume)."""

    key: str
    topic: str
    group: str
    suffix: str  # 5.x broadcast offsets carry a further "@..." part
    queue_id: int
    offset: int


def consumer_offsets(cf: ConfigFile) -> list[OffsetEntry]:
    out = []
    for key, queues in cf.table().items():
        if not isinstance(key, str) or not isinstance(queues, dict):
            continue
        topic, _, rest = key.partition(TOPIC_GROUP_SEPARATOR)
        group, _, suffix = rest.partition(TOPIC_GROUP_SEPARATOR)
        for q, off in queues.items():
            qi, oi = as_long(q), as_long(off)
            if qi is None or oi is None:
                continue
            out.append(OffsetEntry(key, topic, group, suffix, qi, oi))
    out.sort(key=lambda e: (e.group, e.topic, e.suffix, e.queue_id))
    return out


def lmq_consumer_offsets(cf: ConfigFile) -> list[OffsetEntry]:
    """``lmqOffsetTable["topic@group"]``: an LMQ group's committed offset in queue 0 of an LMQ queue."""
    out = []
    for key, off in cf.table().items():
        oi = as_long(off)
        if not isinstance(key, str) or oi is None:
            continue
        topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
        out.append(OffsetEntry(key, topic, group, "", 0, oi))
    out.sort(key=lambda e: (e.group, e.topic))
    return out


def delay_offsets(cf: ConfigFile) -> dict[int, int]:
    out = {}
    for k, v in cf.table().items():
        lk, lv = as_long(k), as_long(v)
        if lk is not None and lv is not None:
            out[lk] = lv
    return dict(sorted(out.items()))


def topic_table(cf: ConfigFile) -> dict[str, dict]:
    return {k: v for k, v in cf.table().items() if isinstance(k, str) and isinstance(v, dict)}


def topic_queue_count(cfg: dict) -> int | None:
    """The broker accepts queue ids below max(readQueueNums, writeQueueNums) (§16)."""
    r, w = as_long(cfg.get("readQueueNums")), as_long(cfg.get("writeQueueNums"))
    if r is None and w is None:
        return None
    return max(r or 0, w or 0)


# --- writing (the broker's persist) --------------------------------------------------------------


def _write_durable(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class WriteResult:
    """What writing one config file did: its path, whether a .bak was written, the steps taken."""

    path: str
    bak_written: bool
    steps: list = field(default_factory=list)


def write_config_file(root: str, name: str, value, *, backup=None, keep_previous_as_bak: bool = True,
                      keep_order: bool = False) -> WriteResult:
    """Persist ``value`` like ConfigManager.persist (MixAll.string2File): ``FILE.tmp`` written, the previous
    content kept as ``FILE.bak`` (only when it decodes, so a good ``.bak`` is never replaced by garbage; a
    ``.bak`` that does not decode gets the new content), then ``FILE.tmp`` renamed over ``FILE``; each step
    fsynced. Every file about to change is first saved
    into ``backup`` (an :class:`~rmqstore_cli.engine.repair.backup.Backup`), a file created is journaled so
    ``restore`` removes it. The caller holds the store's lock. ``consumerOffset.json`` is laid out as the
    broker's ConsumerOffsetManager writes it (:mod:`.offsetdoc`); ``keep_order`` keeps its entries in the
    order given (a copy the broker wrote, restored), else they take the order of the broker's maps."""
    d = config_dir(root)
    if not os.path.isdir(d):
        os.makedirs(d)
        _fsync_dir(root)
    path = os.path.join(d, name)
    tmp, bak = path + ".tmp", path + ".bak"
    prev = read_copy(path)
    if name == CONSUMER_OFFSETS and isinstance(value, dict):
        from .offsetdoc import broker_consumer_offsets

        # the broker's table came from the file it loaded: the main file, else the .bak
        start = prev if prev.usable else read_copy(bak)
        loaded = start.value.get("offsetTable") if start.usable and isinstance(start.value, dict) else None
        value = broker_consumer_offsets(value, loaded, keep_order=keep_order)
    data = fastjson.dumps(value).encode("utf-8")
    res = WriteResult(path, False)
    for p in (path, bak, tmp):
        if backup is not None:
            if os.path.isfile(p):
                backup.save_file(p)
            else:
                backup.mark("created", path=os.path.relpath(p, root))
    _write_durable(tmp, data)
    if keep_previous_as_bak and prev.usable:
        with open(path, "rb") as f:
            _write_durable(bak, f.read())
        res.bak_written = True
        res.steps.append(f"kept the previous {name} as {name}.bak")
    elif (os.path.exists(bak) or prev.exists) and not read_copy(bak).usable:
        # a .bak the broker cannot decode makes its load fail the day the main file is damaged again
        _write_durable(bak, data)
        res.bak_written = True
        res.steps.append(f"wrote {name}.bak with the same content (the old one did not decode)")
    os.replace(tmp, path)
    _fsync_dir(d)
    res.steps.append(f"wrote {name} ({len(data)} bytes, the broker's format)")
    return res


def check_writable_name(name: str) -> str:
    base = name.removesuffix(".bak")
    if base not in CONFIG_FILES:
        raise UsageError(f"unknown config file {name!r}; one of {', '.join(CONFIG_FILES)}")
    return base


def read_store_config_json(root: str, name: str) -> dict | None:
    """A ``config/*.json`` file written by fastjson (bare integer keys), falling back to ``.bak``."""
    for candidate in (name, name + ".bak"):
        path = os.path.join(root, "config", candidate)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.EISDIR):
                continue
            raise UsageError(f"cannot read {path}: {e.strerror}") from None
        if not text.strip():
            continue
        try:
            return parse_fastjson(text)
        except ValueError:
            continue
    return None


_BARE_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def parse_fastjson(text: str) -> dict:
    """fastjson writes non-string map keys without quotes (``{0:250}``); quote them first."""
    return json.loads(_BARE_KEY.sub(r'\1"\2"\3', text))
