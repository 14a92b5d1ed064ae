"""Index files in recovery planning (hooks of recovery.Planner): which files the broker's next start
deletes (§10.6), which ones we rebuild from the commitlog and from which record.

Files are rewritten only from the first one that needs it: a damaged file (cut short, or a put torn
past its indexCount), the first one holding entries at or past the recovered end, or the first one
that disagrees with the records; the files before it are kept as they are. The index writer only
appends, so the files after it are rebuilt too, from the first record after the last one the kept
files index (a record whose keys straddle into the next file resumes with its remaining keys), and
the files rebuilt keep their names (``apply.reused_names``): a rebuild with the same records gives
the same files back.
"""

from __future__ import annotations

import os

import numpy as np

from .derived_windows import index_problems
from .probes import index_torn


def load_index(planner) -> None:
    """Index files at load (IndexService.load): stray entries moved aside; from the first damaged file on,
    files moved aside to be rebuilt (``planner.index_damaged_from``; :func:`check_index` says from which record)."""
    idx = planner.store.index
    planner.index_rebuild_from = None
    damaged = None
    for f in idx.problems:
        if f.code == "IDX_BAD_NAME":
            planner.plan.notes.append(f"index/{os.path.basename(f.path)} is not an index file name; the broker would "
                                      f"load it as an index file anyway (and grow it to full size)")
            planner.move_aside(f.path, "stray file in index/")
        elif f.code == "IDX_STRAY":
            planner.move_aside(f.path, "stray entry in index/")
    files = list(idx.files)
    torn = False
    for k, f in enumerate(files):
        if not f.complete or index_torn(f):
            damaged, torn = k, f.complete
            break
    planner.index_files = files
    planner.index_damaged_from = None
    if damaged is not None:
        bad = files[damaged]
        what = ("holds entries or slots past its indexCount (a put cut short by a crash): re-dispatching into it "
                "would link new entries to stale ones" if torn else
                f"is {bad.size} bytes, not {bad.expected_size}: the broker would map it at full "
                f"size (growing it with zeros) and silently miss the lost entries")
        if planner.broker_only:  # what the next start reads, not a plan to apply: every file counted as rebuilt
            planner.plan.notes.append(f"index file {bad.name} {what}; the index is rebuilt from the commitlog")
            for f in files:
                planner.move_aside(f.path, "index rebuilt from the commitlog (damaged index file)")
                planner.plan.index_deleted.append(f.name)
            planner.index_files, planner.index_rebuild_from = [], 0
            return
        planner.plan.notes.append(
            f"index file {bad.name} {what}; it and the {len(files) - damaged - 1} files after it are moved into "
            f"the backup and rebuilt from the commitlog under their names; the {damaged} files before it are kept")
        for f in files[damaged:]:
            planner.move_aside(f.path, "index rebuilt from the commitlog (damaged index file)")
            planner.plan.index_deleted.append(f.name)
        # where the rebuild starts (after the last record the kept files index) needs the records:
        # check_index finishes it
        planner.index_files = files[:damaged]
        planner.index_damaged_from = damaged


def index_after_crash(planner, cp) -> None:
    """§10.6: an abnormal start deletes the index files newer than the checkpoint's indexMsgTimestamp."""
    if planner.plan.last_exit_ok:
        return
    keep = []
    for f in planner.index_files:
        h = f.header()
        if h.endTimestamp > cp.indexMsgTimestamp:
            planner.move_aside(f.path, f"abnormal start: index file endTimestamp {h.endTimestamp} > checkpoint "
                               f"indexMsgTimestamp {cp.indexMsgTimestamp} (the broker deletes it); its entries are re-indexed")
            planner.plan.index_deleted.append(f.name)
        else:
            keep.append(f)
    if len(keep) < len(planner.index_files) and not planner.broker_only:
        # The broker indexes again only the records its walk re-dispatches; the records between the last kept
        # file's end and the walk's start would be in no index file (verify: IDX_MISSING). Ours re-dispatch from
        # the kept files' end at least (Planner._dispatch), where the broker's own rule takes over: the record at
        # that end is indexed again whole, as when its walk starts before it.
        planner.plan.notes.append(f"abnormal start: {len(planner.index_files) - len(keep)} index file(s) deleted; the "
                                  "broker indexes again only what its walk re-dispatches, so records after the last "
                                  "kept index file and before the walk would be in no index file: we re-dispatch from "
                                  "the end of the kept files at least")
        planner.index_crash_deleted = True
    planner.index_files = keep


def index_past_end(planner) -> None:
    """Index entries pointing at or past the recovered end: the broker keeps them (lookups
    return offsets that no longer exist); we rebuild the files that hold such entries from the
    commitlog (under their names), the files before them stay."""
    files = planner.index_files
    k = next((i for i, f in enumerate(files) if f.header().endPhyOffset >= planner.end), None)
    if k is None:
        return
    whole = k == 0 or planner.broker_only
    planner.plan.notes.append(f"index files hold entries at or past the recovered end {planner.end}; the broker keeps "
                              f"them; " + ("every index file is rebuilt from the commitlog instead" if whole else
                                           f"the {len(files) - k} files from {files[k].name} on are rebuilt from the "
                                           f"commitlog instead, the {k} before them are kept"))
    for f in (files if whole else files[k:]):
        planner.move_aside(f.path, f"index entries point past the recovered end {planner.end}; index rebuilt")
        planner.plan.index_deleted.append(f.name)
    if whole:
        planner.index_files = []
        planner.index_rebuild_from = 0
    else:  # check_index finds where the rebuild starts
        planner.index_files = files[:k]
        planner.index_damaged_from = k


