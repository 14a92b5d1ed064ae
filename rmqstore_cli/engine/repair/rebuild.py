"""Rebuilding consume queues, ext files and index files from the commitlog (the broker's reput).

The Dispatcher writes into a fresh folder beside the store (same filesystem); the old
folders are then moved into the backup folder and the new ones renamed into place, each
step journaled so ``restore`` undoes it. Index files are named after the store time of the
record that opened them (the broker names them by its clock, so names differ; content is
the same for the same record sequence).
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from rmqstore_cli.formats.records import BCQ_UNIT_SIZE, CQ_UNIT_SIZE

from .backup import Backup, fsync_path
from ..log.writeback import _sync_file_range  # libc's, or None (one lookup for append and rebuild)
from ..errors import UsageError
from ..derived.batchcq import BCQ_DIR
from ..derived.indexwriter import store_time_namer

PARTS = {"consumequeue": ["consumequeue"], "cqext": ["consumequeue", "consumequeue_ext"], "index": ["index"],
         "all": ["consumequeue", "consumequeue_ext", "index"]}


def rebuilt_parts(store, what: str) -> list:
    """The folders ``rebuild WHAT`` regenerates on this store (batchconsumequeue/ with the consume queues when
    the store has batch topics)."""
    ext = store.config.enableConsumeQueueExt or what == "cqext"
    parts = [p for p in PARTS[what] if p != "consumequeue_ext" or ext]
    if "consumequeue" in parts and store.batch_topics():
        parts.insert(parts.index("consumequeue") + 1, BCQ_DIR)
    return parts


def cut_queue_dir(d: str, phy: int, batch: bool = False) -> None:
    """§13.7 (§9.3 for a batch queue) in a scratch copy: keep the valid units of records starting before ``phy``;
    the files after the cut go, and so does the cut file when nothing of it is kept (never the first)."""
    from ..derived.batchcq import BCQ_DTYPE, valid_units
    from ..derived.consumequeue import CQ_DTYPE

    dtype, unit = (BCQ_DTYPE, BCQ_UNIT_SIZE) if batch else (CQ_DTYPE, CQ_UNIT_SIZE)
    names = sorted(n for n in os.listdir(d) if n.isdigit())
    cut = False
    for n in names:
        p = os.path.join(d, n)
        if cut:
            os.unlink(p)
            continue
        arr = np.fromfile(p, dtype=dtype)
        valid = valid_units(arr) if batch else (arr["phyOffset"] >= 0) & (arr["size"] > 0)
        bad = np.flatnonzero(~(valid & (arr["phyOffset"] < phy)))
        if len(bad):
            k = int(bad[0]) * unit
            with open(p, "r+b") as f:
                f.seek(k)
                f.write(bytes(os.path.getsize(p) - k))
            cut = True
            if k == 0 and n != names[0]:
                os.unlink(p)


def rebuild(store, what: str, *, topic: str | None = None, from_offset: int | None = None,
            backup: Backup | None = None, index_namer=store_time_namer, jobs: int = 1, keep_columns: bool = False) -> dict:
    """Regenerate ``what`` (PARTS) from the commitlog into a scratch folder and swap it in; the result as a dict.
    ``keep_columns`` (verify after follows): the log is walked once, by verify's walk (:mod:`.rebuildwalk`), and what
    it kept is ``result["_columns"]`` (a DispatchSpill for verify after, or None) for the caller to remove."""
    from ..derived.dispatch import Dispatcher
    from ..verify.records import keep_freed_heap

    # each scan chunk's columns (~24 of 64 KiB) are freed after the chunk: kept by glibc instead of handed back and
    # faulted in (zeroed) again for the next chunk; set before any -j worker is forked, so they inherit it
    keep_freed_heap()
    if what not in PARTS:
        raise UsageError(f"rebuild what? one of {', '.join(PARTS)}")
    if topic is not None and what in ("index", "all"):
        raise UsageError("--topic works with consumequeue or cqext only (index files hold every topic)")
    cfg = store.config
    if what == "cqext" and not cfg.enableConsumeQueueExt:
        cfg = cfg.with_(enableConsumeQueueExt=True)
    parts = [p for p in PARTS[what] if p != "consumequeue_ext" or cfg.enableConsumeQueueExt]
    if "consumequeue" in parts and store.batch_topics():
        parts.insert(parts.index("consumequeue") + 1, BCQ_DIR)
    root = store.root
    tmp = os.path.join(os.path.dirname(root), f".{os.path.basename(root)}.rebuild-{os.getpid()}")
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    start = 0
    walked = None
    try:
        if from_offset is not None:
            start = from_offset
            for part in parts:
                src = os.path.join(root, part)
                if os.path.isdir(src):
                    shutil.copytree(src, os.path.join(tmp, part))
            for part in ("consumequeue", "consumequeue_ext", BCQ_DIR):
                base = os.path.join(tmp, part)
                if part in ("consumequeue", BCQ_DIR) and os.path.isdir(base):
                    for t in os.listdir(base):
                        for q in os.listdir(os.path.join(base, t)):
                            cut_queue_dir(os.path.join(base, t, q), from_offset, batch=part == BCQ_DIR)
            idx = os.path.join(tmp, "index")
            if os.path.isdir(idx):
                from ..derived.index import IndexFile

                for n in sorted(os.listdir(idx)):
                    f = IndexFile(os.path.join(idx, n), cfg.maxHashSlotNum, cfg.maxIndexNum)
                    end = f.header().endPhyOffset
                    f.close()
                    if end >= from_offset:
                        os.unlink(os.path.join(idx, n))
                    else:
                        start = min(start, end)
        dcfg = cfg.with_(messageIndexEnable=cfg.messageIndexEnable and "index" in parts)
        if (keep_columns and from_offset is None and topic is None and not cfg.enableConsumeQueueExt
                and cfg.maxIndexNum >= 2 and not store.batch_topics()):
            from .rebuildwalk import ColumnsRefused, walk_and_dispatch

            d = Dispatcher(tmp, dcfg, index_namer=index_namer, batch_topics=store.batch_topics())
            try:
                walked = walk_and_dispatch(store, d, jobs, DispatchWriteback(d))
            except ColumnsRefused:  # -j: the workers' way, as if the walk had not been made
                pass
            if walked is None:
                shutil.rmtree(tmp)
                os.makedirs(tmp)
        direct = (walked is None and jobs > 1 and from_offset is None and topic is None and not cfg.enableConsumeQueueExt and cfg.maxIndexNum >= 2
                  and not store.batch_topics() and cfg.mappedFileSizeConsumeQueue % CQ_UNIT_SIZE == 0
                  and len(store.commitlog.segments.segments) > 1)
        if direct:
            from ..derived.cqdirect import SpeculationRefused

            d = Dispatcher(tmp, dcfg, index_namer=index_namer, batch_topics=store.batch_topics())
            try:
                try:
                    direct_requests(store, d, jobs, DispatchWriteback(d))
                    d.flush(checkpoint=False)
                finally:
                    d.close(flush=False)
            except SpeculationRefused:
                # a queue's units are not where the workers wrote them (gaps, repeats, a log that ends before its
                # last segment): built again below, the parent writing every unit
                shutil.rmtree(tmp)
                os.makedirs(tmp)
                direct = False
        if not direct and walked is None:
            d = Dispatcher(tmp, dcfg, index_namer=index_namer, batch_topics=store.batch_topics())
            _dispatch_all(store, d, jobs, start, topic)
        stats = d.stats
        for dp, _, fn in os.walk(tmp):
            for f in fn:
                fsync_path(os.path.join(dp, f))
            fsync_path(dp, True)
        swapped = []
        for part in parts:
            rel = os.path.join(part, topic) if topic is not None else part
            new = os.path.join(tmp, rel)
            old = os.path.join(root, rel)
            if not os.path.exists(new):
                continue
            if backup is not None and os.path.exists(old):
                backup.move(old, f"replaced by rebuild {what}")
            elif os.path.exists(old):
                shutil.rmtree(old)
            if backup is not None:
                backup.mark("swapped-in", path=rel)
            os.makedirs(os.path.dirname(old), exist_ok=True)
            os.rename(new, old)
            fsync_path(os.path.dirname(old), True)
            swapped.append(rel)
        checkpoint = _checkpoint_after_rebuild(root, cfg, parts, topic, d, backup) if swapped else {}
    except BaseException:
        if walked is not None:
            walked.spill.remove()
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    kept = {"_columns": walked.spill if walked is not None else None} if keep_columns else {}
    return kept | {"rebuilt": swapped, "checkpoint": checkpoint, "records": stats.records, "cqUnits": stats.cq_units, "extUnits": stats.ext_units,
            "indexEntries": stats.index_entries, "from": start,
            "problems": [f.as_json() for f in getattr(d, "problems", [])]}  # records not dispatched, and why


def _dispatch_all(store, d, jobs: int, start: int, topic) -> None:
    """The records of the log (from ``start``; only ``topic``'s units kept) dispatched by ``d``, which writes
    every file: parsed in this process, or with ``jobs`` > 1 in workers (:func:`parallel_requests`)."""
    writeback = DispatchWriteback(d)
    try:
        def handle(reqs) -> None:
            keep = np.ones(len(reqs), dtype=bool)
            if start:
                keep &= reqs.phy >= start
            if topic is not None:
                # the queue's own records, and (an LMQ queue) the records multi-dispatched to it; the other
                # queues they also reach are written in the scratch folder only
                mine = np.fromiter((t == topic for t in reqs.topic), dtype=bool, count=len(reqs))
                lt = reqs.lmq
                if lt is not None and topic in lt.names:
                    mine[lt.row[lt.name == lt.names.index(topic)]] = True
                keep &= mine
            if not keep.all():
                reqs = reqs.take(np.flatnonzero(keep))
            d.dispatch_many(reqs)
            writeback.after(reqs)

        if jobs > 1:
            # a record's strings (spans into its segment) travel only when someone reads them: the topic filter
            # and the one-key-at-a-time index writer (maxIndexNum < 2)
            parallel_requests(store, d, jobs, handle, strings=topic is not None or d.config.maxIndexNum < 2)
        else:
            for chunk in store.commitlog.scan(check_crc=False, stop_at_invalid=False):
                handle(d.requests_from_chunk(chunk))
        d.flush(checkpoint=False)
    finally:
        d.close(flush=False)


def direct_requests(store, d, jobs: int, writeback) -> None:
    """``rebuild -j`` into a fresh folder: the workers write the consume-queue units themselves (:mod:`..derived.cqdirect`);
    this process accepts them in log order, writes what they left (groups that are not straight, LMQ units) and the
    index. Raises SpeculationRefused when the workers' units cannot stand (the caller builds again, classically)."""
    from ..derived.cqdirect import DirectChunk, apply_direct
    from ..parallel import spill_dir, stream_segments

    n = len(store.commitlog.segments.segments)
    d.fresh_queues = True
    _warm_kernels(store, d)
    # the workers' items wait in files there (parallel.stream_segments), or in the queue when no disk has room
    spill = spill_dir(min(jobs, n), store.commitlog.segments.file_size, d.root)
    stream = stream_segments(_segment_direct, n, jobs, store, d, spill=spill, balance=True)
    i = 0
    try:
        for item in stream:
            if isinstance(item, _SegmentEnd):
                if not item.continues:
                    _nothing_written_past(stream, i)
                    break
                i += 1
                continue
            if isinstance(item, DirectChunk):
                apply_direct(d, item)
                if item.n:
                    writeback.after_range(item.phy0 + int(item.phy[0]), d.last_dispatched_end)
            else:
                d.problems.extend(item.pop("_problems"))
                reqs = _unpack_batch(item, store)
                d.dispatch_many(reqs)
                writeback.after(reqs)
    finally:
        stream.close()  # stops the workers before anyone removes what they write into
        if spill:
            shutil.rmtree(spill, ignore_errors=True)


def _nothing_written_past(stream, i: int) -> None:
    """The log ended in segment ``i``: what the workers made of the later segments is never dispatched. Raises
    SpeculationRefused when they wrote units there (a log torn in the middle); a crash's pre-allocated, all-zero
    next file gives them no record, and then the files stand."""
    from ..derived.cqdirect import DirectChunk, SpeculationRefused

    for item in stream:
        if isinstance(item, DirectChunk) and item.written.any():
            raise SpeculationRefused(f"the log ends in segment {i}, the workers wrote units past it")


def _segment_direct(i: int, store, d):
    from ..derived.cqdirect import QueueFiles, write_chunk
    from ..log.commitlog import ScanResult

    res = ScanResult()
    segs = store.commitlog.segments.segments
    files = QueueFiles(d.root, d.config.mappedFileSizeConsumeQueue, _sync_file_range())
    try:
        for c in store.commitlog.scan(start_index=i, end_index=i + 1, check_crc=False, result=res, stop_at_invalid=False):
            b, found = _requests_and_problems(d, c)
            if b.lmq is not None or b.msg_base is not None:
                yield _pack_batch(b, i, strings=False) | {"_problems": found}  # multi-dispatch units: by the parent
            else:
                yield write_chunk(b, files, found)
    finally:
        files.close()
    yield _SegmentEnd(res.stop is not None and res.stop.kind == "blank" and res.stop.segment is segs[i])


def parallel_requests(store, d, jobs: int, handle, strings: bool = True) -> None:
    """``-j``: parse the records of each segment in forked workers, ``handle`` their batches here in log order, a
    chunk's batch at a time (:func:`.parallel.stream_segments`: never a whole segment's batches at once).

    A worker does all the per-record work: the scan, the property scan, the index key hashes and the
    consume-queue units grouped and packed per queue (:mod:`..derived.cqplan`); ``handle`` (e.g.
    ``d.dispatch_many``) is left with the writes in order. ``strings``: the batches can be read as requests
    (topic and key strings); without it they carry only what the bulk dispatch reads.

    The walk goes on into segment i + 1 only when segment i ends in a BLANK, exactly as one scan
    does; what workers made past the end of the log is dropped unread.
    """
    from ..parallel import spill_dir, stream_segments
    from ..verify.records import keep_freed_heap

    keep_freed_heap()  # as rebuild does (recover's re-dispatch comes here directly)
    n = len(store.commitlog.segments.segments)
    spill = None
    if jobs > 1 and n > 1:
        _warm_kernels(store, d)
        # the workers' batches wait in files there, not in memory (or in the queue when no disk has room)
        spill = spill_dir(min(jobs, n), store.commitlog.segments.file_size, d.root)
    stream = stream_segments(_segment_requests, n, jobs, store, d, jobs > 1, strings, spill=spill, balance=True)
    try:
        for item in stream:
            if isinstance(item, _SegmentEnd):
                if not item.continues:
                    break
                continue
            if jobs > 1:
                d.problems.extend(item.pop("_problems"))  # found in the worker, reported here in log order
                item = _unpack_batch(item, store)
            handle(item)
    finally:
        stream.close()
        if spill:
            shutil.rmtree(spill, ignore_errors=True)


def _warm_kernels(store, d) -> None:
    """Load the compiled scan and dispatch kernels here, before the workers are forked: each forked worker
    then has them, instead of every process paying numba's start-up (about half a second of CPU each).
    One chunk of the first segment is scanned and dropped; nothing is dispatched (what it finds is the first
    worker's to report)."""
    for chunk in store.commitlog.scan(end_index=1, check_crc=False):
        _requests_and_problems(d, chunk)
        break


def _requests_and_problems(d, chunk):
    """``d.requests_from_chunk(chunk)`` and the findings it added (taken out of ``d.problems``): in a ``-j`` worker
    they travel with the chunk's batch, the parent reports them in log order."""
    before = len(d.problems)
    b = d.requests_from_chunk(chunk)
    found = d.problems[before:]
    del d.problems[before:]
    return b, found


class DispatchWriteback:
    """Starts writing the rebuilt files to disk while the rebuild goes on: every WRITEBACK_BYTES of log dispatched,
    the bytes that will not change again (queue units, index entries: :meth:`Dispatcher.written_ranges`) are
    handed to the kernel's write-back (sync_file_range, SYNC_FILE_RANGE_WRITE: it starts the writes and returns).
    Otherwise the kernel holds every dirty page until the final flush, which then waits for all of them at once
    (hundreds of MB of index and queue pages on a large store). Durability is unchanged: the final flush and
    fsyncs run as before. A no-op where the C library has no sync_file_range."""

    WRITEBACK_BYTES = 128 << 20
    _START_WRITE = 2  # SYNC_FILE_RANGE_WRITE

    def __init__(self, d):
        self.d = d
        self.since = 0
        self.call = _sync_file_range()

    def after(self, reqs) -> None:
        if len(reqs):
            self.after_range(int(reqs.phy[0]), int(reqs.phy[-1]) + int(reqs.size[-1]))

    def after_range(self, start: int, end: int) -> None:
        """The records of [start, end) of the log have been dispatched."""
        if self.call is None:
            return
        self.since += end - start
        if self.since < self.WRITEBACK_BYTES:
            return
        self.since = 0
        for fd, start, end in self.d.written_ranges():
            if end > start:
                self.call(fd, start, end - start, self._START_WRITE)  # a failure only leaves it to the final flush


class _SegmentEnd:
    """The last item of a segment's requests: whether the walk goes on into the next segment."""

    def __init__(self, continues: bool):
        self.continues = continues



def _segment_requests(i: int, store, d, packed: bool = False, strings: bool = True):
    from ..log.commitlog import ScanResult

    res = ScanResult()
    segs = store.commitlog.segments.segments
    for c in store.commitlog.scan(start_index=i, end_index=i + 1, check_crc=False, result=res, stop_at_invalid=False):
        if packed:
            b, found = _requests_and_problems(d, c)
            yield _pack_batch(b, i, strings) | {"_problems": found}
        else:
            yield d.requests_from_chunk(c)
    yield _SegmentEnd(res.stop is not None and res.stop.kind == "blank" and res.stop.segment is segs[i])


class _SegmentStrings:
    """A scanned batch's lazy topic / UNIQ_KEY / KEYS strings sent from a ``-j`` worker without bytes: the
    value spans (positions in the segment) travel, the receiving process reads the same segment file itself
    if a string is ever asked for. Pickling the batch as it is would decode every record's strings into
    Python objects in the worker and rebuild them in the parent (rebuild -j 2 ran slower than -j 1)."""

    def __init__(self, strings, segment_index: int):
        self.topic_names, self.tids, self.slow = strings.topic_names, strings.tids, strings.slow
        self.spans = {name: (_narrow(strings.pv.start[name]), _narrow(strings.pv.end[name])) for name in ("UNIQ_KEY", "KEYS")}
        self.segment_index = segment_index
        self.store = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "store"} | {"store": None}

    def rows(self, rows: list) -> tuple[list, list, list]:
        from rmqstore_cli.formats import fast

        from ..derived.dispatch import _ChunkStrings
        from rmqstore_cli.formats.propscan import PropValues

        seg = self.store.commitlog.segments.segments[self.segment_index]
        pv = PropValues({k: _widen(v[0]) for k, v in self.spans.items()}, {k: _widen(v[1]) for k, v in self.spans.items()}, None)
        return _ChunkStrings(fast.kernel_view(seg.buffer()), self.topic_names, self.tids, pv, self.slow).rows(rows)


