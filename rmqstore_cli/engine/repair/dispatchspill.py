"""recover's re-dispatch fed from the planning walk's columns, not from a walk of its own.

The plan's walk (verify's walk of the log, with the broker's walk read off it: walkalong.py, walkalongjobs.py)
already computes, for every record, what the re-dispatch's scan computes again after the apply: offsets, sizes,
queue ids and offsets, flags, store times, topic ids, tagsCode and the index key hashes, by the same compiled
property pass (``dispatch_columns`` and verify's one-pass kernel are tested equal to the one-at-a-time rules).
When the plan is going to be applied, the walk also writes those columns, segment by segment, into files
(:class:`DispatchSpill`: on disk, so memory stays flat whatever the log's size), and the apply reads them back
instead of walking the log again (apply.run_dispatch).

The columns stand for the re-dispatch's own scan when the records the walk read are the records the scan reads
in the dispatched range: the walk along answered (verify's records are the broker's up to its stop) and verify
rejected no record before the walk's start file (the scan reads without CRC). A segment whose records need more
than the columns (a tagsCode Java cannot compute, multi-dispatch units) is marked unusable; so is a segment
the walk did not finish. Then the re-dispatch walks as before: the same files either way.
"""

from __future__ import annotations

import atexit
import os
import shutil

import numpy as np

from ..derived.dispatchbatch import DispatchBatch

PREFIX = ".rmqstore-columns-"  # then the process id, "-" and a random part

# A chunk in a segment's file: (records, key hashes) as two int64, then each column's bytes, raw, in this order and
# type: written and read back with no pickling (the columns are copied once each way, not twice).
_COLUMNS = (("phy", np.int64), ("size", np.int32), ("queue_id", np.int32), ("queue_offset", np.int64),
            ("sysflag", np.int32), ("store_timestamp", np.int64), ("tids", np.int32), ("codes", np.int64),
            ("counts", np.int16))
_HASHES = np.int32


def write_chunk(f, cols: tuple, hashes: np.ndarray) -> None:
    """One chunk's columns (``cols`` in :data:`_COLUMNS`' order, one value per record) and its key hashes."""
    n = len(cols[0])
    f.write(np.asarray([n, len(hashes)], np.int64).tobytes())
    for (_, dtype), c in zip(_COLUMNS, cols):
        f.write(memoryview(np.ascontiguousarray(c, dtype=dtype)).cast("B"))
    f.write(memoryview(np.ascontiguousarray(hashes, dtype=_HASHES)).cast("B"))


def read_chunk(f) -> tuple | None:
    """The next chunk written by :func:`write_chunk`: (columns, hashes), or None at the end of the file."""
    head = np.empty(2, np.int64)
    got = f.readinto(memoryview(head).cast("B"))
    if not got:
        return None
    if got != head.nbytes:
        raise EOFError("a dispatch column file ends inside a chunk")
    n, m = int(head[0]), int(head[1])
    cols = tuple(_read_array(f, n, dtype) for _, dtype in _COLUMNS)
    return cols, _read_array(f, m, _HASHES)


def _read_array(f, n: int, dtype) -> np.ndarray:
    a = np.empty(n, dtype)
    if f.readinto(memoryview(a).cast("B")) != a.nbytes:
        raise EOFError("a dispatch column file ends inside a chunk")
    return a

class _SegmentFile:
    """One segment's columns being written (in this process or a ``-j`` worker)."""

    def __init__(self, path: str):
        self.path = path
        self.f = open(path, "wb")  # buffered: its write() writes every byte
        self.ok = True
        self.interner = None

    def add(self, seg_start: int, h, topics) -> None:
        if not self.ok:
            return
        if topics is None or topics.codes is None or topics.tags_bad.any() or topics.multi.any():
            self.ok = False  # needs what the columns do not hold: the re-dispatch reads this segment itself
            return
        self.interner = topics.interner
        write_chunk(self.f, (h.offsets + seg_start, h.totalSize, h.queueId, h.queueOffset, h.sysFlag, h.storeTimestamp,
                             topics.tids, topics.codes, topics.counts), topics.hashes)

    def close(self) -> tuple:
        """(ok, topic names of the segment's ids, their bytes)"""
        self.f.close()
        names = list(self.interner.topics()) if self.interner is not None else []
        raws = list(self.interner.ids) if self.interner is not None else []  # in id order
        return self.ok, names, raws


