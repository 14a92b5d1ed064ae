"""``rmqstore dump commitlog|consumequeue|cqext|index|checkpoint|store``."""

from __future__ import annotations

import sys
from itertools import islice
from typing import Optional

import typer

from rmqstore_cli.formats.fast import REASON_TEXT, STOP_BAD_MAGIC, STOP_BAD_SIZE, STOP_INVALID, STOP_TORN
from rmqstore_cli.formats.extaddr import decorate
from rmqstore_cli.formats.message import BODY_MODES, render_body
from rmqstore_cli.engine.query.queuerows import EXT_FIELDS, queue_unit_rows, select_queues
from rmqstore_cli.engine.query.stats import rocksdb_summary
from rmqstore_cli.engine.log.commitlog import ScanResult
from rmqstore_cli.engine.config.offsets import group_offsets
from rmqstore_cli.engine.parallel import default_jobs
from rmqstore_cli.engine.errors import EXIT_CORRUPT, EXIT_FINDINGS, NotFoundError, StoreCorruptError, UsageError

from .common import (Geometry, JsonOpt, SinceOpt, StoreArg, UntilOpt, geometry_options, open_store,
                     parse_time_option)
from .output import Output, handle_errors, iso_ms, progress, stderr, stdout, warn

dump_app = typer.Typer(help="Print the records of one part of a store (read-only).", no_args_is_help=True)

MSG_COLUMNS = [
    ("offset", "offset"), ("storeSize", "size"), ("topic", "topic"), ("queueId", "q"), ("queueOffset", "qoff"),
    ("storeTimestamp", "store time"), ("sysFlag", "sys"), ("msgId", "msgId"), ("propertiesRaw", "properties"),
]


