"""``append --from``: JSON Lines of dumped messages replayed into an :class:`Appender`, many lines at a time.

:class:`DumpReplay` mirrors the broker's ``CommitLog.putMessage`` + ``DefaultAppendMessageCallback.doAppend``
run for every line of the input, in order, followed by the reput of what was written (consume queues,
index, checkpoint) -- the same as one ``Appender.put`` per line, done in batches:

- the input is read in blocks of whole lines (memory stays flat whatever the input size);
- the compiled parser (:mod:`formats.replaykernel`) recognises the lines ``dump commitlog --json --body
  base64`` writes and turns them into columns; each distinct topic is checked once per block;
- every other line -- a batch, a body in hex or text, a property the broker treats specially, a
  schedule/batch topic, a store time older than the log's, a message too large, anything the
  parser does not recognise or the checks refuse -- goes, at its place in the order, through the
  plain per-line route (:func:`linejson.line_messages`, ``MessageBuilder``, ``Appender.put``), which
  gives the value or the error;
- a run of recognised lines gets its queue offsets and positions (BLANK at a segment end) in bulk,
  its records encoded by one compiled call, written with one ``pwrite`` per segment, and dispatched
  through the rebuild's dispatch of a commitlog chunk (``Dispatcher.requests_from_chunk``).

So an error on line *n* leaves the store with exactly the lines before *n*, as the plain route
always did: the lines before it in its block are written first, then the plain route raises.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np

from rmqstore_cli.formats import fast, propscan
from rmqstore_cli.formats.records import (MAGIC_V1, MAX_PROPERTIES_LENGTH, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6,
                                          TRANSACTION_PREPARED, TRANSACTION_ROLLBACK)
from rmqstore_cli.formats.tags import SCHEDULE_TOPIC

from ..arrays import queue_key
from .appender import AppendResult, Appender
from .commitlog import Chunk
from .linejson import line_messages
from .messages import InputError, MessageBuilder
from .writeback import EarlyWriteback

BLOCK_BYTES = 4 << 20  # input read per block (whole lines; a longer line makes its block longer)


def _kernel():
    from rmqstore_cli.formats import replaykernel

    return replaykernel


def _encoder():
    from rmqstore_cli.formats import replayencode

    return replayencode


class BatchResults(Sequence):
    """The :class:`AppendResult` of a run of records, kept as columns and made one by one when read."""

    def __init__(self, phy, size, queue_offset, topics, topic_of, queue_id, store_ts, host_hex, host_port):
        self.phy, self.size, self.queue_offset = phy, size, queue_offset
        self.topics, self.topic_of, self.queue_id, self.store_ts = topics, topic_of, queue_id, store_ts
        self.host_hex, self.host_port = host_hex, host_port  # (input bytes, start, length) of each ipHex

    def _ip(self, i: int) -> bytes:
        u8, start, length = self.host_hex
        s = int(start[i])
        return bytes.fromhex(bytes(u8[s:s + int(length[i])]).decode("ascii"))

    def __len__(self) -> int:
        return len(self.phy)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        host = (self._ip(i), int(self.host_port[i]))
        return AppendResult(int(self.phy[i]), int(self.size[i]), int(self.queue_offset[i]),
                            self.topics[int(self.topic_of[i])], int(self.queue_id[i]), int(self.store_ts[i]), host)



class DumpReplay:
    """Replays input lines into ``app`` (opened on the first line that is not blank)."""

    def __init__(self, app: Appender, builder: MessageBuilder, *, batch: bool = True):
        self.app = app
        self.builder = builder
        self.messages = line_messages(builder)
        cfg = app.config
        # --fsync always puts one message at a time; a __CRC32# reserve depends on the record's position
        self.batch = batch and not app.fsync_always and not builder.crc_on
        self.v5 = cfg.version >= 5
        self.batched = 0  # lines put by the batch route
        self.line = 0  # lines read so far (the numbering of error messages: universal newlines, from 1)
        self._scratch = np.empty(0, np.uint8)  # the records of a run, encoded (written and dispatched before the next)
        self.writeback = EarlyWriteback()  # the disk takes each run while the next is made, not all at the end

    # --- input ------------------------------------------------------------------------------------

    def feed_stream(self, stream):
        """Every line of a binary stream; yields the results of each run of puts. With the batch route, blocks
        are read and parsed by other threads (:func:`parse_threads`) while this one puts (the parse needs no store
        state: it is a function of the bytes, and the compiled parser releases the GIL). Blocks are read in turn
        (a block ends where a line does) and put in order."""
        blocks = _blocks(stream)
        if not self.batch:
            for block in blocks:
                yield from self.feed(block)
            return
        _kernel(), _encoder()  # imported here, not in the workers while this thread imports others
        turn = threading.Condition()
        state = {"turn": 0}
        tickets = itertools.count()
        threads = parse_threads()
        with ThreadPoolExecutor(threads, thread_name_prefix="append-parse") as pool:
            pending = deque(pool.submit(self._read_parse, blocks, turn, state, next(tickets))
                            for _ in range(threads + 1))
            try:
                while True:
                    parsed = pending.popleft().result()
                    if parsed is None:
                        break
                    pending.append(pool.submit(self._read_parse, blocks, turn, state, next(tickets)))
                    yield from self.feed(parsed[0], parsed)
            finally:
                # the end of the input, or an error: reads not started are dropped, newest first, so that a worker
                # never starts one whose turn (a cancelled older ticket's) would never come
                for f in reversed(pending):
                    f.cancel()

    def _read_parse(self, blocks, turn, state, ticket: int):
        """Read block number ``ticket`` (after the one before it: tasks start in ticket order, so the one whose turn
        it is is running already) and parse it; None at the end of the input."""
        with turn:
            turn.wait_for(lambda: state["turn"] == ticket)
            try:
                block = next(blocks, None)
            finally:
                state["turn"] += 1
                turn.notify_all()
        return None if block is None else self._parse(block)

    def _parse(self, block: bytes) -> tuple:
        """(block, u8, starts, ends, logical lines per line, inner \\r, columns, status, side): no store state."""
        u8 = np.frombuffer(block, np.uint8)
        k = _kernel()
        ends = np.empty(len(block) // 64 + 64, np.int64)  # room for lines of 64 bytes on average
        count, has_cr, wide = k.line_ends(u8, ends)
        if count >= 0:
            ends = ends[:count]
        else:  # short lines: no room for them all
            text = bytes(block)
            ends, has_cr, wide = np.flatnonzero(u8 == 10), text.find(b"\r") >= 0, not text.isascii()
        if not len(ends) or ends[-1] != len(block) - 1:
            ends = np.append(ends, len(block))
        n = len(ends)
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        # universal newlines: a \r inside a line (not before its \n nor at the end) starts another line of text
        logical = np.ones(n, np.int64)
        inner = np.zeros(n, bool)
        if has_cr:
            cr = np.flatnonzero(u8 == 13)
            cr = cr[(cr + 1 < len(block)) & (u8[np.minimum(cr + 1, len(block) - 1)] != 10)]
            at = np.searchsorted(ends, cr, side="left")
            np.add.at(logical, at, 1)
            inner[at] = True
        cols = status = side = None
        if self.batch and (not wide or _valid_utf8(block)):
            cols, status, side = k.parse(u8, starts, ends, self.v5)
        return block, u8, starts, ends, logical, inner, cols, status, side

    def feed(self, block: bytes, parsed: tuple | None = None):
        """Whole lines (the last one may lack its newline); yields the results of each run of puts."""
        block, u8, starts, ends, logical, inner, cols, status, side = parsed or self._parse(block)
        k = _kernel()
        n = len(ends)
        first_line = self.line + 1 + np.concatenate(([0], np.cumsum(logical)[:-1]))
        self.line += int(logical.sum())
        slow = np.ones(n, bool)
        blank = np.zeros(n, bool)
        if status is not None:
            blank = status == k.BLANK
            ok = (status == k.OK) & ~inner
            ok &= self._checks(u8, cols, ok)
            slow = ~ok & ~blank
        i = 0
        filtered = False
        while i < n:
            if blank[i]:
                i += 1
                continue
            if slow[i]:
                yield from self._plain(bytes(block[starts[i]:ends[i]]), int(first_line[i]))
                i += 1
                continue
            if not filtered:  # batch consume queue topics are known once the store is open
                filtered = True
                if not self.app.session.active:
                    self.app.open()
                batch_topics = self.app.dispatcher.batch_topics
                ids = [g for g, name in enumerate(self._topic_names) if name in batch_topics]
                if ids:
                    slow |= np.isin(self._group, ids)
                    continue
            j = i
            while j < n and not slow[j]:
                j += 1
            rows = np.flatnonzero(~blank[i:j]) + i
            while len(rows):
                done = self._fast(u8, cols, side, rows)
                if done:
                    yield done
                if len(done) < len(rows):  # a store time older than the log's: the plain route refuses it
                    r = int(rows[len(done)])
                    yield from self._plain(bytes(block[starts[r]:ends[r]]), int(first_line[r]))
                    rows = rows[len(done) + 1:]
                else:
                    break
            i = j

    # --- the plain route: one line, one put -----------------------------------------------------

    def _plain(self, raw: bytes, n: int):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"line {n}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
        app = self.app
        for k, line in enumerate(io.StringIO(text, newline=None) if "\r" in text else (text,)):
            if not line or line.isspace():
                continue
            try:
                msgs = self.messages(line)
            except json.JSONDecodeError as e:
                raise InputError(f"line {n + k}: not valid JSON ({e.msg} at column {e.colno})") from None
            except InputError as e:
                raise InputError(f"line {n + k}: {e}") from None
            if not app.session.active:
                app.open()
            try:
                yield app.put(msgs)
            except InputError as e:  # refused before any write: the lines before it are kept
                raise InputError(f"line {n + k}: {e}") from None

    # --- the batch route --------------------------------------------------------------------------

    def _checks(self, u8, cols, ok) -> np.ndarray:
        """Which recognised lines the plain route would take as they are: topic rules (each distinct topic
        checked once), no special topic, sizes within the broker's limits. Others go the plain way."""
        k = _kernel()
        rows = np.flatnonzero(ok)
        good = ok.copy()
        if not len(rows):
            return good
        group, firsts = propscan.group_spans(u8, cols[rows, k.I_TOPIC], cols[rows, k.I_TOPICLEN])
        magic_of = np.zeros(len(firsts), np.int64)
        allowed = np.zeros(len(firsts), bool)
        names = []
        for g, r in enumerate(rows[firsts].tolist()):
            s = int(cols[r, k.I_TOPIC])
            topic = bytes(u8[s:s + int(cols[r, k.I_TOPICLEN])]).decode("ascii")
            names.append(topic)
            try:
                _, magic_of[g] = self.builder.replay_topic(topic)
            except InputError:
                continue
            allowed[g] = topic != SCHEDULE_TOPIC
        magic = magic_of[group]
        sf = cols[rows, k.I_SYSFLAG]
        total = (74 + np.where(sf & SYSFLAG_BORNHOST_V6, 20, 8) + np.where(sf & SYSFLAG_STOREHOST_V6, 20, 8)
                 + np.where(magic == MAGIC_V1, 1, 2) + cols[rows, k.I_BODYLEN] + cols[rows, k.I_TOPICLEN]
                 + cols[rows, k.I_RAWLEN])
        cfg = self.app.config
        fits = (cols[rows, k.I_RAWLEN] <= MAX_PROPERTIES_LENGTH) & (total + 8 <= cfg.mappedFileSizeCommitLog)
        if self.v5:
            fits &= (cols[rows, k.I_BODYLEN] <= cfg.maxMessageSize) & (total <= cfg.maxMessageSize + 65536)
        else:
            fits &= total <= cfg.maxMessageSize
        good[rows] = allowed[group] & fits
        self._topic_names = names
        self._group = np.full(len(ok), -1, np.int64)
        self._group[rows] = group
        self._magic = np.zeros(len(ok), np.int64)
        self._magic[rows] = magic
        self._total = np.zeros(len(ok), np.int64)
        self._total[rows] = total
        return good

    def _fast(self, u8, cols, side, rows) -> BatchResults:
        """Put ``rows`` (recognised lines, in order) as single messages; stops before the first whose store time
        is older than the log's newest (unless the session keeps store times). Returns the results."""
        app = self.app
        try:
            return self._fast_put(u8, cols, side, rows)
        except OSError as e:
            app._rollback(e)
        except BaseException:
            app._failed = True
            raise

    def _fast_put(self, u8, cols, side, rows) -> BatchResults:
        k = _kernel()
        app = self.app
        if not app.session.active:
            app.open()
        ts = cols[rows, k.I_STORE_TS]
        if not app.keep_store_times:
            newest = np.maximum.accumulate(np.concatenate(([app.last_store_ts], ts)))[:-1]
            back = np.flatnonzero(ts < newest)
            if len(back):
                rows, ts = rows[: back[0]], ts[: back[0]]
        n = len(rows)
        if not n:
            empty = np.zeros(0, np.int64)
            return BatchResults(empty, empty, empty, [], empty, empty, empty, (u8, empty, empty), empty)
        app._write()  # the plain route's pending records go first
        group, qid, sysflag = self._group[rows], cols[rows, k.I_QUEUE], cols[rows, k.I_SYSFLAG]
        total, magic = self._total[rows], self._magic[rows]
        qo = np.zeros(n, np.int64)
        counted = np.flatnonzero(~np.isin(sysflag & 0xC, (TRANSACTION_PREPARED, TRANSACTION_ROLLBACK)))
        if len(counted):
            key = queue_key(group[counted], qid[counted])
            uniq, first, inv, count = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
            order = np.argsort(inv, kind="stable")
            rank = np.empty(len(counted), np.int64)
            rank[order] = np.arange(len(counted)) - np.repeat(np.cumsum(count) - count, count)
            base = np.empty(len(uniq), np.int64)
            names = self._topic_names
            for u, r in enumerate(first.tolist()):
                qk = (names[int(group[counted[r]])], int(qid[counted[r]]))
                b = app.table.get(qk)
                base[u] = app.next_queue_offset(*qk) if b is None else b
                app.table[qk] = int(base[u] + count[u])
            qo[counted] = base[inv] + rank
        phy = np.empty(n, np.int64)
        blank = np.empty(n, np.int64)
        app.offset = int(_encoder().layout(total, app.offset, app.file_size, phy, blank))
        cuts = np.flatnonzero(blank >= 0).tolist()
        for a, b in zip([0] + cuts, cuts + [n]):
            if a < b:
                self._write_run(u8, cols, side, rows[a:b], magic[a:b], total[a:b], qo[a:b], phy[a:b])
            if b < n:
                app.write_blank(int(blank[b]))
        newest = int(ts.max())
        if newest > app.last_store_ts:
            app.last_store_ts = newest
        app.written += n
        self.batched += n
        return BatchResults(phy, total, qo, self._topic_names, group, qid, ts,
                            (u8, cols[rows, k.I_STORE_HEX], cols[rows, k.I_STORE_HEXLEN]), cols[rows, k.I_STORE_PORT])

    def _write_run(self, u8, cols, side, rows, magic, total, qo, phy) -> None:
        """Records of one segment: encoded together, one write, then dispatched (commitlog order)."""
        app = self.app
        at = phy - phy[0]
        size = int(at[-1] + total[-1])
        if len(self._scratch) < size:  # one buffer for every run: its pages are faulted in once, not per block
            self._scratch = np.empty(max(size, 2 * len(self._scratch)), np.uint8)
        out = self._scratch[:size]
        _encoder().encode_records(u8, side, cols, rows, magic, total, qo, phy, out, at)
        start = int(phy[0])
        pos = start % app.file_size
        seg = app.cl.open(start - pos)
        seg.touch(pos, size)
        view = memoryview(out)
        done = 0
        while done < size:
            done += os.pwrite(seg.fd, view[done:], pos + done)
        seg.dirty = True
        self.writeback.written(seg.fd, pos, pos + size)
        h = fast.decode_headers(out, at, u8=out)
        chunk = Chunk(SimpleNamespace(start=start), out, h, True)
        app.dispatcher.dispatch_many(app.dispatcher.requests_from_chunk(chunk))
        self.writeback.every(app.dispatcher.written_ranges)


