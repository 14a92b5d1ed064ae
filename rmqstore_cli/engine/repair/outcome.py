"""The exit-code contract of the repair commands (recover, truncate, rebuild).

Before anything is applied, ``verify`` runs and every error/warning finding is sorted against
the plan: **fixed** (an action removes it: a file moved into the backup, bytes cut or zeroed,
records re-dispatched, the checkpoint rewritten), **kept** on purpose (the plan leaves it and
says why, e.g. a bad CRC in a commitlog region the broker's recovery never re-reads: recover
keeps the log as the broker will use it), or **left** (damage this plan does not repair; the
applied repair will exit 1). After apply, ``verify`` runs again and :func:`judge` compares:
exit 0 when nothing is left or only the kept findings remain, 1 for anything else (something
the repair should have fixed and did not).

The engine never prints; the commands render ``Outcome.line``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import EXIT_CLEAN, EXIT_FINDINGS
from .probes import file_has_data

SEVERE = ("error", "warning")
# Commitlog findings that describe one record or a region of the log, not how it ends.
CHECKPOINT_CODES = ("CP_MISSING", "CP_SIZE", "CP_PHYSIC_AHEAD", "CP_LOGICS_AHEAD", "CP_INDEX_AHEAD")


def _rel(root: str, path: str | None) -> str | None:
    if not path:
        return None
    return os.path.relpath(os.path.abspath(path), os.path.abspath(root))


def entry(finding, root: str, why: str) -> dict:
    """A finding as the plan lists it (store-relative path, so it matches after apply)."""
    d = finding.as_json() if hasattr(finding, "as_json") else dict(finding)
    d["path"] = _rel(root, d.get("path"))
    d["why"] = why
    return d


def _key(d: dict) -> tuple:
    return d.get("code"), d.get("path"), d.get("offset")


class PlanScope:
    """What a plan's actions touch, to tell which findings they remove."""

    def __init__(self, root: str, plan):
        self.root = os.path.abspath(root)
        self.moved: set[str] = set()
        self.zeroed: dict[str, int] = {}
        self.extended: set[str] = set()
        self.dispatch = None
        self.checkpoint = False
        for a in plan.actions:
            p = _rel(self.root, a.path)
            if a.kind == "move_aside":
                self.moved.add(p)
            elif a.kind == "zero_tail":
                self.zeroed[p] = min(a.offset, self.zeroed.get(p, a.offset))
            elif a.kind == "extend":
                self.extended.add(p)
            elif a.kind == "dispatch":
                self.dispatch = (a.extra["from"], a.extra["to"])
            elif a.kind == "checkpoint":
                self.checkpoint = True
        cl = plan.commitlog or {}
        self.end = cl.get("recoveredEnd", plan.summary.get("maxPhyOffset", 0))
        self.walk_start = cl.get("startOffset") if cl.get("startReason") != "truncate" else None
        self.check_crc = cl.get("checkCRCOnRecover", True)
        self.queue_ends = getattr(plan, "queue_ends", {}) or {}
        self.timer = getattr(plan, "timer_repair", None)

    def _moved(self, rel: str) -> bool:
        parts = rel.split(os.sep)
        return any(os.sep.join(parts[:k]) in self.moved for k in range(1, len(parts) + 1))

    def classify(self, f: dict) -> tuple[str, str]:
        """('fixed' | 'kept' | 'left', why) for one finding (``entry`` form)."""
        code, rel, off = f.get("code"), f.get("path"), f.get("offset")
        if rel and self._moved(rel):
            return "fixed", "its file is moved into the backup"
        if rel and rel in self.zeroed and off is not None and off >= self.zeroed[rel]:
            return "fixed", "bytes from here on are cut (zeroed)"
        if rel and rel in self.extended and code == "SEG_WRONG_SIZE":
            return "fixed", "the file is padded to its full size"
        top = rel.split(os.sep)[0] if rel else None
        if code and code.startswith("TM_"):
            from .timerfix import timer_verdict

            return timer_verdict(self.timer, f)
        if code in CHECKPOINT_CODES:
            if self.checkpoint:
                return "fixed", "the checkpoint is rewritten consistent with the log"
            return "left", "the plan does not rewrite the checkpoint"
        if top == "commitlog":
            return self._commitlog(f)
        if top in ("consumequeue", "consumequeue_ext"):
            return "left", "consume-queue damage this plan does not repair (`rmqstore rebuild consumequeue` does)"
        if top == "index":
            return "left", "index damage this plan does not repair (`rmqstore rebuild index` does)"
        return "left", "not repaired by this plan"

    def _commitlog(self, f: dict) -> tuple[str, str]:
        code = f.get("code")
        phy = f.get("phyOffset")
        if phy is None:
            rel = f.get("path") or ""
            name = os.path.basename(rel)
            phy = (int(name) if name.isdigit() else 0) + (f.get("offset") or 0)
        if code in ("CQ_NOT_DISPATCHED", "LMQ_NOT_DISPATCHED"):
            if phy >= self.end:
                return "fixed", "the record is cut"
            qend = self.queue_ends.get((f.get("topic"), f.get("queueId")))
            if qend is not None and f.get("queueOffset") is not None and f["queueOffset"] < qend:
                return "left", (f"its unit belongs below units the queue keeps (queue end {qend}): the broker's put rules "
                                "cannot fill that hole; not repaired by this plan")
            if self.dispatch and self.dispatch[0] <= phy < self.dispatch[1]:
                return "fixed", "the record is dispatched again"
            return "left", "the plan does not dispatch this record"
        if code == "CL_LOST_TAIL":
            return "fixed", "consume-queue units and index entries past the log end are cut"
        if phy >= self.end:
            return "fixed", f"the log is cut at {self.end}"
        if code.startswith("SEG_"):
            return "left", "segment layout this plan does not repair"
        if self.walk_start is not None and phy < self.walk_start:
            return "kept", (f"before {self.walk_start}, where the broker's recovery starts its walk: the broker never "
                            "re-reads it, so recover keeps the log as the broker will use it (`rmqstore salvage` reads "
                            "around damaged records)")
        if code in ("CL_BODY_CRC", "CL_PROP_CRC") and not self.check_crc:
            return "kept", "checkCRCOnRecover is false: the broker's recovery does not check CRCs, the record stays"
        if self.walk_start is None:
            return "kept", f"before the cut at {self.end}: truncate keeps the records before the cut as they are"
        return "kept", "the broker's recovery does not check this: the record stays in the log"


