"""Two stores of one broker pair, side by side (master and slave, or before and after a repair).

A slave copies the master's commitlog byte for byte (HA replication ships commitlog bytes), so
over the offsets both hold the two logs must be equal, and one may reach further: a *prefix*.
The comparison streams: the valid end of each log comes from the engine's walk, then the bytes
both hold are compared window by window (:mod:`.diffjobs`: ``WINDOW`` bytes at a time, numpy on the
read-only mappings), so memory does not grow with the log. Derived files are per broker (each builds its
own consume queues and index, index files are named by each broker's clock), so they are
compared by what they say: per-queue min/max offsets, index files paired by the first commitlog
offset they cover, checkpoints field by field.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


from rmqstore_cli.formats import fast
from rmqstore_cli.formats.message import RecordError, decode_message

IDENTICAL, PREFIX, DIVERGENT = "identical", "prefix", "divergent"
RECORD_FIELDS = ("offset", "storeSize", "topic", "queueId", "queueOffset", "storeTimestamp", "bornTimestamp",
                 "msgId", "bodyCRC")


@dataclass
class StoreDiff:
    a: str
    b: str
    relation: str = IDENTICAL
    first_divergence: int | None = None  # absolute commitlog offset of the first differing byte
    records: dict = field(default_factory=dict)  # side -> the record holding that byte (or None)
    logs: dict = field(default_factory=dict)  # side -> {minOffset, maxOffset, endKind}
    longer: str | None = None  # "a" / "b": the side that reaches further
    compared_bytes: int = 0
    queues: list = field(default_factory=list)
    index_files: list = field(default_factory=list)
    checkpoints: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    @property
    def differs(self) -> bool:
        return self.relation == DIVERGENT

    def as_json(self) -> dict:
        return {"a": self.a, "b": self.b, "relation": self.relation, "firstDivergentOffset": self.first_divergence,
                "records": self.records, "commitlog": self.logs, "longer": self.longer,
                "comparedBytes": self.compared_bytes, "queues": self.queues, "indexFiles": self.index_files,
                "checkpoints": self.checkpoints, "notes": self.notes}


def diff_stores(a, b, progress=None, jobs: int = 1) -> StoreDiff:
    """Compare two opened :class:`~.store.Store` objects (both read-only); ``jobs`` > 1 spreads the walks, the byte
    comparison and the index digests over that many processes (:mod:`.diffjobs`: the same result)."""
    from . import diffjobs

    d = StoreDiff(a.root, b.root)
    ends = {}
    for side, st in (("a", a), ("b", b)):
        res = diffjobs.find_end(st.commitlog, jobs)
        stop = res.stop
        ends[side] = stop.offset if stop else 0
        d.logs[side] = {"minOffset": st.commitlog.min_offset if st.commitlog.segments.segments else 0,
                        "maxOffset": ends[side], "endKind": stop.kind if stop else None, "records": res.records}
    lo = max(d.logs["a"]["minOffset"], d.logs["b"]["minOffset"])
    hi = min(ends["a"], ends["b"])
    if d.logs["a"]["minOffset"] != d.logs["b"]["minOffset"]:
        d.notes.append("the logs start at different offsets (older files deleted on one side); compared from "
                       f"{lo}")
    first, compared = diffjobs.first_difference(a.commitlog, b.commitlog, lo, hi, progress, jobs)
    d.compared_bytes += compared
    if first is not None:
        d.relation = DIVERGENT
        d.first_divergence = first
        d.records = {"a": _record_at(a.commitlog, first), "b": _record_at(b.commitlog, first)}
    elif ends["a"] != ends["b"]:
        d.relation = PREFIX
    if ends["a"] != ends["b"]:
        d.longer = "a" if ends["a"] > ends["b"] else "b"
    d.queues = _queues(a, b)
    d.index_files = _index_files(a, b, jobs)
    d.checkpoints = {"a": a.checkpoint().as_json(a.config.version), "b": b.checkpoint().as_json(b.config.version)}
    return d


def _record_at(cl, offset: int) -> dict | None:
    """The record whose bytes hold ``offset`` (found by walking its segment), decoded briefly."""
    seg = cl.segments.find(offset)
    if seg is None:
        return None
    buf = seg.buffer()
    # piecewise up to the offset: a 1 GiB segment of small messages holds millions of records
    pos = fast.neighbours(buf, offset - seg.start, seg.size, cl.magics(False)).before
    if pos is None:
        return None
    try:
        msg = decode_message(buf, pos, with_body=False)
    except RecordError as e:
        return {"offset": seg.start + pos, "error": str(e)}
    msg["offset"] = seg.start + pos
    out = {k: msg.get(k) for k in RECORD_FIELDS}
    out["byteInRecord"] = offset - out["offset"]
    return out


def _queues(a, b) -> list[dict]:
    rows = []
    on_disk = {"a": set(a.queues()), "b": set(b.queues())}  # listed once: thousands of queues
    keys = sorted(on_disk["a"] | on_disk["b"])
    for t, q in keys:
        row = {"topic": t, "queueId": q}
        for side, st in (("a", a), ("b", b)):
            if (t, q) in on_disk[side]:
                u = st.queue(t, q).units()
                row[f"{side}Min"], row[f"{side}Max"] = int(u.min_offset), int(u.end_offset)
            else:
                row[f"{side}Min"] = row[f"{side}Max"] = None
        row["same"] = row["aMin"] == row["bMin"] and row["aMax"] == row["bMax"]
        rows.append(row)
    return rows


def _index_files(a, b, jobs: int = 1) -> list[dict]:
    """Index files paired by the first commitlog offset they index (names follow each broker's clock)."""
    from .diffjobs import digests

    def files(st):
        out = {}
        for f in st.index.files:
            h = f.header()
            out.setdefault(h.beginPhyOffset, []).append((f, h))
        return out

    fa, fb = files(a), files(b)
    both = [(f, g) for begin in sorted(set(fa) & set(fb)) for (f, _), (g, _) in zip(fa[begin], fb[begin])]
    digest = digests([f.path for pair in both for f in pair], jobs, _digest)
    rows = []
    for begin in sorted(set(fa) | set(fb)):
        la, lb = fa.get(begin, []), fb.get(begin, [])
        for i in range(max(len(la), len(lb))):
            ea = la[i] if i < len(la) else None
            eb = lb[i] if i < len(lb) else None
            row = {"beginPhyOffset": begin, "aName": ea[0].name if ea else None, "bName": eb[0].name if eb else None}
            for side, e in (("a", ea), ("b", eb)):
                row[f"{side}IndexCount"] = e[1].indexCount if e else None
                row[f"{side}EndPhyOffset"] = e[1].endPhyOffset if e else None
            if ea and eb:
                row["state"] = "same" if digest[ea[0].path] == digest[eb[0].path] else "differs"
            else:
                row["state"] = "only in a" if ea else "only in b"
            rows.append(row)
    return rows


def _digest(index_file) -> str:
    h = hashlib.sha256()
    with open(index_file.path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
