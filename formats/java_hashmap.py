"""Java ``HashMap`` iteration order and the broker's property strings (FORMAT.md §3, §2.7, App. A).

Java serialises a message's property map by iterating a ``java.util.HashMap``; the stored string
is therefore in hash-bucket order, and only keys that share a bucket keep their insertion order.
This module emulates that order so that a writer can reproduce broker bytes exactly.

Rule found in the shared broker stores (4.9.3 and 5.3.3, written through ``DefaultMessageStore``):

* every record's map is a default ``HashMap`` (initial capacity 16) for both versions — the
  5.3.3 strings are *not* in the 128-capacity order App. A gives for the 5.x parser map (the
  stored strings come from the message's own default map, not from a re-parsed one);
* within a bucket, insertion order is: ``WAIT``, ``CLUSTER``, user keys, the message-level keys
  (``TRAN_MSG``, ``TAGS``, ``KEYS``, ``UNIQ_KEY``, ``DELAY``, …) and finally the keys the store adds
  when it redirects a message (``REAL_TOPIC``, ``REAL_QID``, …).  Collisions that the data pins
  down at capacity 16: CLUSTER before UNIQ_KEY (bucket 12), WAIT before DELAY (13), the user key
  ``a`` before REAL_TOPIC (1);
* classic batch records (§2.7): ``entry part`` + (``\\x02`` if the entry part does not already end
  with one) + ``batch part``; each part is its own capacity-16 HashMap serialisation, the entry
  part with the client's version convention, the batch part (here only ``CLUSTER``) with the
  broker's.

Empty values: Java writes ``key\\x01`` for an empty-string value but its decoder drops such
entries, so the decoded dict is lossy; reproduce from :func:`parse_properties_lossless` instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rmqstore_cli.formats.hashing import java_hash
from rmqstore_cli.formats.properties import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, serialize_properties

MAXIMUM_CAPACITY = 1 << 30
TREEIFY_THRESHOLD = 8  # a bin holding more than this many nodes is treeified (or the table grown)
MIN_TREEIFY_CAPACITY = 64


def spread_hash(key: str) -> int:
    """``h ^ (h >>> 16)`` with ``h`` = Java ``String.hashCode`` taken as unsigned 32-bit."""
    h = java_hash(key) & 0xFFFFFFFF
    return h ^ (h >> 16)


def table_size_for(initial_capacity: int) -> int:
    """Capacity Java allocates for ``new HashMap(initial_capacity)``: next power of two (min 1)."""
    if initial_capacity < 0:
        raise ValueError("illegal initial capacity")
    cap = 1
    while cap < initial_capacity and cap < MAXIMUM_CAPACITY:
        cap <<= 1
    return cap


class JavaHashMapOrder:
    """Key bookkeeping of a ``java.util.HashMap`` (values are irrelevant to the order).

    Models: lazy table of ``table_size_for(initial_capacity)`` buckets; bucket index
    ``spread_hash(key) & (cap - 1)``; new keys appended to the end of their bucket; re-putting an
    existing key keeps its position; ``remove`` unlinks it (a later put appends it again); resize
    (doubling) when ``size > floor(0.75 * cap)``, each old bucket splitting into a lo list (same
    index) and a hi list (index + old cap) that keep their relative order.

    Treeification is not modelled: it only matters when one bucket would hold more than 8 keys.
    Below ``MIN_TREEIFY_CAPACITY`` Java then grows the table instead, which *is* modelled; at 64
    buckets or more a real tree bin would be built, whose iteration order differs, so that case
    raises ``NotImplementedError`` rather than guessing.  Property maps never get near it.
    """

    def __init__(self, initial_capacity: int = 16) -> None:
        self.capacity = table_size_for(initial_capacity)
        self.buckets: list[list[str]] = [[] for _ in range(self.capacity)]
        self.size = 0

    def _threshold(self) -> int:
        return (self.capacity * 3) // 4

    def _resize(self) -> None:
        old = self.buckets
        old_cap = self.capacity
        new_cap = old_cap << 1
        new: list[list[str]] = [[] for _ in range(new_cap)]
        for j, bucket in enumerate(old):
            for key in bucket:  # split preserving order: lo stays at j, hi moves to j + old_cap
                new[spread_hash(key) & (new_cap - 1)].append(key)
        self.buckets = new
        self.capacity = new_cap

    def put(self, key: str) -> None:
        bucket = self.buckets[spread_hash(key) & (self.capacity - 1)]
        if key in bucket:
            return
        bucket.append(key)
        if len(bucket) > TREEIFY_THRESHOLD:
            if self.capacity < MIN_TREEIFY_CAPACITY:
                self._resize()
            else:
                raise NotImplementedError("HashMap tree bins (more than 8 keys in one bucket) are not emulated")
        self.size += 1
        if self.size > self._threshold():
            self._resize()

    def remove(self, key: str) -> None:
        bucket = self.buckets[spread_hash(key) & (self.capacity - 1)]
        if key in bucket:
            bucket.remove(key)
            self.size -= 1

    def keys(self) -> list[str]:
        return [k for bucket in self.buckets for k in bucket]


def hashmap_order(keys_in_insertion_order: Iterable[str], initial_capacity: int = 16) -> list[str]:
    """Iteration order of a ``HashMap(initial_capacity)`` after putting these keys in this order.

    Duplicates keep their first position (a Java ``put`` of an existing key only replaces the value).
    """
    m = JavaHashMapOrder(initial_capacity)
    for k in keys_in_insertion_order:
        m.put(k)
    return m.keys()


# --------------------------------------------------------------------------------------------------
# Insertion order of the property map (empirical, see module docstring)

#: keys the harness put into the map first, in this order
LEADING_KEYS: tuple[str, ...] = ("WAIT", "CLUSTER")
#: message-level keys set through Message setters / the producer, after user properties
MESSAGE_KEYS: tuple[str, ...] = (
    "TRAN_MSG",
    "PGROUP",
    "TAGS",
    "KEYS",
    "UNIQ_KEY",
    "DELAY",
    "RETRY_TOPIC",
    "RECONSUME_TIME",
    "MAX_RECONSUME_TIMES",
    "ORIGIN_MESSAGE_ID",
    "__transactionId__",
    "TRANSACTION_CHECK_TIMES",
    "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "INNER_MULTI_DISPATCH",
)
#: keys the store adds when it rewrites a message (redirections, multi-dispatch), in this order
STORE_ADDED_KEYS: tuple[str, ...] = (
    "REAL_TOPIC",
    "REAL_QID",
    "TRAN_PREPARED_QUEUE_OFFSET",
    "INNER_MULTI_QUEUE_OFFSET",
)
_KNOWN = frozenset(LEADING_KEYS) | frozenset(MESSAGE_KEYS) | frozenset(STORE_ADDED_KEYS)


def property_insertion_order(keys: Iterable[str]) -> list[str]:
    """The insertion order the stores demand: LEADING_KEYS, then unknown (user) keys in the order
    given, then MESSAGE_KEYS, then STORE_ADDED_KEYS (each known group in its fixed order).

    Only the relative order of keys sharing a bucket matters; the shared stores pin down
    CLUSTER < UNIQ_KEY, WAIT < DELAY and user keys < REAL_TOPIC.  The order among *unknown* keys
    that share a bucket is not recoverable from a dict: pass them in their original order.
    """
    present = list(dict.fromkeys(keys))
    s = set(present)
    out = [k for k in LEADING_KEYS if k in s]
    out += [k for k in present if k not in _KNOWN]
    out += [k for k in MESSAGE_KEYS if k in s]
    out += [k for k in STORE_ADDED_KEYS if k in s]
    return out


def _ordered_pairs(props: Mapping[str, str | None], initial_capacity: int) -> list[tuple[str, str | None]]:
    order = hashmap_order(property_insertion_order(props.keys()), initial_capacity)
    return [(k, props[k]) for k in order]


def broker_properties_string(props: Mapping[str, str | None], version: int, initial_capacity: int = 16) -> str:
    """The stored property string of a single (non-batch) record, from its decoded property dict.

    ``props``: the record's full property map *including empty-valued entries*, e.g.
    ``parse_properties_lossless(propertiesRaw)``.  The Java-decoder dict (``parse_properties``,
    the ``properties`` field of ``broker-read.jsonl``) lacks entries with an empty value, so from
    it the 195 records per store carrying ``a=""`` cannot be reproduced.  Dict order is ignored
    except among unknown keys (see :func:`property_insertion_order`).
    ``version``: broker major version (4 → no final ``\\x02``; 5 → final ``\\x02``).
    ``initial_capacity``: 16 for every record of the shared stores (both versions).
    Entries whose value is ``None`` are skipped, as Java does.
    """
    return serialize_properties(_ordered_pairs(props, initial_capacity), version)


def broker_batch_record_properties(
    entry_props: Mapping[str, str | None],
    batch_props: Mapping[str, str | None],
    version: int,
    entry_version: int | None = None,
    initial_capacity: int = 16,
) -> str:
    """Stored property string of one record of a classic batch (FORMAT.md §2.7).

    ``entry_props``: the entry's own properties (what the producer put in the batch body entry);
    ``batch_props``: the batch-level properties (request properties + ``CLUSTER``; in the shared
    stores exactly ``{"CLUSTER": ...}``), identical for every record of the batch;
    ``version``: broker version (serialises the batch part); ``entry_version``: version of the
    client that serialised the entry (defaults to ``version``; matches the shared stores).
    Result = entry part, then ``\\x02`` if both parts are non-empty and the entry part does not end
    with ``\\x02``, then the batch part.
    """
    ev = version if entry_version is None else entry_version
    entry = serialize_properties(_ordered_pairs(entry_props, initial_capacity), ev)
    batch = serialize_properties(_ordered_pairs(batch_props, initial_capacity), version)
    if entry and batch and not entry.endswith(PROPERTY_SEPARATOR):
        entry += PROPERTY_SEPARATOR
    return entry + batch


DEFAULT_BATCH_KEYS: frozenset[str] = frozenset({"CLUSTER"})


def parse_properties_lossless(raw: str) -> dict[str, str]:
    """Every ``key\\x01value`` entry of a stored property string, *including empty values*.

    The Java decoder (``formats.properties.parse_properties``) drops entries whose value is empty
    (and 1-2 character fragments), but the Java serialiser writes an empty-string value as
    ``key\\x01``.  The shared stores contain such entries (user property ``a`` = ``""``), so a
    writer that must reproduce the stored bytes has to keep them: use this parser.  Segments with
    no ``\\x01`` or an empty key are dropped; a later duplicate key overwrites the value but keeps
    the first position (as a Java ``HashMap.put`` does).
    """
    out: dict[str, str] = {}
    for seg in raw.split(PROPERTY_SEPARATOR):
        k, sep, v = seg.partition(NAME_VALUE_SEPARATOR)
        if sep and k:
            out[k] = v
    return out


def _raw_entries(raw: str) -> list[tuple[str, str]]:
    out = []
    for seg in raw.split(PROPERTY_SEPARATOR):
        k, sep, v = seg.partition(NAME_VALUE_SEPARATOR)
        if sep and k:
            out.append((k, v))
    return out


def split_batch_record_properties(
    raw: str, batch_keys: Iterable[str] = DEFAULT_BATCH_KEYS
) -> tuple[dict[str, str], dict[str, str]]:
    """Split a stored batch record's property string into ``(entry_props, batch_props)``.

    The batch part is the longest run of trailing entries whose keys are all in ``batch_keys``
    (each at most once); everything before it is the entry part.  The shared stores' batch part
    is ``CLUSTER`` only (the default).  An appender that re-appends a decoded classic batch should
    call this on each record's ``propertiesRaw`` (all records of one batch give the same
    ``batch_props``) and then pass both dicts, unchanged, to
    :func:`broker_batch_record_properties` with the target version.  Caveat: if an entry itself
    ends with a key from ``batch_keys``, the split is ambiguous; narrow ``batch_keys``.
    """
    entries = _raw_entries(raw)
    keys = set(batch_keys)
    seen: set[str] = set()
    i = len(entries)
    while i > 0 and entries[i - 1][0] in keys and entries[i - 1][0] not in seen:
        seen.add(entries[i - 1][0])
        i -= 1
    return dict(entries[:i]), dict(entries[i:])


def split_batch_group(
    raws: Sequence[str], batch_keys: Iterable[str] = DEFAULT_BATCH_KEYS
) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Split every record of one classic batch; checks the batch part is common to all records."""
    parts = [split_batch_record_properties(r, batch_keys) for r in raws]
    batch = parts[0][1] if parts else {}
    for _, b in parts:
        if b != batch:
            raise ValueError("records of one batch carry different batch-level properties")
    return [e for e, _ in parts], batch
