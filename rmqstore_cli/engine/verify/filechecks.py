"""``-j``: the record-independent checks of every consume queue and index file, spread over worker processes.

Before the log is walked, each consume queue (``ConsumeQueue``, with its ``ConsumeQueueExt``) and each index
file (``IndexFile``) gets its per-file checks and the routing of its units / entries to the log's windows
(:class:`.windows.QueueWindows`, :class:`.windows.IndexWindows`). Those are independent per queue and per file,
so the ``-j`` workers build them, a share each, before their segments (the same processes: one fork each), and
send the built check objects to this process, which hands every worker all of them. The objects refer to the
store's open files (queues, segments, index files); such references travel as the object's identity — the
workers are forks of this process, which holds the very same objects — never as a copy of a file or mapping.
"""

from __future__ import annotations

import io
import pickle

from rmqstore_cli.formats.records import INDEX_ENTRY_SIZE, INDEX_SLOT_SIZE

from ..log.segments import Segment, SegmentQueue
from .windows import IndexWindows, QueueWindows


MIN_PARALLEL_BYTES = 256 << 20  # below this much to read, forking costs more than sharing the checks saves


class FileChecksPlan:
    """The per-file checks of a ``-j`` verify, to be built by its workers: made in this process before the fork
    (the handles the built checks refer to exist here, so their identities hold in every worker)."""

    def __init__(self, store, items: list, weights: list, registry: dict, windows):
        self.store, self.items, self.weights, self.registry, self.windows = store, items, weights, registry, windows

    @classmethod
    def make(cls, store, keys: list, files: list, windows) -> "FileChecksPlan | None":
        """None when there is too little to share out (the caller builds the checks here)."""
        items = [("q", k) for k in keys] + [("x", f) for f in files]
        weights = [_weight(kind, store.queue(*h) if kind == "q" else h) for kind, h in items]
        if len(items) < 2 or sum(weights) < MIN_PARALLEL_BYTES:
            return None
        ext = store.config.enableConsumeQueueExt
        handles = [store]
        for topic, qid in keys:  # made before the fork, so the workers use (and refer to) these objects
            handles.append(store.queue(topic, qid))
            if ext:
                handles.append(store.ext(topic, qid))
        handles += files
        return cls(store, items, weights, _registry(handles), windows)

    def part(self, k: int, workers: int) -> bytes | None:
        """Worker ``k``'s share of ``workers`` (by size), built and pickled; None when it cannot travel."""
        bins = _balanced(self.weights, workers)
        out = []
        for i in (bins[k] if k < len(bins) else []):
            kind, key = self.items[i]
            found: list = []
            out.append((i, (QueueWindows(self.store, *key, self.windows, found) if kind == "q" else IndexWindows(key, self.windows),
                            found)))
        buf = io.BytesIO()
        try:
            _ByReference(buf, self.registry).dump(out)
        except (pickle.PicklingError, TypeError, AttributeError):  # something not meant to travel
            return None
        return buf.getvalue()

    def load(self, parts: list) -> tuple | None:
        """(queue checks, index-file checks, the findings their construction made in the one-process order) from
        every worker's part, or None if one could not be sent."""
        if any(p is None for p in parts):
            return None
        built = [None] * len(self.items)
        for part in parts:
            for k, got in _FromReference(io.BytesIO(part), self.registry).load():
                built[k] = got
        items = self.items
        queues = [obj for (kind, _), (obj, _) in zip(items, built) if kind == "q"]
        index_files = [obj for (kind, _), (obj, _) in zip(items, built) if kind == "x"]
        findings = [f for (kind, _), (_, found) in zip(items, built) if kind == "q" for f in found]
        return queues, index_files, findings


def _weight(kind: str, h) -> int:
    """Bytes a queue's or index file's checks read: what their time follows (an index file: its slot table and
    the entries its header counts)."""
    if kind == "x":
        return h.slots * INDEX_SLOT_SIZE + max(h.header().indexCount, 0) * INDEX_ENTRY_SIZE
    return sum(s.size for s in h.segments.segments)


def _balanced(weights: list, parts: int) -> list:
    """Item numbers in ``parts`` lists of near-equal total weight (heaviest first, each to the lightest list)."""
    bins: list = [[] for _ in range(max(1, min(parts, len(weights))))]
    totals = [0] * len(bins)
    for k in sorted(range(len(weights)), key=lambda k: -weights[k]):
        b = totals.index(min(totals))
        bins[b].append(k)
        totals[b] += weights[k]
    return [sorted(b) for b in bins]


def _registry(handles: list) -> dict:
    """id -> object of the store's file handles and their segments (what a built check may refer to)."""
    reg: dict = {}

    def add(obj) -> None:
        reg[id(obj)] = obj

    for h in handles:
        add(h)
        for v in vars(h).values():
            if isinstance(v, SegmentQueue):
                add(v)
                add(v.budget)
                for seg in v.segments:
                    add(seg)
            elif isinstance(v, Segment):
                add(v)
                if v.budget is not None:
                    add(v.budget)
    return reg


_ABSENT = object()


class _ByReference(pickle.Pickler):
    """Pickles the registered handles as their identity (valid in the process this one was forked from)."""

    def __init__(self, f, registry: dict):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.registry = registry

    def persistent_id(self, obj):
        return id(obj) if self.registry.get(id(obj), _ABSENT) is obj else None


class _FromReference(pickle.Unpickler):
    def __init__(self, f, registry: dict):
        super().__init__(f)
        self.registry = registry

    def persistent_load(self, pid):
        return self.registry[pid]
