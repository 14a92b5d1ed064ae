"""Verify a DLedger log (DLedgerMmapFileStore.recover's rules, and what it does not check).

Two parts:

* :func:`message_stop`: phase 1 (``verify/commitlog``) walks the messages inside the entries; where one fails
  the broker's CRC-checked record parse, DLedger's recovery (header checks only) still keeps and serves the
  entry, so the finding says so and the walk goes on at the next entry.
* :func:`check_dledger`: the entries themselves, once over the whole log: the header rules (magic, size,
  pos, contiguous index, non-decreasing term), the blanks, the files after the end, every index unit against
  its entry, and the DLedger checkpoint / currterm against the log. Memory stays one chunk of entries.

Finding codes are stable (docs/dledger.md).
"""

from __future__ import annotations

import os

import numpy as np

from rmqstore_cli.formats import dledger as dl
from rmqstore_cli.formats import fast

from ..findings import ERROR, INFO, WARNING, Finding
from ..log.dledger import EntryWalk, recovery_start_file, resume_by_unit
from ..log.dledgerjobs import EntryCapture, FilePart, LogWalk, walk_log

HEADER = dl.ENTRY_HEADER_SIZE
RULE_CODES = {dl.E_POS: "DL_ENTRY_POS", dl.E_BODYLEN: "DL_ENTRY_SIZE", dl.E_SIZE: "DL_ENTRY_SIZE",
              dl.E_INDEX: "DL_ENTRY_INDEX", dl.E_TERM: "DL_ENTRY_TERM"}
UNIT_FIELDS = ("magic", "pos", "size", "index", "term")


def _entry_head(seg, at: int) -> dict:
    return dict(dl.ENTRY_HEADER.parse(bytes(seg.buffer()[at:at + HEADER])))


def message_stop(commitlog, seg, stop, u8, add) -> int | None:
    """Phase 1 on a DLedger log, where the message walk stopped without a blank: reports a damaged message
    (and returns where the walk goes on: the next entry), or records nothing for the end of the entries (the
    entry checks of :func:`check_dledger` report a broken header). ``add(pos, code, severity, text, **extra)``."""
    if stop.kind != fast.STOP_INVALID or getattr(stop, "entry_level", False):
        return None
    p = stop.position
    at = p - HEADER
    head = _entry_head(seg, at)
    end = at + head["size"]
    tail = u8[max(p, end - 8):end]
    torn = end <= len(u8) and len(tail) and not tail.any()
    why = fast.REASON_TEXT.get(stop.reason, "invalid message")
    extra = dict(entryIndex=head["index"], entryTerm=head["term"], entryPos=seg.start + at, reason=why)
    if torn:
        add(p, "DL_TORN_ENTRY", ERROR, f"entry {head['index']} (pos {seg.start + at}): its message is cut short and "
            f"zero-filled ({why}), a torn write; DLedger's recovery checks headers only, so the broker keeps and serves "
            "this entry: repair it from a replica (recover --from-replica) or cut the log before it", **extra)
    else:
        add(p, "DL_MESSAGE_INVALID" if stop.reason != fast.R_BODY_CRC else "DL_MESSAGE_CRC", ERROR,
            f"entry {head['index']} (pos {seg.start + at}): the message inside fails the broker's CRC-checked parse "
            f"({why}); DLedger's recovery checks headers only, so the broker keeps and serves this entry: repair it "
            "from a replica (recover --from-replica) or cut the log before it", **extra)
    nxt = at + head["size"]
    return nxt if head["size"] > HEADER and nxt <= seg.size else None