def check_index(planner, table) -> None:
    """Index files that disagree with the log are rebuilt, with every file after them; so are the files from a
    damaged one on (moved aside at load: ``planner.index_damaged_from``). The files before stay as they are."""
    damaged = getattr(planner, "index_damaged_from", None)
    if planner.index_rebuild_from is not None or (not planner.index_files and damaged is None):
        return
    files = planner.index_files
    probs = _verified(planner, files)
    if probs is None:
        probs = (index_problems(planner.store, table, files) if files else []) + _missing_entries(planner, files)
    if probs:
        bad = {f.path for f in probs}
        first_bad = min(i for i, f in enumerate(files) if f.path in bad)
    elif damaged is not None:
        first_bad = len(files)  # every kept file agrees: the rebuild starts after the last one
    else:
        return
    j, after, held = _index_restart(files, first_bad, table)
    if probs:
        first = next(f for f in probs if f.path == files[first_bad].path)
        planner.plan.notes.append(
            f"index file {os.path.basename(first.path)} disagrees with the commitlog ({first.code}: {first.message}); "
            f"the broker keeps it (lookups would return wrong or no messages); "
            + (f"it and the {len(files) - j - 1} files after it are rebuilt from the commitlog, from the first record "
               f"after {after}" if j else "every index file is rebuilt from the commitlog"))
    elif j < first_bad:
        planner.plan.notes.append(f"the last record of index file {os.path.basename(files[j].path)} is not whole in the "
                                  f"log: it is rebuilt too, with the {first_bad - j - 1} kept files after it")
    for f in files[j:]:
        planner.move_aside(f.path, "index rebuilt from the commitlog (entries disagree with the records)" if probs else
                           "index rebuilt from the commitlog (after a damaged index file)")
        planner.plan.index_deleted.append(f.name)
    planner.index_files = files[:j]
    if j:
        recs = table.recs
        k = int(np.searchsorted(recs.phy, after, side="right"))
        if held is not None:  # the record's remaining keys start the rebuilt file
            k = int(np.searchsorted(recs.phy, after, side="left"))
        planner.index_rebuild_from = int(recs.phy[k]) if k < len(recs) else table.end
        planner.index_resume_after = (after, held)
    else:
        planner.index_rebuild_from = 0


def _verified(planner, files: list) -> list | None:
    """verify's error and warning findings on the kept index files, when the plan verified the store along its walk
    and the recovered log is the log verify read: the broker's walk ended at the end of the data and verify found
    nothing wrong in the commitlog (no record cut, none invalid). The index checks then read the same records as
    :func:`index_problems` would, in the same windows, and are not made twice. None otherwise."""
    from rmqstore_cli.formats.fast import STOP_EOF, STOP_ZERO

    from .derived import in_file_order

    found = getattr(planner, "verify_findings", None)
    stop = getattr(planner, "stop", None)
    if found is None or stop is None or stop.kind not in (STOP_ZERO, STOP_EOF):
        return None
    log_dir = planner.store.commitlog.segments.directory
    if any(f.severity in ("error", "warning") and f.path and f.path.startswith(log_dir) for f in found):
        return None
    kept = {f.path for f in files}
    return in_file_order([f for f in found if f.path in kept and f.severity in ("error", "warning")], files)


def _missing_entries(planner, files: list) -> list:
    """verify's IDX_MISSING findings on the kept files (records below the index's end that lack entries: the
    broker never indexes them again), when the plan verified the store along its walk; the file they name is
    where the entries belong, so it is rebuilt like a file that disagrees with the log."""
    kept = {f.path for f in files}
    return [f for f in getattr(planner, "verify_findings", None) or [] if f.code == "IDX_MISSING" and f.path in kept]


def _index_restart(files: list, j: int, table) -> tuple[int, int | None, int | None]:
    """(first file to rebuild, the endPhyOffset of the file kept before it, how many keys of that record
    the kept file holds when its keys straddle into the rebuilt file (None: all of them)). A kept file
    whose last record the log does not hold is rebuilt too."""
    recs = table.recs
    while j > 0:
        prev = files[j - 1]
        h = prev.header()
        end = h.endPhyOffset
        ent = prev.entry_table(max(h.indexCount, 1))[1:]
        held = int((ent["phyOffset"] == end).sum()) if len(ent) else 0
        i, found = recs.lookup(np.asarray([end], np.int64))
        if found[0] and held and held <= int(recs.c["keyCount"][i[0]]):
            return j, end, (None if held == int(recs.c["keyCount"][i[0]]) else held)
        j -= 1
    return 0, None, None
