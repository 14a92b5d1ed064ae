"""The requests dispatch works on (the broker's DispatchRequest), one at a time or as columns.

:class:`DispatchBatch` holds many requests as columns (what a commitlog chunk or an append hands the
Dispatcher, :mod:`.dispatch`), with what dispatch derives per record: topic ids, index key hashes, the
multi-dispatch (LMQ) units and, for batch topics, msgBaseOffset / batchSize.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from rmqstore_cli.formats.message import decode_utf8

from .lmq import LmqTargets


@dataclass(slots=True)
class DispatchRequest:
    """What the broker's DispatchRequest carries for the CQ and index dispatchers."""

    phy: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sysflag: int
    store_timestamp: int
    tags_code: int
    uniq_key: str | None = None
    keys: str | None = None
    bitmap: bytes = b""
    lmq: tuple = ()  # (queue name, queue id, queue offset) of each multi-dispatch unit (.lmq)


_NUMBERS = ("phy", "size", "queue_id", "queue_offset", "sysflag", "store_timestamp", "tags_code")


class _ChunkStrings:
    """Topic, UNIQ_KEY and KEYS strings of a scanned chunk's records, decoded only when a caller reads
    the batch as requests (the bulk dispatch works on topic ids and key hashes and never asks)."""

    def __init__(self, u8, topic_names: list[str], tids, pv, slow: dict):
        self.u8, self.topic_names, self.tids, self.pv, self.slow = u8, topic_names, tids, pv, slow

    def _span(self, name: str, i: int) -> str | None:
        s = int(self.pv.start[name][i])
        return None if s < 0 else decode_utf8(bytes(self.u8[s:int(self.pv.end[name][i])]))

    def rows(self, rows: list[int]) -> tuple[list, list, list]:
        topics = [self.topic_names[t] for t in self.tids[rows].tolist()] if rows else []
        uniqs, keyss = [], []
        for i in rows:
            props = self.slow.get(i)
            if props is None:
                uniqs.append(self._span("UNIQ_KEY", i))
                keyss.append(self._span("KEYS", i))
            else:
                uniqs.append(props.get("UNIQ_KEY") or None)
                keyss.append(props.get("KEYS") or None)
        return topics, uniqs, keyss


