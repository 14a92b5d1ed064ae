"""``rmqstore spark rebuild``: consume queues and index files computed in parallel.

Consume queues: one task per topic/queue replays the broker's dispatch (types NOT and COMMIT,
§14.1) through the engine's ``ConsumeQueueWriter`` (and ``ConsumeQueueExtWriter`` when the
store uses ext files), so pre-blank filling and file roll-over follow the same code as the
single-process writers.

Index: the broker fills index files strictly in dispatch order (§10.4, §10.6), so which
file an entry lands in depends only on how many keys came before it. A first pass counts
the keys of every record (UNIQ_KEY, then each KEYS token; ROLLBACK records are not
indexed), a prefix sum over the partition counts gives every entry its global number, and
then each index file is built by its own task: entry number ``k`` goes to file
``k // (maxIndexNum - 1)``; the only thing a file needs from its predecessor is the end
timestamp it inherits (the §10.4 quirk for the first entry's timeDiff).
"""

from __future__ import annotations

import os

import numpy as np

from rmqstore_cli.formats import fast
from rmqstore_cli.engine.errors import UsageError

from .common import read_records

def reader_options(overrides: dict | None, config_file: str | None) -> dict:
    o = overrides or {}
    return {"brokerVersion": o.get("version"), "commitlogFileSize": o.get("mappedFileSizeCommitLog"), "config": config_file}


def dispatch_end(spark, df, st) -> int:
    """Where the broker's reput would stop: the first finding, or the first segment not closed by a BLANK."""
    from pyspark.sql import functions as F

    from .datasource import plan_segment

    end = None
    cl = st.commitlog
    for seg in cl.segments:
        tail = plan_segment(st.root, seg, cl.segments.file_size, st.config, 1 << 62)[-1]
        if tail.tail_kind != fast.STOP_BLANK:
            end = seg.start + tail.end
            break
    first_bad = df.filter(F.col("finding").isNotNull()).agg(F.min("commitLogOffset")).collect()[0][0]
    if first_bad is not None:
        end = first_bad if end is None else min(end, first_bad)
    return end if end is not None else (1 << 63) - 1


# --- consume queues -------------------------------------------------------------------


def _write_queue_fn(out_root: str, cfg):
    def write(table):
        import pyarrow as pa

        from rmqstore_cli.formats.extaddr import is_ext_addr
        from rmqstore_cli.formats.tags import TagsCodeError, tags_code
        from rmqstore_cli.engine.derived.cqwriter import ConsumeQueueExtWriter, ConsumeQueueWriter

        t = table.sort_by("commitLogOffset")
        topic = t.column("topic")[0].as_py()
        qid = t.column("queueId")[0].as_py()
        cq = ConsumeQueueWriter(out_root, topic, qid, cfg)
        ext = ConsumeQueueExtWriter(out_root, topic, qid, cfg) if cfg.enableConsumeQueueExt else None
        delays = cfg.delay_table
        units = skipped = 0
        cols = [t.column(c).to_pylist() for c in ("commitLogOffset", "storeSize", "queueOffset", "ts", "tags", "delay")]
        try:
            for phy, size, qoff, ts, tags, delay in zip(*cols):
                props = {"TAGS": tags} if tags else {}
                if delay is not None:
                    props["DELAY"] = delay
                try:
                    code = tags_code(topic, props, ts, delays)
                except TagsCodeError:
                    skipped += 1  # the broker's dispatch rejects the record
                    continue
                if ext is not None and cq.accepts(phy, size, qoff):
                    addr = ext.put(code, ts)
                    if is_ext_addr(addr):
                        code = addr
                if cq.put(phy, size, code, qoff):
                    units += 1
                else:
                    skipped += 1
            files = len(cq.files.created)
        finally:
            cq.close(flush=True)
            if ext is not None:
                ext.close(flush=True)
        return pa.table({"topic": [topic], "queueId": pa.array([qid], pa.int32()), "units": pa.array([units], pa.int64()),
                         "skipped": pa.array([skipped], pa.int64()), "files": pa.array([files], pa.int32())})

    return write


