"""``rmqstore spark verify`` as a distributed job: the engine's verify with its cross-checks as joins.

1. ``rocketmq-verified`` runs the per-segment checks in executor tasks and yields the record
   DataFrame (one row per valid record, what dispatch computes for it) plus one small ``meta`` row
   per task (segment reports without columns, findings, store-time partials); persisted on disk.
2. The driver collects only the meta rows and derives the store-level facts the engine derives
   from them (end of data, where recovery stops, explained regions, invalid record offsets).
3. Consume queues: units (``rocketmq-consumequeue``) ⋈ records on (store, phyOffset), grouped by
   (store, topic, queueId); each group runs the engine's ``check_queue`` against the records its
   units point at. Index: entries (``rocketmq-index``) ⋈ records on (store, phyOffset), grouped
   by (store, index file), through the engine's ``check_index_file``.
   The consume-queue join is a full outer join: its rows without a unit are the records no queue
   holds, which is the dispatch check's input.
   Index coverage (IDX_MISSING): entries counted per (store, phyOffset) ⋈ the records below the index's
   end, per record; the range and whether the files' entries keep commitlog order come from the engine.
4. Dispatch completeness: those records aggregated per store and queue, split at the high-water
   mark the queue checks report (furthest unit; end of the furthest record a unit points at).

Only findings (aggregated per queue / file / code, as the engine aggregates them) and per-segment,
per-queue and per-file summaries reach the driver; nothing per record is collected or broadcast.
"""

from __future__ import annotations

import json
import os
import pickle
import time

import numpy as np

GROUP_RESULT_DDL = ("store string, key string, n bigint, lost bigint, findings binary, foundEnd bigint, maxPhy bigint, "
                    "unordered boolean")


def _reader(spark, fmt: str, roots: list[str], options: dict):
    r = spark.read.format(fmt)
    for k, v in options.items():
        if v is not None:
            r = r.option(k, str(v))
    return r.load(",".join(roots))


# --- executor side -----------------------------------------------------------------------


def mini_records(store, t, invalid: np.ndarray):
    """The engine's ``_Records`` holding only the records in Arrow table ``t`` (one group's join result)."""
    import pyarrow.compute as pc

    from rmqstore_cli.engine.verify.records import _COL_TYPES, _Records

    t = t.filter(pc.is_valid(t.column("size")))
    phy_all = t.column("phyOffset").to_numpy(zero_copy_only=False).astype(np.int64)
    phy, first = np.unique(phy_all, return_index=True)  # several units/entries may point at one record
    t = t.take(first)
    n = len(phy)
    recs = _Records.__new__(_Records)
    recs.store = store
    names = t.column_names
    col = lambda name, dt: (t.column(name).to_numpy(zero_copy_only=False).astype(dt) if name in names  # noqa: E731
                            else np.zeros(n, dt))
    if "recTopic" in names:
        enc = t.column("recTopic").combine_chunks().dictionary_encode()
        recs.topics = enc.dictionary.to_pylist()
        topic = enc.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    else:
        recs.topics, topic = [], np.zeros(n, np.int32)
    recs.topic_ids = {name: i for i, name in enumerate(recs.topics)}
    recs.c = {"phy": phy, "size": col("size", np.int32), "queueId": col("recQueueId", np.int32),
              "queueOffset": col("recQueueOffset", np.int64), "sysFlag": col("sysFlag", np.int32),
              "storeTimestamp": col("storeTimestamp", np.int64), "topic": topic, "tagsCode": col("tagsCode", np.int64),
              "tagsBad": col("tagsBad", np.bool_)}
    if "keyHashes" in names:
        keys = t.column("keyHashes").combine_chunks()
        counts = pc.list_value_length(keys).to_numpy(zero_copy_only=False).astype(np.int64)
        recs.keys = pc.list_flatten(keys).to_numpy(zero_copy_only=False).astype(np.int32)
    else:
        counts, recs.keys = np.zeros(n, np.int64), np.zeros(0, np.int32)
    recs.c["keyCount"] = counts.astype(_COL_TYPES["keyCount"])
    recs.key_start = np.cumsum(counts) - counts
    recs.seg = col("seg", np.int32)
    recs.phy = phy
    recs.invalid = invalid
    return recs


def mini_refs(recs, commitlog, ctx: dict):
    """The engine's ``_RefClassifier`` from the store-level facts the driver derived (no reports needed)."""
    from rmqstore_cli.engine.verify.records import _RefClassifier

    refs = _RefClassifier.__new__(_RefClassifier)
    refs.recs, refs.data_end = recs, ctx["dataEnd"]
    segs = commitlog.segments.segments
    refs.starts = np.asarray([s.start for s in segs], dtype=np.int64)
    refs.ends = np.asarray([s.start + min(s.size, commitlog.segments.file_size) for s in segs], dtype=np.int64)
    refs.explained = ctx["explained"]
    refs.lost_refs = 0
    return refs