class _Narrow:
    """An int64 column sent as int32 differences from its smallest value (offsets in one segment, queue
    offsets, store times and tags codes of one chunk span far less than 2^31): half the bytes through the
    pipe, the same values back."""

    __slots__ = ("base", "delta")

    def __init__(self, a: np.ndarray):
        self.base = int(a.min())
        self.delta = (a - self.base).astype(np.int32)

    def __getstate__(self):
        return (self.base, self.delta)

    def __setstate__(self, state) -> None:
        self.base, self.delta = state

    def value(self) -> np.ndarray:
        return self.delta.astype(np.int64) + self.base


def _narrow(a):
    if isinstance(a, np.ndarray) and a.dtype == np.int64 and a.ndim == 1 and len(a):
        lo, hi = int(a.min()), int(a.max())
        if hi - lo < 2**31:
            return _Narrow(a)
    return a


def _widen(a):
    return a.value() if isinstance(a, _Narrow) else a


def _pack_batch(batch, segment_index: int, strings: bool = True) -> dict:
    """A DispatchBatch as the columns it holds (int64 ones narrowed), its strings left undecoded (see
    _SegmentStrings), or left out without ``strings``."""
    from ..derived.dispatch import DispatchBatch

    state = {k: _narrow(getattr(batch, k)) for k in DispatchBatch.__slots__}
    if not strings:
        state["_strings"] = state["_rows"] = None
    if state["_strings"] is not None:
        state["_strings"] = _SegmentStrings(state["_strings"], segment_index)
    return state