def rebuild_consumequeue(spark, st, out_root: str, *, overrides=None, config_file=None) -> dict:
    from pyspark.sql import functions as F

    df = read_records(spark, [st.root], body=False, options=reader_options(overrides, config_file))
    end = dispatch_end(spark, df, st)
    sel = (df.filter(F.col("finding").isNull() & (F.col("commitLogOffset") < end)
                     & F.col("transactionType").isin("normal", "commit"))
           .select("topic", "queueId", "queueOffset", "commitLogOffset", "storeSize",
                   (F.unix_micros("storeTimestamp") / 1000).cast("long").alias("ts"), "tags",
                   F.col("properties").getItem("DELAY").alias("delay")))
    rows = (sel.groupBy("topic", "queueId")
            .applyInArrow(_write_queue_fn(out_root, st.config),
                          "topic string, queueId int, units bigint, skipped bigint, files int")
            .collect())
    # No orderBy before collect: its sampling pass would run the writing tasks twice.
    queues = sorted((r.asDict() for r in rows), key=lambda q: (q["topic"], q["queueId"]))
    return {"what": "consumequeue", "out": out_root, "queues": queues, "units": sum(q["units"] for q in queues),
            "files": sum(q["files"] for q in queues), "dispatchEnd": end}


# --- index ----------------------------------------------------------------------------


def _explode_keys(batches):
    """Per record: one (phy, ts, keyHash) row per index key, in the broker's key order."""
    import pyarrow as pa

    from rmqstore_cli.formats.hashing import index_key, index_key_hash

    for b in batches:
        phy, ts, hashes = [], [], []
        cols = [b.column(c).to_pylist() for c in ("commitLogOffset", "ts", "topic", "uniqKey", "keys")]
        for p, t, topic, uniq, keys in zip(*cols):
            ks = ([uniq] if uniq else []) + (keys or [])
            for k in ks:
                phy.append(p)
                ts.append(t)
                hashes.append(index_key_hash(index_key(topic, k)))
        yield pa.RecordBatch.from_arrays([pa.array(phy, pa.int64()), pa.array(ts, pa.int64()), pa.array(hashes, pa.int32())],
                                         names=["phy", "ts", "keyHash"])


def write_index_file(path: str, key_hash: np.ndarray, phy: np.ndarray, ts: np.ndarray, inherited_ts: int,
                     inherited_phy: int, slots: int, entries: int) -> None:
    """One index file whose entries 1..n are the given keys, in order, through the engine's writer.

    A file that follows a full one starts with begin = end = its predecessor's end (§10.4 quirk),
    exactly as the engine's IndexWriter seeds a new file; then the keys go in with putKey's rules.
    """
    from rmqstore_cli.engine.derived.indexwriter import _OpenIndex

    f = _OpenIndex(path, slots, entries, create=True)
    try:
        if inherited_phy > 0:
            f.begin_phy = f.end_phy = inherited_phy
        if inherited_ts > 0:
            f.begin_ts = f.end_ts = inherited_ts
        f.put_many(np.asarray(key_hash, np.int64), np.asarray(phy, np.int64), np.asarray(ts, np.int64))
    finally:
        f.close(flush=True)


def index_name(ms: int) -> str:
    """yyyyMMddHHmmssSSS in the local time zone, as the broker names a new file (§10.2)."""
    from rmqstore_cli.engine.derived.indexwriter import millis_name

    return millis_name(ms)


def _write_index_fn(index_dir: str, slots: int, entries: int, inherited: dict, names: dict):
    def write(table):
        import pyarrow as pa

        t = table.sort_by("n")
        f = t.column("file")[0].as_py()
        its, iphy = inherited.get(f, (0, 0))
        # Written under a temporary name and renamed: a retried task leaves one whole file.
        tmp = os.path.join(index_dir, f".{names[f]}.tmp{os.getpid()}")
        write_index_file(tmp, t.column("keyHash").to_numpy(), t.column("phy").to_numpy(), t.column("ts").to_numpy(),
                         its, iphy, slots, entries)
        os.replace(tmp, os.path.join(index_dir, names[f]))
        return pa.table({"file": pa.array([f], pa.int64()), "name": [names[f]], "entries": pa.array([t.num_rows], pa.int64())})

    return write


