"""Recovery planning for derived files that lie (hooks of recovery.Planner).

After the broker's own steps (§13.2 consume-queue recovery, §13.6/13.7 truncation, §10.6
index deletion) every consume queue, ext queue and index file left is checked against the
records of the recovered log (:mod:`derived`). A queue is cut at its first unit that
disagrees with its record and re-dispatched from the record with that QUEUEOFFSET; units are
only ever written at their record's QUEUEOFFSET, so a queue whose log lacks an offset stops
there (the plan says so) instead of being shifted. An index that disagrees with the log is
rebuilt. For every such queue the plan carries what the broker would leave and what we leave.
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from .derived import QueueVerdict, check_queue, record_table
from .derived_windows import windowed_verdicts
from .extplan import cut_ext
from .indexplan import check_index
from ..arrays import distinct_rows

_REWRITTEN = "belong to rewritten consume-queue units; they are written again by the re-dispatch"


def _queue_units(qs) -> tuple[np.ndarray, int]:
    """The units the broker's recovery keeps for a queue (contiguous files up to qs.end), and
    the queue offset of the first one."""
    from ..derived.consumequeue import CQ_DTYPE
    from .probes import queue_file_units

    parts = []
    first = None
    pos = None
    for seg in qs.segments:
        if seg.start >= qs.end:
            break
        if pos is not None and seg.start != pos:
            break
        arr = queue_file_units(seg, qs.file_size)
        n = min(len(arr), (qs.end - seg.start) // CQ_UNIT_SIZE)
        parts.append(arr[:n])
        if first is None:
            first = seg.start // CQ_UNIT_SIZE
        pos = seg.start + qs.file_size
    if not parts:
        return np.zeros(0, dtype=CQ_DTYPE), qs.end // CQ_UNIT_SIZE
    return np.concatenate(parts), first


def check_derived(planner) -> None:
    """Cut queues at their first lying unit, cut ext behind them, rebuild a lying index; record
    the verdicts for ``_dispatch`` and the plan's ``queueRepairs``."""
    planner.verdicts = {}
    if getattr(planner, "verify_along", False):
        found = _verify_along(planner)
        if not planner.cl_kept:
            return
    else:
        if not planner.cl_kept:
            return
        found = windowed_verdicts(planner)  # one segment at a time while no unit lies
    if found is None:
        _check_queues(planner)
    else:
        for key, (v, b_end, b_maxp) in found.items():
            planner.verdicts[key] = (v, b_end, b_maxp)
            qs = planner.queues.get(key)
            if qs is not None and qs.segments and v.refused:
                _refuse(planner, key, v)
    check_index(planner, planner.record_table)


def _verify_along(planner) -> dict | None:
    """verify of the store as it is now (the plan's assessment needs it) in one walk of the log with the
    windowed derived check: each of verify's window reports is also fed to :class:`WindowedCheck`. Its
    findings go to ``planner.verify_findings``. Verify checks CRCs, the derived check reads records without:
    when a report holds an invalid record before the recovered end, or a unit lies, the derived check walks
    again on its own (``windowed_verdicts``, same answers as ever)."""
    from ..verify.commitlog import iter_windows
    from ..verify.pipeline import verify_store
    from .derived_windows import WindowedCheck

    store = planner.store
    along = getattr(planner, "walk_along", None)
    if along is not None:  # verify ran in the broker's walk of the log (walkalong.py, walkalongjobs.py), feeding the check
        if not planner.cl_kept:
            return None
        return along.check.finish() if along.check_holds() else windowed_verdicts(planner)
    segments = sum(1 for s in store.commitlog.segments.segments if s.start < planner.end)
    if planner.jobs > 1 and segments > 1:
        # -j: verify's workers also run the derived check on each segment they walk (one walk for both, as below);
        # a log of one file is walked in this process (below), not set up for workers and then walked again
        from ..verify.pipeline import verify_store_jobs
        from .derived_windows import FedByVerify

        check = WindowedCheck.start(planner) if planner.cl_kept else None
        fed = FedByVerify(check) if check is not None and len(check.segs) > 1 else None
        planner.verify_findings = verify_store_jobs(store, planner.jobs, extra=fed).findings
        if not planner.cl_kept:
            return None
        found = fed.verdicts() if fed is not None else None
        return found if found is not None else windowed_verdicts(planner)
    check = WindowedCheck.start(planner, grouped=True) if planner.cl_kept else None  # fed by verify in this process

    def reports():
        for rep in iter_windows(store.commitlog):
            if check is not None:
                check.report(rep)
            yield rep

    planner.verify_findings = verify_store(store, reports=reports()).findings
    if not planner.cl_kept:
        return None
    if check is not None and not check.invalid_seen and not check.lied:
        return check.finish()
    return windowed_verdicts(planner)


def _refuse(planner, key, v: QueueVerdict) -> None:
    # Cutting would leave the records after the gap without units; shifting them would give
    # consumers other messages at those offsets: the queue is left as the broker leaves it.
    t, q = key
    planner.plan.notes.append(f"queue {t}/{q}: " + (v.detail + "; " if v.lies else "") + f"{v.refused}; the queue is "
                              "left as the broker leaves it (refused)")
    planner.plan.refused_queues.append({"topic": t, "queueId": q, "reason": v.refused, "firstBadOffset": v.cut_offset,
                                        "code": v.code})


