"""The data sources behind the distributed ``spark verify``: records as the engine's verify sees them,
and the references the derived files hold (consume-queue units, index entries).

- ``rocketmq-verified``: one task per group of whole commitlog segments runs the engine's
  per-segment checks (:func:`~rmqstore_cli.engine.verify.pipeline.verify_segments`) and yields one row per
  valid record with what dispatch computes for it (tagsCode, index key hashes), plus one ``meta``
  row per task: the segment reports without their columns, the task's findings and a partial
  store-time aggregate (a few hundred bytes per segment, never per record).
- ``rocketmq-consumequeue``: one row per valid non-filler unit of every consume queue
  (the broker's view: up to the first invalid unit), plus one marker row per queue
  (``phyOffset`` null) so that empty queues are checked too; partitions hold whole queues.
- ``rocketmq-index``: one row per counted entry of every complete index file (file-aligned
  partitions), plus one marker row per file.

Options of all three: ``brokerVersion``, ``commitlogFileSize``, ``config``, ``overrides`` (a JSON object
of any geometry the engine's ``Store.open`` accepts, as the commands' geometry options give it);
``splitSize`` (bytes of commitlog / consume queue per task); ``checkCrc`` (verified only).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from rmqstore_cli.formats.records import CQ_FILLER

from .datasource import DEFAULT_BATCH_ROWS, DEFAULT_SPLIT, _flag, open_store_from_options, store_roots

VERIFIED_DDL = ("store string, seg int, phyOffset bigint, size int, recTopic string, recQueueId int, recQueueOffset bigint, "
                "sysFlag int, storeTimestamp bigint, tagsCode bigint, tagsBad boolean, keyHashes array<int>, meta binary")
UNITS_DDL = "store string, topic string, queueId int, phyOffset bigint"
ENTRIES_DDL = "store string, file int, phyOffset bigint"

_KEY_LIST = pa.list_(pa.field("element", pa.int32()))
_VERIFIED_TYPES = [("store", pa.string()), ("seg", pa.int32()), ("phyOffset", pa.int64()), ("size", pa.int32()),
                   ("recTopic", pa.string()), ("recQueueId", pa.int32()), ("recQueueOffset", pa.int64()),
                   ("sysFlag", pa.int32()), ("storeTimestamp", pa.int64()), ("tagsCode", pa.int64()),
                   ("tagsBad", pa.bool_()), ("keyHashes", _KEY_LIST), ("meta", pa.binary())]


def _options(ds) -> dict:
    return {str(k).lower(): v for k, v in ds.options.items()}


def _open(root: str, options: dict):
    """The store with every geometry override the command was given (all tasks see the same store)."""
    if options.get("overrides"):
        import json

        from rmqstore_cli.engine.store import Store

        return Store.open(root, config_file=options.get("config"), overrides=json.loads(options["overrides"]))
    return open_store_from_options(root, options)


class _StoreReader(DataSourceReader):
    """Partitions of every store the ``path`` option names (:meth:`work`), each read with its store open."""

    def __init__(self, options: dict):
        self.options = options
        self.roots = store_roots(options.get("path"))

    def partitions(self):
        out = []
        for root in self.roots:
            st = _open(root, self.options)
            try:
                out += self.work(st)
            finally:
                st.close()
        return out or [Work("", [])]

    def read(self, partition: Work):
        if not partition.items:
            return
        st = _open(partition.store, self.options)
        try:
            yield from self.read_items(st, partition.items)
        finally:
            st.close()

    def work(self, st) -> list:
        raise NotImplementedError

    def read_items(self, st, items):
        raise NotImplementedError


class _StoreSource(DataSource):
    """A source named :attr:`NAME` with the DDL schema :attr:`DDL`, read by :attr:`READER`."""

    NAME = DDL = ""
    READER = _StoreReader

    @classmethod
    def name(cls) -> str:
        return cls.NAME

    def schema(self):
        return self.DDL

    def reader(self, schema):
        return self.READER(_options(self))


@dataclass
class Work(InputPartition):
    """One task's share of one store: segment indexes, (topic, queueId) pairs or index file numbers."""

    store: str
    items: list

    def __post_init__(self):
        InputPartition.__init__(self, None)


