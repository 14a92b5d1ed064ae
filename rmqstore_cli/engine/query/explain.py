"""Why a lookup finds nothing: the evidence on disk behind an index query or a msgId (read-only).

An empty ``queryMessage`` answer has a handful of causes that all show in the files: the record
is gone from the commitlog; the index file that held its entries was deleted, cut or never
written (the broker only indexes what dispatch reached, and crash recovery deletes index files
newer than the checkpoint); the query's time range misses the record's store time (the index
filters by the broker's clock, at one-second precision, not the producer's); another key shares
the slot and stored hash (the broker does not filter collisions, its client does, after the
``maxMsgsNumBatch`` cap has counted them); and for an offset msgId, the offset names a record
that has expired or never existed. :func:`explain_key` and :func:`explain_msgid` collect those
facts; the commands render them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from rmqstore_cli.formats.hashing import index_key, index_key_hash
from rmqstore_cli.formats.message import RecordError
from rmqstore_cli.formats.msgid import decode_offset_msgid
from rmqstore_cli.formats.records import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE

from ..errors import UsageError
from ..derived.indexgaps import Gap, gaps_and_scan  # noqa: F401 - Gap is part of this module's answer
from ..derived.index import ENTRY_STRUCT, MAX_MSGS_NUM_BATCH, _overlaps
from .lookup import PROP_KEYS, PROP_UNIQ_KEY, TIME_MAX, _hp, _index_topics, index_health
from ..log.segments import segment_name
from ..store import Store

SLOT_SAMPLE = 12  # records read to name other keys in the slot (the count covers every entry)


@dataclass
class KeyExplanation:
    """Everything on disk that decides what ``queryMessage(topic, key, maxNum, begin, end)`` returns."""

    topics: list
    key: str
    begin: int
    end: int
    cap: int
    key_hashes: dict  # topic -> stored keyHash
    slot: dict  # topic -> slot number
    answer: list  # offsets the broker returns (capped, collisions included), ascending
    hits_in_range: int  # same-hash entries in the range, uncapped
    records: list = field(default_factory=list)  # records carrying the key (dicts)
    collisions: list = field(default_factory=list)
    stale_hits: list = field(default_factory=list)
    slot_entries: int = 0
    slot_other_keys: list = field(default_factory=list)
    index_files: list = field(default_factory=list)
    gaps: list = field(default_factory=list)
    scan: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    reasons: list = field(default_factory=list)

    def as_json(self) -> dict:
        return {
            "type": "explain-key", "topics": self.topics, "key": self.key, "begin": self.begin, "end": self.end,
            "keyHash": self.key_hashes, "slot": self.slot, "brokerCap": self.cap,
            "brokerAnswer": self.answer, "hitsInRange": self.hits_in_range, "capped": self.hits_in_range > self.cap,
            "records": self.records, "collisions": self.collisions, "staleHits": self.stale_hits,
            "slotEntries": self.slot_entries, "slotOtherKeys": self.slot_other_keys,
            "indexFiles": self.index_files, "gaps": [g.as_json() for g in self.gaps], "scan": self.scan,
            "indexProblems": self.problems, "reasons": self.reasons,
        }


def _record_keys(msg: dict) -> list[str]:
    props = msg.get("properties") or {}
    keys = [k for k in (props.get(PROP_KEYS) or "").split(" ") if k]
    if props.get(PROP_UNIQ_KEY):
        keys.append(props[PROP_UNIQ_KEY])
    return keys


def _carries(msg: dict, topics: list, key: str, uniq_only: bool) -> bool:
    if msg.get("topic") not in topics:
        return False
    props = msg.get("properties") or {}
    if props.get(PROP_UNIQ_KEY) == key:
        return True
    return not uniq_only and key in (props.get(PROP_KEYS) or "").split(" ")


def _chain(f, key_hash: int):
    """Every entry of the slot chain of ``key_hash`` in one index file, newest first, by the
    broker's chain rules (§10.5) but without the time filter: (entry number, hash, offset, index time)."""
    h = f.header()
    count = h.indexCount if h.indexCount > 0 else 1
    buf = f.segment.buffer()
    (v,) = struct.unpack_from(">i", buf, INDEX_HEADER_SIZE + (key_hash % f.slots) * INDEX_SLOT_SIZE)
    if v <= 0 or v > count or count <= 1:
        return
    base = INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE
    n, seen = v, 0
    while n < f.entries and seen <= f.entries:
        hsh, phy, diff, prev = ENTRY_STRUCT.unpack_from(buf, base + n * INDEX_ENTRY_SIZE)
        if diff < 0:
            return
        yield n, hsh, phy, h.beginTimestamp + diff * 1000
        if prev <= 0 or prev > count or prev == n:
            return
        n, seen = prev, seen + 1