class DispatchSpill:
    """The dispatch columns of the walked records, one file per commitlog segment (keyed by the segment's start
    offset) in a scratch folder removed when the process exits (or by :meth:`remove`)."""

    def __init__(self, directory: str):
        self.dir = directory
        self.parts: dict = {}  # segment start -> (ok, names)
        self._open: dict = {}  # segment start -> _SegmentFile being written here
        self.usable = False  # set by the planner: the walk's records are the re-dispatch's
        self.delay_table = None  # the delay levels the walk's tagsCode used (the re-dispatch's must be the same)
        self.keep = False  # set by a caller that reads the columns again after the re-dispatch (and removes them)
        self.segment_ids = False  # the topic ids are each segment's own (a -j walk's), not the whole log's
        # verify's outcome of each segment the walk read whole (verify.segmentreport.segment_outcome), by start offset,
        # and what says a segment file is still the one it read: the plan's fingerprint of the store
        # (plan.store_fingerprint, taken before the walk) and the rules its verify used (:func:`walk_rules`)
        self.outcomes: dict = {}
        self.root: str | None = None
        self.fingerprint: dict | None = None
        self.rules: tuple | None = None
        atexit.register(self.remove)

    @classmethod
    def create(cls, near: str, log_bytes: int) -> "DispatchSpill | None":
        """A spill in a new folder on a disk with room for the columns (~60 bytes a record, bounded here by a
        tenth of the log's bytes), tried in the temporary folder, then beside ``near``; None when neither has it.
        The folder is named after this process: the folders of a recover that was killed (no exit handler ran)
        are removed here, where their process no longer exists."""
        import tempfile

        from ..parallel import spill_dir

        for place in (tempfile.gettempdir(), near):
            _remove_orphans(place)
        d = spill_dir(1, max(1, log_bytes // 20), near, prefix=f"{PREFIX}{os.getpid()}-")
        return cls(d) if d else None

    def path(self, seg_start: int) -> str:
        return os.path.join(self.dir, f"{seg_start:020d}")

    # -- writing: the walk's chunk sink, in this process or a worker --

    def add(self, seg, h, topics) -> None:
        f = self._open.get(seg.start)
        if f is None:
            for start in list(self._open):  # the walk went on to another segment: the one before is whole
                self.parts[start] = self._open.pop(start).close()
            f = self._open[seg.start] = _SegmentFile(self.path(seg.start))
        f.add(seg.start, h, topics)

    def keep_outcome(self, rep) -> None:
        """verify's findings and segment-level fields of a segment its walk read whole (``rep``: the segment's last
        window report, before the checks read it), for verify after the apply (:meth:`SpilledColumns.replay`)."""
        from ..verify.segmentreport import segment_outcome

        self.outcomes[rep.start] = segment_outcome(rep)

    def finish_segment(self, seg_start: int):
        """What was kept of a segment walked (in a worker: sent to the main process): (its part, None if it had no
        record; verify's outcome of it, or None)."""
        f = self._open.pop(seg_start, None)
        return f.close() if f is not None else None, self.outcomes.pop(seg_start, None)

    def merge_segment(self, seg_start: int, kept) -> None:
        """A worker's :meth:`finish_segment` of the segment at ``seg_start``."""
        part, outcome = kept
        if part is not None:
            self.parts[seg_start] = part
        if outcome is not None:
            self.outcomes[seg_start] = outcome

    def finish(self) -> None:
        for start in list(self._open):
            self.parts[start] = self._open.pop(start).close()

    def drop_segment(self, seg_start: int) -> None:
        """The segment's columns and outcome are not to be used (its file removed): readers read it themselves."""
        self.parts.pop(seg_start, None)
        self.outcomes.pop(seg_start, None)
        try:
            os.unlink(self.path(seg_start))
        except FileNotFoundError:
            pass

    # -- reading: the apply's re-dispatch --

    def covers(self, seg_starts: list) -> bool:
        """Whether every segment of ``seg_starts`` (the dispatched ones) is here whole and usable; a segment
        without a file had no record."""
        if not self.usable:
            return False
        for s in seg_starts:
            part = self.parts.get(s)
            if part is None:
                if os.path.exists(self.path(s)):
                    return False  # written but not finished
                continue
            if not part[0] or not os.path.isfile(self.path(s)):  # a file removed since (a temporary-folder cleaner)
                return False
        return True

    def batches(self, seg_start: int):
        """The segment's records as DispatchBatches, chunk by chunk, in log order."""
        part = self.parts.get(seg_start)
        if part is None:
            return
        names = part[1]
        with open(self.path(seg_start), "rb") as f:  # buffered: readinto() fills the array unless the file ends
            while True:
                chunk = read_chunk(f)
                if chunk is None:
                    return
                (phy, size, qid, qo, flag, ts, tids, codes, counts), hashes = chunk
                n = len(phy)
                yield DispatchBatch(phy, size, None, qid, qo, flag, ts, codes, None, None, topic_ids=tids,
                                    topic_names=names, key_count=counts, key_hashes=hashes, strings=None,
                                    rows=np.arange(n, dtype=np.int64), lmq=None)

    def same_delays(self, delay_table: dict) -> bool:
        """Whether the walk's tagsCode were computed with these delay levels (a reader's must be the same)."""
        return self.delay_table is not None and self.delay_table == delay_table

    def chunks(self, seg_start: int):
        """The segment's chunks as the walk wrote them, ``(columns, hashes)`` (:func:`read_chunk`), with the bytes of
        the topics of its walk's ids (in id order); None when the segment's columns are not whole and usable."""
        part = self.parts.get(seg_start)
        if not self.usable or part is None or not part[0] or not os.path.isfile(self.path(seg_start)):
            return None
        return _read_all(self.path(seg_start)), part[2]

    def unchanged(self, path: str) -> bool:
        """Whether the file at ``path`` is the one the plan fingerprinted before its walk, not written since: same
        size, modification time and inode (the plan's own test that the store did not change before the lock)."""
        if self.fingerprint is None or self.root is None:
            return False
        want = self.fingerprint.get(os.path.relpath(os.path.abspath(path), self.root))
        try:
            st = os.lstat(path)
        except OSError:
            return False
        return want == (st.st_size, st.st_mtime_ns, st.st_ino)

    def remove(self) -> None:
        for f in self._open.values():
            f.f.close()
        self._open, self.parts, self.outcomes, self.usable = {}, {}, {}, False
        shutil.rmtree(self.dir, ignore_errors=True)


def walk_rules(commitlog) -> tuple:
    """What verify's reading of a segment depends on besides its bytes: the broker version, the largest record it
    accepts, the segment size and the property-CRC rule."""
    cfg = commitlog.config
    return (cfg.version, cfg.maxMessageSize, commitlog.segments.file_size,
            bool(getattr(cfg, "forceVerifyPropCRC", False)), bool(getattr(commitlog, "is_dledger", False)))


def _read_all(path: str):
    with open(path, "rb") as f:
        while True:
            chunk = read_chunk(f)
            if chunk is None:
                return
            yield chunk


class SpilledColumns:
    """verify's walk after the apply fed the dispatch columns the plan's walk kept, instead of computing them again
    (verify.commitlog.iter_segment_windows, ``columns``): both are verify's one-pass property kernel over the same
    bytes (the apply writes nothing into the log before its recovered end, and the lock is held throughout), so
    they are the same columns; each chunk's records are checked to be the plan's (offsets and sizes), and after
    the first that is not, every later chunk is computed as usual. The walk numbers topics as the plan's did: over
    the whole log in one process, each segment on its own in a ``-j`` worker."""

    def __init__(self, spill: DispatchSpill, delay_table: dict):
        self.spill = spill
        self.dead = spill is None or not spill.usable or not spill.same_delays(delay_table)
        self._segment = None  # (chunks of the segment being walked, the topics' bytes)

    def start_segment(self, seg_start: int, known_topics: list, whole_log_ids: bool) -> bool:
        """The walk enters the segment at ``seg_start`` knowing these topics (their bytes, in id order; its ids
        are the whole log's, or the segment's own): whether its chunks can be taken from the columns."""
        self._segment = None
        if self.dead or whole_log_ids == self.spill.segment_ids:
            return False
        got = self.spill.chunks(seg_start)
        if got is None:
            return False
        if got[1][:len(known_topics)] != known_topics:
            self.dead = True  # not the ids of this walk
            return False
        self._segment = got
        return True

    def replay(self, commitlog, seg, known_topics: list, whole_log_ids: bool, check_crc: bool):
        """(the segment's kept chunks, its walk's topics' bytes, verify's outcome of it) when verify of ``seg`` can be
        taken whole from the plan's walk instead of reading the segment again
        (verify.segmentreport.replayed_windows); None otherwise (the segment is walked). It can when the plan's
        walk verified this segment whole (its CRCs too, if this walk checks them) under the same rules, kept its
        columns whole, numbered its topics as this walk does, and the file is the one the plan fingerprinted before
        that walk, not written since. The apply writes into the log only from its cut on and holds the lock
        throughout; a file it wrote (its cut's) has changed and is walked again."""
        spill = self.spill
        if self.dead or whole_log_ids == spill.segment_ids or spill.rules != walk_rules(commitlog):
            return None
        outcome = spill.outcomes.get(seg.start)
        if outcome is None or (check_crc and not outcome["crc_checked"]) or not spill.unchanged(seg.path):
            return None
        if seg.start not in spill.parts:  # no record in the segment: no columns file
            if outcome["records"] or os.path.exists(spill.path(seg.start)):
                return None  # written but not finished
            return iter(()), [], outcome
        got = spill.chunks(seg.start)
        if got is None or got[1][:len(known_topics)] != known_topics:
            return None
        return got[0], got[1], outcome

    def take(self, phy: np.ndarray, size: np.ndarray):
        """The kept (topic ids, tagsCode, keyCount, key hashes) of the chunk whose records start at ``phy`` with these
        sizes, and the topics' bytes in id order; None (and none again) when the records are not the plan's."""
        if self.dead or self._segment is None:
            return None
        chunks, raws = self._segment
        got = next(chunks, None)
        if got is None or not (np.array_equal(got[0][0], phy) and np.array_equal(got[0][1], size)):
            self.dead = True
            return None
        (_, _, _, _, _, _, tids, codes, counts), hashes = got
        return tids, codes, counts, hashes, raws


def discard(plan) -> None:
    """Remove the columns a plan kept (a plan that is not applied, or planned again)."""
    spill = getattr(plan, "dispatch_spill", None)
    if spill is not None:
        spill.remove()


def _remove_orphans(place: str | None) -> None:
    """Remove the column folders in ``place`` whose process is gone (a killed recover's)."""
    if not place:
        return
    try:
        names = os.listdir(place)
    except OSError:
        return
    for n in names:
        if not n.startswith(PREFIX):
            continue
        pid = n[len(PREFIX):].partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(place, n), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, someone else's
        return True
    return True
