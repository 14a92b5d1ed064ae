"""Appending messages to a store the way the broker's CommitLog.putMessage does (FORMAT.md §2).

``Appender.open`` takes the store's lock and ``abort`` (a write session), finds the end of the
commitlog like a clean restart, and lets the :class:`Dispatcher` recover every consume queue
it touches, so queue offsets continue the broker's topicQueueTable (§13.8).  Each put
(single message or classic batch) goes into the current segment if ``TOTALSIZE + 8`` fits in
what remains, else an 8-byte BLANK marker ends the segment and the put moves to the next one
(a batch is all-or-nothing).  A put only assigns offsets; up to ``DISPATCH_EVERY`` records are
then encoded together, written with one copy and dispatched in commitlog order in the same
process; ``close`` flushes everything, updates the checkpoint and removes ``abort``.

An I/O failure (disk full, file too large, read-only, I/O error) anywhere in the session undoes
it: every file is put back from the session's :class:`UndoJournal` and :class:`WriteFailed`
says so.  Bad input (a bad DELAY, say) only stops the session: earlier puts are kept.

Store times: a message without one gets the clock's time, raised to the newest store time in the log
if the clock is behind it (times never go down along what we write).  A message that brings its own
(a replay) is refused with :class:`StoreTimeBackwards` when it is older than the newest store time in
the log, unless the session keeps store times as given (``keep_store_times``): a log whose times go
down is what a broker whose clock went back writes, and verify reports it (``CL_STORE_TIME``).
"""

from __future__ import annotations

import errno
import os
import struct
from operator import itemgetter
from time import time as _time
from typing import Callable, Sequence

import numpy as np

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.hashing import crc32 as _crc32
from rmqstore_cli.formats.message import encode_message
from rmqstore_cli.formats.msgid import encode_offset_msgid
from rmqstore_cli.formats.records import MAGIC_BLANK, TRANSACTION_PREPARED, TRANSACTION_ROLLBACK
from rmqstore_cli.formats.tags import SCHEDULE_TOPIC, tags_code

from .checkpointwriter import CheckpointWriter
from .commitlog import CommitLog
from ..config.storeconfig import StoreConfig
from ..derived.dispatch import DispatchBatch, Dispatcher
from ..errors import StoreCorruptError, UsageError
from .lockfile import WriteSession
from .mappedfile import SegmentQueueWriter, UndoJournal
from ..derived.lmq import (DISPATCH_PROP, LMQ_QUEUE_ID, OFFSET_PROP, LmqTargets, MultiDispatchRule, append_side_on,
                           is_lmq, lmq_names, wrapped_properties, wraps_lmq)
from .messages import InputError, OutMessage, header_struct, topic_length_piece, with_properties

_BLANK = struct.Struct(">ii")
_I16 = struct.Struct(">h")
_HEADER_V4 = header_struct(4, 4)
_NO_QUEUE_OFFSET = (TRANSACTION_PREPARED, TRANSACTION_ROLLBACK)
_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 1024
DISPATCH_EVERY = 4096  # records buffered before they are written and dispatched


_tuple_new = tuple.__new__
_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class WriteFailed(UsageError):
    """An append that could not write; ``rolled_back`` tells whether the store is as it was."""

    def __init__(self, message: str, rolled_back: bool):
        super().__init__(message)
        self.rolled_back = rolled_back


class StoreTimeBackwards(InputError):
    """A replayed message stored earlier than the newest record in the log (refused before any write)."""


class AppendResult(tuple):
    """Where one record went (the broker's AppendMessageResult): a tuple (made without a
    Python-level constructor, one per message) with named fields; msgId is computed on demand."""

    __slots__ = ()
    _fields = ("offset", "size", "queueOffset", "topic", "queueId", "storeTimestamp", "storeHost")

    def __new__(cls, offset: int, size: int, queueOffset: int, topic: str, queueId: int, storeTimestamp: int,
                storeHost: tuple):
        return _tuple_new(cls, (offset, size, queueOffset, topic, queueId, storeTimestamp, storeHost))

    offset = property(itemgetter(0))
    size = property(itemgetter(1))
    queueOffset = property(itemgetter(2))
    topic = property(itemgetter(3))
    queueId = property(itemgetter(4))
    storeTimestamp = property(itemgetter(5))
    storeHost = property(itemgetter(6))

    @property
    def msgId(self) -> str:
        host = self[6]
        return encode_offset_msgid(host[0], host[1], self[0])

    def as_json(self) -> dict:
        return {"offset": self[0], "size": self[1], "msgId": self.msgId, "queueOffset": self[2], "topic": self[3],
                "queueId": self[4], "storeTimestamp": self[5]}

    def __repr__(self) -> str:
        return f"AppendResult({self.as_json()!r})"


