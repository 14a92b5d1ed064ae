"""``spark.read.format("rocketmq")``: one row per commitlog record, across any number of stores.

Mirrors the broker's commitlog read path (CommitLog + checkMessageAndReturnSize): record
boundaries come from TOTALSIZE, validity from the engine's rules. The driver plans
message-aligned byte ranges by following only the size+magic chain of each segment
(:func:`formats.fast.walk`); executors map the segment read-only, re-walk their range and
yield Arrow batches. A region that is not a record becomes a row with ``finding`` set
(mode ``permissive``, the default) or fails the task (``failfast``).

Options: ``body`` (true), ``mode`` (permissive|failfast), ``splitSize`` (bytes per task,
64 MiB), ``batchRows`` (65536), ``batchBytes`` (16 MiB of records: a batch holds at most that many rows and
about that many bytes, so messages of any size keep a task's memory bounded), ``checkCrc`` (true),
``brokerVersion``, ``commitlogFileSize``, ``config`` (a broker.conf), ``since``/``until`` (epoch ms, inclusive: only records stored in that
range; the driver finds the byte range by binary search and plans only the segments in it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from rmqstore_cli.formats import fast
from rmqstore_cli.engine.log.commitlog import CommitLog
from rmqstore_cli.engine.config.storeconfig import StoreConfig
from rmqstore_cli.engine.log.segments import Segment
from rmqstore_cli.engine.store import Store

from . import codes
from rmqstore_cli.formats.arrow import build_batch, ddl, finding_batch

DEFAULT_SPLIT = 64 << 20
DEFAULT_BATCH_ROWS = 65536
# A batch's records take at most about this many bytes (the Arrow batch, then the Parquet writer's row group made
# from it, are each about that size): with rows alone, 65,536 records of 16 KiB would be a 1 GiB batch.
DEFAULT_BATCH_BYTES = 16 << 20


def _flag(options, name: str, default: bool) -> bool:
    v = options.get(name)
    return default if v is None else str(v).strip().lower() in ("true", "1", "yes")


def store_roots(path_option: str | None, paths: list[str] | None = None) -> list[str]:
    roots = list(paths or [])
    if path_option:
        roots += [p for p in (x.strip() for x in path_option.split(",")) if p]
    return [os.path.abspath(os.path.expanduser(r)) for r in roots]


def open_store_from_options(root: str, options) -> Store:
    overrides = {}
    if options.get("brokerversion"):
        overrides["version"] = int(options["brokerversion"])
    if options.get("commitlogfilesize"):
        overrides["mappedFileSizeCommitLog"] = int(options["commitlogfilesize"])
    return Store.open(root, config_file=options.get("config"), overrides=overrides)


@dataclass
class SegmentRange(InputPartition):
    """Records of one segment whose starts lie in [pos, end); ``tail`` says how the walk ended there."""

    store: str
    path: str
    name: str
    start: int
    size: int
    pos: int
    end: int
    version: int
    force_prop_crc: bool
    tail_kind: str | None  # fast.STOP_* when this range holds the segment's end, else None
    tail_size: int = 0
    tail_magic: int = 0
    since: int | None = None  # store-time filter (epoch ms, inclusive)
    until: int | None = None
    dledger: bool = False  # a DLedger data file: the messages inside its entries (read whole, by the entry walk)

    def __post_init__(self):
        InputPartition.__init__(self, None)


def plan_segment(store: str, seg: Segment, file_size: int, cfg: StoreConfig, split: int) -> list[SegmentRange]:
    """Cut one segment into message-aligned ranges of about ``split`` bytes (size+magic reads only)."""
    if seg.size == 0:
        return [SegmentRange(store, seg.path, seg.name, seg.start, 0, 0, 0, cfg.version, cfg.forceVerifyPropCRC,
                             fast.STOP_EOF)]
    limit = min(seg.size, file_size)
    buf = seg.buffer()
    cuts = [0]
    pos = 0
    while True:  # piecewise: a broker's 1 GiB segment of small messages holds millions of records
        w = fast.walk(buf, pos, limit, max_records=fast.WALK_PIECE)
        offs = w.offsets
        while True:
            k = int(np.searchsorted(offs, cuts[-1] + split))
            if k >= len(offs):
                break
            cuts.append(int(offs[k]))
        if w.kind != fast.STOP_CHUNK or not len(offs):
            break
        pos = w.stop
    bounds = cuts + [w.stop]
    out = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        last = i == len(bounds) - 2
        out.append(SegmentRange(store, seg.path, seg.name, seg.start, seg.size, a, b, cfg.version, cfg.forceVerifyPropCRC,
                                w.kind if last else None, w.size if last else 0, w.magic if last else 0))
    return out


def dledger_range(store: str, seg: Segment, cfg: StoreConfig) -> SegmentRange:
    """A DLedger data file is one range (entries are walked from the file's start: no cut is planned)."""
    return SegmentRange(store, seg.path, seg.name, seg.start, seg.size, 0, seg.size, cfg.version, cfg.forceVerifyPropCRC,
                        None, dledger=True)


def plan_whole_or_cut(store: str, seg: Segment, file_size: int, cfg: StoreConfig, split: int) -> list[SegmentRange]:
    """A segment no larger than ``split`` is one range, planned without reading it: the task's own walk
    finds where its records end and reports a damaged tail (:func:`read_range`), so the driver walks
    only the segments it must cut."""
    limit = min(seg.size, file_size)
    if 0 < limit <= split:
        return [SegmentRange(store, seg.path, seg.name, seg.start, seg.size, 0, limit, cfg.version,
                             cfg.forceVerifyPropCRC, None)]
    return plan_segment(store, seg, file_size, cfg, split)


@dataclass
class RangeGroup(InputPartition):
    """Consecutive ranges read by one task: small segments are grouped up to ``splitSize`` bytes."""

    ranges: list

    def __post_init__(self):
        InputPartition.__init__(self, None)


def group_ranges(ranges: list[SegmentRange], split: int) -> list[RangeGroup]:
    groups: list[RangeGroup] = []
    cur: list[SegmentRange] = []
    size = 0
    for r in ranges:
        n = max(r.end - r.pos, 1)
        if cur and size + n > split:
            groups.append(RangeGroup(cur))
            cur, size = [], 0
        cur.append(r)
        size += n
    if cur:
        groups.append(RangeGroup(cur))
    return groups


def plan(roots: list[str], options) -> list[SegmentRange]:
    split = int(options.get("splitsize") or DEFAULT_SPLIT)
    since = int(options["since"]) if options.get("since") not in (None, "") else None
    until = int(options["until"]) if options.get("until") not in (None, "") else None
    parts: list[SegmentRange] = []
    for root in roots:
        st = open_store_from_options(root, options)
        try:
            cl = st.commitlog
            lo = hi = None
            if since is not None or until is not None:
                lo, hi, any_ = cl.time_window(since, until)
                if not any_:
                    continue
            for seg in cl.segments:
                if (lo is not None and seg.start + seg.size <= lo) or (hi is not None and seg.start >= hi):
                    continue  # wholly outside the time range
                planned = [dledger_range(st.root, seg, st.config)] if getattr(cl, "is_dledger", False) else \
                    plan_whole_or_cut(st.root, seg, cl.segments.file_size, st.config, split)
                for r in planned:
                    r.since, r.until = since, until
                    parts.append(r)
        finally:
            st.close()
    return parts


class RocketMQDataSource(DataSource):
    """The ``rocketmq`` format: ``load("store1,store2")`` or ``option("paths", ...)``."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self):
        return ddl(_flag(self.options, "body", True))

    def reader(self, schema):
        # Spark hands options over case-insensitively; keep them under lower-case names.
        return RocketMQReader({str(k).lower(): v for k, v in self.options.items()}, schema)


class RocketMQReader(DataSourceReader):
    def __init__(self, options: dict, schema):
        self.options = options
        self.schema = schema
        self.roots = store_roots(options.get("path"), [p for p in (options.get("paths") or "").split(",") if p])
        if not self.roots:
            raise ValueError("rocketmq: give one or more store roots: load('store1,store2')")
        mode = (options.get("mode") or "permissive").lower()
        if mode not in ("permissive", "failfast"):
            raise ValueError(f"rocketmq: mode must be permissive or failfast, not {mode!r}")
        self.failfast = mode == "failfast"
        self.with_body = _flag(options, "body", True)
        self.check_crc = _flag(options, "checkcrc", True)
        self.batch_rows = int(options.get("batchrows") or DEFAULT_BATCH_ROWS)
        self.batch_bytes = batch_bytes_of(options)

    def partitions(self):
        split = int(self.options.get("splitsize") or DEFAULT_SPLIT)
        return group_ranges(plan(self.roots, self.options), split) or [RangeGroup([])]

    def read(self, partition: RangeGroup) -> Iterator:
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(self.schema, timezone="UTC")
        yield from group_batches(partition.ranges, schema, with_body=self.with_body, check_crc=self.check_crc,
                                 batch_rows=self.batch_rows, failfast=self.failfast, batch_bytes=self.batch_bytes)


def batch_bytes_of(options: dict) -> int:
    """The ``batchBytes`` option (options keyed in lower case), at least 1."""
    return max(1, int(options.get("batchbytes") or DEFAULT_BATCH_BYTES))


def group_batches(ranges: list[SegmentRange], schema, *, with_body: bool, check_crc: bool, batch_rows: int,
                  failfast: bool, batch_bytes: int = DEFAULT_BATCH_BYTES) -> Iterator[pa.RecordBatch]:
    """The batches of some ranges; ranges of small segments give small batches, passed on together up to
    ``batch_rows`` rows or ``batch_bytes`` bytes of Arrow buffers."""
    pending, rows, size = [], 0, 0
    for r in ranges:
        for b in read_range(r, schema, with_body=with_body, check_crc=check_crc, batch_rows=batch_rows,
                            failfast=failfast, batch_bytes=batch_bytes):
            if not pending and (b.num_rows >= batch_rows or b.nbytes >= batch_bytes):
                yield b
                continue
            if pending and size + b.nbytes > batch_bytes:
                yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
                pending, rows, size = [], 0, 0
            pending.append(b)
            rows += b.num_rows
            size += b.nbytes
            if rows >= batch_rows or size >= batch_bytes:
                yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
                pending, rows, size = [], 0, 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


def byte_pieces(sizes: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Cut records of ``sizes`` bytes, in order, into runs [a, b) of at most ``budget`` bytes each; a record larger
    than the budget is a run of its own. A size below 0 (a damaged record's header) counts as 0."""
    n = len(sizes)
    if n == 0:
        return []
    ends = np.cumsum(np.maximum(sizes.astype(np.int64), 0))
    if int(ends[-1]) <= budget:
        return [(0, n)]
    pieces, a, base = [], 0, 0
    while a < n:
        b = int(np.searchsorted(ends, base + budget, side="right"))
        b = max(b, a + 1)
        pieces.append((a, b))
        base = int(ends[b - 1])
        a = b
    return pieces


class CorruptRecordError(RuntimeError):
    """Raised in failfast mode at the first finding."""


def _row_batches(p: SegmentRange, schema, buf, u8, h, *, with_body: bool, check_crc: bool, failfast: bool,
                 reason_codes: dict, batch_bytes: int):
    """Arrow batches of decoded records (the damaged ones with their finding), the time filter applied; each holds
    records of at most ``batch_bytes`` bytes in all (or a single larger record)."""
    if p.since is not None or p.until is not None:
        keep = np.ones(len(h), bool)
        if p.since is not None:
            keep &= h.storeTimestamp >= p.since
        if p.until is not None:
            keep &= h.storeTimestamp <= p.until
        keep |= h.reason != fast.R_OK  # a damaged record is reported whatever its time field says
        if not keep.all():
            h = h.select(keep)
    crc_ok = h.reason != fast.R_BODY_CRC
    bad = np.flatnonzero(h.reason != fast.R_OK)
    found: list[str | None] = [None] * len(h)
    texts: list[str | None] = [None] * len(h)
    for i in bad.tolist():
        r = int(h.reason[i])
        found[i] = reason_codes[r]
        texts[i] = fast.REASON_TEXT[r]
        if failfast:
            raise CorruptRecordError(f"{found[i]} at commitlog offset {p.start + int(h.offsets[i])} "
                                     f"({p.path}): {texts[i]}")
    if not check_crc:
        crc_ok = np.ones(len(h), bool)
    for a, b in byte_pieces(h.totalSize, batch_bytes):
        part = h if (a, b) == (0, len(h)) else h.select(slice(a, b))  # views, no copy
        yield build_batch(schema, store=p.store, segment=p.name, seg_start=p.start, buf=buf, u8=u8, h=part,
                          crc_ok=crc_ok[a:b], findings=found[a:b], messages=texts[a:b], with_body=with_body)


def read_dledger_range(p: SegmentRange, schema, *, with_body: bool, check_crc: bool, batch_rows: int, failfast: bool,
                       batch_bytes: int = DEFAULT_BATCH_BYTES):
    """The messages inside the entries of one DLedger data file (entry pos + 48), damaged ones as findings (the
    broker serves them), and a broken entry header where the entries end."""
    from rmqstore_cli.engine.log.dledger import DLedgerCommitLog, EntryWalk, walk_entries

    seg = Segment(p.path, p.name, p.start, p.size)
    cl = DLedgerCommitLog.__new__(DLedgerCommitLog)  # only the record rules are needed, not a directory listing
    cl.config = StoreConfig(version=p.version, forceVerifyPropCRC=p.force_prop_crc)
    prop, magics = cl.prop_crc_policy(check_crc), cl.magics(False)
    try:
        walk = EntryWalk()
        for ec in walk_entries([seg], result=walk, chunk=batch_rows):
            h, _ = cl.messages(ec, check_crc, prop, magics)
            yield from _row_batches(p, schema, ec.buf, fast.as_u8(ec.buf), h, with_body=with_body, check_crc=check_crc,
                                    failfast=failfast, reason_codes=codes.DLEDGER_REASON_CODES, batch_bytes=batch_bytes)
        s = walk.stop
        if s is not None and s.kind not in (fast.STOP_ZERO, fast.STOP_BLANK, fast.STOP_EOF):
            code = codes.DLEDGER_STOP_CODES.get(s.kind, "DL_ENTRY_INVALID")
            msg = f"{s.text()}; DLedger's recovery ends the log here"
            if failfast:
                raise CorruptRecordError(f"{code} at offset {s.offset} ({p.path}): {msg}")
            yield finding_batch(schema, store=p.store, segment=p.name, offset=s.offset, code=code, message=msg,
                                size=s.size)
    finally:
        seg.close()


def read_range(p: SegmentRange, schema, *, with_body: bool, check_crc: bool, batch_rows: int, failfast: bool,
               batch_bytes: int = DEFAULT_BATCH_BYTES):
    if p.dledger:
        yield from read_dledger_range(p, schema, with_body=with_body, check_crc=check_crc, batch_rows=batch_rows,
                                      failfast=failfast, batch_bytes=batch_bytes)
        return
    if not p.path or p.end <= p.pos and p.tail_kind in (None, fast.STOP_EOF, fast.STOP_ZERO, fast.STOP_BLANK):
        return
    seg = Segment(p.path, p.name, p.start, p.size)
    cl = CommitLog.__new__(CommitLog)  # only the validation rules are needed, not a directory listing
    cl.config = StoreConfig(version=p.version, forceVerifyPropCRC=p.force_prop_crc)
    try:
        buf = seg.buffer()
        u8 = fast.as_u8(buf) if p.size else np.zeros(0, np.uint8)
        pos = p.pos
        w = None
        while pos < p.end:
            w = fast.walk(buf, pos, p.end, max_records=batch_rows)
            h = fast.decode_headers(buf, w.offsets, u8) if len(w.offsets) else None
            if h is not None:
                cl.validate(buf, u8, h, check_crc)
                yield from _row_batches(p, schema, buf, u8, h, with_body=with_body, check_crc=check_crc,
                                        failfast=failfast, reason_codes=codes.REASON_CODES, batch_bytes=batch_bytes)
                del h
            pos = w.stop
            if w.kind != fast.STOP_CHUNK:
                break
        kind, size, magic, at = p.tail_kind, p.tail_size, p.tail_magic, p.end
        if w is not None and w.kind not in (fast.STOP_CHUNK, fast.STOP_EOF):
            # where this walk stopped: a range the driver did not walk, or the file changed since planning
            kind, size, magic, at = w.kind, w.size, w.magic, w.stop
        if kind in codes.STOP_CODES:
            code, text = codes.STOP_CODES[kind]
            msg = f"{text} (TOTALSIZE {size}, magic 0x{magic & 0xFFFFFFFF:08X}); the broker stops reading here"
            if failfast:
                raise CorruptRecordError(f"{code} at commitlog offset {p.start + at} ({p.path}): {msg}")
            yield finding_batch(schema, store=p.store, segment=p.name, offset=p.start + at, code=code, message=msg,
                                size=size)
    finally:
        seg.close()
