"""A DLedger log listed entry by entry (``dump dledger``): DLedgerMmapFileStore.get(index) for every entry,
the blanks at file ends, the index file's units, the checkpoint and currterm. Read-only.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from rmqstore_cli.formats import dledger as dl
from rmqstore_cli.formats import fast

from ..errors import UsageError
from ..log.dledger import EntryWalk, walk_entries

HEADER = dl.ENTRY_HEADER_SIZE


def require_dledger(store) -> None:
    if not getattr(store.commitlog, "is_dledger", False):
        raise UsageError(f"{store.root} is not a DLedger store (no dledger-<selfId>/ beside an empty commitlog/)")


def _topics(buf, h: fast.Headers) -> list[str | None]:
    out = []
    mv = memoryview(buf)
    for ok, start, n in zip((h.reason == fast.R_OK).tolist(), h.topicStart.tolist(), h.topicLength.tolist()):
        out.append(bytes(mv[start:start + n]).decode("utf-8", "replace") if ok and n >= 0 else None)
    return out


def entry_rows(store, *, start_index: int | None = None, limit: int | None = None,
               walk: EntryWalk | None = None) -> Iterator[dict]:
    """One row per entry (header fields and the message inside: offset, size, topic, queue, queue offset,
    whether the broker's CRC-checked parse accepts it) and per blank, in log order."""
    require_dledger(store)
    cl = store.commitlog
    walk = walk if walk is not None else EntryWalk()
    blanks_done = 0
    left = limit
    for ec in walk_entries(cl.segments.segments, result=walk):
        while blanks_done < len(walk.blanks):  # blanks met before this chunk's file
            yield _blank_row(walk.blanks[blanks_done])
            blanks_done += 1
        c = ec.cols
        keep = np.arange(len(ec))
        if start_index is not None:
            keep = keep[c["index"] >= start_index]
        if left is not None:
            keep = keep[:left]
        if not len(keep):
            if left == 0:
                return
            continue
        h = fast.decode_headers(ec.buf, c["at"][keep] + HEADER)
        fast.validate(ec.buf, h, True, cl.prop_crc_policy(True))
        topics = _topics(ec.buf, h)
        base = ec.segment.start
        cols = {k: c[k][keep].tolist() for k in ("index", "term", "pos", "size", "magic", "channel", "chainCrc",
                                                  "bodyCrc", "bodyLength", "at")}
        for j in range(len(keep)):
            r = int(h.reason[j])
            sized = int(h.totalSize[j]) == cols["bodyLength"][j]
            yield {"type": "entry", "index": cols["index"][j], "term": cols["term"][j], "pos": cols["pos"][j],
                   "size": cols["size"][j], "magic": cols["magic"][j], "channel": cols["channel"][j],
                   "chainCrc": cols["chainCrc"][j], "bodyCrc": cols["bodyCrc"][j], "bodyLen": cols["bodyLength"][j],
                   "messageOffset": base + cols["at"][j] + HEADER, "topic": topics[j],
                   "queueId": int(h.queueId[j]), "queueOffset": int(h.queueOffset[j]),
                   "messageSize": int(h.totalSize[j]),
                   "messageOk": r == fast.R_OK and sized,
                   "messageProblem": None if r == fast.R_OK and sized else
                   fast.REASON_TEXT.get(r if r != fast.R_OK else fast.R_ENTRY_SIZE)}
        if left is not None:
            left -= len(keep)
            if left <= 0:
                return
    for b in walk.blanks[blanks_done:]:
        yield _blank_row(b)


def _blank_row(b: tuple[int, int]) -> dict:
    pos, size = b
    return {"type": "blank", "pos": pos, "magic": dl.BLANK_MAGIC, "size": size, "nextEntryPos": pos + size}


def end_row(walk: EntryWalk) -> dict:
    s = walk.stop
    if s is None:  # the listing stopped before the walk ended: nothing is known about the end
        return {"type": "end", "entries": None, "lastIndex": None, "lastTerm": None, "endPos": None, "stop": "limit",
                "why": "the listing stopped at --limit"}
    return {"type": "end", "entries": walk.entries, "lastIndex": walk.last_index, "lastTerm": walk.last_term,
            "endPos": s.offset, "stop": s.kind, "why": s.text()}


def unit_rows(store, *, start_index: int = 0, limit: int | None = None, piece: int = 1 << 16) -> Iterator[dict]:
    """The index file's units from ``start_index`` up to the first all-zero unit (DLedger's write position)."""
    require_dledger(store)
    files = store.commitlog.files
    i = start_index
    left = limit
    while left is None or left > 0:
        n = piece if left is None else min(piece, left)
        u = files.index_units(i, n)
        if not len(u):
            return
        zero = (u["magic"] == 0) & (u["pos"] == 0) & (u["size"] == 0) & (u["index"] == 0) & (u["term"] == 0)
        stop = int(np.flatnonzero(zero)[0]) if zero.any() else len(u)
        for k in range(stop):
            yield {"type": "indexUnit", "unit": i + k, "magic": int(u["magic"][k]), "pos": int(u["pos"][k]),
                   "size": int(u["size"][k]), "index": int(u["index"][k]), "term": int(u["term"][k])}
        if stop < len(u):
            return
        i += len(u)
        if left is not None:
            left -= len(u)


def state_rows(store) -> list[dict]:
    """The DLedger checkpoint and currterm files, and which folder is read."""
    require_dledger(store)
    files = store.commitlog.files
    cp = files.checkpoint()
    ct = files.currterm()
    return [{"type": "dledger", "selfId": files.self_id, "directory": files.directory,
             "dataFileSize": files.data.file_size, "dataFiles": len(files.data.segments),
             "indexFileSize": files.index.file_size, "indexFiles": len(files.index.segments)},
            {"type": "checkpoint", **(cp or {"file": None, "committedIndex": None, "endIndex": None})},
            {"type": "currterm", **(ct or {"currTerm": None, "voteLeader": None})}]
