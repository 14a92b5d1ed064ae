"""The verify cross-checks on the executors: one Spark task per consume queue (CQ + ext checks)
and one per index file, all against the merged record columns, broadcast once per store.

Plugged into the engine's ``verify_store(cross_checks=...)``, so the driver keeps only the
store-level checks (log end, store times, dispatch completeness, lost tail, checkpoint, root)
and the codes, messages and order of the findings are those of the single-process ``verify``.
"""

from __future__ import annotations

from functools import partial

from pyspark.accumulators import AccumulatorParam


class _Counts(AccumulatorParam):
    """Tasks done, by kind."""

    def zero(self, value):
        return {}

    def addInPlace(self, a, b):
        for k, v in b.items():
            a[k] = a.get(k, 0) + v
        return a


def _ship(recs, refs) -> dict:
    """The picklable part of the merged columns and the reference classifier (no open store)."""
    return {"recs": {k: v for k, v in vars(recs).items() if k != "store"},
            "refs": {k: v for k, v in vars(refs).items() if k not in ("recs", "lost_refs")}}


def _unship(state: dict, store):
    from rmqstore_cli.engine.verify_records import _Records, _RefClassifier

    recs = _Records.__new__(_Records)
    vars(recs).update(state["recs"])
    recs.store = store  # the rare checks that re-read a record (properties, locations) use the executor's own mapping
    refs = _RefClassifier.__new__(_RefClassifier)
    vars(refs).update(state["refs"])
    refs.recs, refs.lost_refs = recs, 0
    return recs, refs


def _cross_task(bc, done, item):
    """Executor side: the checks of one consume queue or one index file."""
    from rmqstore_cli.engine.store import Store
    from rmqstore_cli.engine.verify_index import check_index_file
    from rmqstore_cli.engine.verify_queues import check_queue

    root, overrides, config_file, kind, key = item
    st = Store.open(root, config_file=config_file, overrides=overrides)
    try:
        recs, refs = _unship(bc.value, st)
        if kind == "queue":
            findings, n, phys = check_queue(st, key[0], key[1], recs, refs)
        else:
            f = st.index.files[key[0]]
            if f.path != key[1]:
                raise RuntimeError(f"index files changed while verifying: expected {key[1]}, found {f.path}")
            (findings, n), phys = check_index_file(st, f, recs, refs), None
    finally:
        st.close()
    done.add({kind: 1})
    return findings, n, phys, refs.lost_refs


class SparkCrossChecks:
    """``verify_store``'s ``cross_checks``: the consume-queue and index checks as one Spark job.

    The job runs when ``verify_store`` asks for the consume-queue results; the index results
    wait for its second call, so findings keep the engine's order (queues, dispatch, index).
    """

    def __init__(self, spark, overrides: dict | None = None, config_file: str | None = None):
        self.sc = spark.sparkContext
        self.overrides, self.config_file = overrides, config_file
        # Counted on the executors only: proof (for the summary and the tests) that the checks ran there.
        self.done = self.sc.accumulator({}, _Counts())
        self._index = None

    @property
    def tasks(self) -> dict:
        v = self.done.value
        return {"queues": v.get("queue", 0), "indexFiles": v.get("index", 0)}

    def consume_queues(self, store, recs, refs, findings: list, summary: dict) -> list:
        queues = store.queues()
        files = store.index.files
        base = (store.root, self.overrides, self.config_file)
        items = [base + ("queue", (t, q)) for t, q in queues] + [base + ("index", (i, f.path)) for i, f in enumerate(files)]
        results = []
        if items:
            # The merged columns are a few numpy arrays (~65 bytes per record plus 4 per index key,
            # ~70 MB per million records): small enough to broadcast, cheaper than re-reading the log per task.
            bc = self.sc.broadcast(_ship(recs, refs))
            try:
                rdd = self.sc.parallelize(items, numSlices=len(items))
                results = rdd.map(partial(_cross_task, bc, self.done)).collect()
            finally:
                bc.destroy()
        q_res, self._index = results[:len(queues)], results[len(queues):]
        all_phys, n_units = [], 0
        for f, n, phys, lost in q_res:
            findings += f
            n_units += n
            all_phys.append(phys)
            refs.lost_refs += lost
        summary["consumeQueues"] = {"queues": len(queues), "units": n_units}
        return all_phys

    def index(self, store, recs, refs, findings: list, summary: dict) -> None:
        findings += store.index.problems
        n_entries = 0
        for f, n, _, lost in self._index or []:
            findings += f
            n_entries += n
            refs.lost_refs += lost
        summary["index"] = {"files": len(store.index.files), "entries": n_entries}
        self._index = None