class DispatchBatch(Sequence):
    """Many DispatchRequests as columns (commitlog order): int64 arrays for the numbers, lists
    for topics, keys and bitmaps.  Reads like a list of :class:`DispatchRequest` (index, slice,
    iterate); the Dispatcher works on the columns without making a request object per record.

    A batch scanned from the commitlog (:meth:`Dispatcher.requests_from_chunk`) also carries what
    dispatch computes per record as columns: ``topic_ids`` into ``topic_names``, and each record's
    index key hashes (``key_count`` per record, ``key_hashes`` in record order); its topic and key
    strings are decoded only if someone reads them."""

    __slots__ = _NUMBERS + ("_topic", "_uniq", "_keys", "bitmap", "topic_ids", "topic_names", "key_count", "key_hashes",
                            "_strings", "_rows", "lmq", "msg_base", "batch_size", "cq_plan")

    def __init__(self, phy, size, topic, queue_id, queue_offset, sysflag, store_timestamp, tags_code,
                 uniq_key, keys, bitmap=None, *, topic_ids=None, topic_names=None, key_count=None, key_hashes=None,
                 strings: _ChunkStrings | None = None, rows=None, lmq: LmqTargets | None = None):
        i64 = np.int64
        self.lmq = lmq  # the records' multi-dispatch units (None: none)
        # batch consume queue fields (None: each record's QUEUEOFFSET and 1), set for chunks holding batch topics
        self.msg_base, self.batch_size = None, None
        self.cq_plan = None  # the consume-queue units grouped and packed (.cqplan), made with the batch
        self.phy = np.asarray(phy, dtype=i64)
        self.size = np.asarray(size, dtype=i64)
        self.queue_id = np.asarray(queue_id, dtype=i64)
        self.queue_offset = np.asarray(queue_offset, dtype=i64)
        self.sysflag = np.asarray(sysflag, dtype=i64)
        self.store_timestamp = np.asarray(store_timestamp, dtype=i64)
        self.tags_code = np.asarray(tags_code, dtype=i64)
        self._topic, self._uniq, self._keys = topic, uniq_key, keys
        self.bitmap = bitmap  # None: no record has a bitmap
        self.topic_ids, self.topic_names = topic_ids, topic_names
        self.key_count, self.key_hashes = key_count, key_hashes
        self._strings, self._rows = strings, rows

    def __getstate__(self):
        # A batch sent between processes (rebuild -j) must not carry its chunk's buffer: its strings are
        # decoded here, once, and the reference to the mapped segment is dropped.
        if self._strings is not None:
            if self._uniq is None or self._keys is None or self._topic is None:
                self._decode_strings()
        return {k: (None if k in ("_strings", "_rows") else getattr(self, k)) for k in self.__slots__}

    def __setstate__(self, state) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def _decode_strings(self) -> None:
        self._topic, self._uniq, self._keys = self._strings.rows(self._rows.tolist())

    @property
    def topic(self) -> list:
        if self._topic is None:
            if self._strings is None:
                self._topic = [self.topic_names[t] for t in self.topic_ids.tolist()]
            else:
                self._decode_strings()
        return self._topic

    @property
    def uniq_key(self) -> list:
        if self._uniq is None:
            self._decode_strings()
        return self._uniq

    @property
    def keys(self) -> list:
        if self._keys is None:
            self._decode_strings()
        return self._keys

    @classmethod
    def from_requests(cls, reqs: Sequence[DispatchRequest]) -> "DispatchBatch":
        if isinstance(reqs, DispatchBatch):
            return reqs
        bitmaps = [r.bitmap for r in reqs]
        lmq = [(i, r.lmq) for i, r in enumerate(reqs) if r.lmq]
        return cls([r.phy for r in reqs], [r.size for r in reqs], [r.topic for r in reqs],
                   [r.queue_id for r in reqs], [r.queue_offset for r in reqs], [r.sysflag for r in reqs],
                   [r.store_timestamp for r in reqs], [r.tags_code for r in reqs], [r.uniq_key for r in reqs],
                   [r.keys for r in reqs], bitmaps if any(bitmaps) else None,
                   lmq=LmqTargets.from_lists(lmq) if lmq else None)

    def __len__(self) -> int:
        return len(self.phy)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self.phy))[i])
        n = len(self.phy)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("DispatchBatch index out of range")
        return DispatchRequest(int(self.phy[i]), int(self.size[i]), self.topic[i], int(self.queue_id[i]),
                               int(self.queue_offset[i]), int(self.sysflag[i]), int(self.store_timestamp[i]),
                               int(self.tags_code[i]), self.uniq_key[i], self.keys[i],
                               b"" if self.bitmap is None else self.bitmap[i])

    def __iter__(self):
        cols = (self.phy.tolist(), self.size.tolist(), self.topic, self.queue_id.tolist(),
                self.queue_offset.tolist(), self.sysflag.tolist(), self.store_timestamp.tolist(),
                self.tags_code.tolist(), self.uniq_key, self.keys)
        if self.bitmap is None:
            for row in zip(*cols):
                yield DispatchRequest(*row)
        else:
            for row, bm in zip(zip(*cols), self.bitmap):
                yield DispatchRequest(*row, bm)

    def take(self, idx: np.ndarray) -> "DispatchBatch":
        """The records at the (sorted) positions ``idx``."""
        idx = np.asarray(idx, dtype=np.int64)
        il = idx.tolist()
        pick = lambda col: None if col is None else [col[i] for i in il]  # noqa: E731
        columns = dict(topic_names=self.topic_names, strings=self._strings,
                       lmq=None if self.lmq is None else self.lmq.take_rows(idx),
                       topic_ids=None if self.topic_ids is None else self.topic_ids[idx],
                       rows=None if self._rows is None else self._rows[idx])
        if self.key_hashes is not None:
            counts = self.key_count.astype(np.int64)
            keep = np.zeros(len(self.phy), dtype=bool)
            keep[idx] = True
            columns.update(key_count=self.key_count[idx], key_hashes=self.key_hashes[np.repeat(keep, counts)])
        out = DispatchBatch(self.phy[idx], self.size[idx], pick(self._topic), self.queue_id[idx], self.queue_offset[idx],
                            self.sysflag[idx], self.store_timestamp[idx], self.tags_code[idx], pick(self._uniq),
                            pick(self._keys), pick(self.bitmap), **columns)
        if self.msg_base is not None:
            out.msg_base, out.batch_size = self.msg_base[idx], self.batch_size[idx]
        return out