def assess_plan(store, plan, findings=None, jobs: int = 1) -> None:
    """Fill ``plan.fixed_findings / kept_findings / left_findings`` from a verify of ``store`` now (by ``jobs``
    processes)."""
    if findings is None:
        from ..verify.pipeline import verify_store_jobs

        findings = verify_store_jobs(store, jobs).findings
    scope = PlanScope(store.root, plan)
    plan.fixed_findings, plan.kept_findings, plan.left_findings = [], [], []
    for f in findings:
        if f.severity not in SEVERE:
            continue
        e = entry(f, store.root, "")
        verdict, why = scope.classify(e)
        e["why"] = why
        {"fixed": plan.fixed_findings, "kept": plan.kept_findings, "left": plan.left_findings}[verdict].append(e)
    plan.left_findings += lost_references(store.root, plan, scope)
    plan.assessed = True


def lost_references(root: str, plan, scope: PlanScope) -> list[dict]:
    """Damage the plan's own actions leave behind, though verify cannot see it yet: a short commitlog file
    before the recovered end is padded with zeros (the records after its end are gone, the units and
    entries pointing at them stay, and the file has no BLANK); a data-holding ext file of the wrong size
    is moved out whole (the consume-queue units addressing it cannot be read)."""

    out = []
    for a in plan.actions:
        rel = _rel(root, a.path) or ""
        top = rel.split(os.sep)[0]
        if a.kind == "extend" and top == "commitlog" and os.path.basename(rel).isdigit():
            start, full = int(os.path.basename(rel)), a.extra["size"]
            if start + full > scope.end:
                continue  # the recovery walk reaches into it and cuts there
            if _ends_with_blank(a.path):
                continue  # its data ended before the missing bytes
            size = os.path.getsize(a.path)
            out.append({"code": "LOST_SHORT_FILE", "severity": "error", "path": rel, "offset": size,
                        "phyOffset": start + size,
                        "message": f"commitlog file {os.path.basename(rel)} is {size} bytes: the records after that are gone",
                        "why": "padded with zeros so the broker can start; the consume-queue units and index entries "
                               "that point past its end, and its missing BLANK, are not repaired by this plan"})
        elif (a.kind == "move_aside" and top == "commitlog" and os.path.basename(rel).isdigit()
              and int(os.path.basename(rel)) < scope.end and _kept_before(root, scope, int(os.path.basename(rel)))):
            out.append({"code": "LOST_GAP", "severity": "error", "path": rel, "offset": 0,
                        "phyOffset": int(os.path.basename(rel)),
                        "message": f"commitlog file {os.path.basename(rel)} inside the log is moved out",
                        "why": "moved so the broker can start; the gap it leaves in the log (and any reference into "
                               "it) is not repaired by this plan"})
        elif (a.kind == "move_aside" and top == "consumequeue_ext" and "so the broker can start" in a.why
              and os.path.isfile(a.path) and file_has_data(a.path)):
            out.append({"code": "LOST_EXT_FILE", "severity": "error", "path": rel, "offset": 0,
                        "message": f"ext file {rel} of the wrong size holds units",
                        "why": "moved out whole; the consume-queue units addressing its ext units are not repaired "
                               "by this plan"})
    return out


def _kept_before(root: str, scope: PlanScope, start: int) -> bool:
    """A commitlog file before ``start`` stays: moving ``start`` out leaves a gap (not just a later log start)."""
    d = os.path.join(root, "commitlog")
    return any(n.isdigit() and int(n) < start and os.path.join("commitlog", n) not in scope.moved
               for n in os.listdir(d))