def _group_fn(kind: str, ctx: dict, config_file, overrides):
    def run(table):
        import pyarrow as pa
        import pyarrow.compute as pc

        from rmqstore_cli.engine.store import Store
        from rmqstore_cli.engine.verify.index import check_index_file
        from rmqstore_cli.engine.verify.queues import check_queue

        root = table.column("store")[0].as_py()
        c = ctx[root]
        st = Store.open(root, config_file=config_file, overrides=overrides)
        try:
            recs = mini_records(st, table, c["invalid"])
            refs = mini_refs(recs, st.commitlog, c)
            unordered = None
            if kind == "queue":
                topic, qid = table.column("topic")[0].as_py(), table.column("queueId")[0].as_py()
                findings, n, _ = check_queue(st, topic, qid, recs, refs)
                key = f"{topic}\x00{qid}"
                # for the dispatch high-water mark: the furthest unit, and the end of the furthest record a unit points at
                max_phy = pc.max(table.column("phyOffset")).as_py()
                found = table.filter(pc.is_valid(table.column("size")))
                found_end = (pc.max(pc.add(found.column("phyOffset"), pc.cast(found.column("size"), pa.int64()))).as_py()
                             if found.num_rows else None)
            else:
                i = table.column("file")[0].as_py()
                findings, n, unordered = check_index_file(st, st.index.files[i], recs, refs)
                key, max_phy, found_end = str(i), None, None
        finally:
            st.close()
        return pa.table({"store": [root], "key": [key], "n": pa.array([n], pa.int64()),
                         "lost": pa.array([refs.lost_refs], pa.int64()), "findings": [pickle.dumps(findings)],
                         "foundEnd": pa.array([found_end], pa.int64()), "maxPhy": pa.array([max_phy], pa.int64()),
                         "unordered": pa.array([unordered], pa.bool_())})

    return run


# --- driver side -------------------------------------------------------------------------


class _Totals:
    """What the checkpoint check reads of the records: how many, and the newest store time."""

    def __init__(self, n: int, newest: int):
        self.n = n
        self.c = {"storeTimestamp": np.asarray([newest], np.int64)}

    def __len__(self) -> int:
        return self.n


def _store_times(parts: list, findings: list) -> None:
    """CL_STORE_TIME from the tasks' partials: their own backsteps plus those across task boundaries."""
    from rmqstore_cli.engine.verify.pipeline import add_store_time_finding
    from rmqstore_cli.engine.verify.records import _Agg

    agg, prev = _Agg(), None
    for p in sorted(parts, key=lambda p: p["firstPhy"]):
        if prev is not None and p["first"][2] < prev:
            path, pos, ts, phy = p["first"]
            add_store_time_finding(agg, path, pos, ts, prev, phy)
        if p["back"]:
            add_store_time_finding(agg, *p["firstBack"], count=p["back"])
        prev = p["last"]
    findings += agg.findings()


