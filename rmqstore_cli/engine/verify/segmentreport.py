"""What verify's walk of one commitlog segment reports (:class:`SegmentReport`), how a segment's records are cut into
its windows' reports (:class:`WindowCut`), and a segment's report made again from what an earlier walk of the same
bytes kept (:func:`replayed_windows`) instead of walking it again.

The walk itself is :func:`.commitlog.iter_segment_windows`; both it and the replay feed a :class:`WindowCut`, so a
window's report is the same whichever made it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from .records import _COL_TYPES, _COLS


@dataclass
class SegmentReport:
    """What one commitlog segment holds, read on its own: the records of one of its windows, or of all of it.

    The segment-level fields (findings, invalid, ended_with_blank, stop_*, data_end, unread_*, all_zero,
    records, bytes, blanks, crc_checked) describe the whole segment and are set on its ``last`` report only (a
    window report that is not the last has them empty: its ``records`` are ``len(cols["phy"])``)."""

    index: int  # window number in the log (whole-segment reports: the segment's number)
    path: str
    start: int  # the segment's start
    findings: list = field(default_factory=list)
    cols: dict = field(default_factory=dict)  # name -> numpy column over the segment's valid records
    topics: list = field(default_factory=list)  # topic strings; cols["topic"] holds indexes into it
    key_hashes: object = None  # index key hashes of the records, cols["keyCount"] per record, in order
    invalid: list = field(default_factory=list)  # absolute offsets of records that failed validation
    ended_with_blank: bool = False
    stop_offset: int = 0  # absolute offset where the walk stopped
    stop_kind: str = ""
    data_end: int = 0  # absolute end of the last byte that belongs to a record (valid or not)
    unread_from: int | None = None  # absolute offset from which the rest of the file was not read as records
    unread_reported: bool = False  # a finding already explains the unread rest
    all_zero: bool = False
    records: int = 0
    bytes: int = 0
    blanks: int = 0
    segment: int = -1  # the segment's number
    window_start: int = 0  # absolute start of the window (whole-segment reports: the segment's start)
    last: bool = True  # the segment's last report: carries the segment-level fields
    crc_checked: bool = True  # the walk checked every record's body CRC


# the segment-level fields a replay takes from the earlier walk (records and bytes it counts again from the columns)
_OUTCOME = ("findings", "invalid", "ended_with_blank", "stop_offset", "stop_kind", "data_end", "unread_from",
            "unread_reported", "all_zero", "records", "bytes", "blanks", "crc_checked")


def segment_outcome(rep: SegmentReport) -> dict:
    """The segment-level fields of a segment's last report, copied (the checks that read the report extend its
    lists), to make the report again later (:func:`replayed_windows`)."""
    return {f: copy.deepcopy(getattr(rep, f)) for f in _OUTCOME}


class _Columns:
    """Record columns accumulated chunk by chunk during a segment's walk, cut into windows by offset."""

    def __init__(self):
        self.parts = {c: [] for c in _COLS}
        self.keys: list = []

    def add(self, cols: dict, keys: np.ndarray) -> None:
        for c, v in cols.items():
            self.parts[c].append(v)
        self.keys.append(keys)

    def _joined(self) -> tuple[dict, np.ndarray]:
        cols = {c: (np.concatenate(v) if v else np.zeros(0)).astype(_COL_TYPES[c], copy=False)
                for c, v in self.parts.items()}
        keys = np.concatenate(self.keys).astype(np.int32, copy=False) if self.keys else np.zeros(0, np.int32)
        return cols, keys

    def cut(self, bounds: np.ndarray) -> list[tuple[dict, np.ndarray]]:
        """The records before each of ``bounds`` (absolute offsets, increasing) and after the previous one, one
        piece per bound; the records from the last bound on stay accumulated. Key hashes follow keyCount."""
        cols, keys = self._joined()
        at = np.searchsorted(cols["phy"], bounds, side="left").tolist()
        key_at = np.zeros(len(cols["phy"]) + 1, np.int64)
        np.cumsum(cols["keyCount"], out=key_at[1:])
        pieces, a = [], 0
        for b in at:
            pieces.append(({c: v[a:b] for c, v in cols.items()}, keys[key_at[a]:key_at[b]]))
            a = b
        self.parts = {c: [v[a:].copy()] for c, v in cols.items()}
        self.keys = [keys[key_at[a]:].copy()]
        return pieces

    def take_all(self) -> tuple[dict, np.ndarray]:
        cols, keys = self._joined()
        self.parts = {c: [] for c in _COLS}
        self.keys = []
        return cols, keys


