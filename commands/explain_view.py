"""Rendering of ``--explain`` (index query, get) and of the broker's start-up cost (recover, dump store)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from .output import Output, stderr, stdout

RECORD_COLUMNS = [
    ("offset", "offset"), ("foundBy", "found by"), ("storeTimestamp", "store time"), ("bornTimestamp", "born time"),
    ("inRange", "in range"), ("indexFile", "index file"), ("indexTimestamp", "index time"),
    ("inBrokerAnswer", "answered"), ("gap", "gap"),
]
FILE_COLUMNS = [
    ("name", "index file"), ("beginTimestamp", "begin time"), ("endTimestamp", "end time"),
    ("beginPhyOffset", "begin offset"), ("endPhyOffset", "end offset"), ("indexCount", "entries"),
    ("complete", "complete"), ("matchesRange", "matches range"), ("visitedByBroker", "read by query"),
]
GAP_COLUMNS = [
    ("gap", "gap"), ("kind", "kind"), ("firstOffset", "first offset"), ("lastOffset", "last offset"),
    ("records", "records"), ("firstStoreTimestamp", "first store time"), ("lastStoreTimestamp", "last store time"),
    ("previousIndexFile", "after file"), ("nextIndexFile", "before file"),
]
COLLISION_COLUMNS = [("offset", "offset"), ("indexFile", "index file"), ("otherKeys", "other key"),
                     ("indexTimestamp", "index time"), ("inRange", "in range")]
MAX_FILE_ROWS = 12


@contextmanager
def scan_progress(description: str):
    """A progress callback for the engine's scans: ``cb(n, total=None)`` (a bar only on a terminal)."""
    if not sys.stderr.isatty():
        yield lambda n, total=None: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=stderr, transient=True) as p:
        task = p.add_task(description, total=None)

        def advance(n: int, total: int | None = None) -> None:
            if total is not None:
                p.update(task, total=total)
            p.advance(task, n)

        yield advance


def _say(text: str) -> None:
    stdout.print(text, markup=False, highlight=False, soft_wrap=True)


def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width // 2 - 1] + "…" + text[-(width // 2):]


def print_key_explanation(out: Output, ex) -> None:
    """One screen: the conclusions first, then the evidence they rest on."""
    d = ex.as_json()
    if out.as_json:
        out.line(d)
        return
    topics = "/".join(ex.topics) if len(ex.topics) < 4 else f"{len(ex.topics)} topics"
    _say(f"why: key {ex.key!r} in {topics}, store time [{ex.begin}, {ex.end}]")
    for r in ex.reasons:
        _say(f"  - {r}")
    first = next(iter(d["keyHash"]))
    out.kv({"keyHash (stored)": d["keyHash"][first] if len(d["keyHash"]) == 1 else d["keyHash"],
            "slot": d["slot"][first] if len(d["slot"]) == 1 else d["slot"],
            "broker answer": f"{_n(len(d['brokerAnswer']), 'offset')} (cap {d['brokerCap']}, maxMsgsNumBatch; "
                             f"{_n(d['hitsInRange'], 'same-hash hit')} in range)",
            "entries in the slot": f"{d['slotEntries']} (all keys, all times)",
            "other keys in the slot": ", ".join(_short(k) for k in d["slotOtherKeys"][:3])
                                      + (" ..." if len(d["slotOtherKeys"]) > 3 else ""),
            "commitlog scanned": f"{d['scan'].get('bytes', 0)} bytes in {len(d['scan'].get('ranges', []))} range(s) "
                                 f"no index file covers"},
           title="index evidence")
    if ex.records:
        cols = RECORD_COLUMNS + ([("topic", "topic")] if len(ex.topics) > 1 else [])
        out.table(ex.records, cols, title="records carrying the key")
    if ex.gaps:
        out.table([dict(g.as_json(), gap=k) for k, g in enumerate(ex.gaps)], GAP_COLUMNS,
                  title="commitlog ranges with no index file")
    if ex.collisions:
        out.table([dict(c, otherKeys=", ".join(c["otherKeys"])) for c in ex.collisions], COLLISION_COLUMNS,
                  title="same slot and stored hash, other key")
    files = d["indexFiles"]
    if len(files) > MAX_FILE_ROWS:
        gap_names = {n for g in ex.gaps for n in (g.previous_file, g.next_file)}
        rec_names = {r["indexFile"] for r in ex.records}
        first = {f["name"] for f in files if f["name"] in gap_names or f["name"] in rec_names or not f["complete"]}
        then = [f["name"] for f in files if f["visitedByBroker"] and f["name"] not in first]
        chosen = first | set(then[:max(0, MAX_FILE_ROWS - len(first))])
        shown = [f for f in files if f["name"] in chosen]
        note = f"{len(files) - len(shown)} more index files not shown (--json lists all)"
    else:
        shown, note = files, None
    if shown:
        out.table(shown, FILE_COLUMNS, title="index files (name order)", limit_note=note)
    elif not files:
        _say("  no index files")


