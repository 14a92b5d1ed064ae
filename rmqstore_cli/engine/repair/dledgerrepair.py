"""What a broker's start does to a DLedger store, as a plan (``recover``, ``truncate`` on DLedger).

The start runs DLedger's own recovery (DLedgerMmapFileStore.recover: entries are checked by their headers
only; the log ends at the first broken header; index units that differ from their entries are written again;
the data and index files are cut at the end), then the store's recovery over the DLedger log
(DLedgerCommitLog.recover: consume-queue units past the log's end are removed, the rest is dispatched again).
The plan does the same, and says where the broker would keep serving a damaged entry (its message fails the
CRC-checked parse: DLedger never looks at the body). Such an entry is repaired only from another replica of the
group (``--from-replica``: the entry there must agree on index, term, pos and size and parse cleanly, then its
bytes are copied) or, as an explicit choice, by cutting the log before it (every later entry is lost).

Actions (carried out by :mod:`.apply`, every overwritten byte saved first): ``copy_range`` (an entry's bytes
from the replica), ``rewrite_units`` (index units from their entries), ``zero_tail`` / ``move_aside`` (the
cut), ``write_text`` (the DLedger checkpoint), ``rebuild_derived`` (consume queues and index files from the
repaired log, the broker's dispatch), ``checkpoint`` (the store checkpoint's times), ``remove_abort``.
"""

from __future__ import annotations

import os

import numpy as np

from rmqstore_cli.formats import dledger as dl
from rmqstore_cli.formats import fast

from ..errors import UsageError
from ..log.dledger import EntryWalk, recovery_start_file, resume_by_unit, walk_entries
from ..verify.dledger import dispatched_index
from .outcome import entry
from .plan import Action, RecoveryPlan, store_fingerprint

HEADER = dl.ENTRY_HEADER_SIZE
DAMAGE_CODES = {"DL_TORN_ENTRY", "DL_MESSAGE_CRC", "DL_MESSAGE_INVALID"}
END_CODES = {"DL_ENTRY_POS", "DL_ENTRY_SIZE", "DL_ENTRY_INDEX", "DL_ENTRY_TERM", "DL_ENTRY_INVALID", "DL_ENTRY_MAGIC",
             "DL_ENTRY_TORN", "DL_UNREACHABLE", "DL_NO_BLANK", "DL_BLANK_SIZE"}
UNIT_CODES = {"DL_INDEX_UNIT", "DL_INDEX_MISSING", "DL_INDEX_STALE"}
STATE_CODES = {"DL_CHECKPOINT_STALE", "DL_CHECKPOINT_AHEAD", "DL_CHECKPOINT_MISSING", "DL_CHECKPOINT_FIELD"}
UNSEEN_REFS = {"CQ_NO_RECORD", "IDX_NO_RECORD"}  # references into an entry whose header is broken (kept)
DERIVED_PREFIXES = ("CQ_", "EXT_", "IX_", "CP_", "CL_LOST_TAIL", "DISPATCH_", "INDEX_")


class _LogState:
    """One pass over our entries: the damaged messages, the index units that differ, where the entries end."""

    def __init__(self, store):
        self.store = store
        self.damaged: list[dict] = []  # index, term, pos, size
        self.unit_runs: list[list[int]] = []  # [first, count] of units differing from their entries
        self.entries = 0
        self.walk = EntryWalk()
        self.resume()

    def resume(self, start_index: int = 0, start_position: int = 0, last_index: int = -1, last_term: int = -1) -> None:
        """Walk (on) from a file and position: after a broken entry the replica will repair, the walk goes on."""
        cl = self.store.commitlog
        self.walk = EntryWalk()
        prop = cl.prop_crc_policy(True)
        magics = cl.magics(False)
        for ec in walk_entries(cl.segments.segments, start_index=start_index, start_position=start_position,
                               last_index=last_index, last_term=last_term, result=self.walk):
            self.entries += len(ec)
            h, _ = cl.messages(ec, True, prop, magics)
            c = ec.cols
            for j in np.flatnonzero(h.reason != fast.R_OK).tolist():
                self.damaged.append({k: int(c[k][j]) for k in ("index", "term", "pos", "size")})
            units = cl.files.index_units(int(c["index"][0]), len(ec))
            wrong = np.ones(len(ec), bool)
            wrong[:len(units)] = False
            for f in ("magic", "pos", "size", "index", "term"):
                wrong[:len(units)] |= units[f].astype(np.int64) != c[f][:len(units)]
            for j in np.flatnonzero(wrong).tolist():
                i = int(c["index"][j])
                if self.unit_runs and self.unit_runs[-1][0] + self.unit_runs[-1][1] == i:
                    self.unit_runs[-1][1] += 1
                else:
                    self.unit_runs.append([i, 1])