class WindowCut:
    """A segment's records, chunk after chunk in offset order, cut into its windows' reports: a window's report is
    made once the records have passed its end (:meth:`add`), the rest by :meth:`finish`; the segment-level fields
    are gathered on ``rep``, the last window's report."""

    def __init__(self, rep: SegmentReport, seg, i: int, first: int, starts: np.ndarray, interner,
                 progress: Callable[[int], None] | None):
        self.rep, self.seg, self.i, self.first, self.starts = rep, seg, i, first, starts
        self.nw = len(starts)
        self.interner, self.progress = interner, progress
        self.acc = _Columns()
        self.k = 0  # the window being filled
        self.records = 0  # added so far
        self.totals = [0, 0]  # records, bytes in the windows made

    def _window(self, cols: dict, keys: np.ndarray) -> SegmentReport:
        k, starts, seg = self.k, self.starts, self.seg
        last = k == self.nw - 1
        out = self.rep if last else SegmentReport(self.first + k, seg.path, seg.start, segment=self.i,
                                                  window_start=int(starts[k]), last=False)
        out.cols, out.key_hashes, out.topics = cols, keys, self.interner.topics()
        self.totals[0] += len(cols["phy"])
        self.totals[1] += int(cols["size"].sum()) if len(cols["phy"]) else 0
        if self.progress:
            self.progress(int((starts[k + 1] if not last else seg.start + seg.size) - starts[k]))
        self.k += 1
        return out

    def add(self, cols: dict, keys: np.ndarray) -> Iterator[SegmentReport]:
        """A chunk's records (``cols`` by :data:`.records._COLS`, non-empty): the reports of the windows they passed."""
        self.acc.add(cols, keys)
        self.records += len(cols["phy"])
        k, starts = self.k, self.starts
        top = int(cols["phy"][-1])
        if k + 1 < self.nw and top >= starts[k + 1]:
            passed = starts[k + 1:int(np.searchsorted(starts, top, side="right"))]
            for piece, piece_keys in self.acc.cut(passed):
                yield self._window(piece, piece_keys)

    def finish(self) -> Iterator[SegmentReport]:
        """The window the records ended in, the empty ones after it, and last ``rep`` with its records and bytes."""
        cols, keys = self.acc.take_all()
        while self.k < self.nw - 1:
            yield self._window(cols, keys)
            cols, keys = {c: v[:0] for c, v in cols.items()}, keys[:0]
        last = self._window(cols, keys)
        del cols, keys
        self.rep.records, self.rep.bytes = self.totals
        yield last


def replayed_windows(cut: WindowCut, chunks, raws: list, outcome: dict) -> Iterator[SegmentReport]:
    """The segment's window reports made again from an earlier walk of the same bytes: its kept chunks (``chunks``:
    repair/dispatchspill.read_chunk's (columns, key hashes), in log order), the bytes of that walk's topics in id
    order (``raws``) and its segment-level fields (:func:`segment_outcome`). The records' columns are the walk's, so
    the windows hold what a walk would put in them (a segment's columns are kept only without records whose tagsCode
    Java cannot compute: tagsBad is all false)."""
    interner = cut.interner
    for (phy, size, qid, qo, flag, ts, tids, codes, counts), hashes in chunks:
        if not len(phy):
            continue
        interner.learn(raws, int(tids.max()) + 1)
        yield from cut.add({"phy": phy, "size": size, "queueId": qid, "queueOffset": qo, "sysFlag": flag,
                            "storeTimestamp": ts, "topic": tids, "tagsCode": codes,
                            "tagsBad": np.zeros(len(phy), dtype=bool), "keyCount": counts}, hashes)
    for f, v in outcome.items():
        setattr(cut.rep, f, copy.deepcopy(v))
    yield from cut.finish()