class Appender:
    """A write session on one store: ``open``, ``put``/``put_many``, ``close``."""

    def __init__(self, root: str, config: StoreConfig, *, index_namer: Callable[[int], str] | None = None,
                 fsync_always: bool = False, keep_store_times: bool = False):
        self.root = root
        self.keep_store_times = keep_store_times
        self.config = config
        self.index_namer = index_namer
        self.fsync_always = fsync_always
        self.session = WriteSession(root)
        self.cl_dir = config.storePathCommitLog or os.path.join(root, "commitlog")
        self.file_size = config.mappedFileSizeCommitLog
        self.offset = 0  # next physical offset
        self.last_store_ts = 0  # the newest store time in the log (of the files a restart checks) and of our puts
        self.table: dict[tuple[str, int], int] = {}
        # Puts accepted but not yet written: the messages and their results (offsets, store time).
        self._p_msgs: list[OutMessage] = []
        self._p_res: list[AppendResult] = []
        self._tags_cache: dict = {}
        self._topic_pieces: dict = {}
        self.written = 0
        self.blanks = 0
        self.cl: SegmentQueueWriter | None = None
        self.dispatcher: Dispatcher | None = None
        self.journal: UndoJournal | None = None
        self._failed = False
        self.rolled_back = False
        self.lmq_append = config.version >= 5 and append_side_on(config)
        self.multi_dispatch = MultiDispatchRule(config)

    # --- open: the state a clean restart would rebuild ----------------------------------------

    def open(self) -> "Appender":
        os.makedirs(self.root, exist_ok=True)
        self.session.begin()
        self.journal = j = UndoJournal()
        try:
            self._find_end()
            self.cl = SegmentQueueWriter(self.cl_dir, self.file_size, j)
            self.dispatcher = Dispatcher(self.root, self.config, index_namer=self.index_namer,
                                         checkpoint=CheckpointWriter(self.root, j), journal=j)
        except OSError as e:
            self._rollback(e)
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
                newest = int(chunk.headers.storeTimestamp.max())
                last_ts = newest if last_ts is None else max(last_ts, newest)
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
        except OSError as e:
            self._rollback(e)
        except StoreTimeBackwards:
            raise  # refused before any side effect: the session goes on (and closes clean)
        except BaseException:
            self._failed = True
            raise

    def _wrap_lmq(self, m: OutMessage) -> OutMessage:
        """The 5.x append of a message to LMQ queues (LmqDispatch.wrapLmqDispatch): each ``%LMQ%`` name gets its
        queue's next offset in INNER_MULTI_QUEUE_OFFSET (a non-LMQ name an empty one), the properties are stored
        re-serialised, and each LMQ queue's offset goes up by one (updateLmqOffsets)."""
        names = lmq_names(m.props_map)
        offsets = [self.next_queue_offset(n, LMQ_QUEUE_ID) if is_lmq(n) else None for n in names]
        m = with_properties(m, wrapped_properties(m.props_b.decode("utf-8", "replace"), offsets), self.config)
        for n in names:
            if is_lmq(n):
                self.table[(n, LMQ_QUEUE_ID)] = self.next_queue_offset(n, LMQ_QUEUE_ID) + 1
        return m

    def _put(self, msgs: Sequence[OutMessage]) -> list[AppendResult]:
        if self.lmq_append and len(msgs) == 1 and wraps_lmq(msgs[0].topic, msgs[0].props_map):
            msgs = [self._wrap_lmq(msgs[0])]
        first = msgs[0]
        ts = first.store_timestamp
        if ts is None:
            ts = int(_time() * 1000)
            if ts < self.last_store_ts:
                ts = self.last_store_ts  # our clock never takes a log's store time back
        elif ts < self.last_store_ts and not self.keep_store_times:
            raise StoreTimeBackwards(
                f"storeTimestamp {ts} is older than the newest store time in the log ({self.last_store_ts}, "
                f"{self.last_store_ts - ts} ms later); store times do not go down along a log unless the broker's "
                "clock went back: give --keep-store-times to write it as given (verify then reports CL_STORE_TIME)")
        single = len(msgs) == 1
        need = first.total_size if single else sum(m.total_size for m in msgs)
        fs = self.file_size
        phy = self.offset
        pos = phy % fs
        if need + 8 > fs - pos:
            self._write()  # the records before the BLANK go into this segment first
            self.write_blank(phy)
            phy += fs - pos
            self.offset = phy
        table = self.table
        if single:
            m = first
            topic = m.topic
            if topic == SCHEDULE_TOPIC:
                tags_code(topic, m.props_map, ts, self.dispatcher.delay_table)  # a bad DELAY fails the put here
            if m.sysflag & 0xC in _NO_QUEUE_OFFSET:
                qo = 0  # half/rollback records get no queue position
            else:
                key = (topic, m.queue_id)
                qo = table.get(key)
                if qo is None:
                    qo = self.next_queue_offset(topic, m.queue_id)
                table[key] = qo + 1
            out = [_tuple_new(AppendResult, (phy, m.total_size, qo, topic, m.queue_id, ts, m.store_host))]
            self._p_msgs.append(m)
            self._p_res.append(out[0])
            phy += m.total_size
        else:
            out = []
            assigned: dict[tuple[str, int], int] = {}
            for m in msgs:
                topic = m.topic
                if topic == SCHEDULE_TOPIC:
                    tags_code(topic, m.props_map, ts, self.dispatcher.delay_table)
                if m.sysflag & 0xC in _NO_QUEUE_OFFSET:
                    qo = 0
                else:
                    key = (topic, m.queue_id)
                    qo = assigned.get(key)
                    if qo is None:
                        qo = table.get(key)
                        if qo is None:
                            qo = self.next_queue_offset(topic, m.queue_id)
                    assigned[key] = qo + 1
                out.append(_tuple_new(AppendResult, (phy, m.total_size, qo, topic, m.queue_id, ts, m.store_host)))
                phy += m.total_size
            # Nothing above had a side effect: from here on the batch is committed.
            table.update(assigned)
            self._p_msgs.extend(msgs)
            self._p_res.extend(out)
        # Records are encoded and written in bulk (``_write``), before any BLANK, dispatch or flush.
        self.offset = phy
        if ts > self.last_store_ts:
            self.last_store_ts = ts
        self.written += len(msgs)
        if len(self._p_msgs) >= DISPATCH_EVERY or self.fsync_always:
            self._write()
            if self.fsync_always:
                self.flush()
        return out

    def write_blank(self, at: int) -> None:
        """End the segment at offset ``at`` with the 8-byte BLANK marker (the rest of it stays zeros)."""
        fs = self.file_size
        pos = at % fs
        seg = self.cl.open(at - pos)
        seg.touch(pos, 8)
        _BLANK.pack_into(seg.mm, pos, fs - pos, MAGIC_BLANK)
        seg.dirty = True
        self.blanks += 1

    def _write(self) -> None:
        """Encode the pending records, write them with one copy into their segment, dispatch them."""
        msgs = self._p_msgs
        if not msgs:
            return
        res = self._p_res
        self._p_msgs, self._p_res = [], []
        pieces = []
        add = pieces.extend
        codes = []
        code_of = self._tags_cache
        topic_piece = self._topic_pieces
        delay_table = self.dispatcher.delay_table
        v4 = _HEADER_V4
        for m, r in zip(msgs, res):
            topic = m.topic
            props = m.props_map
            if topic == SCHEDULE_TOPIC:
                codes.append(tags_code(topic, props, r[5], delay_table))
            else:
                # Outside the schedule topic tagsCode depends on TAGS alone.
                tags = props.get("TAGS")
                code = code_of.get(tags)
                if code is None:
                    code = code_of[tags] = tags_code(topic, {"TAGS": tags} if tags else None, 0)
                codes.append(code)
            if m.crc_prop:  # __CRC32# covers the finished record
                pieces.append(encode_message(
                    topic=m.topic_b, queue_id=m.queue_id, flag=m.flag, queue_offset=r[2], physical_offset=r[0],
                    sysflag=m.sysflag, born_timestamp=m.born_timestamp, born_host=m.born_host, store_timestamp=r[5],
                    store_host=m.store_host, reconsume_times=m.reconsume_times, prepared_offset=m.prepared_offset,
                    body=m.body, properties=m.props_b, magic=m.magic, append_crc_property=True))
                continue
            bh, sh = m.born_host, m.store_host
            body = m.body
            tb = m.topic_b
            tp = topic_piece.get((tb, m.magic))
            if tp is None:
                tp = topic_piece[(tb, m.magic)] = topic_length_piece(tb, m.magic) + tb
            hdr = v4 if len(bh[0]) == 4 and len(sh[0]) == 4 else header_struct(len(bh[0]), len(sh[0]))
            pb = m.props_b
            add((hdr.pack(m.total_size, m.magic, _crc32(body) & 0x7FFFFFFF if body else 0, m.queue_id, m.flag, r[2],
                          r[0], m.sysflag, m.born_timestamp, bh[0], bh[1], r[5], sh[0], sh[1], m.reconsume_times,
                          m.prepared_offset, len(body)),
                 body, tp, _I16.pack(len(pb)), pb))
        start = res[0][0]
        pos = start % self.file_size
        seg = self.cl.open(start - pos)
        # pwritev gathers the pieces straight into the page cache (the mapping sees them): no
        # joined copy in fresh memory and no page faults, the two costs of a big mapped write.
        fd = seg.fd
        seg.touch(pos, res[-1][0] + res[-1][1] - start)
        for i in range(0, len(pieces), _IOV_MAX):
            part = pieces[i : i + _IOV_MAX]
            n = os.pwritev(fd, part, pos)
            want = sum(map(len, part))
            if n != want:  # short write (e.g. a signal): finish it from one joined buffer
                rest = memoryview(b"".join(part))[n:]
                while rest:
                    k = os.pwrite(fd, rest, pos + want - len(rest))
                    rest = rest[k:]
            pos += want
        seg.dirty = True
        phy, size, qo, topics, qids, tss, _ = zip(*res)
        rule = self.multi_dispatch
        lmq = [(i, t) for i, m in enumerate(msgs) if OFFSET_PROP in m.props_map
               for t in (rule.targets(m.topic, m.queue_id, m.props_map.get(DISPATCH_PROP), m.props_map[OFFSET_PROP]),) if t]
        self.dispatcher.dispatch_many(DispatchBatch(
            phy, size, list(topics), qids, qo, [m.sysflag for m in msgs], tss, codes,
            [m.props_map.get("UNIQ_KEY") for m in msgs], [m.props_map.get("KEYS") for m in msgs],
            lmq=LmqTargets.from_lists(lmq) if lmq else None))

    def _dispatch(self) -> None:
        self._write()

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
        except OSError as e:
            self._rollback(e)
        except BaseException:
            clean = False
            raise
        finally:
            if self.cl is not None:
                self.cl.close(flush=False)
            if self.dispatcher is not None:
                self.dispatcher.close(flush=False)
            self.session.end(clean=clean)

    def _rollback(self, err: OSError) -> None:
        """Undo the whole session after an I/O failure, end it, and raise :class:`WriteFailed`."""
        self._failed = True
        name = errno.errorcode.get(err.errno, "") if err.errno else ""
        strerror = f"{err.strerror or err}"
        what = (f"{name}: " if name and name not in strerror else "") + strerror + (f": {err.filename}" if err.filename else "")
        head = f"out of space ({what})" if err.errno in _NO_SPACE else f"cannot write the store ({what})"
        try:
            if self.cl is not None:
                self.cl.close(flush=False)
            if self.dispatcher is not None:
                self.dispatcher.close(flush=False)
            if self.journal is not None:
                self.journal.undo()
        except OSError as e2:
            self.session.end(clean=False)
            raise WriteFailed(f"{head}; undoing the partial append failed too ({e2.strerror or e2}): the store is "
                              f"left marked unclean (abort file): run `rmqstore recover {self.root}`",
                              rolled_back=False) from None
        finally:
            self.cl = self.dispatcher = None
        self.rolled_back = True
        self.session.end(clean=not self.session.found_abort)
        raise WriteFailed(f"{head}: nothing was written; the store is as it was", rolled_back=True) from None

    def __enter__(self):
        return self.open()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and not issubclass(exc_type, Exception):
            self._failed = True
        self.close()
