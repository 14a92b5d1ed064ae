"""Reading past corruption (no broker equivalent: the broker stops at the first bad record).

After an invalid record the scan resynchronises on the next position where a record is
self-consistent (magic, TOTALSIZE equal to the length its fields imply, PHYSICALOFFSET equal
to its position, body CRC), walks on from there, and reports every byte range it skipped.
The source store is only read.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from typing import Iterator

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.message import decode_message, render_body

from ..log.walk import broker_walk, resync
from .fileops import last_nonzero


@dataclass
class SalvageReport:
    skipped: list = field(default_factory=list)  # [start, end, reason]
    rescued: dict = field(default_factory=dict)  # "topic-queueId" -> count
    records: int = 0
    renumbered: int = 0

    def as_json(self) -> dict:
        return {"type": "lost-and-found", "records": self.records, "skippedRanges": self.skipped,
                "skippedBytes": sum(e - s for s, e, _ in self.skipped), "rescuedPerQueue": self.rescued,
                "queueOffsetsRenumbered": self.renumbered}


class _View:
    """A segment seen from ``pos`` on (records keep their absolute offsets)."""

    def __init__(self, seg, pos: int):
        self.seg, self.pos = seg, pos
        self.start, self.size, self.name, self.path = seg.start + pos, seg.size - pos, seg.name, seg.path

    def buffer(self):
        return memoryview(self.seg.buffer())[self.pos:]


# Record offsets gathered before the walk pauses to hand them on: a broker's 1 GiB segment of
# small messages holds millions of records, whose offsets must not be collected all at once.
PAUSE_RECORDS = 1 << 16
WALK_CHUNK = 8192  # records per kernel call of the walk


def scan(store, version: int, report: SalvageReport, start: int = 0) -> Iterator[tuple]:
    """(segment, position) of every valid record from ``start``, skipping damage; fills ``report``."""
    if getattr(store.commitlog, "is_dledger", False):
        from .dledgersalvage import scan_dledger

        yield from scan_dledger(store, report, start)
        return
    for seg in store.commitlog.segments.segments:
        yield from scan_segment(store, seg, version, report, start)


def scan_segment(store, seg, version: int, report: SalvageReport, start: int = 0, pause: int | None = None,
                 chunk: int | None = None) -> Iterator[tuple]:
    """:func:`scan` within one classic segment (records never cross one, so segments are independent).

    The walk runs in stretches of at most ~``pause`` records (``chunk`` per kernel call): the record checks do not
    depend on the records before, so resuming after the last valid record handed on walks exactly as one walk
    (a caller that stops early asks for short stretches: the walk does not run far ahead of what is taken)."""
    if seg.start + seg.size <= start or not seg.size:
        return
    pause = PAUSE_RECORDS if pause is None else pause  # the module's settings at call time
    chunk = WALK_CHUNK if chunk is None else chunk
    cfg = store.config
    pos = max(0, start - seg.start)
    while pos < seg.size:
        starts: list = []  # record offsets (a numpy array per chunk) since the last pause

        def sink(s, _b, h, starts=starts):
            starts.append(h.offsets + s)
            return sum(len(a) for a in starts) >= pause

        stop = broker_walk([_View(seg, pos)], cfg, max(version, 5), 0, True, sink, chunk)
        for part in starts:
            for p in part.tolist():
                yield seg, p - seg.start
        if stop.kind == fast.STOP_CHUNK:  # paused: walk on from the next record
            pos = stop.offset - seg.start
            continue
        if stop.kind == fast.STOP_BLANK:
            return
        bad = stop.offset - seg.start
        nxt = resync(seg.buffer(), bad + 1, seg.size, seg.start, max(version, 5))
        if nxt is None:
            end = last_nonzero(seg.path, bad)
            if end > bad:
                report.skipped.append([seg.start + bad, seg.start + end, stop.reason])
            return
        report.skipped.append([seg.start + bad, seg.start + nxt, stop.reason])
        pos = nxt


def records(store, version: int, report: SalvageReport, start: int = 0, since: int | None = None,
            until: int | None = None) -> Iterator[dict]:
    """Decoded records (``dump commitlog --json --body hex`` shape) of everything rescued; with
    ``since``/``until`` (epoch ms, inclusive) only those stored in that range."""
    bounds = time_bounds(store, start, since, until)
    if bounds is None:
        return
    start, end, lo, hi = bounds
    for seg, pos in scan(store, version, report, start):
        if end is not None and seg.start + pos >= end:
            return
        msg = rescue(seg, pos, lo, hi, report)
        if msg is not None:
            yield msg


def time_bounds(store, start: int, since: int | None, until: int | None) -> tuple | None:
    """(start offset, end offset or None, lowest and highest store time kept) of a salvage from ``start`` within
    ``since``/``until``; None when no record was stored in that range."""
    end = None
    if since is not None or until is not None:
        first, end, any_ = store.commitlog.time_window(since, until)
        if not any_:
            return None
        if first is not None:  # from the start of its segment, so damage before it is still resynced
            seg = store.commitlog.segments.find(first)
            start = max(start, seg.start if seg is not None else first)
    lo = -(1 << 63) if since is None else since
    hi = (1 << 63) - 1 if until is None else until
    return start, end, lo, hi


def rescue(seg, pos: int, lo: int, hi: int, report: SalvageReport) -> dict | None:
    """The record at ``pos`` of ``seg`` decoded and counted in ``report``; None when stored outside [lo, hi]."""
    msg = decode_message(seg.buffer(), pos, with_body=True)
    msg["offset"] = seg.start + pos
    if not lo <= msg["storeTimestamp"] <= hi:
        return None
    key = f"{msg['topic']}-{msg['queueId']}"
    report.rescued[key] = report.rescued.get(key, 0) + 1
    report.records += 1
    return msg


def write_lines(store, version: int, f, report: SalvageReport, start: int, since: int | None,
                until: int | None) -> None:
    """The rescued records as ``--jsonl`` lines into the binary file ``f``, walked and rendered in this process."""
    for msg in records(store, version, report, start, since, until):
        f.write(json_line(msg))


def json_line(msg: dict) -> bytes:
    """A rescued record as one line of the ``--jsonl`` file (UTF-8)."""
    return (json.dumps(render_body(msg, "hex"), ensure_ascii=False, separators=(",", ":"), default=_js) + "\n").encode()


def to_jsonl(store, version: int, path: str, start: int = 0, since: int | None = None,
             until: int | None = None, write=None) -> SalvageReport:
    """Every rescued record into the JSON Lines file ``path``. ``write(store, version, f, report, start, since,
    until)`` writes the lines (default: this process; ``salvage -j``: :func:`.salvagejobs.to_jsonl_jobs`)."""
    rep = SalvageReport()
    with open(path, "wb") as f:
        (write or write_lines)(store, version, f, rep, start, since, until)
        f.flush()
        if stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a pipe or /dev/null cannot be synced (EINVAL)
            os.fsync(f.fileno())
    return rep


def _js(o):
    if isinstance(o, (bytes, bytearray, memoryview)):
        return bytes(o).hex()
    raise TypeError(type(o).__name__)


def to_store(store, version: int, new_root: str, index_namer=None) -> SalvageReport:
    """Append every rescued record to a new store (queue offsets, store times and properties kept)."""
    from ..log.appender import Appender
    from ..log.messages import InputError, MessageBuilder

    if os.path.exists(new_root) and os.listdir(new_root):
        from ..errors import UsageError

        raise UsageError(f"{new_root} is not empty; salvage writes into a new store only")
    if os.path.realpath(new_root).startswith(os.path.realpath(store.root) + os.sep):
        from ..errors import UsageError

        raise UsageError("the new store cannot be inside the source store")
    cfg = store.config.with_(version=version)
    rep = SalvageReport()
    builder = MessageBuilder(cfg)
    app = Appender(new_root, cfg, index_namer=index_namer, keep_store_times=True).open()  # the source's times, as they are
    try:
        for msg in records(store, version, rep):
            obj = render_body(msg, "hex")
            qoff = obj["queueOffset"]
            try:
                m = builder.from_json({k: v for k, v in obj.items() if k in _INPUT})
            except InputError as e:
                # e.g. a topic that names a path: the record cannot be stored; skip it, say why
                rep.skipped.append([msg["offset"], msg["offset"] + msg["storeSize"], f"not stored: {e}"])
                continue
            key = (m.topic, m.queue_id)
            tx = m.sysflag & 0xC
            if tx in (0x0, 0x8):
                if key not in app.table and app.dispatcher.next_queue_offset(*key) == 0:
                    app.table[key] = qoff  # a queue starting past 0 keeps its offsets (pre-blank fill)
                elif app.next_queue_offset(*key) != qoff:
                    rep.renumbered += 1
            app.put([m])
    finally:
        app.close()
    return rep


_INPUT = {"topic", "queueId", "flag", "sysFlag", "bornTimestamp", "bornHost", "storeTimestamp", "storeHost",
          "reconsumeTimes", "preparedTransactionOffset", "bodyHex", "propertiesRaw", "properties"}


def salvage_ranges_to_jsonl(store, plan, backup_dir: str) -> SalvageReport:
    """recover --keep-valid-after: copy the records after the first bad one before the cut."""
    s = plan.salvage
    return to_jsonl(store, plan.version, os.path.join(backup_dir, "salvaged.jsonl"), start=s["firstValidAfter"])
