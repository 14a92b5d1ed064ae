"""Batch consume queues, read side (the broker's BatchConsumeQueue, FORMAT.md §9).

``batchconsumequeue/<topic>/<queueId>/`` holds 46-byte units appended one after the other (the file
position is not derived from the queue offset): each unit covers the queue offsets
``msgBaseOffset .. msgBaseOffset + batchSize - 1`` of one commitlog record (an inner batch of
``INNER_NUM`` messages, or a single message with batchSize 1). A unit is valid iff
``phy >= 0 and size > 0 and msgBaseOffset >= 0 and batchSize > 0``; the first invalid unit, a file
that is not full or a gap between files ends the queue, as the broker's recovery reads it.
"""

from __future__ import annotations

import os

import numpy as np

from rmqstore_cli.formats.records import BCQ_UNIT_FIELDS, BCQ_UNIT_SIZE, fields_dtype

from ..log.segments import SegmentQueue
from .consumequeue import list_queues
from ..arrays import distinct

BCQ_DIR = "batchconsumequeue"
BCQ_DTYPE = fields_dtype(BCQ_UNIT_FIELDS)
assert BCQ_DTYPE.itemsize == BCQ_UNIT_SIZE
QUEUE_TYPE_ATTRIBUTE = "queue.type"
BATCH_CQ = "BatchCQ"


def valid_units(arr: np.ndarray) -> np.ndarray:
    """The broker's validity test of §9.3, per unit."""
    return (arr["phyOffset"] >= 0) & (arr["size"] > 0) & (arr["msgBaseOffset"] >= 0) & (arr["batchSize"] > 0)


class BatchConsumeQueue:
    """One ``batchconsumequeue/<topic>/<queueId>`` directory."""

    def __init__(self, root: str, topic: str, queue_id: int, config):
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(root, BCQ_DIR, topic, str(queue_id))
        self.file_size = config.mapperFileSizeBatchConsumeQueue
        self.segments = SegmentQueue(self.directory, self.file_size, "batch consume queue")

    def file_units(self, seg) -> np.ndarray:
        n = min(seg.size, self.file_size) // BCQ_UNIT_SIZE
        if n <= 0:
            return np.zeros(0, dtype=BCQ_DTYPE)
        return np.frombuffer(seg.buffer(), dtype=BCQ_DTYPE, count=n)

    def valid_files(self):
        """(file, number of valid units) of each file the queue reaches, in order."""
        end = None
        for seg in self.segments.segments:
            if end is not None and seg.start != end:
                break  # gap between files
            arr = self.file_units(seg)
            bad = np.flatnonzero(~valid_units(arr))
            n = int(bad[0]) if len(bad) else len(arr)
            yield seg, n
            end = seg.start + self.file_size
            if n * BCQ_UNIT_SIZE < self.file_size:
                break

    def units(self) -> np.ndarray:
        """Every valid unit (BCQ_DTYPE, a copy)."""
        parts = [self.file_units(seg)[:n] for seg, n in self.valid_files() if n]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=BCQ_DTYPE)

    def bounds(self) -> tuple[int, int, int]:
        """(min offset, max offset, maxMsgPhyOffsetInCommitLog) as the broker's recovery leaves them: the
        first unit's msgBaseOffset, the last unit's msgBaseOffset + batchSize, the last unit's phyOffset
        (-1 without units; the broker keeps the start, not the end, of the last record)."""
        first = last = None
        for seg, n in self.valid_files():
            if n:
                arr = self.file_units(seg)
                if first is None:
                    first = arr[0]
                last = arr[n - 1]
        if last is None:
            return 0, 0, -1
        return (int(first["msgBaseOffset"]), int(last["msgBaseOffset"]) + int(last["batchSize"]),
                int(last["phyOffset"]))

    def unit_at(self, queue_offset: int) -> dict | None:
        """The unit covering ``queue_offset`` (msgBaseOffset <= offset < msgBaseOffset + batchSize), found
        like getBatchMsgIndexBuffer: the last file whose first unit starts at or before it, then a binary search
        on msgBaseOffset."""
        files = [(seg, n) for seg, n in self.valid_files() if n]
        for seg, n in reversed(files):
            arr = self.file_units(seg)[:n]
            if int(arr["msgBaseOffset"][0]) > queue_offset:
                continue
            base = arr["msgBaseOffset"].astype(np.int64)
            k = int(np.searchsorted(base, queue_offset, side="right")) - 1
            if k < 0:
                return None
            u = arr[k]
            if queue_offset >= int(u["msgBaseOffset"]) + int(u["batchSize"]):
                return None
            return unit_dict(u, seg.start + k * BCQ_UNIT_SIZE)
        return None


INNER_NUM, INNER_BASE = "INNER_NUM", "INNER_BASE"
_SHORT_MIN, _SHORT_MAX = -(1 << 15), (1 << 15) - 1


