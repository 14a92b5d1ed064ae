"""``rebuild -j``: consume-queue units written by the workers themselves, at the place the broker's put gives them.

A fresh rebuild appends every queue's units one after the other from its first record's queue offset
(ConsumeQueue.putMessagePositionInfo, FORMAT.md §7.5): in a log whose queue offsets run on without gaps or
repeats, the unit of a record lands at ``QUEUEOFFSET * 20``. A worker that has planned a chunk's units
(:mod:`.cqplan`) writes each *straight* group (record ends increasing, queue offsets consecutive) there at
once, straight into the queue's mapped files (created as the writer creates them: full size, zero-filled),
and sends the parent only what the put rules check: per group the first queue offset, the first and last
record end, the first unit (the pre-blank fill of a new queue), and the index columns.

The parent (:func:`apply_direct`) takes the chunks in log order and asks each queue whether the broker would
have put the group exactly there (:meth:`.cqwriter.ConsumeQueueWriter.accept_written`): the first offset is
the write position, the first end is past the queue's max physical offset. Accepted, the queue's state moves
on and nothing is copied. Any group the worker did not write goes through the unit rules in the parent.

Why the files end up as one process writes them: an accepted group starts at the write position of the
moment it is accepted, so every byte the parent wrote before lies below it and every byte written after lies
past its end; two accepted groups are disjoint. What can differ is only bytes of groups that are never
accepted: a refused group, or a group of a segment after the end of the log. The parent then raises
:class:`SpeculationRefused` and the caller rebuilds again in the classic way (same files, more time).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from ..findings import Finding
from ..log.mappedfile import reserve
from ..log.segments import mapping_error, segment_name

MAX_OPEN = 64  # mapped queue files a worker keeps open (least recently used closed first)
WRITEBACK_BYTES = 4 << 20  # units a worker writes between two starts of their write-back (~200k records)
_PAGE = mmap.PAGESIZE


class SpeculationRefused(Exception):
    """A group a worker wrote is not where the broker's put puts it: the files must be built the classic way."""