def _data_path(store, pos: int) -> tuple[str, int]:
    seg = store.commitlog.segments.find(pos)
    if seg is None:
        raise UsageError(f"offset {pos} is outside every DLedger data file")
    return seg.path, pos - seg.start


def _cut_actions(store, pos: int, last_index: int, why: str) -> list[Action]:
    """The data files cut at ``pos`` (an entry start) and the index files after unit ``last_index``."""
    cl = store.commitlog
    acts = []
    for seg in cl.segments.segments:
        if seg.start + seg.size <= pos:
            continue
        if seg.start < pos:
            acts.append(Action("zero_tail", seg.path, why, offset=pos - seg.start))
        elif seg.start == pos and seg is cl.segments.segments[0]:
            acts.append(Action("zero_tail", seg.path, why, offset=0))
        else:
            acts.append(Action("move_aside", seg.path, why))
    cut = (last_index + 1) * dl.INDEX_UNIT_SIZE
    for seg in cl.files.index.segments:
        if seg.start + seg.size <= cut:
            continue
        if seg.start < cut or seg is cl.files.index.segments[0]:
            acts.append(Action("zero_tail", seg.path, why, offset=max(cut - seg.start, 0)))
        else:
            acts.append(Action("move_aside", seg.path, why))
    return acts


def _replica_entry_at(store, replica, walk: EntryWalk) -> Action | str:
    """Where our entries end at a broken header: the replica's entry with the next index, if it sits at that very
    position and our own index unit for it agrees with it on (magic, pos, size, index, term) and its message parses
    cleanly; else why not."""
    rcl, cl = replica.commitlog, store.commitlog
    k, at = walk.last_index + 1, walk.stop.offset
    ru = rcl.files.index_units(k, 1)
    if not len(ru) or int(ru["index"][0]) != k:
        return f"entry {k} (where our entries end, at {at}) is not in the replica {replica.root}"
    theirs = {f: int(ru[f][0]) for f in ("magic", "pos", "size", "index", "term")}
    if theirs["pos"] != at:
        return f"the replica's entry {k} is at {theirs['pos']}, ours would be at {at}: not the same log"
    seg = rcl.segments.find(at)
    if seg is None or at - seg.start + theirs["size"] > seg.size:
        return f"the replica's entry {k} is not readable at {at}"
    head = dict(dl.ENTRY_HEADER.parse(bytes(seg.buffer()[at - seg.start:at - seg.start + HEADER])))
    if (head["magic"], head["size"], head["index"], head["term"], head["pos"]) != \
            (theirs["magic"], theirs["size"], k, theirs["term"], at):
        return f"the replica's entry {k} does not match its own index unit: it cannot be trusted"
    h = fast.decode_headers(seg.buffer(), np.asarray([at - seg.start + HEADER], np.int64))
    fast.validate(seg.buffer(), h, True, rcl.prop_crc_policy(True))
    if h.reason[0] != fast.R_OK or int(h.totalSize[0]) != theirs["size"] - HEADER:
        return f"the replica's entry {k} is damaged too"
    ours = cl.files.index_units(k, 1)
    mine = {f: int(ours[f][0]) for f in theirs} if len(ours) else None
    if mine != theirs:
        return (f"entry {k}: its header is broken here and our index unit {mine} does not confirm the replica's "
                f"(index, term, pos, size) {theirs}: nothing is copied")
    path, off = _data_path(store, at)
    return Action("copy_range", path, f"entry {k} (term {theirs['term']}) from the replica: its header is broken "
                  "here (DLedger's recovery would end the log at it); our index unit confirms the replica's entry",
                  offset=off, extra={"source": seg.path, "sourceOffset": at - seg.start, "length": theirs["size"],
                                     "entryIndex": k, "term": theirs["term"], "header": True})


