"""Following a live DLedger log (``dump commitlog --follow`` on a DLedger store).

The reader's side of DLedgerMmapFileStore.appendAsLeader / appendAsFollower: the leader (or a follower
replicating it) appends whole entries (48-byte header + one message) to the last data file, writes a blank
where the next entry does not fit and goes on in a new file. Read-only and lock-free, like
:class:`~.follow.Follower`: an entry is passed on once DLedger's recovery would accept its header (magic,
size, pos, contiguous index, non-decreasing term) and its message is whole. The last entry seen must pass
the broker's CRC-checked record parse: until it does it may still be being copied in, and it is read again at
the next poll. An entry that a later entry already follows is finished: its message is passed on as the plain
listing passes it on (the record parse without the CRC, as the broker's reput dispatches it), and one that fails
even that is stepped over as the reput steps over it (its offset in :attr:`DLedgerFollower.skipped`).
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterator

import numpy as np

from rmqstore_cli.formats import fast

from ..log.commitlog import Chunk
from ..log.dledger import DLedgerCommitLog, EntryWalk, walk_entries
from ..log.segments import segment_name
from .follow import FOLLOW_CHUNK, POLL_SECONDS, Follower


class DLedgerFollower(Follower):
    """One entry position (with the index and term of the entry before it), advanced entry by entry as data is
    confirmed, across data-file rolls."""

    def __init__(self, commitlog: DLedgerCommitLog, start: int | None = None, poll: float = POLL_SECONDS):
        self.commitlog = commitlog
        self.file_size = commitlog.segments.file_size
        self.poll = poll
        self._seg = None
        self.skipped: list[tuple[int, int]] = []  # (message offset, fast.R_* reason) of damaged entries stepped over
        segs = commitlog.segments.segments
        seg = commitlog.segments.find(start) if start is not None else None
        if seg is not None:  # from the start of the file holding ``start``; the caller's filter drops earlier ones
            k = segs.index(seg)
            self.offset, self.last_index, self.last_term = seg.start, commitlog.index_before(k, 0), -1
            return
        if start is not None and segs and start < segs[0].start:
            self.offset, self.last_index, self.last_term = segs[0].start, commitlog.index_before(0, 0), -1
            return
        # the end of the entries DLedger's recovery accepts (or of the log, for a start past it)
        walk = EntryWalk()
        for _ in walk_entries(segs, result=walk, chunk=1 << 16):
            pass
        stop = walk.stop
        self.offset = stop.offset if stop is not None else 0
        if stop is not None and stop.kind == fast.STOP_BLANK:
            self.offset = stop.segment.start + self.file_size  # the log goes on in the next file
        self.last_index, self.last_term = walk.last_index, walk.last_term

    def chunks(self, stop: Callable[[], bool] = lambda: False) -> Iterator[Chunk]:
        """Chunks of the messages of new entries, forever (until ``stop()`` is true or the caller stops)."""
        cl = self.commitlog
        magics, prop_crc, listing_prop_crc = cl.magics(False), cl.prop_crc_policy(True), cl.prop_crc_policy(False)
        while not stop():
            seg = self._segment()
            if seg is None or seg.size == 0:
                time.sleep(self.poll)
                continue
            pos = self.offset - seg.start
            walk = EntryWalk()
            entries = walk_entries([seg], start_position=pos, last_index=self.last_index, last_term=self.last_term,
                                   result=walk, chunk=FOLLOW_CHUNK)
            ec = next(entries, None)
            entries.close()
            if ec is not None:
                whole = cl.messages(ec, True, prop_crc, magics)[0].reason[-1] == fast.R_OK
                done = len(ec) if whole else len(ec) - 1  # the last entry failing may be still being written
                h, _ = cl.messages(ec, False, listing_prop_crc, magics)  # the finished ones: as the listing reads them
                ok = h.reason == fast.R_OK
                if done:
                    c = ec.cols
                    for o, r in zip(h.offsets[:done][~ok[:done]].tolist(), h.reason[:done][~ok[:done]].tolist()):
                        self.skipped.append((seg.start + int(o), int(r)))
                    self.offset = seg.start + int(c["at"][done - 1]) + int(c["size"][done - 1])
                    self.last_index, self.last_term = int(c["index"][done - 1]), int(c["term"][done - 1])
                    keep = np.zeros(len(h), bool)
                    keep[:done] = ok[:done]
                    if keep.any():
                        yield Chunk(seg, ec.buf, h.select(keep), True)
                    continue
            elif walk.stop is not None and walk.stop.kind == fast.STOP_BLANK and walk.stop.position == pos:
                if self._next_file_exists(seg):
                    self.offset = seg.start + self.file_size
                    seg.close()
                    self._seg = None
                    continue
            time.sleep(self.poll)  # nothing new, or an entry still being written

    def _next_file_exists(self, seg) -> bool:
        return os.path.exists(os.path.join(self.commitlog.directory, segment_name(seg.start + self.file_size)))


__all__ = ["DLedgerFollower"]