class _UnitCheck:
    """Every entry's index unit (at index x 32) against the entry, a chunk of entries at a time."""

    def __init__(self, files, findings: list):
        self.files = files
        self.findings = findings
        self.bad = 0
        self.missing = 0
        self.first_bad: tuple | None = None

    def chunk(self, ec) -> None:
        c = ec.cols
        first, n = int(c["index"][0]), len(ec)
        units = self.files.index_units(first, n, copy=False)  # compared at once: views of the mapped index
        have = len(units)
        if have < n:
            self.missing += n - have
            if self.first_bad is None:
                self.first_bad = ("missing", first + have, int(c["pos"][have]))
        want = {"magic": c["magic"][:have], "pos": c["pos"][:have], "size": c["size"][:have],
                "index": c["index"][:have], "term": c["term"][:have]}
        wrong = np.zeros(have, bool)
        for f in UNIT_FIELDS:
            wrong |= units[f].astype(np.int64) != want[f]
        hits = np.flatnonzero(wrong)
        if len(hits):
            self.bad += len(hits)
            for j in hits[:5].tolist():
                u = {f: int(units[f][j]) for f in UNIT_FIELDS}
                e = {f: int(want[f][j]) for f in UNIT_FIELDS}
                idx = first + j
                self.findings.append(Finding(
                    "DL_INDEX_UNIT", ERROR, self._path(idx), (idx * dl.INDEX_UNIT_SIZE) % self.files.index.file_size,
                    f"index unit {idx} says {u}, its entry is {e}: DLedger's recovery rewrites the index from here, and "
                    "a read through this unit (get(index)) finds the wrong bytes", {"entryIndex": idx, "unit": u, "entry": e}))

    def take(self) -> tuple:
        """What the chunks so far added (a worker's result for one data file)."""
        return self.findings, self.bad, self.missing, self.first_bad

    def merge(self, part: tuple) -> None:
        findings, bad, missing, first_bad = part
        self.findings += findings
        self.bad += bad
        self.missing += missing
        self.first_bad = self.first_bad or first_bad

    def _path(self, idx: int) -> str:
        seg = self.files.index.find(idx * dl.INDEX_UNIT_SIZE)
        return seg.path if seg else self.files.index.directory

    def finish(self, end_index: int) -> None:
        if self.missing:
            self.findings.append(Finding("DL_INDEX_MISSING", ERROR, self.files.index.directory, None,
                                         f"{self.missing} entries have no index unit (the index files end early); "
                                         "DLedger's recovery writes them again", {"entries": self.missing}))
        if self.bad > 5:
            self.findings.append(Finding("DL_INDEX_UNIT", ERROR, self.files.index.directory, None,
                                         f"{self.bad} index units in all differ from their entries (the first 5 are listed)",
                                         {"units": self.bad}))
        # units past the last entry: DLedger's recovery truncates the index there
        after = self.files.index_units(end_index + 1, 1 << 16)
        live = np.flatnonzero(after.view(np.uint8).reshape(len(after), -1).any(axis=1)) if len(after) else []
        if len(live):
            idx = end_index + 1 + int(live[0])
            self.findings.append(Finding("DL_INDEX_STALE", WARNING, self._path(idx), None,
                                         f"index units after the last entry ({end_index}) are not zero (from unit {idx}): "
                                         "left from a longer log; DLedger's recovery cuts the index at the last entry",
                                         {"firstStaleUnit": idx}))


def capture_entries(store) -> EntryCapture:
    """Make the scans of ``store``'s DLedger log keep each data file's index-unit checks as they walk it whole (the
    window walk of verify -j 1), for :func:`check_dledger` (``captured``) to use instead of a walk of its own."""
    cl = store.commitlog
    captured = EntryCapture(cl.segments.segments, lambda: _UnitCheck(cl.files, []))
    cl.entry_capture = captured
    return captured


def check_dledger(store, findings: list, summary: dict, jobs: int = 1, captured: EntryCapture | None = None) -> None:
    """The entry-level checks of a DLedger log into ``findings``; what the log holds into ``summary["dledger"]``.
    With ``jobs`` > 1 workers walk whole data files and check their index units (:mod:`..log.dledgerjobs`);
    ``captured`` (:func:`capture_entries`): the files an earlier walk went through whole are not walked again."""
    cl = store.commitlog
    files = cl.files
    findings += files.index.problems
    segs = cl.segments.segments
    units = _UnitCheck(files, findings)
    start_file = recovery_start_file(cl)

    def on_stop(walk: EntryWalk):
        stop = walk.stop
        if stop.segment is None:
            return None
        unseen = segs.index(stop.segment) < start_file
        _entries_end(stop, walk, findings, unseen, start_file)
        # unseen: the broker never reads this entry's header: the log goes on, and so do the checks
        return resume_by_unit(cl, walk) if unseen else None

    log = LogWalk()
    if captured is not None:
        cl.entry_capture = None  # the scans from here on are not the window walk's
    for item in walk_log(cl, on_stop, log, jobs=jobs, file_part=_file_units, args=(files,), captured=captured):
        if isinstance(item, FilePart):
            units.merge(item.item)
        else:
            units.chunk(item)
    walk, first_index = log.walk, log.first_index
    stop, blanks = walk.stop, walk.blanks
    for pos, size in blanks:
        seg = cl.segments.find(pos)
        if seg is not None and size != seg.end - pos:
            findings.append(Finding("DL_BLANK_SIZE", ERROR, seg.path, pos - seg.start,
                                    f"blank says {size} bytes remain, the file has {seg.end - pos}", {"pos": pos}))
    end = stop.offset if stop else 0
    if stop is not None:
        later = [s for s in segs if s.start > (stop.segment.start if stop.segment else -1)]
        with_data = [s for s in later if _has_data(s)]
        if with_data:
            findings.append(Finding("DL_UNREACHABLE", ERROR, with_data[0].path, 0,
                                    f"the entries end at {end} ({stop.text()}) but {len(with_data)} later data file(s) hold "
                                    "bytes: DLedger's recovery ends the log there and deletes them", {"endPos": end}))
    units.finish(walk.last_index)
    _check_state(files, walk, findings, lambda: dispatched_index(store))
    if "commitlog" in summary:  # where the broker's start ends the log: DLedger's header walk, not a message check
        summary["commitlog"]["recoveryEnd"] = end
    summary["dledger"] = {"selfId": files.self_id, "entries": walk.entries, "firstIndex": first_index,
                          "lastIndex": walk.last_index, "lastTerm": walk.last_term, "endPos": end,
                          "endKind": stop.kind if stop else None}


