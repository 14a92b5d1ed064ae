"""Salvage on a DLedger log: every message that passes the broker's CRC-checked parse, in log order, past
damaged entries and past a broken entry header (the walk resumes at the next entry its index unit finds
intact). Skipped ranges are reported like the classic salvage's; the source store is only read."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from rmqstore_cli.formats import fast

from ..log.dledger import EntryWalk, resume_by_unit, walk_entries
from .fileops import last_nonzero


def scan_dledger(store, report, start: int = 0) -> Iterator[tuple]:
    """(segment, position) of every message that parses cleanly, from physical offset ``start``; fills ``report``."""
    cl = store.commitlog
    prop, magics = cl.prop_crc_policy(True), cl.magics(False)
    k, pos, last = 0, 0, -1
    while True:
        walk = EntryWalk()
        for ec in walk_entries(cl.segments.segments, start_index=k, start_position=pos, last_index=last, result=walk):
            h, _ = cl.messages(ec, True, prop, magics)
            base = ec.segment.start
            bad = h.reason != fast.R_OK
            for j in np.flatnonzero(bad).tolist():
                at = int(ec.cols["at"][j])
                report.skipped.append([base + at, base + at + int(ec.cols["size"][j]),
                                       f"entry {int(ec.cols['index'][j])}: {fast.REASON_TEXT.get(int(h.reason[j]))}"])
            for p in h.offsets[~bad].tolist():
                if base + p >= start:
                    yield ec.segment, p
        stop = walk.stop
        if stop is None or stop.kind in (fast.STOP_ZERO, fast.STOP_BLANK):
            return
        nxt = resume_by_unit(cl, walk)
        seg = stop.segment
        if nxt is None:
            if seg is not None:
                end = last_nonzero(seg.path, stop.position)
                if end > stop.position:
                    report.skipped.append([stop.offset, seg.start + end, stop.text()])
            return
        k, pos, last, _ = nxt
        resume = cl.segments.segments[k].start + pos
        report.skipped.append([stop.offset, resume, stop.text()])