def _unpack_batch(state: dict, store):
    from ..derived.dispatch import DispatchBatch

    batch = DispatchBatch.__new__(DispatchBatch)
    batch.__setstate__({k: _widen(v) for k, v in state.items()})
    if isinstance(batch._strings, _SegmentStrings):
        batch._strings.store = store
    return batch


def _checkpoint_after_rebuild(root: str, cfg, parts: list, topic: str | None, d, backup) -> dict:
    """The checkpoint's logics / index timestamps as the rebuilt files leave them (§11): the store time of
    the last record the consume queues took, the end of the index file left behind full. Saved first."""
    from .checkpointfix import index_timestamp_on_disk, write_fields

    fields = {}
    logics = d.checkpoint.values.logicsMsgTimestamp  # the dispatcher's: last record a queue took
    if "consumequeue" in parts and topic is None and logics > 0:
        fields["logicsMsgTimestamp"] = logics
    if "index" in parts:
        fields["indexMsgTimestamp"] = index_timestamp_on_disk(root, cfg)
    if not fields:
        return {}
    if backup is None:
        from ..log.checkpointwriter import CheckpointWriter

        w = CheckpointWriter(root)
        w.set(**fields)
        if w.dirty:
            w.flush()
        return fields
    return fields if write_fields(root, fields, backup) else {}