def print_msgid_explanation(out: Output, d: dict) -> None:
    if out.as_json:
        out.line(d)
        return
    _say(f"why: msgId {d['msgId']} -> store host {d['storeHost']}, commitlog offset {d['offset']}")
    _say(f"  - {d['status']}: {d['why']}")
    kv = {"commitlog min offset": d["commitlogMinOffset"], "commitlog files end": d["commitlogFilesEnd"]}
    for k in ("expiredFile", "segment", "dataEnd", "nearestBefore", "nearestAfter", "recordStoreHost"):
        if k in d:
            kv[k] = d[k]
    out.kv(kv, title="commitlog")
    if d.get("record"):
        out.table([d["record"]], RECORD_COLUMNS[:5] + [("topic", "topic"), ("keys", "KEYS"), ("uniqKey", "UNIQ_KEY")],
                  title="record at the offset")


def _secs(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.1f} s" if s < 100 else f"{s / 60:.1f} min"


def startup_lines(cost: dict) -> list[str]:
    """The start-up cost as a few lines for the recover plan / dump store screens."""
    if not cost:
        return []
    if "error" in cost:
        return [f"next broker start: cannot be planned: {cost['error']}"]
    lines = [f"next broker start: {cost['mode']} recovery ({cost['modeWhy']})",
             f"  commitlog: from {cost['startFile']} (offset {cost['startOffset']}; {cost['startRule']}) to "
             f"{cost['endOffset']}: {cost['bytesRead']} bytes read"
             + (", every body CRC-checked" if cost["crcChecked"] else " (checkCRCOnRecover=false)")
             + f", {cost['recordsWalked']} records"]
    if cost.get("dispatchBytes"):
        lines.append(f"  re-dispatch: {cost['dispatchRecords']} records ({cost['dispatchBytes']} bytes) into consume "
                     f"queues and index ({cost['dispatchRule']})")
    cq, ix = cost["consumeQueues"], cost["indexFiles"]
    lines.append(f"  loads {cq['files']} consume-queue files ({cq['bytes']} bytes; recovery reads the last three of "
                 f"each queue: {cq['recoveryFiles']} files, {cq['recoveryBytes']} bytes) and {ix['files']} index files "
                 f"({ix['bytes']} bytes{'; ' + str(len(ix['deletedAtStart'])) + ' deleted and re-indexed' if ix['deletedAtStart'] else ''})")
    est = cost["estimate"]
    lines.append(f"  estimate: ~{_secs(est['seconds'])} ({est['how']})")
    if est["scanSeconds"] != est["seconds"]:
        lines.append(f"  the walk alone: ~{_secs(est['scanSeconds'])} at {est['scanRateMBps']:g} MB/s "
                     f"({est['scanRateSource']})")
    return lines


def print_next_start(out: Output, root: str, version: int, before: dict | None, jobs: int = 1) -> None:
    """After an applied repair: what the broker's next start reads now, beside what it would have read."""
    from rmqstore_cli.engine.repair.next_start import next_start_after_repair

    try:
        after = next_start_after_repair(root, version, jobs=jobs)
    except Exception as e:  # noqa: BLE001 - the repair is done; this is information only
        stderr.print(f"rmqstore: could not cost the next start: {e}", markup=False, highlight=False)
        return
    if out.as_json:
        out.line(dict(after, type="next-start", before=before))
        return
    for line in startup_lines(after):
        stderr.print(f"  {line}", markup=False, highlight=False)
    if before and after:
        stderr.print(f"  the next start reads {after['bytesRead']} bytes from {after['startFile']} "
                     f"(~{_secs(after['estimate']['seconds'])}) instead of {before['bytesRead']} bytes from "
                     f"{before['startFile']} (~{_secs(before['estimate']['seconds'])})", markup=False, highlight=False)
