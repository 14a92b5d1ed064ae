"""Finding messages: by key through the index, by offset / msgId / UNIQ_KEY / queue position.

Mirrors the read side of the broker's DefaultMessageStore.queryMessage (index query, then the
answer sorted by physical offset) and lookMessageByOffset / getMessage (consume queue unit ->
commitlog record). The engine returns records and problems; it never prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from rmqstore_cli.formats.message import RecordError
from rmqstore_cli.formats.msgid import decode_offset_msgid

from ..derived.consumequeue import is_filler
from ..errors import NotFoundError, StoreCorruptError, UsageError
from ..derived.batchcq import batch_fields
from ..derived.lmq import DISPATCH_PROP, OFFSET_PROP, MultiDispatchRule
from ..store import Store

TIME_MAX = (1 << 63) - 1
PROP_KEYS = "KEYS"
PROP_UNIQ_KEY = "UNIQ_KEY"
# Topics a UNIQ_KEY can be indexed under besides the consume-queue topics (redirected records).
SYSTEM_INDEX_TOPICS = ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC")


def parse_time(text: str | int | None, default: int) -> int:
    """Epoch milliseconds, or ISO-8601 (naive = local time zone, like the broker's clock)."""
    if text is None or text == "":
        return default
    if isinstance(text, int):
        return text
    s = str(text).strip()
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00") if s.endswith("Z") else s)
    except ValueError:
        raise UsageError(f"time {s!r} is neither epoch milliseconds nor ISO-8601") from None
    if dt.tzinfo is None:
        dt = dt.astimezone()  # local time zone
    return int(dt.timestamp() * 1000)


def carries_key(msg: dict, topic: str, key: str) -> bool:
    """Does the record really hold ``key`` (a KEYS token or its UNIQ_KEY) under ``topic`` (§10.3)?"""
    if msg.get("topic") != topic:
        return False
    props = msg.get("properties") or {}
    if props.get(PROP_UNIQ_KEY) == key:
        return True
    return key in (props.get(PROP_KEYS) or "").split(" ")


@dataclass
class IndexHealth:
    """Why an index answer may be incomplete for a time range (empty list: trustworthy)."""

    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def index_health(store: Store, begin: int = 0, end: int = TIME_MAX) -> IndexHealth:
    svc = store.index
    out = IndexHealth()
    if not store.config.messageIndexEnable:
        out.problems.append("messageIndexEnable is false: the broker keeps no index")
    if not svc.files:
        out.problems.append(f"no index files in {svc.directory}")
        return out
    for p in svc.problems:
        if p.code == "IDX_WRONG_SIZE":
            out.problems.append(p.message + " (skipped by the query)")
    cfg = store.config
    for f in svc.files:
        if not f.complete:
            continue
        h = f.header()
        if h.indexCount > cfg.maxIndexNum or h.indexCount < 0 or h.hashSlotCount < 0 or h.hashSlotCount > cfg.maxHashSlotNum:
            out.problems.append(f"index file {f.name} header is inconsistent (indexCount {h.indexCount}, "
                                f"hashSlotCount {h.hashSlotCount})")
        elif h.indexCount > 1 and h.beginTimestamp > h.endTimestamp:
            out.problems.append(f"index file {f.name} begins after it ends ({h.beginTimestamp} > {h.endTimestamp})")
    return out


@dataclass
class QueryAnswer:
    """One ``index query``: the broker's answer and, unless raw, the records that really match."""

    topic: str
    key: str
    begin: int
    end: int
    max_num: int | None
    offsets: list[int]  # the broker's answer: queryOffset results sorted ascending (queryMessage)
    newest_first: list[int]  # IndexService.queryOffset order, before queryMessage sorts
    matches: list[dict]  # records carrying the key (empty when raw)
    collisions: list[int]  # offsets whose record does not carry the key
    unreadable: list[int]  # offsets outside the commitlog / not a record
    health: IndexHealth
    source: str = "index"  # or "scan"


def query_index(store: Store, topic: str, key: str, begin: int = 0, end: int = TIME_MAX,
                max_num: int | None = None, raw: bool = False, with_body: bool = False) -> QueryAnswer:
    """DefaultMessageStore.queryMessage without the 64 cap (unless ``max_num``)."""
    limit = max_num if max_num is not None else (1 << 62)
    if limit <= 0:
        raise UsageError("--max must be positive")
    newest_first = store.index.query(topic, key, limit, begin, end, cap=False)
    health = index_health(store, begin, end)
    matches, collisions, unreadable, answer = [], [], [], []
    for phy in sorted(newest_first):
        try:
            msg = store.commitlog.read(phy, with_body=with_body and not raw)
        except (RecordError, ValueError):
            # getData finds no mapped file / a broken record: the broker drops the offset.
            unreadable.append(phy)
            if store.commitlog.segments.find(phy) is not None:
                answer.append(phy)
            continue
        answer.append(phy)
        msg["offset"] = phy
        if raw or (matches and matches[-1]["offset"] == phy):
            continue  # one record per offset: a key listed twice gives the broker two entries
        if carries_key(msg, topic, key):
            matches.append(msg)
        else:
            collisions.append(phy)
    return QueryAnswer(topic, key, begin, end, max_num, answer, newest_first, matches, collisions, unreadable, health)


def scan_for_key(store: Store, topic: str, key: str, begin: int = 0, end: int = TIME_MAX,
                 max_num: int | None = None, with_body: bool = False) -> list[dict]:
    """Commitlog walk filtered by key: the fallback when the index cannot be trusted."""
    needle = key.encode("utf-8")
    out: list[dict] = []
    for chunk in store.commitlog.scan(check_crc=False):
        h = chunk.headers
        buf = chunk.buf
        base = chunk.segment.start
        ts = h.storeTimestamp
        in_time = (ts >= begin) & (ts <= end)
        for i in in_time.nonzero()[0].tolist():
            ps, pl = int(h.propsStart[i]), int(h.propsLength[i])
            if pl <= 0 or bytes(buf[ps:ps + pl]).find(needle) < 0:
                continue  # cheap byte test before decoding the record
            msg = store.commitlog.read(base + int(h.offsets[i]), with_body=with_body)
            msg["offset"] = base + int(h.offsets[i])
            if carries_key(msg, topic, key):
                out.append(msg)
                if max_num is not None and len(out) >= max_num:
                    return out
    return out


# --- get -----------------------------------------------------------------------------------


def get_by_offset(store: Store, phy: int, with_body: bool = True) -> dict:
    seg = store.commitlog.segments.find(phy)
    if seg is None:
        raise NotFoundError(f"offset {phy} is outside every commitlog file "
                            f"(min offset {store.commitlog.min_offset})")
    try:
        msg = store.commitlog.read(phy, with_body=with_body)
    except RecordError as e:
        before, after = store.commitlog.boundaries_near(phy)
        near = f"; nearest record boundaries: {before} and {after}" if before is not None or after is not None else ""
        raise NotFoundError(f"no message record at offset {phy}: {e}{near}") from None
    if msg["commitLogOffset"] != phy:
        before, after = store.commitlog.boundaries_near(phy)
        if before != phy:
            raise NotFoundError(f"no message record starts at offset {phy} (nearest boundaries: {before} and {after})")
    msg["offset"] = phy
    return msg


def get_by_msgid(store: Store, msg_id: str, with_body: bool = True) -> dict:
    try:
        mid = decode_offset_msgid(msg_id)
    except ValueError as e:
        raise UsageError(f"{msg_id!r} is not an offset msgId: {e}") from None
    msg = get_by_offset(store, mid.offset, with_body)
    sh = msg["storeHost"]
    if sh["ipHex"] != mid.ip.hex() or sh["port"] != mid.port:
        raise NotFoundError(f"msgId {msg_id} names store host {_hp(mid.host, mid.port)} but the record at offset "
                            f"{mid.offset} was stored by {_hp(sh['ip'], sh['port'])}")
    return msg


def get_by_uniq_key(store: Store, uniq_key: str, topic: str | None = None, with_body: bool = True,
                    allow_scan: bool = True) -> tuple[list[dict], str]:
    """Records whose UNIQ_KEY is ``uniq_key`` (a half message and its commit share one). -> (records, source)."""
    topics = [topic] if topic else _index_topics(store)
    found: dict[int, dict] = {}
    if store.index.files:
        for t in topics:
            for phy in store.index.query(t, uniq_key, 1 << 62, 0, TIME_MAX, cap=False):
                if phy in found:
                    continue
                try:
                    msg = store.commitlog.read(phy, with_body=with_body)
                except (RecordError, ValueError):
                    continue
                if (msg.get("properties") or {}).get(PROP_UNIQ_KEY) == uniq_key:
                    msg["offset"] = phy
                    found[phy] = msg
    if found:
        return [found[k] for k in sorted(found)], "index"
    if not allow_scan:
        return [], "index"
    out = []
    needle = uniq_key.encode("ascii", "replace")
    for chunk in store.commitlog.scan(check_crc=False):
        h, buf, base = chunk.headers, chunk.buf, chunk.segment.start
        for i in range(len(h)):
            ps, pl = int(h.propsStart[i]), int(h.propsLength[i])
            if pl <= 0 or bytes(buf[ps:ps + pl]).find(needle) < 0:
                continue
            phy = base + int(h.offsets[i])
            msg = store.commitlog.read(phy, with_body=with_body)
            if (msg.get("properties") or {}).get(PROP_UNIQ_KEY) == uniq_key and (topic is None or msg["topic"] == topic):
                msg["offset"] = phy
                out.append(msg)
    return out, "scan"


def get_by_queue(store: Store, topic: str, queue_id: int, queue_offset: int, with_body: bool = True) -> dict:
    """Consume queue unit -> record, checking the unit against the record (§7)."""
    if queue_offset < 0:
        raise UsageError("--queue-offset must be >= 0")
    if (topic, queue_id) in store.batch_queues():
        return _get_by_batch_queue(store, topic, queue_id, queue_offset, with_body)
    cq = store.queue(topic, queue_id)
    if store.rocksdb is not None:
        unit = _rocksdb_unit(store, cq, topic, queue_id, queue_offset)
    else:
        if not cq.segments.segments:
            raise NotFoundError(f"no consume queue {topic}/{queue_id} in {store.root}")
        unit = cq.unit_at(queue_offset)
    if unit is None:
        raise NotFoundError(f"queue offset {queue_offset} is outside the files of consume queue {topic}/{queue_id}")
    phy, size, tags = unit
    if is_filler(phy, size, tags):
        raise NotFoundError(f"queue offset {queue_offset} of {topic}/{queue_id} is pre-blank filler (no message)")
    if phy < 0 or size <= 0:
        raise NotFoundError(f"queue offset {queue_offset} of {topic}/{queue_id} is past the end of the queue")
    try:
        msg = get_by_offset(store, phy, with_body)
    except NotFoundError as e:
        raise StoreCorruptError(f"unit {queue_offset} of {topic}/{queue_id} points to {phy}: {e}") from None
    wrong = []
    if msg["storeSize"] != size:
        wrong.append(f"size {size} != record size {msg['storeSize']}")
    props = msg.get("properties") or {}
    lmq = MultiDispatchRule(store.config).targets(msg["topic"], msg["queueId"], props.get(DISPATCH_PROP),
                                                  props.get(OFFSET_PROP))
    if (topic, queue_id, queue_offset) in lmq:
        msg["multiDispatch"] = True  # a unit of the LMQ queue the record names (§14.3): its topic is its own
    elif msg["topic"] != topic or msg["queueId"] != queue_id:
        wrong.append(f"record belongs to {msg['topic']}/{msg['queueId']}")
    elif msg["queueOffset"] != queue_offset:
        wrong.append(f"record's QUEUEOFFSET is {msg['queueOffset']}")
    if wrong:
        raise StoreCorruptError(f"unit {queue_offset} of {topic}/{queue_id} -> offset {phy} does not match the "
                                f"record: {'; '.join(wrong)}")
    msg["cqUnit"] = {"phyOffset": phy, "size": size, "tagsCode": tags}
    return msg


def _rocksdb_unit(store: Store, cq, topic: str, queue_id: int, queue_offset: int) -> tuple[int, int, int]:
    """The unit the broker serves at ``queue_offset`` of a RocksDB consume queue (RocksDBConsumeQueue#get)."""
    if (topic, queue_id) not in store.queues():
        raise NotFoundError(f"no consume queue {topic}/{queue_id} in the RocksDB consume queue {cq.directory}")
    if queue_offset >= cq.max_offset:
        raise NotFoundError(f"queue offset {queue_offset} of {topic}/{queue_id} is past the end of the queue "
                            f"(max offset {cq.max_offset})")
    unit = cq.unit_at(queue_offset)
    if unit is None:
        raise NotFoundError(f"queue offset {queue_offset} of {topic}/{queue_id} has no unit in the RocksDB consume queue "
                            f"(min offset {cq.min_offset()})")
    return unit


def _index_topics(store: Store) -> list[str]:
    topics = sorted({t for t, _ in store.queues()})
    return topics + [t for t in SYSTEM_INDEX_TOPICS if t not in topics]


def _hp(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _get_by_batch_queue(store: Store, topic: str, queue_id: int, queue_offset: int, with_body: bool) -> dict:
    """Batch consume queue: the unit covering the offset (msgBaseOffset <= offset < msgBaseOffset + batchSize)
    -> its whole record, as the broker's getMessage returns it (messageCount = batchSize, next offset =
    msgBaseOffset + batchSize), the unit checked against the record (§9)."""
    bcq = store.batch_queue(topic, queue_id)
    lo, hi, _ = bcq.bounds()
    unit = bcq.unit_at(queue_offset) if lo <= queue_offset < hi else None
    if unit is None:
        raise NotFoundError(f"queue offset {queue_offset} is outside batch consume queue {topic}/{queue_id} "
                            f"(offsets {lo} .. {hi - 1})" if hi > lo else
                            f"batch consume queue {topic}/{queue_id} holds no unit")
    phy, size = unit["phyOffset"], unit["size"]
    try:
        msg = get_by_offset(store, phy, with_body)
    except NotFoundError as e:
        raise StoreCorruptError(f"the unit of offset {queue_offset} of {topic}/{queue_id} points to {phy}: {e}") from None
    props = msg.get("properties") or {}
    base, count = unit["msgBaseOffset"], unit["batchSize"]
    want_base, want_count = batch_fields(props, msg["queueOffset"])
    wrong = []
    if msg["storeSize"] != size:
        wrong.append(f"size {size} != record size {msg['storeSize']}")
    if msg["topic"] != topic or msg["queueId"] != queue_id:
        wrong.append(f"record belongs to {msg['topic']}/{msg['queueId']}")
    if (base, count) != (want_base, want_count):
        wrong.append(f"unit covers {base} + {count}, the record {want_base} + {want_count}")
    if wrong:
        raise StoreCorruptError(f"the unit of offset {queue_offset} of {topic}/{queue_id} -> offset {phy} does not "
                                f"match the record: {'; '.join(wrong)}")
    msg["bcqUnit"] = unit
    msg["messageCount"] = count
    msg["nextBeginOffset"] = base + count
    return msg