def _bytes_after(store, pos: int) -> bool:
    """Non-zero bytes at or after ``pos`` in the data files (entries a cut there would lose)."""
    for seg in store.commitlog.segments.segments:
        if seg.start + seg.size <= pos or not seg.size:
            continue
        u8 = np.frombuffer(seg.buffer(), np.uint8)[max(pos - seg.start, 0):]
        if u8.any():
            return True
    return False


def _replica_copies(store, replica, damaged: list[dict]) -> tuple[list[Action], list[str]]:
    """The replica's bytes for each damaged entry, after checking the replica holds the same entry (index, term,
    pos, size) and that its message parses cleanly; refusals otherwise."""
    rcl = replica.commitlog
    prop, magics = rcl.prop_crc_policy(True), rcl.magics(False)
    want = {d["index"]: d for d in damaged}
    found: dict[int, tuple] = {}
    for ec in walk_entries(rcl.segments.segments):
        c = ec.cols
        lo, hi = int(c["index"][0]), int(c["index"][-1])
        hit = [i for i in want if lo <= i <= hi and i not in found]
        if not hit:
            continue
        h, _ = rcl.messages(ec, True, prop, magics)
        for i in hit:
            j = i - lo
            found[i] = ({k: int(c[k][j]) for k in ("index", "term", "pos", "size")}, int(h.reason[j]), ec.segment, int(c["at"][j]))
    acts, refusals = [], []
    for i, d in sorted(want.items()):
        if i not in found:
            refusals.append(f"entry {i} is not in the replica {replica.root}: it cannot repair it")
            continue
        theirs, reason, seg, at = found[i]
        if any(theirs[k] != d[k] for k in ("index", "term", "pos", "size")):
            refusals.append(f"entry {i}: ours is (index, term, pos, size) = {tuple(d.values())}, the replica's "
                            f"{tuple(theirs.values())}: not the same entry (the replicas diverge); nothing is copied")
            continue
        if reason != fast.R_OK:
            refusals.append(f"entry {i} is damaged in the replica too ({fast.REASON_TEXT.get(reason)})")
            continue
        path, off = _data_path(store, d["pos"])
        acts.append(Action("copy_range", path, f"entry {i} (term {d['term']}) from the replica: its message fails the "
                           "CRC-checked parse here, the replica's is intact", offset=off,
                           extra={"source": seg.path, "sourceOffset": at, "length": d["size"], "entryIndex": i}))
    return acts, refusals


def entry_index_at(store, offset: int) -> int:
    """The index of the entry at ``offset`` (its pos, or its message's offset pos + 48); the end of the log
    gives the next index. Anything else is refused with the message offsets around it."""
    cl = store.commitlog
    walk = EntryWalk()
    for ec in walk_entries(cl.segments.segments, result=walk):
        c = ec.cols
        hit = np.flatnonzero((c["pos"] == offset) | (c["pos"] + HEADER == offset))
        if len(hit):
            return int(c["index"][hit[0]])
    if walk.stop is not None and offset in (walk.stop.offset, walk.stop.offset + HEADER):
        return walk.last_index + 1
    before, after = cl.boundaries_near(offset)
    raise UsageError(f"offset {offset} is not an entry or its message in the DLedger log "
                     f"(messages around it: {before} and {after}); give a message offset or --index")


def _broken(walk: EntryWalk) -> bool:
    """The entries end at something other than zeros or a last blank: a broken header (or bytes that are none)."""
    return walk.stop is not None and walk.stop.kind not in (fast.STOP_ZERO, fast.STOP_BLANK)


