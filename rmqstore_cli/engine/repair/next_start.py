"""What the broker's next start reads once a repair is applied: the repaired store opened afresh and
costed as :mod:`.startup` costs a plan (the recovery plan it is costed on comes from :mod:`.recovery`)."""

from __future__ import annotations

from ..store import Store
from .recovery import plan_recovery
from .startup import startup_cost


def next_start_after_repair(root: str, version: int, rate_mbps: float | None = None, jobs: int = 1) -> dict:
    """Open the repaired store afresh and cost the broker's next start on it; ``jobs`` > 1: the broker's walk (the
    last files of a normal start, CRC checked) by that many processes (recoveryjobs.py), the same cost."""
    st = Store.open(root, overrides={"version": version})
    with st:
        plan = plan_recovery(st, version, broker_only=True, jobs=jobs)  # what the broker reads: its own steps suffice
        return plan.startup_cost if rate_mbps is None else startup_cost(st, plan, rate_mbps)
