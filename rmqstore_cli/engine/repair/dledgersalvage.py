"""Salvage on a DLedger log: every message that passes the broker's CRC-checked parse, in log order, past
damaged entries and past a broken entry header (the walk resumes at the next entry its index unit finds
intact). Skipped ranges are reported like the classic salvage's; the source store is only read."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from rmqstore_cli.formats import fast

from ..log.dledger import EntryWalk, resume_by_unit
from ..log.dledgerjobs import LogWalk, walk_log
from .fileops import last_nonzero


def scan_dledger(store, report, start: int = 0) -> Iterator[tuple]:
    """(segment, position) of every message that parses cleanly, from physical offset ``start``; fills ``report``."""
    cl = store.commitlog
    checks = message_checks(cl)
    for ec in walk_log(cl, resume_past(cl, report), LogWalk()):
        yield from chunk_messages(cl, ec, report, start, checks)


def message_checks(cl) -> tuple:
    """How the messages are checked: CRCs on, the log's property-CRC policy and magics."""
    return cl.prop_crc_policy(True), cl.magics(False)


def chunk_messages(cl, ec, report, start: int, checks: tuple) -> Iterator[tuple]:
    """(segment, position) of the chunk's messages that parse cleanly, from ``start``; the others' entries are
    added to ``report.skipped`` first."""
    prop, magics = checks
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


def resume_past(cl, report):
    """The salvage's ``on_stop``: past a broken entry header, go on at the next entry its index unit finds intact
    (the bytes between are a skipped range); when none, skip to the file's last non-zero byte and end."""

    def on_stop(walk: EntryWalk):
        stop = walk.stop
        nxt = resume_by_unit(cl, walk)
        seg = stop.segment
        if nxt is None:
            if seg is not None:
                end = last_nonzero(seg.path, stop.position)
                if end > stop.position:
                    report.skipped.append([stop.offset, seg.start + end, stop.text()])
            return None
        resume = cl.segments.segments[nxt[0]].start + nxt[1]
        report.skipped.append([stop.offset, resume, stop.text()])
        return (*nxt[:3], -1)  # the term rule starts afresh past the damage: any term is rescued

    return on_stop