@dataclass
class Outcome:
    """The applied repair's exit code and its one-line verdict."""

    exit_code: int
    line: str
    unexpected: list = field(default_factory=list)  # findings the plan did not name as kept
    kept: list = field(default_factory=list)


def _summary(items: list, n: int = 3) -> str:
    parts = [f"{d.get('code')} {d.get('path') or ''}" + (f"@{d['offset']}" if d.get("offset") is not None else "")
             for d in items[:n]]
    return ", ".join(parts) + (f", … ({len(items) - n} more)" if len(items) > n else "")


def judge(kept_findings: list, root: str, findings, left_findings: list = ()) -> Outcome:
    """Compare verify after apply with what the plan kept on purpose (the contract's exit code)."""
    severe = [entry(f, root, "") for f in findings if f.severity in SEVERE]
    keys = {_key(k) for k in kept_findings}
    # an aggregated finding (count > 1) may start elsewhere once part of it was cut
    agg = {(k.get("code"), k.get("path")) for k in kept_findings if (k.get("count") or 1) > 1}
    kept = [d for d in severe if _key(d) in keys or (d.get("code"), d.get("path")) in agg]
    unexpected = [d for d in severe if not (_key(d) in keys or (d.get("code"), d.get("path")) in agg)]
    if not severe:
        return Outcome(EXIT_CLEAN, "verify after apply: clean")
    if not unexpected:
        return Outcome(EXIT_CLEAN, f"verify after apply: only the {len(kept)} finding(s) the plan kept on purpose remain "
                                   f"({_summary(kept)})", [], kept)
    left = {_key(k) for k in left_findings}
    said = "; the plan named them as not repaired" if all(_key(d) in left for d in unexpected) else ""
    return Outcome(EXIT_FINDINGS, f"verify after apply: {len(unexpected)} finding(s) the repair did not fix "
                                  f"({_summary(unexpected)}){said}", unexpected, kept)


def assess_rebuild(store, parts: list, topic: str | None, findings=None) -> dict:
    """``rebuild``'s side of the contract: findings in the folders it regenerates are fixed, every
    other one is kept on purpose (rebuild never changes the commitlog or the folders it was not
    asked to rebuild). Returns {"fixed": [...], "kept": [...]} in ``entry`` form."""
    if findings is None:
        from ..verify.pipeline import verify_store

        findings = verify_store(store).findings
    return sort_rebuild_findings(store.root, parts, topic, findings)


def sort_rebuild_findings(root: str, parts: list, topic: str | None, findings) -> dict:
    """:func:`assess_rebuild` on findings already at hand: before the rebuild (its plan) or after it (an
    applied rebuild keeps exactly the findings outside what it regenerates; one left inside is not kept)."""
    out: dict = {"fixed": [], "kept": []}
    cq = "consumequeue" in parts
    idx = "index" in parts
    for f in findings:
        if f.severity not in SEVERE:
            continue
        e = entry(f, root, "")
        rel = e.get("path") or ""
        bits = rel.split(os.sep)
        top = bits[0]
        in_topic = topic is None or (len(bits) > 1 and bits[1] == topic) or e.get("topic") == topic
        if top in ("consumequeue", "consumequeue_ext", "batchconsumequeue") and top in parts and in_topic:
            verdict, why = "fixed", f"{top} is regenerated from the commitlog"
        elif top == "index" and idx:
            verdict, why = "fixed", "index is regenerated from the commitlog"
        elif e.get("code") in ("CQ_NOT_DISPATCHED", "LMQ_NOT_DISPATCHED") and cq and in_topic:
            verdict, why = "fixed", "the record is dispatched into the rebuilt consume queue"
        elif e.get("code") == "CL_LOST_TAIL" and cq and idx and topic is None:
            verdict, why = "fixed", "units and entries past the log end are not rebuilt"
        elif e.get("code") in ("CP_LOGICS_AHEAD",) and cq and topic is None:
            verdict, why = "fixed", "logicsMsgTimestamp is set from the rebuilt consume queues"
        elif e.get("code") in ("CP_INDEX_AHEAD",) and idx:
            verdict, why = "fixed", "indexMsgTimestamp is set from the rebuilt index files"
        elif top == "commitlog":
            verdict, why = "kept", "rebuild never changes the commitlog"
        else:
            verdict, why = "kept", f"outside what `rebuild {'/'.join(parts)}` regenerates"
        e["why"] = why
        out[verdict].append(e)
    return out


def _ends_with_blank(path: str) -> bool:
    """Whether a (short) commitlog file's record chain ends in a BLANK: mapped and walked in pieces, never
    read whole (it may be most of a 1 GiB segment)."""
    import mmap

    from rmqstore_cli.formats import fast

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            stop = fast.neighbours(buf, size).walk
            return stop is not None and stop.kind == fast.STOP_BLANK