def _file_units(chunks, files):
    """In a ``-j`` worker: the index-unit checks of one data file's entries."""
    units = _UnitCheck(files, [])
    for ec in chunks:
        units.chunk(ec)
    yield units.take()


def _entries_end(stop, walk: EntryWalk, findings: list, unseen: bool = False, start_file: int = 0) -> None:
    seg, p = stop.segment, stop.position
    path = seg.path if seg else None
    extra = {"pos": stop.offset, "afterIndex": walk.last_index, "seenByRecovery": not unseen}
    tail = "DLedger's recovery ends the log here: every later entry is cut"
    if unseen:
        tail = (f"DLedger's recovery starts at data file {start_file} and never reads this one, so the broker keeps "
                "the log as it is (this entry is read through its index unit); a start with fewer files would end the "
                "log here")
    if stop.kind == fast.STOP_INVALID:
        findings.append(Finding(RULE_CODES.get(stop.rule, "DL_ENTRY_INVALID"), ERROR, path, p,
                                f"entry header at {stop.offset}: {dl.E_TEXT[stop.rule]}; {tail}", extra))
    elif stop.kind == fast.STOP_BAD_MAGIC:
        findings.append(Finding("DL_ENTRY_MAGIC", ERROR, path, p, f"magic {stop.magic} at {stop.offset} is neither an "
                                f"entry (1) nor a blank (-1); {tail}", extra))
    elif stop.kind == fast.STOP_TORN:
        findings.append(Finding("DL_ENTRY_TORN", ERROR, path, p, f"entry at {stop.offset} claims {stop.size} bytes, past "
                                f"the end of its file (a torn header); {tail}", extra))
    elif stop.kind == fast.STOP_EOF and seg is not None and p < seg.size:
        findings.append(Finding("DL_NO_BLANK", WARNING, path, p, f"{seg.size - p} bytes at the end of the file are "
                                "neither an entry nor a blank", extra))


def _has_data(seg) -> bool:
    if not seg.size:
        return False
    return bool(np.frombuffer(seg.buffer(), np.uint8).any())


def dispatched_index(store) -> int:
    """Index of the newest entry whose message a consume-queue unit points at (-1: none): the store only
    dispatches committed entries, so this is a lower bound of the committed index."""
    best = -1
    for t, q in store.queues():
        u = store.queue(t, q).units(all_files=False)  # the last three files, as recovery reads: bounded memory
        if not len(u.phy):
            continue
        phy = int(u.phy.max())
        try:
            head = store.commitlog.entry_at_message(phy)
        except Exception:  # noqa: BLE001 - a unit pointing at nothing readable
            continue
        if head.get("magic") == dl.ENTRY_MAGIC:
            best = max(best, int(head["index"]))
    return best


def _check_state(files, walk: EntryWalk, findings: list, dispatched=lambda: -1) -> None:
    """The DLedger checkpoint and currterm against the log. ``dispatched()``: :func:`dispatched_index`, asked for
    only when the checkpoint's committedIndex is below the log's last entry (it reads every queue's last files)."""
    cp = files.checkpoint()
    path = os.path.join(files.directory, dl.CHECKPOINT_FILE)
    last = walk.last_index
    if cp is None:
        if walk.entries:
            findings.append(Finding("DL_CHECKPOINT_MISSING", WARNING, path, None,
                                    "no DLedger checkpoint (nor checkpoint.bak): DLedger starts with committedIndex -1 "
                                    "and commits again what its group agrees on"))
    else:
        for key in dl.CHECKPOINT_KEYS:
            v = cp.get(key)
            # endIndex is the log's last entry; committedIndex may be below it (a follower's uncommitted tail), but
            # never below the newest entry a consume queue holds (the store dispatches only committed entries)
            floor = last if key == "endIndex" or v is None or v >= last else min(dispatched(), last)
            if v is None:
                findings.append(Finding("DL_CHECKPOINT_FIELD", WARNING, path, None, f"the DLedger checkpoint has no {key}"))
            elif v > last:
                findings.append(Finding("DL_CHECKPOINT_AHEAD", ERROR, path, None,
                                        f"{key}={v} in the DLedger checkpoint, but the log ends at entry {last}: entries "
                                        "that were committed are missing", {key: v, "lastIndex": last}))
            elif v < floor:
                findings.append(Finding("DL_CHECKPOINT_STALE", WARNING, path, None,
                                        f"{key}={v} in the DLedger checkpoint, the log holds entries up to {last}: written "
                                        "periodically, stale after a crash (the broker counts from the log on start)",
                                        {key: v, "lastIndex": last}))
    ct = files.currterm()
    if ct is not None and ct.get("currTerm") is not None and walk.entries and ct["currTerm"] < walk.last_term:
        findings.append(Finding("DL_CURRTERM_BEHIND", WARNING, os.path.join(files.directory, dl.CURRTERM_FILE), None,
                                f"currTerm={ct['currTerm']} is below the last entry's term {walk.last_term}",
                                {"currTerm": ct["currTerm"], "lastTerm": walk.last_term}))
    if walk.entries == 0 and files.data.segments:
        findings.append(Finding("DL_EMPTY", INFO, files.data.directory, None, "the DLedger log holds no entry"))