def _read(store: Store, phy: int, cache: dict):
    if phy not in cache:
        try:
            msg = store.commitlog.read(phy, with_body=False)
            cache[phy] = msg if msg.get("commitLogOffset") == phy else None
        except (RecordError, ValueError):
            cache[phy] = None
    return cache[phy]


def _where(store: Store, phy: int) -> str:
    if phy < store.commitlog.min_offset:
        return f"below the commitlog minimum {store.commitlog.min_offset} (expired, its file was deleted)"
    if store.commitlog.segments.find(phy) is None:
        return "past the last commitlog file"
    return "not the start of a record (past the end of data, or a cut log)"


def _file_row(f, begin: int, end: int, visited: bool) -> dict:
    h = f.header()
    return {"name": f.name, "complete": f.complete, "beginTimestamp": h.beginTimestamp,
            "endTimestamp": h.endTimestamp, "beginPhyOffset": h.beginPhyOffset, "endPhyOffset": h.endPhyOffset,
            "indexCount": h.indexCount, "matchesRange": f.complete and _overlaps(begin, end, h.beginTimestamp,
                                                                                 h.endTimestamp),
            "visitedByBroker": visited}


def _broker_visits(files, begin: int, end: int, cap: int, hits_per_file: dict) -> set:
    """The files IndexService.queryOffset reads, newest first, with its stop rules."""
    seen, got = set(), 0
    for f in reversed(files):
        if not f.complete:
            continue
        h = f.header()
        if _overlaps(begin, end, h.beginTimestamp, h.endTimestamp):
            seen.add(f.name)
            got += hits_per_file.get(f.name, 0)
        if h.beginTimestamp < begin or got >= cap:
            break
    return seen


