"""Batch consume queue writer (the broker's BatchConsumeQueue.putBatchMessagePositionInfo, FORMAT.md §9.3),
with the state its recovery leaves on open.

Units are appended one after the other at the queue's write position (never placed by queue offset; the
first file is ``00000000000000000000``); a unit whose record starts at or before the last unit's record
(``maxMsgPhyOffsetInCommitLog``, a start offset here, not an end) is skipped as already present. Each unit:
phyOffset, size, tagsCode, storeTime, msgBaseOffset, batchSize, compactedOffset = -1, reserved = 0.
"""

from __future__ import annotations

import os

import numpy as np

from rmqstore_cli.formats.records import BCQ_INVALID_POS, BCQ_UNIT_SIZE

from ..log.mappedfile import OPEN_WRITERS, SegmentQueueWriter
from .batchcq import BCQ_DIR, BCQ_DTYPE, valid_units


class BatchConsumeQueueWriter:
    """Appends 46-byte units to ``batchconsumequeue/<topic>/<queueId>``.

    ``strict_offsets`` (repairs): a unit is only written where it continues the queue (its msgBaseOffset is the
    queue's max offset), so a re-dispatch never leaves a gap or an overlap the broker would serve."""

    def __init__(self, root: str, topic: str, queue_id: int, config, journal=None, strict_offsets: bool = False):
        self.topic, self.queue_id = topic, queue_id
        self.file_size = config.mapperFileSizeBatchConsumeQueue
        self.files = SegmentQueueWriter(os.path.join(root, BCQ_DIR, topic, str(queue_id)), self.file_size, journal,
                                        OPEN_WRITERS)
        self.strict_offsets = strict_offsets
        self.refused = 0
        self.write_offset = 0  # logical byte position of the next unit
        self.max_phy = -1  # maxMsgPhyOffsetInCommitLog: the last unit's record start
        self.max_offset: int | None = None  # the last unit's msgBaseOffset + batchSize (None: no unit)
        self._recover()

    def _recover(self) -> None:
        """BatchConsumeQueue.recover: from the third-last file, valid units up to the first invalid one."""
        starts = self.files.existing_starts()
        if not starts:
            return
        fs = self.file_size
        k = max(0, len(starts) - 3)
        write = starts[k]
        for start in starts[k:]:
            if start != write:
                break
            with open(self.files.path_of(start), "rb") as f:
                data = f.read(fs)
            arr = np.frombuffer(data, dtype=BCQ_DTYPE, count=len(data) // BCQ_UNIT_SIZE)
            bad = np.flatnonzero(~valid_units(arr))
            m = int(bad[0]) if len(bad) else len(arr)
            if m:
                last = arr[m - 1]
                self.max_phy = int(last["phyOffset"])
                self.max_offset = int(last["msgBaseOffset"]) + int(last["batchSize"])
            write = start + m * BCQ_UNIT_SIZE
            if m * BCQ_UNIT_SIZE < fs:
                break
        self.write_offset = write

    @property
    def next_offset(self) -> int:
        """The batch queue table's value (§13.8): last unit's msgBaseOffset + batchSize."""
        return self.max_offset or 0

    def put_many(self, phy, size, tags, store_time, base, batch) -> int:
        """putBatchMessagePositionInfo for each unit in order (int64 arrays); returns how many were written."""
        fs = self.file_size
        per_file = fs // BCQ_UNIT_SIZE
        done = 0
        rows = []
        for p, s, t, ts, b, n in zip(*(np.asarray(a).tolist() for a in (phy, size, tags, store_time, base, batch))):
            if p <= self.max_phy:
                continue  # already present
            if self.strict_offsets and self.max_offset is not None and b != self.max_offset:
                self.refused += 1
                continue
            rows.append((p, s, t, ts, b, n))
            self.max_phy, self.max_offset = p, b + n
        at = 0
        while at < len(rows):
            pos = self.write_offset
            in_file = pos % fs
            take = rows[at:at + max(1, per_file - in_file // BCQ_UNIT_SIZE)]
            units = np.zeros(len(take), dtype=BCQ_DTYPE)
            cols = list(zip(*take))
            for name, col in zip(("phyOffset", "size", "tagsCode", "storeTime", "msgBaseOffset", "batchSize"), cols):
                units[name] = col
            units["compactedOffset"] = BCQ_INVALID_POS
            seg = self.files.open(pos - in_file)
            seg.write(in_file, units.tobytes())
            seg.dirty = True
            self.write_offset = pos + len(take) * BCQ_UNIT_SIZE
            at += len(take)
            done += len(take)
        return done

    def flush(self) -> None:
        self.files.flush()

    def close(self, flush: bool = True) -> None:
        self.files.close(flush)
