"""``recover -j`` / ``truncate -j``: the re-dispatch's workers leave out the consume-queue units the queues hold.

After a crash the consume queues usually hold every unit up to their end already, and a re-dispatch of the
whole log hands every record's unit to ConsumeQueueWriter.put only for it to be skipped (the broker's first test,
§7.5: the record ends at or before the queue's maxPhysicOffset). That test needs no order: a queue's
maxPhysicOffset only grows as units are put, so a unit whose record ends at or before the value the writer starts
from is skipped whatever comes before it. The workers of :func:`.rebuild.parallel_requests` drop those units
from their batches' queue plans (the index entries of the records stay), the main process counts them as
skipped: the files and the counts are those of the dispatch without it, the main process and the pipe carry
only the units that may be written.

The starting values come from the writers this process opens (each recovers its queue from its files), once,
when the first batch arrives; the workers, forked before, read them from shared memory. A batch a worker makes
before they are there goes whole, as without this.
"""

from __future__ import annotations

import multiprocessing
import os

import numpy as np

from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from ..derived.cqplan import QueuePlan
from ..derived.dispatch import Dispatcher


class _PrunedPlan(QueuePlan):
    """A :class:`QueuePlan` without the units its queues already hold; ``skipped``: how many were left out."""

    __slots__ = ("skipped",)


class PruningDispatcher(Dispatcher):
    """The re-dispatch's :class:`Dispatcher` (the broker's ReputMessageService dispatch, CommitLogDispatcherBuildConsumeQueue
    and BuildIndex); in a forked worker, once :meth:`queues_known` has run here, the batches it makes
    (:meth:`requests_from_chunk`) leave out the units their queues already hold."""

    def prepare_pruning(self, start: int, end: int) -> None:
        """Before the workers are forked: the queues whose writers will say where they start (file-based, not a batch
        or ext queue) and the shared memory they say it in. Only batches wholly inside [start, end) are pruned
        (the others are cut here, by the caller)."""
        keys = []
        if not self.config.enableConsumeQueueExt:
            base = os.path.join(self.root, "consumequeue")
            for topic in sorted(os.listdir(base)) if os.path.isdir(base) else ():
                if topic in self.batch_topics or not os.path.isdir(os.path.join(base, topic)):
                    continue
                keys += [(topic, int(q)) for q in sorted(os.listdir(os.path.join(base, topic))) if q.isdigit()]
        ctx = multiprocessing.get_context("fork")
        self._slots = {k: i for i, k in enumerate(keys)}
        self._limits = ctx.RawArray("q", max(1, len(keys)))
        self._ready = ctx.RawValue("b", 0)
        self._range = (start, end)
        self._main = os.getpid()

    def queues_known(self) -> None:
        """Here, before the first batch is dispatched: each queue's writer opened, its maxPhysicOffset shared."""
        if getattr(self, "_ready", None) is None or self._ready.value:
            return
        for key, i in self._slots.items():
            try:
                self._limits[i] = self.queue(*key).max_physic_offset
            except Exception:  # noqa: BLE001 - a queue -j 1 may never open: its units go whole, its error stays -j 1's
                self._limits[i] = -(1 << 62)
        self._ready.value = 1

    def requests_from_chunk(self, chunk):
        b = super().requests_from_chunk(chunk)
        ready = getattr(self, "_ready", None)
        if ready is not None and ready.value and os.getpid() != self._main:
            prune_plan(b, self._slots, self._limits, *self._range)
        return b


def skipped_units(batch) -> int:
    """Units a worker left out of ``batch`` (counted as skipped by the caller)."""
    plan = getattr(batch, "cq_plan", None)
    return plan.skipped if isinstance(plan, _PrunedPlan) else 0


def prune_plan(b, slots: dict, limits, start: int, end: int) -> None:
    """``b.cq_plan`` without the units whose record ends at or before its queue's starting maxPhysicOffset
    (``limits[slots[(topic, queueId)]]``), when ``b`` lies wholly inside [start, end)."""
    p = b.cq_plan
    if p is None or type(p) is not QueuePlan or not len(p.rows) or not slots:
        return
    if int(b.phy.min()) < start or int(b.phy.max()) >= end:
        return
    groups = len(p.tids)
    lim = np.full(groups, -(1 << 62), np.int64)
    names = p.names
    for g, (t, q) in enumerate(zip(p.tids.tolist(), p.qids.tolist())):
        i = slots.get((names[t], int(q)))
        if i is not None:
            lim[g] = limits[i]
    rows = p.rows.astype(np.int64)
    ends = b.phy[rows] + b.size[rows]
    grp = np.repeat(np.arange(groups), np.diff(p.starts))
    keep = ends > lim[grp]
    if keep.all():
        return
    counts = np.bincount(grp[keep], minlength=groups)
    live = counts > 0
    q = _PrunedPlan()
    q.names, q.unsafe, q.last_row = p.names, p.unsafe, p.last_row  # last_row: the checkpoint's store time, as before
    q.rows, q.units = p.rows[keep], p.units[keep]
    q.starts = np.concatenate(([0], np.cumsum(counts[live]))).astype(np.int64)
    q.tids, q.qids = p.tids[live], p.qids[live]
    # a straight group's units end increasing, so those left out are a prefix: what is left is straight too
    q.straight = p.straight[live]
    rows, ends = rows[keep], ends[keep]
    firsts = q.starts[:-1]
    q.first_offset = b.queue_offset[rows[firsts]] * CQ_UNIT_SIZE
    q.first_end = ends[firsts]
    q.last_end = ends[q.starts[1:] - 1] if len(rows) else np.zeros(0, np.int64)
    q.skipped = int(len(keep) - np.count_nonzero(keep))
    b.cq_plan = q
