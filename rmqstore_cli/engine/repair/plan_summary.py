"""The summary of a recovery plan (engine/repair/recovery.Planner): the log's ends and every queue's offsets
as the broker's start leaves them."""

from __future__ import annotations

from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from .batchrecovery import batch_summary
from .probes import first_unit, queue_file_units


def summarize(planner) -> None:
    """The plan's ``summary``: the log's ends and every queue's offsets after recovery."""
    plan = planner.plan
    queues = []
    min_phy = planner.cl_kept[0].start if planner.cl_kept else 0
    for (t, q), (max_off, max_phys, new_min, *_) in sorted(planner.qstate.items()):
        qs = planner.queues.get((t, q))
        min_off = new_min or 0
        if qs is not None and qs.segments:
            arr = queue_file_units(qs.segments[0], qs.file_size)
            hit = first_unit(arr, lambda u: (u["phyOffset"] >= min_phy) & (u["size"] > 0))
            if hit < len(arr):
                min_off = qs.segments[0].start // CQ_UNIT_SIZE + hit
        queues.append({"topic": t, "queueId": q, "minOffset": min_off, "maxOffset": max_off,
                       "maxPhysicOffset": max_phys})
    queues += batch_summary(planner, getattr(planner, "bstate", {}))
    plan.summary = {"type": "recover", "version": "4.9.3" if planner.version < 5 else "5.3.3",
                    "lastExitOK": plan.last_exit_ok, "maxPhyOffset": planner.end if planner.cl_kept else 0,
                    "minPhyOffset": min_phy, "queues": queues}
