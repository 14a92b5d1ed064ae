"""Consume-queue units as dump rows: file queues (with their ext units), batch queues and RocksDB queues,
selected by queue, queue-offset range and store time, optionally with the commitlog record each unit points at.
The queues themselves: :mod:`..derived.consumequeue`, :mod:`..derived.rocksdbqueue`."""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats.extaddr import is_ext_addr
from rmqstore_cli.formats.message import RecordError, render_body

from ..derived.consumequeue import is_filler
from ..errors import NotFoundError
from .timesearch import queue_range_by_time

EXT_FIELDS = ("size", "tagsCode", "msgStoreTime", "bitMapSize", "filterBitMapHex")


def select_queues(st, topic, queue, dirname="consumequeue", also_batch: bool = False):
    """The (topic, queueId) pairs of ``dirname`` (consumequeue or consumequeue_ext) matching the selection; with
    ``also_batch`` also the batch queues', as a pair of lists. A selection that matches nothing is NotFoundError."""
    queues = st.queues() if dirname == "consumequeue" else st.ext_queues()
    sel = [(t, q) for t, q in queues if (topic is None or t == topic) and (queue is None or q == queue)]
    batch = [(t, q) for t, q in st.batch_queues() if (topic is None or t == topic) and (queue is None or q == queue)] \
        if also_batch else []
    if not sel and not batch and (topic is not None or queue is not None):
        raise NotFoundError(f"no {dirname} directory for topic {topic!r} queue {queue}")
    return (sel, batch) if also_batch else sel


def _batch_unit_rows(st, queues, from_, to, with_msg: bool, body: str, since=None, until=None):
    """Batch consume queue units (§9): queueOffset is the unit's msgBaseOffset; the unit covers batchSize offsets."""
    for t, q in queues:
        u = st.batch_queue(t, q).units()
        keep = np.ones(len(u), dtype=bool)
        end = u["msgBaseOffset"].astype(np.int64) + u["batchSize"]
        if from_ is not None:
            keep &= end > from_
        if to is not None:
            keep &= u["msgBaseOffset"] < to
        if since is not None:
            keep &= u["storeTime"] >= since
        if until is not None:
            keep &= u["storeTime"] <= until
        for r in u[keep].tolist():
            phy, size, tags, store_time, base, batch, compacted, reserved = r
            row = {"topic": t, "queueId": q, "queueOffset": base, "phyOffset": phy, "size": size, "tagsCode": tags,
                   "queueType": "BatchCQ", "batchSize": batch, "storeTime": store_time, "compactedOffset": compacted,
                   "reserved": reserved}
            if with_msg:
                _attach_record(st, row, phy, body)
            yield row


def queue_unit_rows(st, topic, queue, from_, to, with_msg: bool, body: str, since=None, until=None, starts=None):
    """Units of the selected queues; with ``starts`` ({(topic, queueId): offset}, a group's backlog) only those
    queues, each from its offset (or --from, when later) to its end."""
    if st.rocksdb is not None:
        yield from _rocksdb_unit_rows(st, topic, queue, from_, to, with_msg, body, since, until, starts)
        return
    ext_on = st.config.enableConsumeQueueExt
    timed = since is not None or until is not None
    max_phy = None
    if timed:
        res = st.commitlog.find_end(check_crc=False)
        max_phy = res.stop.offset if res.stop else 0
    if starts is None:
        queues, batch = select_queues(st, topic, queue, also_batch=True)
    else:  # a group's backlog: the file queues it has committed offsets for
        queues, batch = sorted(starts), []
    for t, q in queues:
        u = st.queue(t, q).units()
        first = from_ if starts is None else max(starts[(t, q)], from_ or 0)
        lo = 0 if first is None else int(np.searchsorted(u.queue_offsets, first))
        hi = len(u.queue_offsets) if to is None else int(np.searchsorted(u.queue_offsets, to))
        if timed:
            tlo, thi = queue_range_by_time(st, u, since, until, max_phy)
            lo, hi = max(lo, tlo), min(hi, thi)
        ext = st.ext(t, q) if ext_on else None
        for qo, phy, size, tags in zip(u.queue_offsets[lo:hi].tolist(), u.phy[lo:hi].tolist(), u.size[lo:hi].tolist(),
                                       u.tags[lo:hi].tolist()):
            row = {"topic": t, "queueId": q, "queueOffset": qo, "phyOffset": phy, "size": size, "tagsCode": tags}
            if is_filler(phy, size, tags):
                row["filler"] = True
            elif ext is not None and is_ext_addr(tags):
                unit = ext.get(tags)
                row["ext"] = None if unit is None else {k: unit[k] for k in EXT_FIELDS}
            if with_msg and not row.get("filler"):
                _attach_record(st, row, phy, body)
            yield row
    yield from _batch_unit_rows(st, batch, from_, to, with_msg, body, since, until)


def _rocksdb_unit_rows(st, topic, queue, from_, to, with_msg: bool, body: str, since=None, until=None, starts=None):
    """The units of a RocksDB consume queue (they carry their store time: --since/--until select by it)."""
    from .rocksdbqueue import unit_rows  # the RocksDB modules load only for a RocksDB store

    for t, q in select_queues(st, topic, queue) if starts is None else sorted(starts):
        first = from_ if starts is None else max(starts[(t, q)], from_ or 0)
        for row in unit_rows(st.queue(t, q), first, to, since, until):
            if with_msg:
                _attach_record(st, row, row["phyOffset"], body)
            yield row


def _attach_record(st, row: dict, phy: int, body: str) -> None:
    """Adds the commitlog record at ``phy`` as ``msg`` (or ``msgError`` when it cannot be read there)."""
    try:
        row["msg"] = render_body(st.commitlog.read(phy, with_body=body != "none"), body)
    except RecordError as e:
        row["msg"] = None
        row["msgError"] = str(e)
