"""Store geometry and the broker settings that change how bytes are read or written.

Mirrors the parts of the broker's ``MessageStoreConfig`` the store format depends on.
Values come from, in priority order: explicit options, a ``broker.conf`` properties
file, what the files on disk imply (recorded in ``inferred``), and the version defaults.
"""

from __future__ import annotations

import os
import re
import struct
from collections import Counter
from dataclasses import dataclass, field, fields, replace

import numpy as np

from rmqstore_cli.formats.records import BCQ_UNIT_SIZE, DEFAULT_BCQ_FILE_SIZE, MAGIC_V1, MAGIC_V2, MIN_MESSAGE_SIZE
from rmqstore_cli.formats.tags import DEFAULT_DELAY_LEVELS, parse_delay_levels

from ..errors import UsageError

DEFAULT_COMMITLOG_SIZE = 1073741824
DEFAULT_CQ_SIZE = 6_000_000
DEFAULT_EXT_SIZE = 50331648
DEFAULT_HASH_SLOTS = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
DEFAULT_TIMERLOG_SIZE = 100 * 1024 * 1024


@dataclass
class StoreConfig:
    """The broker settings the store's layout depends on (the broker's MessageStoreConfig, the part read here)."""

    version: int = 4  # 4 = 4.9.x rules, 5 = 5.x rules
    mappedFileSizeCommitLog: int = DEFAULT_COMMITLOG_SIZE
    mappedFileSizeConsumeQueue: int = DEFAULT_CQ_SIZE
    mappedFileSizeConsumeQueueExt: int = DEFAULT_EXT_SIZE
    mapperFileSizeBatchConsumeQueue: int = DEFAULT_BCQ_FILE_SIZE  # (the broker's spelling)
    enableConsumeQueueExt: bool = False
    maxHashSlotNum: int = DEFAULT_HASH_SLOTS
    maxIndexNum: int = DEFAULT_INDEX_NUM
    messageIndexEnable: bool = True
    messageIndexSafe: bool = False
    checkCRCOnRecover: bool = True
    maxMessageSize: int = 4194304
    messageDelayLevel: str = DEFAULT_DELAY_LEVELS
    enabledAppendPropCRC: bool = False
    forceVerifyPropCRC: bool = False
    duplicationEnable: bool = False
    autoMessageVersionOnTopicLen: bool = True
    storePathCommitLog: str | None = None
    # Layouts the broker can also write (engine/layout.py decides what the engine understands)
    enableDLegerCommitLog: bool = False
    dLegerSelfId: str | None = None
    storeType: str = "default"  # 5.3: "defaultRocksDB" keeps consume queues in a RocksDB database
    enableLmq: bool = False
    enableMultiDispatch: bool = False
    # 5.x timer store (FORMAT.md appendix C)
    timerPrecisionMs: int = 1000
    mappedFileSizeTimerLog: int = DEFAULT_TIMERLOG_SIZE
    timerRollWindowSlot: int = 3600 * 24 * 2
    inferred: dict = field(default_factory=dict)  # setting -> how it was inferred
    explicit: set = field(default_factory=set)  # settings given by the user or broker.conf

    @property
    def delay_table(self) -> dict[int, int]:
        return parse_delay_levels(self.messageDelayLevel)

    @property
    def index_file_size(self) -> int:
        return 40 + self.maxHashSlotNum * 4 + self.maxIndexNum * 20

    def with_(self, **kw) -> "StoreConfig":
        return replace(self, **kw)


_FIELD_TYPES = {f.name: f.type for f in fields(StoreConfig)}
_SETTABLE = {n for n in _FIELD_TYPES if n not in ("inferred", "explicit", "version")}


def _coerce(name: str, value: str):
    t = _FIELD_TYPES[name]
    if t in ("bool", bool):
        return str(value).strip().lower() == "true"
    if t in ("int", int):
        return int(str(value).strip())
    return str(value).strip()