def plan_dledger_recovery(store, *, replica=None, cut_damaged: bool = False, truncate_at: int | None = None,
                          findings=None) -> RecoveryPlan:
    """The plan for ``recover`` (``truncate_at`` None) or ``truncate`` (an entry index) on a DLedger store."""
    from ..verify.pipeline import verify_store

    fingerprint = store_fingerprint(store.root)
    if findings is None:
        findings = verify_store(store).findings
    cl = store.commitlog
    state = _LogState(store)
    plan = RecoveryPlan(store.root, store.config.version, not store.abort_exists)
    plan.fingerprint = fingerprint
    acts = plan.actions
    if replica is not None and truncate_at is None:
        if not getattr(replica.commitlog, "is_dledger", False):
            raise UsageError(f"{replica.root} is not a DLedger store: --from-replica needs another replica of the group")
        while _broken(state.walk):  # a broken header: the replica's entry there, if our index unit confirms it
            fix = _replica_entry_at(store, replica, state.walk)
            if isinstance(fix, str):
                plan.refusals.append(fix)
                break
            acts.append(fix)
            nxt = state.walk.stop.offset + fix.extra["length"]
            segs = cl.segments.segments
            i = next(j for j, s in enumerate(segs) if s.start <= nxt - 1 < s.start + s.size)
            i, at = (i + 1, 0) if nxt == segs[i].start + segs[i].size else (i, nxt - segs[i].start)
            state.resume(i, at, fix.extra["entryIndex"], fix.extra["term"])
    # a broken header in a file DLedger's recovery never reads (it starts at the third-last): the broker keeps
    # serving the log; so does the plan (unless --cut-damaged), and it goes on checking after it
    start_file, unseen = recovery_start_file(cl), []
    while (_broken(state.walk) and not cut_damaged and state.walk.stop.segment is not None
           and cl.segments.segments.index(state.walk.stop.segment) < start_file):
        nxt = resume_by_unit(cl, state.walk)
        if nxt is None:
            break
        unseen.append(state.walk.stop.offset)
        state.resume(*nxt)
    if unseen:
        plan.notes.append(f"entry header(s) broken at {', '.join(map(str, unseen))}, in data files DLedger's recovery "
                          f"never reads (it starts at file {start_file}): the broker keeps serving the log as it is. "
                          "Repair: --from-replica OTHER_STORE, or --cut-damaged (cuts the log at the first one)")
    walk = state.walk
    header_copies = [a for a in acts if a.kind == "copy_range" and a.extra.get("header")]
    headers_fixed = bool(header_copies) and not _broken(walk)
    last = walk.last_index
    end = walk.stop.offset if walk.stop else 0
    damaged = [d for d in state.damaged if truncate_at is None or d["index"] < truncate_at]
    cut_at: tuple[int, int] | None = None  # (entry pos, last kept index)
    lost_after = None
    if truncate_at is not None:
        if not walk.entries or not (0 <= truncate_at <= last + 1):
            raise UsageError(f"--index {truncate_at}: the log holds entries "
                             f"{'none' if not walk.entries else f'up to {last}'}")
        if truncate_at <= last:
            head = cl.files.index_units(truncate_at, 1)
            pos = int(head["pos"][0]) if len(head) and int(head["index"][0]) == truncate_at else None
            if pos is None:
                raise UsageError(f"entry {truncate_at} has no index unit to find it by: run recover first")
            cut_at = (pos, truncate_at - 1)
            plan.notes.append(f"truncate at entry {truncate_at} (pos {pos}): entries {truncate_at}..{last} are removed")
    if replica is not None and damaged:
        copies, refusals = _replica_copies(store, replica, damaged)
        acts += copies
        plan.refusals += refusals
        damaged = [d for d in damaged if not any(a.extra.get("entryIndex") == d["index"] for a in copies)]
    if damaged and cut_at is None:
        first = damaged[0]
        lost = last - first["index"] + 1
        offer = (f"cut the log before entry {first['index']} (pos {first['pos']}): loses {lost} entries "
                 f"({first['index']}..{last}), {end - first['pos']} bytes")
        if cut_damaged:
            cut_at = (first["pos"], first["index"] - 1)
            lost_after = offer
        else:
            plan.notes.append(f"the broker keeps and serves {len(damaged)} damaged entr{'y' if len(damaged) == 1 else 'ies'} "
                              f"({', '.join(str(d['index']) for d in damaged[:10])}): DLedger checks headers only. Repair: "
                              f"--from-replica OTHER_STORE copies them from another replica of the group; or --cut-damaged "
                              f"to {offer}")
    if _broken(walk) and cut_at is None:
        if _bytes_after(store, end + 8):
            lost_after = (f"the entries end at {end} ({walk.stop.text()}): DLedger's recovery cuts the log there, "
                          "and every later entry is lost; --from-replica restores the broken entry when our index unit "
                          "confirms the replica's")
        cut_at = (end, last)
    if cut_at is not None:
        why = f"the log is cut at {cut_at[0]} (after entry {cut_at[1]})"
        acts += _cut_actions(store, cut_at[0], cut_at[1], why)
        if lost_after:
            plan.data_loss.append(lost_after)
            plan.keep_valid_after = cut_damaged
        new_last = cut_at[1]
    else:
        new_last = last
        if any(f.code == "DL_INDEX_STALE" for f in findings):
            acts += [a for a in _cut_actions(store, end, last, "index units after the last entry") if
                     os.path.dirname(a.path) == cl.files.index.directory]
    for first, count in state.unit_runs:
        if first > new_last:
            continue
        count = min(count, new_last - first + 1)
        acts.append(Action("rewrite_units", cl.files.index.directory, f"index units {first}..{first + count - 1} differ from "
                           "their entries (DLedger's recovery writes them again)",
                           extra={"first": first, "count": count, "unitFileSize": cl.files.index.file_size,
                                  "dataDir": cl.directory}))
    cp = cl.files.checkpoint()
    if new_last >= 0 or cp is not None:
        committed = cp.get("committedIndex") if cp else None
        floor = dispatched_index(store) if cut_at is None else -1
        want_committed = min(new_last, max(committed if committed is not None else -1, floor))
        want = {"committedIndex": want_committed, "endIndex": new_last}
        if cp is None or any(cp.get(k) != v for k, v in want.items()):
            text = dl.format_properties(want)
            for name in (dl.CHECKPOINT_FILE, dl.CHECKPOINT_FILE + ".bak"):
                acts.append(Action("write_text", os.path.join(cl.files.directory, name),
                                   f"DLedger checkpoint to the log: committedIndex={want_committed} endIndex={new_last}",
                                   extra={"text": text}))
    # a damaged entry the broker keeps serving: its message's store time is not counted by verify, so the
    # checkpoint looks ahead; that is the kept entry, not a derived file to rebuild
    kept_damage = bool(damaged) and cut_at is None
    damage_times = bool(state.damaged) and cut_at is None
    derived = [f for f in findings if f.severity in ("error", "warning") and f.code.startswith(DERIVED_PREFIXES)
               and not (damage_times and f.code.startswith("CP_"))
               and not ((unseen or header_copies) and f.code in UNSEEN_REFS)]
    if cut_at is not None or derived:
        acts.append(Action("rebuild_derived", None, "consume queues and index files follow the repaired log (the "
                           "broker's dispatch over it)", extra={"fromOffset": cut_at[0] + HEADER if cut_at else None}))
        newest = _newest_time(store, cut_at[0] if cut_at else None)
        c = store.checkpoint()
        if newest is not None and c.exists and (c.physicMsgTimestamp > newest or c.logicsMsgTimestamp > newest):
            acts.append(Action("checkpoint", os.path.join(store.root, "checkpoint"), "store times to the log's newest message",
                               extra={"fields": {"physicMsgTimestamp": min(c.physicMsgTimestamp, newest),
                                                 "logicsMsgTimestamp": min(c.logicsMsgTimestamp, newest)},
                                      "indexFromFiles": True}))
    if store.abort_exists:
        acts.append(Action("remove_abort", os.path.join(store.root, "abort"), "a clean shutdown's state", housekeeping=True))
    plan.commitlog = {"dledger": True, "entries": state.entries, "lastIndex": last, "endPos": end,
                      "endReason": walk.stop.text() if walk.stop else None, "damaged": [d["index"] for d in state.damaged],
                      "lastIndexAfter": new_last}
    plan.summary = {"version": store.config.version, "lastExitOK": True, "maxPhyOffset": cut_at[0] if cut_at else end,
                    "minPhyOffset": cl.min_offset, "queues": {}}
    _assess(store, plan, findings, copied={a.extra["entryIndex"] for a in acts if a.kind == "copy_range"},
            cut=cut_at, rebuilt=any(a.kind == "rebuild_derived" for a in acts), kept_damage=kept_damage,
            damage_times=damage_times, headers_fixed=headers_fixed, unseen=set(unseen))
    return plan