def explain_key(store: Store, topic: str | None, key: str, begin: int = 0, end: int = TIME_MAX,
                max_num: int | None = None, *, uniq_only: bool = False, progress=None) -> KeyExplanation:
    """Why ``index query --topic topic --key key`` answers what it does. ``topic`` None (a UNIQ_KEY
    looked up by ``get``) tries every topic the index can hold it under. ``progress(n, total=None)``
    is called once with the bytes to scan as ``total``, then with the bytes walked."""
    if begin > end:
        raise UsageError("begin is after end")
    topics = [topic] if topic is not None else _index_topics(store)
    cap = min(max_num, MAX_MSGS_NUM_BATCH) if max_num else MAX_MSGS_NUM_BATCH
    svc = store.index
    files = [f for f in svc.files if f.complete]
    ex = KeyExplanation(topics, key, begin, end, cap, {}, {}, [], 0)
    ex.problems = index_health(store, begin, end).problems
    cache: dict = {}
    found: dict[int, dict] = {}
    hits_per_file: dict = {}
    other_keys: dict = {}
    answer: set = set()
    for t in topics:
        kh = index_key_hash(index_key(t, key))
        ex.key_hashes[t], ex.slot[t] = kh, kh % store.config.maxHashSlotNum
        answer.update(svc.query(t, key, cap, begin, end, cap=True))
        for f in files:
            for n, hsh, phy, t_index in _chain(f, kh):
                ex.slot_entries += 1
                if hsh != kh:
                    if len(other_keys) < SLOT_SAMPLE and phy not in other_keys:
                        msg = _read(store, phy, cache)
                        if msg is not None:
                            other_keys[phy] = [f"{msg['topic']}#{k}" for k in _record_keys(msg)
                                               if index_key_hash(index_key(msg["topic"], k)) % f.slots == ex.slot[t]]
                    continue
                if begin <= t_index <= end:
                    ex.hits_in_range += 1
                    hits_per_file[f.name] = hits_per_file.get(f.name, 0) + 1
                msg = _read(store, phy, cache)
                if msg is None:
                    ex.stale_hits.append({"offset": phy, "indexFile": f.name, "entry": n, "why": _where(store, phy)})
                elif _carries(msg, [t], key, uniq_only):
                    found.setdefault(phy, _found(msg, "index", f.name, t_index))
                else:
                    same = [f"{msg['topic']}#{k}" for k in _record_keys(msg)
                            if index_key_hash(index_key(msg["topic"], k)) == kh]
                    ex.collisions.append({"offset": phy, "indexFile": f.name, "topic": msg["topic"],
                                          "otherKeys": same or _record_keys(msg), "indexTimestamp": t_index,
                                          "inRange": begin <= t_index <= end})
    ex.answer = sorted(answer)
    ex.slot_other_keys = sorted({k for ks in other_keys.values() for k in ks})
    visits = _broker_visits(svc.files, begin, end, cap, hits_per_file)
    ex.index_files = [_file_row(f, begin, end, f.name in visits) for f in svc.files]
    gaps_and_scan(store, ex, topics, key, uniq_only, found, progress, _carries, _found)
    for phy, rec in sorted(found.items()):
        rec["inRange"] = begin <= rec["storeTimestamp"] <= end
        rec["bornInRange"] = begin <= rec["bornTimestamp"] <= end
        rec["inBrokerAnswer"] = phy in answer
        rec["gap"] = next((k for k, g in enumerate(ex.gaps) if g.first_offset <= phy <= g.last_offset), None)
        ex.records.append(rec)
    ex.reasons = _reasons(store, ex)
    return ex


def _found(msg: dict, by: str, index_file: str | None, index_time: int | None) -> dict:
    props = msg.get("properties") or {}
    return {"offset": msg["commitLogOffset"], "topic": msg["topic"], "queueId": msg["queueId"],
            "queueOffset": msg["queueOffset"], "storeTimestamp": msg["storeTimestamp"],
            "bornTimestamp": msg["bornTimestamp"], "storeMinusBornMs": msg["storeTimestamp"] - msg["bornTimestamp"],
            "keys": props.get(PROP_KEYS), "uniqKey": props.get(PROP_UNIQ_KEY), "msgId": msg.get("msgId"),
            "foundBy": by, "indexFile": index_file, "indexTimestamp": index_time}


def _ts(ms: int) -> str:
    from datetime import datetime

    try:
        return datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _causes(ex: KeyExplanation, r: dict) -> list[str]:
    """Why one record carrying the key is missing from the broker's answer (same text for the same cause)."""
    causes = []
    if r["gap"] is not None:
        g = ex.gaps[r["gap"]]
        causes.append(f"not indexed: no index file covers offsets {g.first_offset}..{g.last_offset} (store times "
                      f"{g.first_timestamp}..{g.last_timestamp}; {g.why})")
    if not r["inRange"]:
        clock = ""
        if r["bornInRange"]:
            clock = ("; the born time (the producer's clock) is inside the range, but the query filters by the "
                     "broker's store time, and the two clocks differ (store - born above)")
        causes.append(f"the store time is outside the query's range [{ex.begin}, {ex.end}]{clock}")
    elif r["indexTimestamp"] is not None and not (ex.begin <= r["indexTimestamp"] <= ex.end):
        causes.append(f"indexed at {r['indexTimestamp']}: index entries keep store time in whole seconds after the "
                      f"file's begin time, and the query compares that rounded-down time with the range")
    if not causes and r["foundBy"] == "index":
        causes.append(f"beyond the broker's result cap: {ex.hits_in_range} index hits in the range (collisions "
                      f"included) and the broker returns the newest {ex.cap} (maxMsgsNumBatch default "
                      f"{MAX_MSGS_NUM_BATCH})")
    if not causes:
        causes.append("found by the scan although an index file covers its offset: the index lacks its entry "
                      "(damaged or partly re-written index)")
    return causes