class QueueFiles:
    """The consume-queue files a worker writes into (``<root>/consumequeue/<topic>/<queueId>/<start>``): each
    created full size and zero-filled as :class:`..log.mappedfile.SegmentQueueWriter` creates it, whichever
    process comes first (the file appears with its full size: made under a private name, then linked)."""

    def __init__(self, root: str, file_size: int, writeback=None):
        self.root = root
        self.file_size = file_size
        self.writeback = writeback  # sync_file_range (see repair/rebuild.DispatchWriteback)
        self._open: dict[str, tuple[int, mmap.mmap]] = {}
        self._paths: dict[tuple[str, int, int], str] = {}
        # the bytes written in each open file since its write-back last started ([lo, hi) in the file), and how many
        self._dirty: dict[str, list] = {}
        self._pending = 0

    def _map(self, path: str) -> mmap.mmap:
        got = self._open.pop(path, None)
        if got is None:
            if len(self._open) >= MAX_OPEN:
                old = next(iter(self._open))
                self._close(*self._open.pop(old))
            got = self._create_or_open(path)
        self._open[path] = got  # most recently used last
        return got[1]

    def _create_or_open(self, path: str) -> tuple[int, mmap.mmap]:
        fs = self.file_size
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.new"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, fs)
                os.link(tmp, path)
            except FileExistsError:
                pass  # made meanwhile by the parent or another worker: use theirs
            finally:
                os.close(fd)
                os.unlink(tmp)
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size < fs:  # the parent creates with O_EXCL, then sizes: the same size
                os.ftruncate(fd, fs)
            reserve(fd, fs, path)
            try:
                return fd, mmap.mmap(fd, fs, access=mmap.ACCESS_WRITE)
            except OSError as e:
                raise mapping_error(path, e) from None
        except BaseException:
            os.close(fd)
            raise

    def write(self, topic: str, queue_id: int, pos: int, data: np.ndarray) -> None:
        """``data`` (bytes as uint8) at logical position ``pos`` of the queue, across file ends."""
        fs = self.file_size
        done = 0
        n = len(data)
        while done < n:
            at = pos + done
            start = at - at % fs
            k = min(n - done, start + fs - at)
            key = (topic, queue_id, start)
            path = self._paths.get(key)
            if path is None:
                path = self._paths[key] = os.path.join(self.root, "consumequeue", topic, str(queue_id), segment_name(start))
            mm = self._map(path)
            mm[at - start:at - start + k] = data[done:done + k]
            span = self._dirty.get(path)
            if span is None:
                self._dirty[path] = [at - start, at - start + k]
            else:
                span[0], span[1] = min(span[0], at - start), max(span[1], at - start + k)
            done += k
        self._pending += n
        if self._pending >= WRITEBACK_BYTES:
            self.start_writeback()

    def start_writeback(self) -> None:
        """Hand the whole pages written since the last call to the kernel's write-back (SYNC_FILE_RANGE_WRITE: it
        starts the writes and returns). Left to the end, a worker's units (~17 MB per 1 GiB segment of 1 KiB
        messages) were all still dirty when the parent's final fsync came, which then waited for them."""
        self._pending = 0
        if self.writeback is None:
            self._dirty.clear()
            return
        for path, (lo, hi) in self._dirty.items():
            got = self._open.get(path)
            lo, hi = lo // _PAGE * _PAGE, hi // _PAGE * _PAGE  # a page the next write completes waits for it
            if got is not None and hi > lo:
                self.writeback(got[0], lo, hi - lo, 2)  # SYNC_FILE_RANGE_WRITE; a failure leaves it to the fsync
        self._dirty.clear()

    def _close(self, fd: int, mm: mmap.mmap) -> None:
        mm.close()
        if self.writeback is not None:
            self.writeback(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE of the whole file: starts the writes, does not wait
        os.close(fd)

    def close(self) -> None:
        for fd, mm in self._open.values():
            self._close(fd, mm)
        self._open.clear()


class DirectChunk:
    """What a worker sends for a chunk whose straight groups it wrote itself (see the module's docstring).

    Per record (int32 differences where a column spans less than 2**31): phy, store time, sysflag (the index
    build's inputs) with each record's key hashes; per queue group: topic id, queue id, unit count, whether the
    worker wrote it, first queue offset (bytes), first and last record end, the first unit (phy, size,
    tagsCode); the units of the groups it did not write as columns (phy, size, tagsCode, queue offset)."""

    __slots__ = ("n", "phy0", "phy", "ts0", "ts", "sysflag", "key_count", "key_hashes", "last_size", "names", "tids",
                 "qids", "counts", "written", "first_offset", "first_end", "last_end", "first_unit", "rest",
                 "unsafe", "last_ts", "problems")

    def __getstate__(self):
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state) -> None:
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)


def _delta(a: np.ndarray) -> tuple[int, np.ndarray]:
    base = int(a.min()) if len(a) else 0
    d = a - base
    return (base, d.astype(np.int32)) if not len(d) or int(d.max()) < 2**31 else (0, a)