def _group(store: str, sized: list, split: int) -> list[Work]:
    out, cur, size = [], [], 0
    for item, n in sized:
        cur.append(item)
        size += n
        if size >= split:
            out.append(Work(store, cur))
            cur, size = [], 0
    if cur:
        out.append(Work(store, cur))
    return out


# --- records ----------------------------------------------------------------------------


def time_partial(recs) -> dict | None:
    """What the store-time check needs from one task: its first/last record and its own backsteps."""
    ts = recs.c["storeTimestamp"]
    if not len(ts):
        return None
    back = np.flatnonzero(ts[1:] < ts[:-1]) + 1
    first_back = None
    if len(back):
        i = int(back[0])
        path, pos = recs.location(i)
        first_back = (path, pos, int(ts[i]), int(ts[i - 1]), int(recs.phy[i]))
    path, pos = recs.location(0)
    return {"firstPhy": int(recs.phy[0]), "first": (path, pos, int(ts[0]), int(recs.phy[0])), "last": int(ts[-1]),
            "back": int(len(back)), "firstBack": first_back, "maxTs": int(ts.max())}


def record_batches(root: str, recs, batch_rows: int):
    """The merged columns of one task as Arrow batches of ``VERIFIED_DDL`` (meta null)."""
    n = len(recs)
    topics = pa.array(recs.topics or [""], pa.string())
    c = recs.c
    counts_all = c["keyCount"].astype(np.int64)
    for a in range(0, n, batch_rows):
        b = min(n, a + batch_rows)
        counts = counts_all[a:b]
        starts = recs.key_start[a:b]
        total = int(counts.sum())
        local = np.cumsum(counts) - counts
        gather = np.repeat(starts - local, counts) + np.arange(total, dtype=np.int64)
        offsets = np.zeros(len(counts) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        keys = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(recs.keys[gather].astype(np.int32), pa.int32()),
                                        type=_KEY_LIST)
        cols = [pa.array(np.full(b - a, root, dtype=object), pa.string()),
                pa.array(recs.seg[a:b].astype(np.int32)),
                pa.array(c["phy"][a:b].astype(np.int64)),
                pa.array(c["size"][a:b].astype(np.int32)),
                pa.DictionaryArray.from_arrays(pa.array(c["topic"][a:b].astype(np.int32)), topics).dictionary_decode(),
                pa.array(c["queueId"][a:b].astype(np.int32)),
                pa.array(c["queueOffset"][a:b].astype(np.int64)),
                pa.array(c["sysFlag"][a:b].astype(np.int32)),
                pa.array(c["storeTimestamp"][a:b].astype(np.int64)),
                pa.array(c["tagsCode"][a:b].astype(np.int64)),
                pa.array(c["tagsBad"][a:b].astype(bool)),
                keys,
                pa.nulls(b - a, pa.binary())]
        yield pa.RecordBatch.from_arrays(cols, schema=pa.schema(_VERIFIED_TYPES))


def meta_batch(root: str, payload: bytes):
    cols = [pa.array([root], pa.string())] + [pa.nulls(1, t) for _, t in _VERIFIED_TYPES[1:-1]] + [pa.array([payload], pa.binary())]
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(_VERIFIED_TYPES))


class _VerifiedReader(_StoreReader):
    def work(self, st) -> list:
        split = int(self.options.get("splitsize") or DEFAULT_SPLIT)
        return _group(st.root, [(i, seg.size) for i, seg in enumerate(st.commitlog.segments.segments)], split)

    def read_items(self, st, items):
        from rmqstore_cli.engine.verify.pipeline import _check_delay_properties, verify_segments
        from rmqstore_cli.engine.verify.records import _Records

        reports = verify_segments(st.commitlog, items, check_crc=_flag(self.options, "checkcrc", True))
        recs = _Records(st, reports)  # consumes the reports' columns
        findings: list = []
        _check_delay_properties(recs, findings)
        times = time_partial(recs)
        yield from record_batches(st.root, recs, int(self.options.get("batchrows") or DEFAULT_BATCH_ROWS))
        del recs
        yield meta_batch(st.root, pickle.dumps({"reports": reports, "findings": findings, "times": times}))


