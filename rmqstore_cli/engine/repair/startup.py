"""What the broker's next start will cost (DefaultMessageStore.load + recover, FORMAT.md §13).

A broker killed during a long abnormal recovery starts over after every kill: the checkpoint it
starts from does not move until recovery finishes. How long that walk is follows from the plan
``engine.recovery`` already builds (which file the broker starts from, where its walk ends, what it
re-dispatches); this module turns it into bytes, files and an estimated time at a stated rate.
Read-only; nothing here re-implements the broker's rules.
"""

from __future__ import annotations

import os

from ..store import Store

MB = 1_000_000
NOTES = "../shared/NOTES-performance.md"
# The Java broker's own measured rates (a warm 240 MB commitlog, 200k x 1 KiB records):
# its recovery walk decodes every record; an abnormal recovery also dispatches each one.
SCAN_RATE_MBPS = {4: (395, f"the 4.9.3 broker's full decode of a warm log, {NOTES}"),
                  5: (223, f"the 5.3.3 broker's full decode of a warm log, {NOTES}")}
DISPATCH_RATE_MBPS = (126, f"the broker's rebuild of consume queues and index (decode + dispatch), {NOTES}")
CQ_RECOVERY_FILES = 3  # §13.2: only the last three files of each queue are read


def _sizes(paths) -> tuple[int, int]:
    n = total = 0
    for p in paths:
        try:
            total += os.path.getsize(p)
            n += 1
        except OSError:
            pass
    return n, total


def startup_cost(store: Store, plan, rate_mbps: float | None = None) -> dict:
    """The next start as the plan predicts it: mode and why, start file and rule, bytes walked
    (and CRC-checked), bytes re-dispatched, files loaded, and a time estimate.

    ``rate_mbps`` overrides the walk rate (MB/s); the default is the broker's measured rate for
    the plan's version. An abnormal start dispatches every record it walks, so that part is
    costed at the broker's measured rebuild rate instead."""
    cl = plan.commitlog
    if not cl:
        return {}
    v = 4 if plan.version < 5 else 5
    start = int(cl.get("startOffset", 0))
    stop = int(cl.get("stopOffset", start))
    walked = max(0, stop - start)
    cp = plan.checkpoint_before or {}
    if plan.last_exit_ok:
        mode, why = "normal", "no abort file: the last run shut down cleanly"
    else:
        mode = "abnormal"
        why = ("the abort file is present: the last run did not shut down cleanly; the start file is picked "
               f"by the checkpoint (physicMsgTimestamp {cp.get('physicMsgTimestamp')}, logicsMsgTimestamp "
               f"{cp.get('logicsMsgTimestamp')}, indexMsgTimestamp {cp.get('indexMsgTimestamp')})")
    d = plan.dispatch or {}
    broker_from = int(d.get("brokerFrom", stop))
    dispatch_bytes = max(0, stop - max(broker_from, start))
    dispatch_records = d.get("records", 0) if dispatch_bytes else 0

    cq_all, cq_recovery = [], []
    for t, q in store.queues():
        segs = [s.path for s in store.queue(t, q).segments]
        cq_all += segs
        cq_recovery += segs[-CQ_RECOVERY_FILES:]
    cq_n, cq_bytes = _sizes(cq_all)
    cqr_n, cqr_bytes = _sizes(cq_recovery)
    ix_n, ix_bytes = _sizes(f.path for f in store.index.files)

    if rate_mbps is not None:
        rate, source = float(rate_mbps), "given rate"
    else:
        rate, source = SCAN_RATE_MBPS[v]
    drate, dsource = DISPATCH_RATE_MBPS
    scan_secs = walked / (rate * MB)
    if not plan.last_exit_ok:
        # one pass: every walked record is decoded, CRC-checked and dispatched (CQ + index)
        secs, how = walked / (drate * MB), f"walk + dispatch at {drate} MB/s ({dsource})"
    elif dispatch_bytes:
        secs = scan_secs + dispatch_bytes / (drate * MB)
        how = f"walk at {rate:g} MB/s ({source}), re-dispatch at {drate} MB/s ({dsource})"
    else:
        secs, how = scan_secs, f"walk at {rate:g} MB/s ({source})"
    return {
        "type": "startup-cost", "version": "4.9.3" if v == 4 else "5.3.3", "mode": mode, "modeWhy": why,
        "abortFile": not plan.last_exit_ok,
        "startFile": cl.get("startFile"), "startOffset": start, "startRule": cl.get("startReason"),
        "endOffset": stop, "bytesRead": walked, "crcChecked": bool(cl.get("checkCRCOnRecover")),
        "bytesCrcChecked": walked if cl.get("checkCRCOnRecover") else 0,
        "recordsWalked": cl.get("walkedRecords", 0),
        "dispatchFrom": broker_from if dispatch_bytes else None, "dispatchBytes": dispatch_bytes,
        "dispatchRecords": dispatch_records, "dispatchRule": d.get("brokerRule"),
        "checkpoint": {k: cp.get(k) for k in ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp",
                                              "minTimestamp", "minTimestampIndex")},
        "consumeQueues": {"files": cq_n, "bytes": cq_bytes, "recoveryFiles": cqr_n, "recoveryBytes": cqr_bytes},
        "indexFiles": {"files": ix_n, "bytes": ix_bytes, "deletedAtStart": list(plan.index_deleted)},
        "estimate": {"seconds": round(secs, 6), "how": how, "scanSeconds": round(scan_secs, 6),
                     "scanRateMBps": rate, "scanRateSource": source,
                     "note": "measured on a warm log; a log not in the page cache is read at the disk's speed"},
    }