def batch_fields(props: dict, queue_offset: int) -> tuple[int, int]:
    """(msgBaseOffset, batchSize) dispatch gives a record (CommitLog.setBatchSizeIfNeeded): INNER_BASE and
    INNER_NUM when the record carries both, else its QUEUEOFFSET and 1. Raises ValueError where Java's
    Long/Short.parseLong would throw (the broker then reads the record as invalid)."""
    if INNER_NUM in props and INNER_BASE in props:
        base, num = _java_long(props[INNER_BASE]), _java_long(props[INNER_NUM])
        if not _SHORT_MIN <= num <= _SHORT_MAX:
            raise ValueError(f"INNER_NUM {props[INNER_NUM]!r} is not a short")
        return base, num
    return queue_offset, 1


def _java_long(text: str) -> int:
    t = text
    if not t or not (t.lstrip("+-").isdigit() and t.lstrip("+-").isascii()) or len(t) - len(t.lstrip("+-")) > 1:
        raise ValueError(f"{text!r} is not a number")
    v = int(t)
    if not -(1 << 63) <= v < (1 << 63):
        raise ValueError(f"{text!r} is out of range")
    return v


def chunk_batch_fields(u8, h, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(msgBaseOffset, batchSize, unparsable) of the records ``rows`` of decoded headers ``h`` over ``u8``
    (:func:`batch_fields`; the two properties located for all of them at once by the compiled scan)."""
    from rmqstore_cli.formats import propscan
    from rmqstore_cli.formats.message import decode_utf8
    from rmqstore_cli.formats.properties import parse_properties

    rows = np.asarray(rows, np.int64)
    base = np.asarray(h.queueOffset, np.int64)[rows].copy()
    num = np.ones(len(rows), np.int64)
    bad = np.zeros(len(rows), bool)
    if not len(rows):
        return base, num, bad
    pv = propscan.scan(u8, np.asarray(h.propsStart)[rows], np.asarray(h.propsLength)[rows], names=(INNER_NUM, INNER_BASE))
    for k in np.flatnonzero(((pv.start[INNER_NUM] >= 0) & (pv.start[INNER_BASE] >= 0)) | ~pv.ascii).tolist():
        i = int(rows[k])
        if pv.ascii[k]:
            props = {n: bytes(u8[int(pv.start[n][k]):int(pv.end[n][k])]).decode("ascii") for n in (INNER_NUM, INNER_BASE)}
        else:
            s, ln = int(h.propsStart[i]), int(h.propsLength[i])
            props = parse_properties(decode_utf8(bytes(u8[s:s + ln])))
        try:
            base[k], num[k] = batch_fields(props, int(base[k]))
        except ValueError:
            bad[k] = True
    return base, num, bad


def record_batch_fields(store, recs, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`chunk_batch_fields` of the records ``rows`` of a verify record table (``verify.records._Records``),
    each segment's records decoded again (headers only)."""
    from rmqstore_cli.formats import fast

    rows = np.asarray(rows, np.int64)
    base = recs.c["queueOffset"][rows].astype(np.int64)
    num = np.ones(len(rows), np.int64)
    bad = np.zeros(len(rows), bool)
    segs = store.commitlog.segments.segments
    seg_of = recs.seg[rows]
    for k in distinct(seg_of).tolist():
        at = np.flatnonzero(seg_of == k)
        seg = segs[k]
        buf = seg.buffer()
        h = fast.decode_headers(buf, recs.phy[rows[at]] - seg.start)
        base[at], num[at], bad[at] = chunk_batch_fields(fast.kernel_view(buf), h, np.arange(len(at)))
    return base, num, bad


def unit_dict(u, position: int | None = None) -> dict:
    out = {n: int(u[n]) for n, _ in BCQ_UNIT_FIELDS}
    if position is not None:
        out["position"] = position
    return out


def list_batch_queues(root: str) -> list[tuple[str, int]]:
    return list_queues(root, BCQ_DIR)


def batch_topics(store) -> set[str]:
    """:func:`batch_topics_at` of a :class:`~..store.Store`."""
    return batch_topics_at(store.root, store.read_config_json)


def batch_topics_at(root: str, read_config_json=None) -> set[str]:
    """Topics whose queues are batch consume queues: every topic with a folder under batchconsumequeue/ (the
    broker loads those as BatchCQ whatever its topic table says) and every topic ``config/topics.json`` gives
    the attribute ``queue.type=BatchCQ`` (QueueTypeUtils.getCQType)."""
    out = {t for t, _ in list_batch_queues(root)}
    if read_config_json is None:
        from ..config.files import read_store_config_json

        def read_config_json(name):
            return read_store_config_json(root, name)
    try:
        table = (read_config_json("topics.json") or {}).get("topicConfigTable") or {}
    except Exception:  # an unreadable topics.json is reported by `dump config`; the folders still decide
        table = {}
    if isinstance(table, dict):
        for name, tc in table.items():
            attrs = (tc or {}).get("attributes") if isinstance(tc, dict) else None
            if isinstance(attrs, dict):
                v = attrs.get(QUEUE_TYPE_ATTRIBUTE, attrs.get("+" + QUEUE_TYPE_ATTRIBUTE))
                if isinstance(v, str) and v == BATCH_CQ:
                    out.add(str(name))
    return out