def _newest_time(store, before: int | None) -> int | None:
    newest = None
    for chunk in store.commitlog.scan(check_crc=False, stop_at_invalid=False):
        ts, phy = chunk.headers.storeTimestamp, chunk.phy
        if before is not None:
            ts = ts[phy < before]
        if len(ts):
            newest = int(ts.max()) if newest is None else max(newest, int(ts.max()))
    return newest


def _assess(store, plan: RecoveryPlan, findings, *, copied: set, cut, rebuilt: bool, kept_damage: bool,
            damage_times: bool, headers_fixed: bool = False, unseen: set = frozenset()) -> None:
    """Sort verify's findings: fixed by an action, kept on purpose (with why), or left."""
    fixed, kept, left = [], [], []
    cut_index = cut[1] + 1 if cut else None
    for f in findings:
        if f.severity not in ("error", "warning"):
            continue
        code = f.code
        idx = f.extra.get("entryIndex")
        if code in DAMAGE_CODES:
            if idx in copied or (cut_index is not None and idx is not None and idx >= cut_index):
                fixed.append(entry(f, store.root, "repaired"))
            else:
                kept.append(entry(f, store.root, "the broker keeps and serves this entry; repair it with --from-replica "
                                                 "or --cut-damaged"))
        elif code in END_CODES and f.extra.get("pos") in unseen:
            kept.append(entry(f, store.root, "a file DLedger's recovery never reads: the broker keeps serving the log; "
                                             "repair it with --from-replica or --cut-damaged"))
        elif headers_fixed and code in UNSEEN_REFS:
            fixed.append(entry(f, store.root, "the entry holding the message is copied from the replica"))
        elif unseen and code in UNSEEN_REFS:
            kept.append(entry(f, store.root, "points at the message inside an entry whose header is broken, which the "
                                             "broker still serves"))
        elif code in END_CODES:
            if headers_fixed:
                fixed.append(entry(f, store.root, "the broken entry is copied from the replica"))
            else:
                (fixed if cut else left).append(entry(f, store.root, "the log is cut there" if cut else "not repaired"))
        elif code in UNIT_CODES or code in STATE_CODES:
            fixed.append(entry(f, store.root, "rewritten"))
        elif damage_times and code.startswith("CP_"):
            if kept_damage:
                kept.append(entry(f, store.root, "the newest message is in a damaged entry the broker keeps serving"))
            else:
                fixed.append(entry(f, store.root, "the repaired entry's message holds the newest store time"))
        elif code.startswith(DERIVED_PREFIXES):
            (fixed if rebuilt else left).append(entry(f, store.root, "rebuilt" if rebuilt else "not repaired"))
        else:
            left.append(entry(f, store.root, "not repaired by this plan"))
    plan.fixed_findings, plan.kept_findings, plan.left_findings = fixed, kept, left
    plan.assessed = True
