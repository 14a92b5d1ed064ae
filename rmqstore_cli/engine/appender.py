"""Appending messages to a store the way the broker's CommitLog.putMessage does (FORMAT.md §2).

``Appender.open`` takes the store's lock and ``abort`` (a write session), finds the end of the
commitlog like a clean restart, and lets the :class:`Dispatcher` recover every consume queue
it touches, so queue offsets continue the broker's topicQueueTable (§13.8).  Each put
(single message or classic batch) goes into the current segment if ``TOTALSIZE + 8`` fits in
what remains, else an 8-byte BLANK marker ends the segment and the put moves to the next one
(a batch is all-or-nothing).  Records are dispatched in commitlog order in the same process;
``close`` flushes everything, updates the checkpoint and removes ``abort``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from formats import fast
from formats.message import encode_message
from formats.msgid import encode_offset_msgid
from formats.records import MAGIC_BLANK, TRANSACTION_PREPARED, TRANSACTION_ROLLBACK
from formats.tags import tags_code

from .checkpointwriter import CheckpointWriter
from .commitlog import CommitLog
from .config import StoreConfig
from .dispatch import DispatchRequest, Dispatcher
from .errors import StoreCorruptError
from .lockfile import WriteSession
from .mappedfile import SegmentQueueWriter
from .messages import OutMessage, now_ms

_BLANK = struct.Struct(">ii")
_QQ = struct.Struct(">qq")
_Q = struct.Struct(">q")
DISPATCH_EVERY = 4096  # records buffered before they are dispatched


@dataclass(slots=True)
class AppendResult:
    offset: int
    size: int
    msgId: str
    queueOffset: int
    topic: str
    queueId: int
    storeTimestamp: int

    def as_json(self) -> dict:
        return {"offset": self.offset, "size": self.size, "msgId": self.msgId, "queueOffset": self.queueOffset,
                "topic": self.topic, "queueId": self.queueId, "storeTimestamp": self.storeTimestamp}


class Appender:
    """A write session on one store: ``open``, ``put``/``put_many``, ``close``."""

    def __init__(self, root: str, config: StoreConfig, *, index_namer: Callable[[int], str] | None = None,
                 fsync_always: bool = False):
        self.root = root
        self.config = config
        self.index_namer = index_namer
        self.fsync_always = fsync_always
        self.session = WriteSession(root)
        self.cl_dir = config.storePathCommitLog or os.path.join(root, "commitlog")
        self.file_size = config.mappedFileSizeCommitLog
        self.offset = 0  # next physical offset
        self.last_store_ts = 0
        self.table: dict[tuple[str, int], int] = {}
        self.pending: list[DispatchRequest] = []
        self.written = 0
        self.blanks = 0
        self.cl: SegmentQueueWriter | None = None
        self.dispatcher: Dispatcher | None = None
        self._failed = False

    # --- open: the state a clean restart would rebuild ----------------------------------------

    def open(self) -> "Appender":
        os.makedirs(self.root, exist_ok=True)
        self.session.begin()
        try:
            self._find_end()
            self.cl = SegmentQueueWriter(self.cl_dir, self.file_size)
            self.dispatcher = Dispatcher(self.root, self.config, index_namer=self.index_namer,
                                         checkpoint=CheckpointWriter(self.root))
        except BaseException:
            self.session.end(clean=False)
            raise
        return self

    def _find_end(self) -> None:
        log = CommitLog(self.cl_dir, self.config)
        try:
            segs = log.segments
            bad = [p for p in segs.problems if p.code in ("SEG_WRONG_SIZE", "SEG_BAD_NAME", "SEG_GAP",
                                                          "SEG_OVERLAP", "SEG_MISALIGNED", "SEG_SYMLINK")]
            if bad:
                raise StoreCorruptError(f"cannot append: {bad[0].message}")
            if not segs.segments:
                self.offset = 0
                return
            from .commitlog import ScanResult

            res = ScanResult()
            start = max(0, len(segs.segments) - 3)  # a clean restart checks the last three files
            last_ts = None
            for chunk in log.scan(start_index=start, check_crc=self.config.checkCRCOnRecover, result=res):
                last_ts = int(chunk.headers.storeTimestamp[-1])
            stop = res.stop
            if stop is None or not stop.clean:
                where = stop.offset if stop else 0
                raise StoreCorruptError(f"cannot append: the commitlog has invalid data at offset {where} "
                                        f"({stop.kind if stop else 'unknown'}); run verify/recover first")
            if stop.kind == fast.STOP_BLANK:
                self.offset = stop.segment.start + self.file_size
            else:
                self.offset = stop.offset if stop.segment is not None else segs.segments[-1].end
            self.last_store_ts = last_ts or 0
            for seg in segs.segments:
                # The broker's recovery deletes files past the end; an all-zero pre-allocated one is harmless.
                if seg.start >= self.offset and np.frombuffer(seg.buffer(), np.uint8).any():
                    raise StoreCorruptError(f"cannot append: commitlog file {seg.name} lies after the end of "
                                            f"the log ({self.offset}) and is not empty; run recover first")
        finally:
            log.close()

    # --- put -----------------------------------------------------------------------------------

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        key = (topic, queue_id)
        v = self.table.get(key)
        if v is None:
            v = self.table[key] = self.dispatcher.next_queue_offset(topic, queue_id)
        return v

    def put(self, msgs: Sequence[OutMessage]) -> list[AppendResult]:
        """One put: a single message, or the records of one classic batch (placed together)."""
        try:
            return self._put(msgs)
        except BaseException:
            self._failed = True
            raise

    def _put(self, msgs: Sequence[OutMessage]) -> list[AppendResult]:
        first = msgs[0]
        if first.store_timestamp is not None:
            ts = first.store_timestamp
        else:
            ts = max(now_ms(), self.last_store_ts)  # the broker's clock never goes back within a log
        need = sum(m.total_size for m in msgs)
        fs = self.file_size
        pos = self.offset % fs
        remaining = fs - pos
        if need + 8 > remaining:
            seg = self.cl.open(self.offset - pos)
            _BLANK.pack_into(seg.mm, pos, remaining, MAGIC_BLANK)
            seg.dirty = True
            self.offset += remaining
            self.blanks += 1
            pos = 0
        seg = self.cl.open(self.offset - pos)
        phy = self.offset
        out = []
        records = []
        reqs = []
        assigned: dict[tuple[str, int], int] = {}
        delay_table = self.dispatcher.delay_table
        for m in msgs:
            tx = m.sysflag & 0xC
            key = (m.topic, m.queue_id)
            if tx == TRANSACTION_PREPARED or tx == TRANSACTION_ROLLBACK:
                qo = 0  # half/rollback records get no queue position
            else:
                qo = assigned.get(key)
                if qo is None:
                    qo = self.table.get(key)
                    if qo is None:
                        qo = self.next_queue_offset(m.topic, m.queue_id)
                assigned[key] = qo + 1
            parts = m.encoded_parts()
            if parts is not None:
                head, mid, tail = parts
                records += (head, _QQ.pack(qo, phy), mid, _Q.pack(ts), tail)
            else:
                records.append(encode_message(
                    topic=m.topic_b, queue_id=m.queue_id, flag=m.flag, queue_offset=qo, physical_offset=phy,
                    sysflag=m.sysflag, born_timestamp=m.born_timestamp, born_host=m.born_host, store_timestamp=ts,
                    store_host=m.store_host, reconsume_times=m.reconsume_times, prepared_offset=m.prepared_offset,
                    body=m.body, properties=m.props_b, magic=m.magic, append_crc_property=m.crc_prop))
            props = m.props_map
            reqs.append(DispatchRequest(phy, m.total_size, m.topic, m.queue_id, qo, m.sysflag, ts,
                                        tags_code(m.topic, props, ts, delay_table),
                                        props.get("UNIQ_KEY"), props.get("KEYS")))
            out.append(AppendResult(phy, m.total_size, encode_offset_msgid(m.store_host[0], m.store_host[1], phy),
                                    qo, m.topic, m.queue_id, ts))
            phy += m.total_size
        data = b"".join(records)
        # Everything above was computed without side effects: from here on the put is committed.
        seg.mm[pos : pos + len(data)] = data
        seg.dirty = True
        self.table.update(assigned)
        self.pending.extend(reqs)
        self.offset = phy
        self.last_store_ts = max(self.last_store_ts, ts)
        self.written += len(msgs)
        if len(self.pending) >= DISPATCH_EVERY or self.fsync_always:
            self._dispatch()
        if self.fsync_always:
            self.flush()
        return out

    def _dispatch(self) -> None:
        if self.pending:
            reqs, self.pending = self.pending, []
            self.dispatcher.dispatch_many(reqs)

    # --- durability ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Commitlog first, then what was dispatched from it, then the checkpoint (the broker's order)."""
        self._dispatch()
        self.cl.flush()
        if self.written:
            self.dispatcher.checkpoint.set(physicMsgTimestamp=self.last_store_ts)
        self.dispatcher.flush()

    def close(self) -> None:
        """Flush and end the session; ``abort`` is removed only if every put completed."""
        if not self.session.active:
            return
        clean = not self._failed
        try:
            if self.cl is not None and self.dispatcher is not None:
                self.flush()
        except BaseException:
            clean = False
            raise
        finally:
            if self.cl is not None:
                self.cl.close(flush=False)
            if self.dispatcher is not None:
                self.dispatcher.close(flush=False)
            self.session.end(clean=clean)

    def __enter__(self):
        return self.open()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and not issubclass(exc_type, Exception):
            self._failed = True
        self.close()