def rebuild_index(spark, st, out_root: str, *, overrides=None, config_file=None) -> dict:
    from pyspark.sql import functions as F

    cfg = st.config
    if not cfg.messageIndexEnable:
        raise UsageError("messageIndexEnable is false for this store: the broker writes no index")
    cap = cfg.maxIndexNum - 1
    df = read_records(spark, [st.root], body=False, options=reader_options(overrides, config_file))
    end = dispatch_end(spark, df, st)
    dispatched = df.filter(F.col("finding").isNull() & (F.col("commitLogOffset") < end))
    sel = (dispatched.filter(F.col("transactionType") != "rollback")
           .select("commitLogOffset", (F.unix_micros("storeTimestamp") / 1000).cast("long").alias("ts"), "topic",
                   "uniqKey", "keys"))
    ents = sel.mapInArrow(_explode_keys, "phy long, ts long, keyHash int").withColumn("mid", F.monotonically_increasing_id())
    ents = ents.withColumn("pid", F.shiftright("mid", 33)).withColumn("local", F.col("mid").bitwiseAND((1 << 33) - 1))
    ents = ents.cache()
    counts = dict(ents.groupBy("pid").count().collect())
    prefix, total = {}, 0
    for pid in sorted(counts):
        prefix[pid] = total
        total += counts[pid]
    pmap = F.create_map(*[x for pid, v in prefix.items() for x in (F.lit(pid), F.lit(v))]) if prefix else None
    index_dir = os.path.join(out_root, "index")
    os.makedirs(index_dir, exist_ok=False)
    nfiles = (total + cap - 1) // cap
    last_phy = dispatched.agg(F.max("commitLogOffset")).collect()[0][0]
    inherited: dict[int, tuple[int, int]] = {}
    first_ts: dict[int, int] = {}
    files = []
    if total:
        g = ents.withColumn("g", pmap[F.col("pid")] + F.col("local"))
        g = g.withColumn("file", (F.col("g") / cap).cast("long")).withColumn("n", F.col("g") % cap + 1)
        for r in g.filter((F.col("n") == cap) | (F.col("n") == 1)).select("file", "n", "ts", "phy").collect():
            if r["n"] == cap:
                inherited[r["file"] + 1] = (r["ts"], r["phy"])
            if r["n"] == 1:
                first_ts[r["file"]] = r["ts"]
        trailing = total % cap == 0 and last_phy is not None and last_phy > inherited.get(nfiles, (0, -1))[1]
    else:
        trailing = last_phy is not None  # records were dispatched but none had a key: one empty file
    names, prev = {}, None
    for f in range(nfiles + (1 if trailing else 0)):
        ms = first_ts.get(f) or inherited.get(f, (0, 0))[0] or 0
        if prev is not None and ms <= prev:
            ms = prev + 1  # names must stay unique and in creation order
        names[f] = index_name(ms)
        prev = ms
    if total:
        rows = (g.select("file", "n", "keyHash", "phy", "ts").groupBy("file")
                .applyInArrow(_write_index_fn(index_dir, cfg.maxHashSlotNum, cfg.maxIndexNum, inherited, names),
                              "file long, name string, entries long")
                .collect())
        files = sorted((r.asDict() for r in rows), key=lambda x: x["file"])
    if trailing:
        f = nfiles
        its, iphy = inherited.get(f, (0, 0))
        write_index_file(os.path.join(index_dir, names[f]), np.zeros(0, np.int64), np.zeros(0, np.int64),
                         np.zeros(0, np.int64), its, iphy, cfg.maxHashSlotNum, cfg.maxIndexNum)
        files.append({"file": f, "name": names[f], "entries": 0})
    ents.unpersist()
    return {"what": "index", "out": out_root, "files": files, "entries": total, "dispatchEnd": end}