@dump_app.command("commitlog")
@handle_errors
@geometry_options
def dump_commitlog(
    store: str = StoreArg,
    topic: Optional[str] = typer.Option(None, "--topic", help="Only records of this topic."),
    queue: Optional[int] = typer.Option(None, "--queue", help="Only records of this queue id."),
    from_: Optional[int] = typer.Option(None, "--from", help="First physical offset (inclusive)."),
    to: Optional[int] = typer.Option(None, "--to", help="Last physical offset (exclusive)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many records."),
    since: Optional[str] = SinceOpt,
    until: Optional[str] = UntilOpt,
    body: str = typer.Option("none", "--body", help="none|hex|text|base64 (--format parquet: none leaves the body "
                             "column out, anything else keeps it)"),
    fmt: Optional[str] = typer.Option(None, "--format", help="jsonl|csv|parquet: write the records to --out "
                                      "(Parquet: the Spark export's schema and column names)."),
    out_path: Optional[str] = typer.Option(None, "--out", help="With --format: the file to write."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep reading as records are appended (tail -f; "
                                "read-only, the lock is not taken; from the end, or from --from/--since). Ctrl-C stops."),
    json_: bool = JsonOpt,
    jobs: int = typer.Option(1, "-j", "--jobs", min=0, help="With --json or --format: worker processes (0: one per "
                             "core) that render whole segments; this process writes their text out in log order. "
                             "Same output as -j 1."),
    geometry: Geometry = None,
):
    """Every commitlog record in order, up to the end of valid data."""
    _check_body(body)
    since_ms, until_ms = parse_time_option(since, "--since"), parse_time_option(until, "--until")
    if (fmt is None) != (out_path is None):
        raise UsageError("--format and --out go together")
    if follow and (fmt is not None or to is not None or until is not None):
        raise UsageError("--follow reads on forever: it does not go with --format, --to or --until")
    if jobs != 1 and (follow or (fmt is None and not json_)):
        raise UsageError("-j/--jobs goes with --json or --format (not with --follow or the table)")
    jobs = jobs or default_jobs()
    st = open_store(store, geometry, command="dump commitlog")
    if follow:
        _follow(st, topic, queue, from_, since_ms, limit, body, json_)
        return
    if fmt is not None:
        _export(st, fmt, out_path, body, topic, queue, from_, to, since_ms, until_ms, limit, json_, jobs)
        return
    if json_:  # columnar encoder: the same bytes as json_line(render_body(record)) per record
        with st, progress("reading commitlog", sum(seg.size for seg in st.commitlog.segments)) as advance:
            res = ScanResult()
            out = Output(True)
            for data, _, walked in _json_blocks(st.commitlog, from_, to, body, topic, queue, limit, res, since_ms,
                                                until_ms, jobs):
                try:
                    out.write_encoded(data)
                except AttributeError:  # stdout is not UTF-8: written line by line from bytes
                    out.write_encoded(bytes(data))
                advance(walked)
        _report_stop(res)
        return
    with st, progress("reading commitlog", sum(seg.size for seg in st.commitlog.segments)) as advance:
        res = ScanResult()
        recs = _advancing(st.commitlog.records(start=from_, end=to, with_body=body != "none", result=res,
                                               since=since_ms, until=until_ms), advance)
        if topic is not None:
            recs = (m for m in recs if m["topic"] == topic)
        if queue is not None:
            recs = (m for m in recs if m["queueId"] == queue)
        if limit is not None:
            recs = islice(recs, limit)
        Output(json_).table((render_body(m, body) for m in recs),
                            MSG_COLUMNS + ([("bodyText", "body")] if body == "text" else []), title=f"commitlog of {st.root}")
    _report_stop(res)


def _json_blocks(cl, from_, to, body, topic, queue, limit, res, since_ms, until_ms, jobs):
    """(text, records, log bytes walked) of the listing: one walk, or ``jobs`` workers (engine.query.dumpjobs)."""
    from rmqstore_cli.engine.log.commitlog import RecordFilter
    from rmqstore_cli.engine.query import dumpjobs

    sel = RecordFilter(start=from_, end=to, topic=topic, queue=queue, since=since_ms, until=until_ms, limit=limit)
    return dumpjobs.json_pieces(cl, sel, body, jobs, res)


def _export(st, fmt, out_path, body, topic, queue, from_, to, since_ms, until_ms, limit, json_, jobs=1) -> None:
    from rmqstore_cli.engine.query.export import export_commitlog

    with st, progress(f"writing {fmt}", sum(seg.size for seg in st.commitlog.segments)) as advance:
        res = export_commitlog(st, out_path, fmt, body=body != "none", json_body=body, topic=topic, queue=queue,
                               start=from_, end=to, since=since_ms, until=until_ms, limit=limit, progress=advance,
                               jobs=jobs)
    Output(json_).kv(res.as_json(), title=f"dump commitlog --format {fmt}")
    _report_stop(res.scan)


def _follow(st, topic, queue, from_, since_ms, limit, body, json_) -> None:
    from rmqstore_cli.engine.log.commitlog import RecordFilter
    from rmqstore_cli.engine.query.follow import Follower
    from rmqstore_cli.engine.query.follow_dledger import DLedgerFollower

    start = from_
    if since_ms is not None:
        start = st.commitlog.time_window(since_ms, None)[0]
    follower = (DLedgerFollower if st.is_dledger else Follower)(st.commitlog, start)
    sel = RecordFilter(start=from_, topic=topic, queue=queue, since=since_ms, limit=limit)
    out = sys.stdout
    try:
        if json_:
            for data in follower.records_json(sel, body):
                out.flush()
                out.buffer.write(data)
                out.buffer.flush()
        else:
            for msgs in follower.records(sel, body != "none"):
                for m in msgs:
                    out.write(_follow_line(render_body(m, body)) + "\n")
                out.flush()
    except KeyboardInterrupt:
        return
    except BrokenPipeError:  # | head: the reader is gone
        sys.stdout = None  # type: ignore[assignment]
    finally:
        follower.close()


def _follow_line(m: dict) -> str:
    line = (f"{m['offset']}  {m['storeSize']}  {iso_ms(m['storeTimestamp'])}  {m['topic']}  q{m['queueId']}"
            f"  qoff {m['queueOffset']}  {m.get('msgId', '')}  {(m.get('propertiesRaw') or '').replace(chr(1), '=').replace(chr(2), ' ')}")
    if "bodyText" in m:
        line += f"  body {m['bodyText']!r}"
    elif "bodyHex" in m:
        line += f"  body {m['bodyHex']}"
    elif "bodyBase64" in m:
        line += f"  body {m['bodyBase64']}"
    return line


def _check_body(body: str) -> None:
    if body not in BODY_MODES:
        raise UsageError(f"--body must be one of {', '.join(BODY_MODES)}")


def _advancing(recs, advance):
    for m in recs:
        advance(m["storeSize"])
        yield m


def _report_stop(res) -> None:
    """Records end where the broker's walk ends; say so when that is not a clean end of data.

    ``res.stop`` stays None when --to/--limit ended the listing before the end of the log.
    """
    stop = res.stop
    if getattr(res, "skipped", None):
        warn(f"{len(res.skipped)} damaged message(s) left out (DLedger entries the broker keeps serving; `verify` names "
             f"them): at {', '.join(str(o) for o, _ in res.skipped[:10])}")
    if stop is None or stop.clean:
        if getattr(res, "skipped", None):
            raise typer.Exit(EXIT_FINDINGS)
        return
    if res.records == 0 and stop.offset == (stop.segment.start if stop.segment else 0):
        raise StoreCorruptError(f"no readable record: {_stop_text(stop)}")
    warn(f"the log stops early: {_stop_text(stop)}")
    raise typer.Exit(EXIT_CORRUPT)


def _stop_text(stop) -> str:
    where = f"{stop.segment.path} at position {stop.position} (offset {stop.offset})" if stop.segment else f"offset {stop.offset}"
    what = stop.text or REASON_TEXT.get(stop.reason) if stop.kind == STOP_INVALID else {
        STOP_TORN: f"a record header claims {stop.size} bytes, past the end of the file",
        STOP_BAD_MAGIC: f"bytes that are not a record (magic 0x{stop.magic & 0xFFFFFFFF:08X})",
        STOP_BAD_SIZE: f"TOTALSIZE {stop.size} is too small for a record",
    }.get(stop.kind, stop.kind)
    return f"{what} in {where}"



CQ_COLUMNS = [("topic", "topic"), ("queueId", "q"), ("queueOffset", "qoff"), ("phyOffset", "phyOffset"), ("size", "size"),
              ("tagsCode", "tagsCode"), ("ext", "ext"), ("batchSize", "batch")]


@dump_app.command("consumequeue")
@handle_errors
@geometry_options
def dump_consumequeue(
    store: str = StoreArg,
    topic: Optional[str] = typer.Option(None, "--topic", help="Only this topic."),
    queue: Optional[int] = typer.Option(None, "--queue", help="Only this queue id."),
    from_: Optional[int] = typer.Option(None, "--from", help="First queue offset (inclusive)."),
    to: Optional[int] = typer.Option(None, "--to", help="Last queue offset (exclusive)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many units."),
    since: Optional[str] = SinceOpt,
    until: Optional[str] = UntilOpt,
    msg: bool = typer.Option(False, "--msg", help="Add the commitlog record each unit points at (as 'msg')."),
    body: str = typer.Option("none", "--body", help="With --msg: none|hex|text|base64"),
    group: Optional[str] = typer.Option(None, "--group", help="A consumer group's backlog: each queue it has a committed "
                                        "offset for (config/consumerOffset.json), from that offset to the queue's end: "
                                        "the units the group has not consumed yet."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Consume queue units (phyOffset, size, tagsCode; the ext unit when tagsCode is an ext address), then the
    batch consume queues' units (batchconsumequeue/: queueOffset = msgBaseOffset, batchSize, storeTime)."""
    _check_body(body)
    since_ms, until_ms = parse_time_option(since, "--since"), parse_time_option(until, "--until")
    st = open_store(store, geometry, command="dump consumequeue")
    with st:
        starts = _backlog_starts(st, group, topic, queue) if group is not None else None
        rows = queue_unit_rows(st, topic, queue, from_, to, msg, body, since_ms, until_ms, starts=starts)
        if group is not None:
            rows = ({"group": group, **r} for r in rows)
        if limit is not None:
            rows = islice(rows, limit)
        cols = CQ_COLUMNS if st.rocksdb is None else CQ_COLUMNS[:-1] + [("storeTime", "storeTime")]
        if msg and not json_:  # a whole message per cell is unreadable: show its id and properties
            cols = CQ_COLUMNS + [("msgId", "msgId"), ("propertiesRaw", "properties")]
            rows = ({**r, **{k: (r.get("msg") or {}).get(k) for k in ("msgId", "propertiesRaw")}} for r in rows)
        title = f"consume queues of {st.root}" if group is None else f"backlog of group {group} in {st.root}"
        n = Output(json_).table(rows, cols, title=title)
        if group is not None and not json_:
            stderr.print(f"rmqstore: group {group}: {n} unit(s) not consumed yet in {len(starts)} queue(s)"
                         + (f" (first {limit} shown)" if limit is not None and n == limit else ""), markup=False)


def _backlog_starts(st, group: str, topic, queue) -> dict[tuple[str, int], int]:
    """{(topic, queueId): first queue offset not consumed} for ``group``'s queues on disk (its committed offsets)."""
    committed = group_offsets(st, group)
    on_disk = set(st.queues())
    starts = {k: v for k, v in committed.items() if (topic is None or k[0] == topic) and (queue is None or k[1] == queue)}
    for t, q in sorted(set(starts) - on_disk):
        warn(f"group {group}: {t} queue {q} has a committed offset ({starts.pop((t, q))}) but no consume queue on disk")
    if not starts and (topic is not None or queue is not None):
        raise NotFoundError(f"group {group!r} has no committed offset for topic {topic!r} queue {queue}")
    return starts


EXT_COLUMNS = [("topic", "topic"), ("queueId", "q"), ("offset", "offset"), ("address", "address"), ("size", "size"),
               ("tagsCode", "tagsCode"), ("msgStoreTime", "msgStoreTime"), ("bitMapSize", "bitMapSize"),
               ("filterBitMapHex", "bitmap")]


@dump_app.command("cqext")
@handle_errors
@geometry_options
def dump_cqext(
    store: str = StoreArg,
    topic: Optional[str] = typer.Option(None, "--topic", help="Only this topic."),
    queue: Optional[int] = typer.Option(None, "--queue", help="Only this queue id."),
    from_: Optional[int] = typer.Option(None, "--from", help="First ext offset (inclusive, undecorated)."),
    to: Optional[int] = typer.Option(None, "--to", help="Last ext offset (exclusive)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many units."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """ConsumeQueueExt units in file order (consumequeue_ext/, only with enableConsumeQueueExt)."""
    st = open_store(store, geometry, command="dump cqext")
    with st:
        def rows():
            for t, q in select_queues(st, topic, queue, "consumequeue_ext"):
                for unit in st.ext(t, q).units():
                    off = unit["offset"]
                    if (from_ is not None and off < from_) or (to is not None and off >= to):
                        continue
                    yield {"topic": t, "queueId": q, "offset": off, "address": decorate(off), **{k: unit[k] for k in EXT_FIELDS}}
        it = rows()
        if limit is not None:
            it = islice(it, limit)
        Output(json_).table(it, EXT_COLUMNS, title=f"consume queue ext of {st.root}")


INDEX_COLUMNS = [("name", "file"), ("size", "size"), ("beginTimestamp", "beginTimestamp"), ("endTimestamp", "endTimestamp"),
                 ("beginPhyOffset", "beginPhyOffset"), ("endPhyOffset", "endPhyOffset"), ("hashSlotCount", "hashSlotCount"),
                 ("indexCount", "indexCount")]
ENTRY_COLUMNS = [("file", "file"), ("entry", "entry"), ("keyHash", "keyHash"), ("slot", "slot"), ("phyOffset", "phyOffset"),
                 ("timeDiff", "timeDiff"), ("prevIndex", "prevIndex"), ("slotHead", "slot head")]


@dump_app.command("index")
@handle_errors
@geometry_options
def dump_index(
    store: str = StoreArg,
    entries: bool = typer.Option(False, "--entries", help="List the entries (with their hash slot) instead of the headers."),
    file: Optional[str] = typer.Option(None, "--file", help="Only this index file (its 17-digit name)."),
    from_: Optional[int] = typer.Option(None, "--from", help="With --entries: first physical offset (inclusive)."),
    to: Optional[int] = typer.Option(None, "--to", help="With --entries: last physical offset (exclusive)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many rows."),
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """Index file headers (the broker's field names), or with --entries every entry and its slot."""
    st = open_store(store, geometry, command="dump index")
    with st:
        files = [f for f in st.index.files if file is None or f.name == file]
        if file is not None and not files:
            raise NotFoundError(f"no index file named {file!r}")
        rows = _entry_rows(files, from_, to) if entries else (
            {"name": f.name, "size": f.size, **f.header().as_json()} for f in files)
        if limit is not None:
            rows = islice(rows, limit)
        Output(json_).table(rows, ENTRY_COLUMNS if entries else INDEX_COLUMNS, title=f"index files of {st.root}")


def _entry_rows(files, from_, to):
    for f in files:
        if not f.complete:
            warn(f"{f.path}: {f.size} bytes, expected {f.expected_size}; skipped (give --index-slots/--index-entries?)")
            continue
        h = f.header()
        count = min(max(h.indexCount, 1), f.entries)
        ent = f.entry_table(count)
        heads = f.slot_table()
        for n in range(1, count):
            kh, phy, diff, prev = (int(ent[n][k]) for k in ("keyHash", "phyOffset", "timeDiff", "prevIndex"))
            if (from_ is not None and phy < from_) or (to is not None and phy >= to):
                continue
            slot = kh % f.slots if kh >= 0 else None
            yield {"file": f.name, "entry": n, "keyHash": kh, "slot": slot, "phyOffset": phy, "timeDiff": diff,
                   "prevIndex": prev, "slotHead": slot is not None and int(heads[slot]) == n}


@dump_app.command("checkpoint")
@handle_errors
@geometry_options(only=("config", "broker_version"))
def dump_checkpoint(
    store: str = StoreArg,
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """The checkpoint file's fields (the broker's StoreCheckpoint names) and derived minimum timestamps."""
    st = open_store(store, geometry, command="dump checkpoint")
    with st:
        Output(json_).kv(_checkpoint_obj(st), title=f"checkpoint of {st.root}")


def _checkpoint_obj(st) -> dict:
    cp = st.checkpoint()
    d = cp.as_json(5)
    if cp.exists:
        d["hex24"] = st.checkpoint_head(24).hex()
    return d


@dump_app.command("store")
@handle_errors
@geometry_options
def dump_store(
    store: str = StoreArg,
    json_: bool = JsonOpt,
    geometry: Geometry = None,
):
    """One-screen summary: version, geometry (inferred or given), files, offsets, queues, index, checkpoint, abort/lock."""
    st = open_store(store, geometry, command="dump store")
    with st:
        with progress("scanning commitlog", sum(seg.size for seg in st.commitlog.segments)) as advance:
            res = ScanResult()
            for chunk in st.commitlog.scan(check_crc=False, result=res, stop_at_invalid=False):
                advance(int(chunk.headers.totalSize.sum()))
        obj = _store_summary(st, res)
        # the start-up plan follows file consume queues; a RocksDB store shows its checkpoint instead
        obj["startupCost"] = _startup_cost(st) if st.rocksdb is None else {}
        from .cleanup_view import cleanup_lines, next_cleanup

        obj["nextCleanup"] = next_cleanup(st, geometry)
        out = Output(json_)
        if json_:
            out.line(obj)
            return
        flat = {k: v for k, v in obj.items() if k not in ("queues", "indexFiles", "geometry", "commitlogFiles",
                                                           "startupCost", "nextCleanup")}
        flat["commitlogFiles"] = f"{len(obj['commitlogFiles'])} ({obj['commitlogFiles'][0]} .. {obj['commitlogFiles'][-1]})" \
            if obj["commitlogFiles"] else "none"
        for k, g in obj["geometry"].items():
            flat[k] = f"{g['value']}  ({g['source']})"
        out.kv(flat, title=f"store {st.root}")
        out.table(obj["queues"], [("topic", "topic"), ("queueId", "q"), ("minOffset", "min"), ("maxOffset", "max"),
                                  ("maxPhysicOffset", "maxPhysicOffset"), ("files", "files")], title="consume queues")
        out.table(obj["indexFiles"], INDEX_COLUMNS, title="index files")
        from .explain_view import startup_lines

        for line in startup_lines(obj["startupCost"]) + cleanup_lines(obj["nextCleanup"]):
            stdout.print(line, markup=False, highlight=False, soft_wrap=True)


def _startup_cost(st) -> dict:
    """The broker's next start on this store (engine.startup via the recovery plan); {} if it cannot be planned."""
    from rmqstore_cli.engine.errors import RmqStoreError
    from rmqstore_cli.engine.repair.recovery import plan_recovery

    if st.is_dledger:
        return {}  # the classic recovery plan does not describe a DLedger start (DLedger's own recovery does)
    try:
        return plan_recovery(st).startup_cost or {}
    except RmqStoreError as e:
        return {"error": str(e)}


def _store_summary(st, res) -> dict:
    cfg = st.config
    cl = st.commitlog
    geometry = {}
    for key in ("version", "mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue", "enableConsumeQueueExt",
                "mappedFileSizeConsumeQueueExt", "maxHashSlotNum", "maxIndexNum"):
        src = "given" if key in cfg.explicit else next(
            (f"inferred: {why}" for k, why in cfg.inferred.items() if key in k.split("/")), "default")
        geometry[key] = {"value": getattr(cfg, key), "source": src}
    queues = []
    for t, q in st.queues():
        cq = st.queue(t, q)
        if st.rocksdb is not None:  # the broker's min/max, no unit loaded
            lo, hi, end = cq.bounds()
            queues.append({"topic": t, "queueId": q, "minOffset": lo, "maxOffset": hi,
                           "maxPhysicOffset": end if end is not None else -1, "files": None})
            continue
        u = cq.units()
        queues.append({"topic": t, "queueId": q, "minOffset": u.min_offset, "maxOffset": u.end_offset,
                       "maxPhysicOffset": int(u.phy[-1] + u.size[-1]) if len(u.phy) else -1, "files": len(cq.segments)})
    for t, q in st.batch_queues():
        bcq = st.batch_queue(t, q)
        lo, hi, last_phy = bcq.bounds()  # offsets in messages; the broker keeps the last record's start
        queues.append({"topic": t, "queueId": q, "queueType": "BatchCQ", "minOffset": lo, "maxOffset": hi,
                       "maxPhysicOffset": last_phy, "files": len(bcq.segments)})
    stop = res.stop
    lock = st.lock_state()
    extra = {}
    if st.rocksdb is not None:
        extra["rocksdbConsumeQueue"] = rocksdb_summary(st, stop.offset if stop else 0)
    summary = {
        "root": st.root,
        "version": cfg.version,
        "geometry": geometry,
        "commitlogFiles": [f"{s.name}:{s.size}" for s in cl.segments],
        "minPhyOffset": cl.min_offset,
        "maxPhyOffset": stop.offset if stop else 0,
        "endKind": stop.kind if stop else None,
        "records": res.records,
        "blanks": len(res.blanks),
        "topics": sorted({q["topic"] for q in queues}),
        "queues": queues,
        "indexFiles": [{"name": f.name, "size": f.size, **f.header().as_json()} for f in st.index.files],
        "checkpoint": _checkpoint_obj(st),
        "abortExists": st.abort_exists,
        "lastExitOK": not st.abort_exists,
        "lock": {"exists": lock.exists, "held": lock.held, "detail": lock.detail},
        **({"dledger": _dledger_obj(st)} if st.is_dledger else {}),
    }
    return summary | extra


def _dledger_obj(st) -> dict:
    from rmqstore_cli.engine.query.dledger import state_rows

    info, cp, ct = state_rows(st)
    return {"folder": info["directory"], "indexFiles": info["indexFiles"], "indexFileSize": info["indexFileSize"],
            "committedIndex": cp["committedIndex"], "endIndex": cp["endIndex"], "currTerm": ct["currTerm"],
            "voteLeader": ct["voteLeader"]}


def register(app: typer.Typer, panel: str | None = None) -> None:
    from . import dledger_cmd

    if not any(c.name == "dledger" for c in dump_app.registered_commands):  # once, however many roots
        dledger_cmd.register(dump_app)
    app.add_typer(dump_app, name="dump", rich_help_panel=panel)


def _register_timer() -> None:
    from .dump_timer import dump_timer

    dump_app.command("timer")(dump_timer)


_register_timer()