def _reasons(store: Store, ex: KeyExplanation) -> list[str]:
    out = []
    recs = ex.records
    if not recs:
        scanned = "the whole commitlog" if any(g.kind == "no-index" for g in ex.gaps) or not ex.index_files \
            else "the index chains and every commitlog range no index file covers"
        out.append(f"no record in the commitlog [{store.commitlog.min_offset}, end) carries key {ex.key!r} "
                   f"under {'/'.join(ex.topics) if len(ex.topics) < 4 else 'any topic'} (searched {scanned}); "
                   f"it expired, was never stored under this topic, or the key is spelled differently")
    answered = [r["offset"] for r in recs if r["inBrokerAnswer"]]
    if answered:
        shown = ", ".join(map(str, answered[:8])) + (" ..." if len(answered) > 8 else "")
        out.append(f"{len(answered)} record{'s' if len(answered) > 1 else ''} carrying the key "
                   f"{'are' if len(answered) > 1 else 'is'} in the broker's answer (offsets {shown})")
    groups: dict = {}
    for r in recs:
        if not r["inBrokerAnswer"]:
            groups.setdefault(tuple(_causes(ex, r)), []).append(r)
    for causes, rs in groups.items():
        if len(rs) == 1:
            r = rs[0]
            who = (f"the record at offset {r['offset']} (store time {r['storeTimestamp']} = {_ts(r['storeTimestamp'])}, "
                   f"born {r['bornTimestamp']}, store - born = {r['storeMinusBornMs']} ms) is")
        else:
            offs = ", ".join(str(r["offset"]) for r in rs[:8]) + (" ..." if len(rs) > 8 else "")
            st = [r["storeTimestamp"] for r in rs]
            skew = [r["storeMinusBornMs"] for r in rs]
            who = (f"{len(rs)} records carrying the key (offsets {offs}; store times {min(st)}..{max(st)}, "
                   f"store - born {min(skew)}..{max(skew)} ms) are")
        out.append(f"{who} not in the broker's answer: " + "; and ".join(causes))
    matching = [f["name"] for f in ex.index_files if f["matchesRange"]]
    if not matching:
        out.append(f"no index file's time span overlaps the query range [{ex.begin}, {ex.end}]"
                   + (f" (index files span {ex.index_files[0]['beginTimestamp']}..{ex.index_files[-1]['endTimestamp']})"
                      if ex.index_files else " (there are no index files)"))
    if ex.hits_in_range > ex.cap:
        out.append(f"the slot holds {ex.hits_in_range} entries with this key's hash in the range: more than the "
                   f"broker's cap {ex.cap} (maxMsgsNumBatch default {MAX_MSGS_NUM_BATCH}); older hits are not returned")
    if ex.collisions:
        names = sorted({k for c in ex.collisions for k in c["otherKeys"]})
        one = len(ex.collisions) == 1
        out.append(f"{len(ex.collisions)} index entr{'y' if one else 'ies'} with the same slot and "
                   f"stored hash belong{'s' if one else ''} to other keys ({', '.join(names[:8])}): the broker returns "
                   f"{'it' if one else 'them'}, its client drops {'it' if one else 'them'}; "
                   f"{'it counts' if one else 'they count'} against the cap")
    if ex.stale_hits:
        out.append(f"{len(ex.stale_hits)} index entr{'y' if len(ex.stale_hits) == 1 else 'ies'} for this hash point "
                   f"to no record ({ex.stale_hits[0]['why']})")
    for g in ex.gaps:
        if not any(r["gap"] is not None and ex.gaps[r["gap"]] is g for r in recs):
            overlap = g.first_timestamp <= ex.end and g.last_timestamp >= ex.begin
            out.append(f"{'the query range overlaps ' if overlap else ''}{g.records} indexable records at offsets "
                       f"{g.first_offset}..{g.last_offset} (store times {g.first_timestamp}..{g.last_timestamp}) "
                       f"have no index file: {g.why}")
    for p in ex.problems:
        out.append(f"index: {p}")
    return out