def parse_threads() -> int:
    """Threads reading and parsing blocks beside the one putting them: reading and parsing a line costs about
    what putting it does, so one keeps two cores busy; a second one, on a machine with cores to spare, halves
    the parse's share. On two cores a second one would only take turns with the putting thread, which is then
    the longest path."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return 2 if cores >= 3 else 1


def _blocks(stream):
    """Whole lines of a binary stream in blocks of about BLOCK_BYTES (the last one may lack its newline), each read
    straight into its own array (one copy): the part of a line at its end is carried to the start of the next
    block, and a line longer than a block makes its block longer. A stream without ``readinto`` gives bytes."""
    readinto = getattr(stream, "readinto", None)
    if readinto is None:
        while True:
            block = stream.read(BLOCK_BYTES)
            if not block:
                return
            if block[-1] != 10:
                block += stream.readline()
            yield block
    carry = b""
    while True:
        size = BLOCK_BYTES
        buf = np.empty(size, np.uint8)
        got = len(carry)
        buf[:got] = np.frombuffer(carry, np.uint8)
        view = memoryview(buf)
        while got < size:
            n = readinto(view[got:])
            if not n:
                break
            got += n
        view.release()
        if got < size:  # the end of the input
            if got:
                yield _frozen(buf[:got])
            return
        cut = _last_newline(buf) + 1
        if cut:
            carry = buf[cut:].tobytes()
            yield _frozen(buf[:cut])
        else:  # no newline in a whole block: the rest of this line comes with it
            carry = b""
            yield _frozen(np.concatenate((buf, np.frombuffer(stream.readline(), np.uint8))))


def _frozen(block: np.ndarray) -> np.ndarray:
    """The block read-only, as input bytes are: nothing writes into it, and the compiled kernels see the array
    type they were compiled (and cached, formats/warmup.py) for, not a second one."""
    block.flags.writeable = False
    return block


def _last_newline(buf: np.ndarray) -> int:
    """Index of the last ``\\n`` in ``buf``, -1 if none (looked for backwards, in growing windows)."""
    window = 1 << 16
    while True:
        start = max(0, len(buf) - window)
        at = buf[start:].tobytes().rfind(b"\n")
        if at >= 0:
            return start + at
        if not start:
            return -1
        window *= 4


def _valid_utf8(block) -> bool:
    try:
        str(memoryview(block), "utf-8")
    except UnicodeDecodeError:
        return False
    return True