class VerifiedRecordsSource(_StoreSource):
    NAME, DDL, READER = "rocketmq-verified", VERIFIED_DDL, _VerifiedReader


# --- consume-queue units ------------------------------------------------------------------


def _refs_batches(root: str, names: list, values: list, phys: np.ndarray, types: list, batch_rows: int = 1 << 20):
    """One marker row (phyOffset null), then one row per reference, in batches."""
    for a in range(0, len(phys) + 1, batch_rows):
        part = phys[max(a - 1, 0):a - 1 + batch_rows].astype(np.int64)
        marker = a == 0
        n = len(part) + marker
        cols = [pa.array(np.full(n, root, dtype=object), pa.string())]
        for v, t in zip(values, types):
            cols.append(pa.array(np.full(n, v, dtype=object if t == pa.string() else None), t))
        mask = np.zeros(n, bool)
        mask[0] = marker
        cols.append(pa.array(np.r_[np.zeros(int(marker), np.int64), part], pa.int64(), mask=mask))
        yield pa.RecordBatch.from_arrays(cols, names=["store"] + names + ["phyOffset"])


class _UnitsReader(_StoreReader):
    def work(self, st) -> list:
        sized = []
        for t, q in st.queues():
            d = os.path.join(st.root, "consumequeue", t, str(q))
            try:
                n = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
            except OSError:
                n = 0
            sized.append(((t, q), max(n, 1)))
        return _group(st.root, sized, int(self.options.get("splitsize") or DEFAULT_SPLIT))

    def read_items(self, st, items):
        for t, q in items:
            u = st.queue(t, q).units()
            filler = (u.phy == CQ_FILLER[0]) & (u.size == CQ_FILLER[1]) & (u.tags == CQ_FILLER[2])
            yield from _refs_batches(st.root, ["topic", "queueId"], [t, q], u.phy[~filler], [pa.string(), pa.int32()])


class ConsumeQueueUnitsSource(_StoreSource):
    NAME, DDL, READER = "rocketmq-consumequeue", UNITS_DDL, _UnitsReader


# --- index entries --------------------------------------------------------------------------


def counted_entries(f) -> int:
    """Entries 1..count-1 the broker's queries can reach (what the engine's index check reads)."""
    h = f.header()
    count = h.indexCount if h.indexCount > 0 else 1
    return min(count, f.entries)


class _EntriesReader(_StoreReader):
    def work(self, st) -> list:
        return [Work(st.root, [(i, f.path)]) for i, f in enumerate(st.index.files)]

    def read_items(self, st, items):
        from rmqstore_cli.engine.log.mappedfile import drop_pages as _drop_pages
        from rmqstore_cli.formats.records import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE

        for i, path in items:
            f = st.index.files[i]
            if f.path != path:
                raise RuntimeError(f"index files changed while verifying: expected {path}, found {f.path}")
            phy = np.zeros(0, np.int64)
            if f.complete:
                count = counted_entries(f)
                phy = f.entry_table(count)[1:]["phyOffset"].astype(np.int64)
                _drop_pages(f.segment.buffer(), INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE, count * INDEX_ENTRY_SIZE)
            yield from _refs_batches(st.root, ["file"], [i], phy, [pa.int32()])


class IndexEntriesSource(_StoreSource):
    NAME, DDL, READER = "rocketmq-index", ENTRIES_DDL, _EntriesReader


SOURCES = (VerifiedRecordsSource, ConsumeQueueUnitsSource, IndexEntriesSource)