def _check_queues(planner) -> None:
    """Every queue against the whole record table (derived.check_queue)."""
    plan = planner.plan
    table = planner.record_table = record_table(planner.store, planner.end)
    recs = table.recs
    ext_on = planner.cfg.enableConsumeQueueExt
    keys = set(planner.queues)
    c = recs.c
    if len(recs):
        tran = c["sysFlag"] & 0xC
        disp = np.flatnonzero((tran == 0) | (tran == 8))
        pairs = distinct_rows(np.stack([c["topic"][disp].astype(np.int64), c["queueId"][disp].astype(np.int64)], 1))
        for tid, q in pairs.tolist():
            keys.add((recs.topics[tid], int(q)))
        keys |= table.lmq_queues()
    batch = planner.store.batch_topics()
    keys = {k for k in keys if k[0] not in batch or k in planner.queues}  # batch topics: batchrecovery.py
    for key in sorted(keys):
        t, q = key
        qs = planner.queues.get(key)
        ext = planner.exts[key][0] if ext_on and key in planner.exts else None
        if qs is None or not qs.segments:
            _, due = table.queue_entries(t, q)
            start = int(due.min()) if len(due) else 0
            if qs is not None:
                start = max(start, qs.end // CQ_UNIT_SIZE) if qs.end else start
            v = check_queue(table, t, q, np.zeros(0, dtype=[("phyOffset", ">i8"), ("size", ">i4"), ("tagsCode", ">i8")]),
                            start, start, ext)
            if v is not None:
                planner.verdicts[key] = (v, start, -1)
                if ext is not None and v.redispatch_phy is not None and not v.refused:
                    cut_ext(planner, key, 0, _REWRITTEN)  # the queue lost every unit: its ext units are all written again
            continue
        units, first = _queue_units(qs)
        v = check_queue(table, t, q, units, first, qs.max_offset, ext)
        if v is None:
            continue
        planner.verdicts[key] = (v, qs.max_offset, qs.max_physic)
        if v.refused:
            _refuse(planner, key, v)
            continue
        if v.lies:
            plan.notes.append(f"queue {t}/{q}: {v.detail}; the broker's validity test (phyOffset >= 0, size > 0) "
                              f"keeps it; we cut the queue at {v.cut_offset} and re-dispatch from the record with that "
                              f"queue offset" + (f" (at {v.redispatch_phy})" if v.redispatch_phy is not None else
                                                 " (the log holds none: the queue ends there)"))
            planner._cut_queue(qs, v.cut_offset * CQ_UNIT_SIZE, f"unit {v.cut_offset} disagrees with its record")
            qs.end = v.cut_offset * CQ_UNIT_SIZE
            qs.max_physic = v.last_kept_end
        if ext is not None and v.ext_cut is not None and v.redispatch_phy is not None:
            # the ext units of the units re-dispatched are written again, at the same addresses
            cut_ext(planner, key, v.ext_cut, _REWRITTEN)


def dispatch_starts(planner, broker_from: int) -> dict:
    """{(topic, qid): phy} of every queue re-dispatched from below ``broker_from`` (what the broker never rebuilds)."""
    out = {}
    for key, (v, _, _) in getattr(planner, "verdicts", {}).items():
        if v.redispatch_phy is not None and not v.refused and (v.redispatch_phy < broker_from or v.lies):
            out[key] = v.redispatch_phy
    return out


def broker_outcome(planner, key, v: QueueVerdict, broker_end: int, broker_max_physic: int, broker_from: int) -> dict:
    """The broker's put rules (§7.5) from its own reput start on the queue as its recovery leaves it."""
    table = planner.record_table
    c = table.recs.c
    mine, due = table.queue_entries(*key)
    end, maxp = broker_end, broker_max_physic
    right = 0
    for i, qo in zip(mine.tolist(), due.tolist()):
        p = int(table.recs.phy[i])
        if p < broker_from:
            continue
        s = int(c["size"][i])
        if p + s <= maxp or (qo != 0 and qo < end):
            continue
        right += qo == end
        end += 1
        maxp = p + s
    return {"maxOffset": end, "maxPhysicOffset": maxp, "appendedUnits": end - broker_end,
            "appendedAtTheirOffset": right}


def queue_repairs(planner, broker_from: int) -> list:
    """Per queue we repair beyond the broker: both outcomes and the records saved."""
    out = []
    summary = {(q["topic"], q["queueId"]): q for q in planner.plan.summary.get("queues", [])}
    for key, (v, b_end, b_maxp) in sorted(getattr(planner, "verdicts", {}).items()):
        if not v.lies and not (v.redispatch_phy is not None and v.redispatch_phy < broker_from) and not v.refused:
            continue
        broker = broker_outcome(planner, key, v, b_end, b_maxp, broker_from)
        ours = summary.get(key, {})
        ours_max = ours.get("maxOffset", v.contiguous_until)
        # units the broker leaves at or after the cut that name the right record: its own re-dispatch
        # lands at the right offset only while no lying unit shifted it
        broker_right = v.agree_after + broker["appendedAtTheirOffset"]
        if v.lies:
            broker["keepsLyingUnit"] = v.code
        saved = max(0, (ours_max - v.cut_offset) - broker_right)
        out.append({"topic": key[0], "queueId": key[1], "firstBadOffset": v.cut_offset, "code": v.code,
                    "detail": v.detail or f"units from queue offset {v.cut_offset} are missing",
                    "broker": {"minOffset": ours.get("minOffset"), **broker},
                    "ours": {"minOffset": ours.get("minOffset"), "maxOffset": ours_max,
                             "maxPhysicOffset": ours.get("maxPhysicOffset"), "redispatchFrom": v.redispatch_phy},
                    "recordsSaved": saved, "refused": v.refused})
    return out