def read_broker_conf(path: str) -> dict[str, str]:
    """Parse a Java ``.properties`` file (``key=value`` or ``key: value``, ``#``/``!`` comments)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"cannot read config {path}: {e.strerror}") from None
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        m = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def apply_settings(cfg: StoreConfig, settings: dict) -> StoreConfig:
    """Apply known keys (broker.conf names); unknown keys are ignored like the broker does."""
    cfg = replace(cfg, explicit=set(cfg.explicit), inferred=dict(cfg.inferred))
    for key, value in settings.items():
        if key == "version" or key == "brokerVersion":
            cfg.version = int(str(value)[0])
            cfg.explicit.add("version")
        elif key in _SETTABLE and value is not None:
            try:
                setattr(cfg, key, _coerce(key, value))
            except ValueError:
                raise UsageError(f"setting {key}={value!r} is not a valid value") from None
            cfg.explicit.add(key)
    return cfg


def _file_sizes(directory: str) -> Counter:
    """How many of the files named by digits (segment files) in ``directory`` have each non-zero size: one stat per
    file (every store open infers the geometry; a test broker's store has dozens of small segments)."""
    sizes: Counter = Counter()
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                if e.name.isdigit() and e.is_file():
                    s = e.stat().st_size
                    if s > 0:
                        sizes[s] += 1
    except OSError:
        pass
    return sizes


def infer_geometry(cfg: StoreConfig, root: str) -> StoreConfig:
    """Fill settings not given explicitly from what the files imply; say so in ``inferred``."""
    cfg = replace(cfg, explicit=set(cfg.explicit), inferred=dict(cfg.inferred))
    cl_dir = cfg.storePathCommitLog or os.path.join(root, "commitlog")
    dledger_data = _dledger_data_dir(cfg, root, cl_dir)
    if dledger_data:
        cl_dir = dledger_data  # the entry files have the commitlog's file size (DLedgerCommitLog)
    if "mappedFileSizeCommitLog" not in cfg.explicit:
        sizes = _file_sizes(cl_dir)
        if len(sizes) >= 1:
            # The most common size wins (the larger on a tie); a wrong-size stray is reported by verify.
            size = max(sizes, key=lambda s: (sizes[s], s))
            cfg.mappedFileSizeCommitLog = size
            cfg.inferred["mappedFileSizeCommitLog"] = "size of the DLedger data files" if dledger_data \
                else "size of the commitlog files"
    cq_root = os.path.join(root, "consumequeue")
    if "mappedFileSizeConsumeQueue" not in cfg.explicit and os.path.isdir(cq_root):
        sizes: set[int] = set()
        # Every queue, not the first: one truncated file must not set the geometry of all the others.
        for topic in _listdir(cq_root):
            for qid in _listdir(os.path.join(cq_root, topic)):
                sizes.update(_file_sizes(os.path.join(cq_root, topic, qid)))
        sizes = {s for s in sizes if s % 20 == 0}
        if sizes:
            cfg.mappedFileSizeConsumeQueue = max(sizes)
            cfg.inferred["mappedFileSizeConsumeQueue"] = "size of the consume queue files"
    lmq = [t for t in _listdir(cq_root) if t.startswith("%LMQ%")] if os.path.isdir(cq_root) else []
    if lmq:
        # the broker that wrote LMQ queues multi-dispatched; with enableLmq every LMQ queue is queue 0, without it
        # they take the record's own queue id
        qids = {q for t in lmq for q in _listdir(os.path.join(cq_root, t))}
        for key, value in (("enableMultiDispatch", True), ("enableLmq", qids <= {"0"})):
            if key not in cfg.explicit:
                setattr(cfg, key, value)
                cfg.inferred[key] = "consumequeue/ holds %LMQ% queues" + ("" if value else " outside queue 0")
    ext_root = os.path.join(root, "consumequeue_ext")
    if "enableConsumeQueueExt" not in cfg.explicit and os.path.isdir(ext_root) and _listdir(ext_root):
        cfg.enableConsumeQueueExt = True
        cfg.inferred["enableConsumeQueueExt"] = "consumequeue_ext/ exists"
    if "mappedFileSizeConsumeQueueExt" not in cfg.explicit and os.path.isdir(ext_root):
        ext_sizes: set[int] = set()
        for topic in _listdir(ext_root):
            for qid in _listdir(os.path.join(ext_root, topic)):
                ext_sizes.update(_file_sizes(os.path.join(ext_root, topic, qid)))
        if ext_sizes:
            cfg.mappedFileSizeConsumeQueueExt = max(ext_sizes)
            cfg.inferred["mappedFileSizeConsumeQueueExt"] = "size of the ext files"
    bcq_root = os.path.join(root, "batchconsumequeue")
    if "mapperFileSizeBatchConsumeQueue" not in cfg.explicit and os.path.isdir(bcq_root):
        bcq_sizes: set[int] = set()
        for topic in _listdir(bcq_root):
            for qid in _listdir(os.path.join(bcq_root, topic)):
                bcq_sizes.update(_file_sizes(os.path.join(bcq_root, topic, qid)))
        bcq_sizes = {s for s in bcq_sizes if s % BCQ_UNIT_SIZE == 0}
        if bcq_sizes:
            cfg.mapperFileSizeBatchConsumeQueue = max(bcq_sizes)
            cfg.inferred["mapperFileSizeBatchConsumeQueue"] = "size of the batch consume queue files"
    if "mappedFileSizeTimerLog" not in cfg.explicit:
        sizes = _file_sizes(os.path.join(root, "timerlog"))
        if sizes:
            cfg.mappedFileSizeTimerLog = max(sizes)  # a wrong-size stray is reported by verify
            cfg.inferred["mappedFileSizeTimerLog"] = "size of the timerlog files"
    idx_dir = os.path.join(root, "index")
    if not ({"maxHashSlotNum", "maxIndexNum"} & cfg.explicit):
        got = infer_index_geometry(idx_dir)
        if got is not None:
            cfg.maxHashSlotNum, cfg.maxIndexNum, why = got
            cfg.inferred["maxHashSlotNum/maxIndexNum"] = why
    if "version" not in cfg.explicit:
        v, why = _infer_version(root, cl_dir, dledger=bool(dledger_data))
        if v:
            cfg.version = v
            cfg.inferred["version"] = why
    return cfg


_INDEX_HEAD = struct.Struct(">qqqqii")  # formats.records.INDEX_HEADER_FIELDS (tested equal)


def infer_index_geometry(idx_dir: str) -> tuple[int, int, str] | None:
    """(maxHashSlotNum, maxIndexNum, how) from the index files: size = 40 + 4 * slots + 20 * entries (§10.1).

    A file that is not the last one was left behind full: its indexCount is maxIndexNum, which fixes both.
    Otherwise the default 1:4 ratio when the size allows it, else the first of a few common ratios under
    which the file's slots and entries are consistent (every slot names an entry below indexCount, every
    entry after the last one is zero)."""
    size_of = {}
    try:
        with os.scandir(idx_dir) as entries:
            size_of = {e.name: e.stat().st_size for e in entries if e.name.isdigit() and e.is_file()}
    except OSError:
        pass
    names = sorted(size_of)
    sizes = Counter(size_of.values())
    sizes = {s: c for s, c in sizes.items() if s > 40}
    if not sizes:
        return None
    size = max(sizes, key=lambda s: (sizes[s], s))
    area = size - 40
    for n in names[:-1]:
        p = os.path.join(idx_dir, n)
        if size_of[n] != size:
            continue
        with open(p, "rb") as f:
            head = f.read(40)
        count = _INDEX_HEAD.unpack(head)[5] if len(head) == 40 else 0
        if 1 < count and area - 20 * count > 0 and (area - 20 * count) % 4 == 0:
            return (area - 20 * count) // 4, count, f"index file {n} (left behind full: indexCount {count}), {size} bytes"
    if area % 84 == 0:
        return area // 84, area // 84 * 4, f"index file size {size} with the default 1:4 ratio"
    if not names or size_of[names[-1]] != size:
        return None
    last = os.path.join(idx_dir, names[-1])
    with open(last, "rb") as f:
        data = f.read()
    count = _INDEX_HEAD.unpack_from(data, 0)[5]
    for ratio in (2, 1, 3, 5, 8, 10, 16, 20, 32, 64):
        if area % (4 + 20 * ratio):
            continue
        slots = area // (4 + 20 * ratio)
        if count > slots * ratio:
            continue
        table = np.frombuffer(data, ">i4", count=slots, offset=40)
        tail = np.frombuffer(data, np.uint8, offset=40 + 4 * slots + 20 * max(count, 1))
        if ((table >= 0) & (table < max(count, 1))).all() and not tail.any():
            return slots, slots * ratio, f"index file size {size}: slots and entries consistent with a 1:{ratio} ratio"
    return None


def _listdir(p: str) -> list[str]:
    try:
        return sorted(os.listdir(p))
    except OSError:
        return []


def _dledger_data_dir(cfg: StoreConfig, root: str, cl_dir: str) -> str | None:
    """``dledger-<selfId>/data`` when the store keeps its messages in a DLedger log (appendix D): the broker
    says so, or a DLedger folder stands beside an empty commitlog (as engine/layout.py detects it)."""
    names = [n for n in _listdir(root) if n.startswith("dledger-") and os.path.isdir(os.path.join(root, n))]
    if not names or (not cfg.enableDLegerCommitLog and _file_sizes(cl_dir)):
        return None
    if cfg.dLegerSelfId and f"dledger-{cfg.dLegerSelfId}" in names:
        names = [f"dledger-{cfg.dLegerSelfId}"]
    return os.path.join(root, names[0], "data")


def _dledger_messages(data: bytes, limit: int = 200) -> list[int]:
    """Offsets of the messages inside the first DLedger entries of a data file head (entry size chain)."""
    import struct

    from rmqstore_cli.formats.dledger import ENTRY_HEADER_SIZE, ENTRY_MAGIC

    out, pos = [], 0
    while len(out) < limit and pos + ENTRY_HEADER_SIZE <= len(data):
        magic, size = struct.unpack_from(">ii", data, pos)
        if magic != ENTRY_MAGIC or size <= ENTRY_HEADER_SIZE or pos + size > len(data):
            break
        out.append(pos + ENTRY_HEADER_SIZE)
        pos += size
    return out


def _first_records(data: bytes, limit: int = 200) -> list[int]:
    """Offsets of the first records of a segment head, by their TOTALSIZE chain (no compiled
    kernel: inferring the version must not cost the kernels' import on commands that never walk)."""
    import struct

    out, pos = [], 0
    while len(out) < limit and pos + 8 <= len(data):
        size, magic = struct.unpack_from(">ii", data, pos)
        if magic not in (MAGIC_V1, MAGIC_V2) or size < MIN_MESSAGE_SIZE or pos + size > len(data):
            break
        out.append(pos)
        pos += size
    return out


def _infer_version(root: str, cl_dir: str, dledger: bool = False) -> tuple[int | None, str]:
    import struct

    import numpy as np

    from rmqstore_cli.formats.fast import R_OK, decode_headers_reference

    for name in _listdir(cl_dir)[:3]:
        p = os.path.join(cl_dir, name)
        try:
            with open(p, "rb") as f:
                data = f.read(1 << 20)
        except OSError:
            continue
        offsets = _dledger_messages(data) if dledger else _first_records(data)
        if not offsets:
            continue
        h = decode_headers_reference(data, np.asarray(offsets, dtype=np.int64))
        for i in range(len(h)):
            if h.magicCode[i] != MAGIC_V1:
                return 5, "magic v2 records in the commitlog"
            plen = int(h.propsLength[i])
            if plen > 0 and h.reason[i] == R_OK:
                last = data[int(h.propsStart[i]) + plen - 1]
                return (5, "property strings end with \\x02 (5.x)") if last == 2 else (4, "property strings without a trailing \\x02 (4.x)")
    cp = os.path.join(root, "checkpoint")
    try:
        with open(cp, "rb") as f:
            head = f.read(40)
        if len(head) == 40 and any(struct.unpack(">qq", head[24:40])):
            return 5, "checkpoint has 5.x fields"
    except OSError:
        pass
    return None, ""