def write_chunk(batch, files: QueueFiles, problems: list = ()) -> DirectChunk:
    """Write the straight groups of a planned batch (``batch.cq_plan``) into ``files`` and describe the chunk;
    ``problems``: what making the batch found (records reput skips), reported by the parent in log order."""
    p = batch.cq_plan
    c = DirectChunk()
    c.problems = list(problems)
    c.n = len(batch)
    c.phy0, c.phy = _delta(batch.phy)
    c.ts0, c.ts = _delta(batch.store_timestamp)
    c.sysflag = batch.sysflag.astype(np.int32)
    c.key_count, c.key_hashes = batch.key_count, batch.key_hashes
    c.last_size = int(batch.size[-1]) if c.n else 0
    c.names = p.names
    c.tids, c.qids = p.tids.astype(np.int32), p.qids.astype(np.int32)
    starts = p.starts
    c.counts = np.diff(starts)
    # a damaged QUEUEOFFSET (negative, or so large that * 20 wraps) is left to the parent's unit rules
    written = p.straight & (p.first_offset >= 0) & (p.qids >= 0) & (p.first_offset < 1 << 60)
    units = p.units.view(np.uint8).reshape(-1, CQ_UNIT_SIZE) if len(p.units) else None
    tids, qids, fo = p.tids.tolist(), p.qids.tolist(), p.first_offset.tolist()
    for g in np.flatnonzero(written).tolist():
        lo, hi = int(starts[g]), int(starts[g + 1])
        files.write(p.names[tids[g]], qids[g], fo[g], units[lo:hi].reshape(-1))
    c.written = written
    c.first_offset, c.first_end, c.last_end = p.first_offset, p.first_end, p.last_end
    firsts = p.rows[starts[:-1]] if len(p.rows) else np.zeros(0, np.int64)
    c.first_unit = (batch.phy[firsts], batch.size[firsts], batch.tags_code[firsts])
    # the units of the groups left to the parent, in group order
    rest = np.concatenate([p.rows[starts[g]:starts[g + 1]] for g in np.flatnonzero(~written).tolist()] or
                          [np.zeros(0, np.int64)]).astype(np.int64)
    c.rest = (batch.phy[rest], batch.size[rest], batch.tags_code[rest], batch.queue_offset[rest])
    c.unsafe = [(int(batch.phy[i]), p.names[int(batch.topic_ids[i])]) for i in p.unsafe.tolist()]
    c.last_ts = int(batch.store_timestamp[p.last_row]) if p.last_row >= 0 else None
    return c


class _IndexColumns:
    """The columns :meth:`.indexwriter.IndexWriter.build` reads, rebuilt from a :class:`DirectChunk`."""

    __slots__ = ("phy", "store_timestamp", "sysflag", "key_count", "key_hashes")

    def __init__(self, c: DirectChunk):
        self.phy = c.phy.astype(np.int64) + c.phy0
        self.store_timestamp = c.ts.astype(np.int64) + c.ts0
        self.sysflag = c.sysflag.astype(np.int64)
        self.key_count, self.key_hashes = c.key_count, c.key_hashes

    def __len__(self) -> int:
        return len(self.phy)


def apply_direct(d, c: DirectChunk) -> None:
    """The parent's side of a :class:`DirectChunk` for a Dispatcher ``d`` writing a fresh folder: what
    ``d.dispatch_many`` does with the batch, except that the written groups are only accepted.
    Raises :class:`SpeculationRefused` when one is not where the put rules would put it."""
    stats = d.stats
    d.problems.extend(c.problems)
    for phy, topic in c.unsafe:
        stats.unsafe_topics += 1
        d.problems.append(Finding("DISPATCH_UNSAFE_TOPIC", "error", None, phy,
                                  f"topic {topic!r} cannot be a consume queue directory; not dispatched"))
    counts = c.counts.tolist()
    written = c.written.tolist()
    fo, fe, le = c.first_offset.tolist(), c.first_end.tolist(), c.last_end.tolist()
    fp, fsz, ft = (a.tolist() for a in c.first_unit)
    rp, rs, rt, ro = c.rest
    at = 0
    for g, (t, q) in enumerate(zip(c.tids.tolist(), c.qids.tolist())):
        cq = d.queue(c.names[t], q)
        k = counts[g]
        if written[g]:
            if not cq.accept_written(fo[g], fe[g], le[g], k, (fp[g], fsz[g], ft[g])):
                raise SpeculationRefused(f"queue {c.names[t]}/{q} at {fo[g] // CQ_UNIT_SIZE}")
            stats.cq_units += k
            continue
        done = cq.put_many(rp[at:at + k], rs[at:at + k], rt[at:at + k], ro[at:at + k])
        stats.cq_units += done
        stats.cq_skipped += k - done
        at += k
    if d.index is not None and c.n:
        before = d.index.entries_written
        d.index.build(_IndexColumns(c))
        stats.index_entries += d.index.entries_written - before
    stats.records += c.n
    if c.n:
        d.last_dispatched_end = c.phy0 + int(c.phy[-1]) + c.last_size
    if c.last_ts is not None:
        d.checkpoint.set(logicsMsgTimestamp=c.last_ts)
