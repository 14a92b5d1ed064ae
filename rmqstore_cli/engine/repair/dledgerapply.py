"""The DLedger actions of a recovery plan (:mod:`.dledgerrepair`), carried out with every overwritten byte
saved to the backup first: an entry's bytes copied from a replica, index units written from their entries,
the DLedger checkpoint, and the consume queues / index files rebuilt from the repaired log."""

from __future__ import annotations

import os

from rmqstore_cli.formats import dledger as dl

from .backup import Backup, fsync_path


def _write(path: str, offset: int, data: bytes, backup: Backup) -> None:
    size = os.path.getsize(path)
    if offset + len(data) > size:
        raise OSError(f"{len(data)} bytes at {offset} run past the end of {path}")
    backup.save_range(path, offset, len(data))
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def apply_dledger_action(a, root: str, config, backup: Backup) -> str:
    rel = os.path.relpath(a.path, root) if a.path else ""
    if a.kind == "copy_range":
        with open(a.extra["source"], "rb") as f:
            f.seek(a.extra["sourceOffset"])
            data = f.read(a.extra["length"])
        if len(data) != a.extra["length"]:
            raise OSError(f"the replica's file {a.extra['source']} is shorter than the entry to copy")
        _write(a.path, a.offset, data, backup)
        return f"copied entry {a.extra['entryIndex']} ({len(data)} bytes) from the replica into {rel}"
    if a.kind == "rewrite_units":
        return _rewrite_units(a, backup)
    if a.kind == "write_text":
        if os.path.exists(a.path):
            backup.save_file(a.path)
        else:
            backup.mark("created", path=os.path.relpath(a.path, root))
        tmp = a.path + ".rmqstore-tmp"
        with open(tmp, "w", encoding="latin-1") as f:
            f.write(a.extra["text"])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, a.path)
        fsync_path(os.path.dirname(a.path), True)
        return f"wrote {rel}: {a.extra['text'].strip().replace(chr(10), ' ')}"
    if a.kind == "rebuild_derived":
        from ..store import Store
        from .rebuild import rebuild

        st = Store.open(root, overrides={k: getattr(config, k) for k in (
            "mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue", "mappedFileSizeConsumeQueueExt",
            "enableConsumeQueueExt", "maxHashSlotNum", "maxIndexNum", "messageIndexEnable", "version", "dLegerSelfId")})
        with st:
            r = rebuild(st, "all", from_offset=a.extra.get("fromOffset"), backup=backup)
        return (f"rebuilt {', '.join(r['rebuilt']) or 'nothing'} from the repaired log ({r['cqUnits']} units, "
                f"{r['indexEntries']} index entries)")
    raise ValueError(a.kind)


def _rewrite_units(a, backup: Backup) -> str:
    """Units [first, first + count) from their entries' headers (read through the units DLedger would use:
    the entry walk of the data files)."""
    from ..log.dledger import walk_entries
    from ..log.segments import SegmentQueue

    first, count, fsize = a.extra["first"], a.extra["count"], a.extra["unitFileSize"]
    data = SegmentQueue(a.extra["dataDir"], _common(a.extra["dataDir"]), "DLedger data")
    written = 0
    try:
        for ec in walk_entries(data.segments):
            c = ec.cols
            lo = int(c["index"][0])
            if lo + len(ec) <= first:
                continue
            if lo >= first + count:
                break
            for j in range(max(first - lo, 0), min(first + count - lo, len(ec))):
                i = lo + j
                unit = dl.encode_index_unit(int(c["magic"][j]), int(c["pos"][j]), int(c["size"][j]), i, int(c["term"][j]))
                at = i * dl.INDEX_UNIT_SIZE
                path = os.path.join(a.path, "%020d" % (at - at % fsize))
                if not os.path.exists(path):
                    backup.mark("created", path=os.path.relpath(path, backup.root))
                    with open(path, "wb") as f:
                        f.truncate(fsize)
                _write(path, at % fsize, unit, backup)
                written += 1
    finally:
        data.close()
    return f"wrote {written} index unit(s) from {first} from their entries"


def _common(directory: str) -> int:
    from ..log.dledger import common_size

    return common_size(directory, 1 << 30)
