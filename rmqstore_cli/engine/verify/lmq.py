"""Verify: the multi-dispatch (LMQ) units each record's properties name (FORMAT.md §14.3).

The units of an LMQ queue are checked against their records like every unit (verify/queues.py: a unit
whose record names the queue at that offset agrees). This is the other direction: every
``(name, offset)`` a dispatchable record names must have its unit, unless the queue's files were cleaned
before it (offset below the queue's first file). A missing unit before the consume queues' high-water
mark is never written again by the broker (its re-dispatch starts after that mark): LMQ_NOT_DISPATCHED.
Active when multi-dispatch is on (given, or inferred from %LMQ% queues on disk).
"""

from __future__ import annotations

import numpy as np

from rmqstore_cli.formats.records import TRANSACTION_COMMIT, TRANSACTION_NOT

from ..arrays import queue_key, queue_of_key
from ..derived.lmq import LmqTargets, MultiDispatchRule, window_targets
from .records import ERROR, _Agg


class LmqDispatchCheck:
    """Fed verify's windows in log order (their record tables); findings at :meth:`finish`. Keeps the
    queues' bounds and, per queue, the first missing unit and a count: memory does not grow with the log."""

    def __init__(self, store, high_water: int | None):
        self.store = store
        self.rule = MultiDispatchRule(store.config)
        self.high_water = high_water  # records from here are dispatched by the broker at start
        self.bounds: dict = {}  # (name, qid) -> (min offset, end offset) of the queue on disk (None: no queue)
        self.agg = _Agg()
        self.units_named = 0

    @property
    def active(self) -> bool:
        return self.rule.enabled and MultiDispatchRule.checked(self.store.config)

    def _bounds(self, key):
        got = self.bounds.get(key, False)
        if got is False:
            got = None
            if key in self._on_disk():
                mn, end, _ = self.store.queue(*key).bounds()
                got = (mn, end)
            self.bounds[key] = got
        return got

    def _on_disk(self) -> set:
        if not hasattr(self, "_disk"):
            self._disk = set(self.store.queues())
        return self._disk

    def window(self, recs) -> None:
        if not self.active or not len(recs):
            return
        lt = window_targets(recs)[0]  # MultiDispatchRule(store.config), as self.rule
        if not len(lt):
            return
        tran = recs.c["sysFlag"][lt.row] & 0xC
        ok = (tran == TRANSACTION_NOT) | (tran == TRANSACTION_COMMIT)
        lt = LmqTargets(lt.row[ok], lt.name[ok], lt.queue_id[ok], lt.queue_offset[ok], lt.names)
        self.units_named += len(lt)
        # the queues' bounds per (name, queue id) named here, then every target at once: present (or cleaned before
        # the queue's first file) when its offset is below the queue's end; only the missing ones are looked at
        pair = queue_key(lt.name.astype(np.int64), np.asarray(lt.queue_id, np.int64))
        keys, inv = np.unique(pair, return_inverse=True)
        ends = np.empty(len(keys), np.int64)
        has_queue = np.empty(len(keys), bool)
        for j, key in enumerate(keys.tolist()):
            number, qid = queue_of_key(key)
            b = self._bounds((lt.names[number], qid))
            has_queue[j] = b is not None
            ends[j] = b[1] if b is not None else 0
        missing = ~(has_queue[inv] & (lt.queue_offset < ends[inv]))
        if self.high_water is not None:
            missing &= recs.phy[lt.row] < self.high_water  # from the high-water mark the broker dispatches at start
        for k in np.flatnonzero(missing).tolist():
            row, name, qid, qo = int(lt.row[k]), lt.names[int(lt.name[k])], int(lt.queue_id[k]), int(lt.queue_offset[k])
            b = self._bounds((name, qid))
            phy = int(recs.phy[row])
            path, pos = recs.location(row)
            where = "has no consume queue" if b is None else f"ends at offset {b[1]}"
            self.agg.add((name, qid), "LMQ_NOT_DISPATCHED", ERROR, path, pos,
                         f"record at {phy} multi-dispatches to {name}/{qid} at queue offset {qo}, but that queue {where}; "
                         "the broker will not dispatch it again", topic=name, queueId=qid, queueOffset=qo, phyOffset=phy,
                         rank=qo)

    def take_partial(self):
        """See :meth:`.windows.QueueWindows.take_partial`."""
        got = (self.agg, self.units_named)
        self.agg, self.units_named = _Agg(), 0
        return got if got[0] or got[1] else None

    def merge_partial(self, got) -> None:
        self.agg.merge(got[0])
        self.units_named += got[1]

    def finish(self, findings: list) -> None:
        findings += self.agg.findings()


def after_furthest_unit(phy_max: int | None) -> int | None:
    """The broker re-dispatches records after the furthest unit's (§13.1): the first offset it takes again."""
    return None if phy_max is None else phy_max + 1


def check_lmq_dispatch(store, recs, phy_max: int | None, findings: list) -> None:
    """The whole-log formulation (one record table)."""
    check = LmqDispatchCheck(store, after_furthest_unit(phy_max))
    check.window(recs)
    check.finish(findings)