def verify(spark, roots: list[str], *, check_crc: bool = True, out: str | None = None, out_format: str = "json",
           overrides: dict | None = None, config_file: str | None = None, split: int = 64 << 20) -> dict:
    """Every check of ``rmqstore verify`` on every store, distributed; same codes, messages and exit codes."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify.pipeline import VerifyResult, _log_end, lost_tail_finding, sort_findings
    from rmqstore_cli.engine.verify.dledger import check_dledger
    from rmqstore_cli.engine.verify.index import _check_checkpoint, _check_root
    from rmqstore_cli.engine.verify.queues import add_not_dispatched, dispatch_high_water, dispatch_lag_finding
    from rmqstore_cli.engine.verify.records import _Agg

    from .common import _write_findings, finding_rows
    from .rebuild import reader_options

    t0 = time.monotonic()
    stores = [Store.open(r, config_file=config_file, overrides=overrides) for r in roots]
    roots = [st.root for st in stores]
    opts = dict(reader_options(overrides, config_file), splitSize=split,
                overrides=json.dumps({k: v for k, v in (overrides or {}).items() if v is not None}) if overrides else None)
    try:
        verified = _reader(spark, "rocketmq-verified", roots, dict(opts, checkCrc=str(check_crc).lower()))
        verified = verified.persist(StorageLevel.DISK_ONLY)
        metas: dict[str, list] = {r: [] for r in roots}
        n_tasks = 0
        # One small row per task (all tasks at once: toLocalIterator would run them one after another).
        for row in verified.where(F.col("meta").isNotNull()).select("store", "meta").collect():
            metas[row["store"]].append(pickle.loads(row["meta"]))
            n_tasks += 1
        records = verified.where(F.col("meta").isNull()).drop("meta")
        units = _reader(spark, "rocketmq-consumequeue", roots, opts)
        entries = _reader(spark, "rocketmq-index", roots, opts)

        # Store-level facts from the per-segment reports (the engine's own functions).
        state = {}
        ctx = {}
        for st in stores:
            ms = metas[st.root]
            reports = sorted((r for m in ms for r in m["reports"]), key=lambda r: r.index)
            findings = list(st.commitlog.segments.problems)
            for r in reports:
                findings += r.findings
            n_records = sum(r.records for r in reports)
            summary = {"root": st.root, "version": st.config.version,
                       "commitlog": {"files": len(reports), "records": n_records, "bytes": int(sum(r.bytes for r in reports)),
                                     "blanks": int(sum(r.blanks for r in reports)), "minOffset": st.commitlog.min_offset}}
            data_end, recovery_end = _log_end(st, reports, findings)
            summary["commitlog"].update(maxOffset=data_end, recoveryEnd=recovery_end)
            parts = [m["times"] for m in ms if m["times"]]
            _store_times(parts, findings)
            for m in ms:
                findings += m["findings"]
            fsize = st.commitlog.segments.file_size
            ctx[st.root] = {"dataEnd": data_end,
                            "explained": [(r.unread_from, r.start + fsize) for r in reports if r.unread_from is not None and r.unread_reported],
                            "invalid": np.asarray(sorted(o for r in reports for o in r.invalid), dtype=np.int64)}
            state[st.root] = {"findings": findings, "summary": summary, "records": n_records,
                              "newest": max((p["maxTs"] for p in parts), default=0), "lost": 0, "queues": 0, "units": 0,
                              "files": 0, "entries": 0}
        del metas

        # Consume queues (+ ext): units ⟗ records (full outer: the records no unit points at are the
        # dispatch check's input), then one engine check per queue on the units' side.
        joined = units.join(records.drop("keyHashes"), ["store", "phyOffset"], "full_outer").persist(StorageLevel.DISK_ONLY)
        q_rows = (joined.where(F.col("topic").isNotNull())
                  .groupBy("store", "topic", "queueId")
                  .applyInArrow(_group_fn("queue", ctx, config_file, overrides), GROUP_RESULT_DDL).collect())
        _add_group_results(state, q_rows, "queues", "units")

        # Dispatch completeness: records missing from every queue, below / above the high-water mark.
        hw = {}
        for root in roots:
            ends = [r["foundEnd"] for r in q_rows if r["store"] == root and r["foundEnd"] is not None]
            phys = [r["maxPhy"] for r in q_rows if r["store"] == root and r["maxPhy"] is not None]
            hw[root] = dispatch_high_water(max(ends, default=None), max(phys, default=None))
        high = F.create_map(*[x for root in roots for x in (F.lit(root), F.lit(hw.get(root, 0)))])
        tran = F.col("sysFlag").bitwiseAND(0xC)
        missing = (joined.where(F.col("topic").isNull() & tran.isin(0, 8))
                   .withColumn("lag", F.col("phyOffset") >= F.coalesce(high[F.col("store")], F.lit(0))))
        for r in (missing.groupBy("store", "lag", "recTopic", "recQueueId")
                  .agg(F.count("*").alias("n"), F.min(F.struct("phyOffset", "seg", "recQueueOffset")).alias("first")).collect()):
            s = state[r["store"]]
            s.setdefault("dispatch", []).append(r)
        for st in stores:
            s = state[st.root]
            rows = s.pop("dispatch", [])
            segs = st.commitlog.segments.segments
            loc = lambda f: (segs[f["seg"]].path, f["phyOffset"] - segs[f["seg"]].start)  # noqa: E731
            lag = [r for r in rows if r["lag"]]
            if lag:
                first = min((r["first"] for r in lag), key=lambda f: f["phyOffset"])
                s["findings"].append(dispatch_lag_finding(*loc(first), sum(r["n"] for r in lag), first["phyOffset"]))
            agg = _Agg()
            for r in sorted((r for r in rows if not r["lag"]), key=lambda r: r["first"]["phyOffset"]):
                f = r["first"]
                add_not_dispatched(agg, *loc(f), r["recTopic"], r["recQueueId"], f["phyOffset"], f["recQueueOffset"], count=r["n"])
            s["findings"] += agg.findings()

        # Index files: entries ⋈ records, one engine check per file.
        i_recs = records.select("store", "phyOffset", "seg", "size", "sysFlag", "storeTimestamp", "keyHashes")
        i_rows = (entries.join(i_recs, ["store", "phyOffset"], "left")
                  .groupBy("store", "file")
                  .applyInArrow(_group_fn("index", ctx, config_file, overrides), GROUP_RESULT_DDL).collect())
        _add_group_results(state, i_rows, "files", "entries")
        _index_coverage(stores, state, i_rows, records, entries)
        joined.unpersist()
        verified.unpersist()

        results = []
        for st in stores:
            s = state[st.root]
            findings, summary = s["findings"], s["summary"]
            summary["consumeQueues"] = {"queues": s["queues"], "units": s["units"]}
            findings += st.index.problems
            summary["index"] = {"files": len(st.index.files), "entries": s["entries"]}
            if s["lost"]:
                findings.append(lost_tail_finding(st.commitlog, ctx[st.root]["dataEnd"], s["lost"]))
            _check_checkpoint(st, _Totals(s["records"], s["newest"]), findings)
            _check_root(st, findings)
            if getattr(st.commitlog, "is_dledger", False):
                # the entry headers, index units and checkpoint: one streamed walk of the entries on the driver
                # (memory stays one chunk of entries), as verify runs it after the message checks
                check_dledger(st, findings, summary)
            sort_findings(findings, summary)
            results.append(VerifyResult(findings, summary))
        tasks = {"queues": len(q_rows), "indexFiles": len(i_rows)}
        n_segments = sum(len(st.commitlog.segments.segments) for st in stores)
    finally:
        for st in stores:
            st.close()
    rows = finding_rows(roots, results)
    if out:
        _write_findings(spark, rows, out, out_format)
    exit_code = max((r.exit_code for r in results), default=0)
    return {"stores": [r.summary for r in results], "findings": rows, "exitCode": exit_code, "segments": n_segments,
            "tasks": n_tasks, "crossCheckTasks": tasks, "seconds": round(time.monotonic() - t0, 3),
            "out": os.path.abspath(out) if out else None}


def _index_coverage(stores: list, state: dict, i_rows, records, entries) -> None:
    """IDX_MISSING: the records below each store's index end holding fewer entries than keys, counted by joining
    the entries (of every index file: a record's keys may span two) to the records, per record; only each store's
    count and first record reach the driver. The range and the files' order are the engine's
    (:class:`~rmqstore_cli.engine.verify.indexcoverage.IndexCoverage`), from the per-file tasks' results."""
    from pyspark.sql import functions as F

    from rmqstore_cli.engine.verify.indexcoverage import FileEntries, IndexCoverage
    from rmqstore_cli.formats.records import SYSFLAG_TRANSACTION_MASK, TRANSACTION_ROLLBACK

    unordered = {(r["store"], int(r["key"])) for r in i_rows if r["unordered"]}
    coverage = {}
    for st in stores:
        files = [FileEntries(f, (st.root, i) in unordered) for i, f in enumerate(st.index.files) if f.complete]
        c = IndexCoverage(st, files)
        if c.files:
            coverage[st.root] = c
    if not coverage:
        return
    bound = lambda pick: F.create_map(*[x for root, c in coverage.items() for x in (F.lit(root), F.lit(pick(c)))])  # noqa: E731
    begin, end = bound(lambda c: c.begin), bound(lambda c: c.end)
    held = entries.groupBy("store", "phyOffset").agg(F.count("*").alias("held"))
    wanted = (records.where(F.col("store").isin(list(coverage)))
              .where((F.col("phyOffset") >= begin[F.col("store")]) & (F.col("phyOffset") < end[F.col("store")]))
              .where(F.col("sysFlag").bitwiseAND(SYSFLAG_TRANSACTION_MASK) != TRANSACTION_ROLLBACK)
              .select("store", "phyOffset", "recTopic", F.size("keyHashes").alias("want"))
              .where(F.col("want") > 0))
    short = (wanted.join(held, ["store", "phyOffset"], "left")
             .withColumn("held", F.coalesce(F.col("held"), F.lit(0)))
             .where(F.col("held") < F.col("want")))
    for r in (short.groupBy("store")
              .agg(F.count("*").alias("n"), F.sum(F.col("want") - F.col("held")).alias("missing"),
                   F.min(F.struct("phyOffset", "held", "want", "recTopic")).alias("first")).collect()):
        f = r["first"]
        coverage[r["store"]].merge_counted(r["n"], r["missing"], f["phyOffset"], f["held"], f["want"], f["recTopic"])
    for root, c in coverage.items():
        c.finish(state[root]["findings"])


def _add_group_results(state: dict, rows, groups: str, refs: str) -> None:
    """Fold the per-queue or per-index-file check results (GROUP_RESULT_DDL rows) into each store's state."""
    for r in rows:
        s = state[r["store"]]
        s["findings"] += pickle.loads(r["findings"])
        s[refs] += r["n"]
        s[groups] += 1
        s["lost"] += r["lost"]