# --- msgId ---------------------------------------------------------------------------------


def explain_msgid(store: Store, msg_id: str) -> dict:
    """What an offset msgId decodes to, and what the commitlog holds there."""
    try:
        mid = decode_offset_msgid(msg_id)
    except ValueError as e:
        raise UsageError(f"{msg_id!r} is not an offset msgId: {e}") from None
    cl = store.commitlog
    segs = cl.segments.segments
    min_off = cl.min_offset
    last_end = segs[-1].start + segs[-1].size if segs else 0
    out = {"type": "explain-msgid", "msgId": msg_id, "storeHost": _hp(mid.host, mid.port), "offset": mid.offset,
           "commitlogMinOffset": min_off, "commitlogFilesEnd": last_end, "record": None}
    if not segs:
        out.update(status="no-commitlog", why="the store has no commitlog files")
        return out
    if mid.offset < min_off:
        size = store.config.mappedFileSizeCommitLog
        gone = segment_name(mid.offset - mid.offset % size) if size > 0 else "?"
        out.update(status="expired", expiredFile=gone,
                   why=f"offset {mid.offset} is below the commitlog's minimum offset {min_off}: the file that held it "
                       f"({gone}) was deleted (expired by fileReservedTime, or removed)")
        return out
    seg = cl.segments.find(mid.offset)
    if seg is None:
        out.update(status="past-end", why=f"offset {mid.offset} is past the last commitlog file (ends at {last_end})")
        return out
    from rmqstore_cli.formats import fast

    # the records around the offset only, walked piecewise (a 1 GiB segment holds millions)
    if getattr(cl, "is_dledger", False):  # the messages inside the entries (DLedger: entry pos + 48)
        b, a = cl.boundaries_near(mid.offset)
        n = fast.Neighbours(None if b is None else b - seg.start, None if a is None else a - seg.start, None)
    else:
        n = fast.neighbours(seg.buffer(), mid.offset - seg.start, seg.size)
    out["segment"] = seg.name
    if n.walk is not None:  # the walk ended before passing the offset: where the data ends matters
        data_end = seg.start + n.walk.stop
        if mid.offset >= data_end and n.walk.kind != fast.STOP_BLANK and seg is segs[-1]:
            out.update(status="past-end", dataEnd=data_end,
                       why=f"offset {mid.offset} is past the end of written data ({data_end}): the record was never "
                           f"stored here, or was cut by a recovery")
            return out
    before = None if n.before is None else seg.start + n.before
    if before != mid.offset:
        after = None if n.after is None else seg.start + n.after
        out.update(status="not-a-record", nearestBefore=before, nearestAfter=after,
                   why=f"offset {mid.offset} is not at a record boundary (nearest record starts: {before} and {after})"
                       f": the msgId belongs to another store or another life of this one")
        return out
    try:
        msg = cl.read(mid.offset, with_body=False)
    except (RecordError, ValueError) as e:
        out.update(status="damaged-record", why=f"a record starts at {mid.offset} but cannot be decoded ({e})")
        return out
    rec = _found(msg, "offset", None, None)
    sh = msg["storeHost"]
    out["record"] = rec
    if sh["ipHex"] != mid.ip.hex() or sh["port"] != mid.port:
        out.update(status="host-mismatch", recordStoreHost=_hp(sh["ip"], sh["port"]),
                   why=f"a record starts at {mid.offset} but was stored by {_hp(sh['ip'], sh['port'])}, not "
                       f"{_hp(mid.host, mid.port)}: the msgId comes from another broker")
    else:
        out.update(status="found", why=f"the record at {mid.offset} is in the commitlog (topic {msg['topic']}, "
                                       f"store time {msg['storeTimestamp']})")
    return out
