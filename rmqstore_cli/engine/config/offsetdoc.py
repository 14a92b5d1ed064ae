"""``consumerOffset.json`` laid out as the broker's ``ConsumerOffsetManager.persist`` writes it (FORMAT.md §15).

fastjson serialises the manager bean: its properties in alphabetical order (4.9.3: ``offsetTable``;
5.3.3: ``dataVersion``, ``groupTopicMap``, ``offsetTable``), each map in the iteration order of the
broker's own map. ``offsetTable`` is a ``ConcurrentHashMap`` of ``topic@group`` to a
``ConcurrentHashMap`` of queue id to offset: made with capacity 512 (per key: 32) when the broker
built it by commits, or fastjson's default-size maps (filled in file order) when it loaded the file.
``groupTopicMap`` (5.x) is not stored state but a getter: a ``HashMap(128)`` of group to a
``HashSet(8)`` of topics, made by iterating ``offsetTable``'s keys; fastjson writes a ``Set`` on one line.
Checked byte for byte against ``../shared/stores/config-samples`` (both versions).
"""

from __future__ import annotations

from rmqstore_cli.formats.fastjson import JavaSet
from rmqstore_cli.formats.java_concurrent_map import concurrent_hashmap_order
from rmqstore_cli.formats.java_hashmap import hashmap_order

from rmqstore_cli.formats.fastjson import as_long

OFFSET_TABLE_CAPACITY = 512  # new ConcurrentHashMap<>(512) in ConsumerOffsetManager
QUEUE_MAP_CAPACITY = 32  # new ConcurrentHashMap<>(32) in commitOffset, per topic@group
GROUP_MAP_CAPACITY = 128  # getGroupTopicMap: new HashMap<>(128)
TOPIC_SET_CAPACITY = 8  # ... and new HashSet<>(8) per group


def _java_split_at(key: str) -> list[str]:
    """``key.split("@")`` as Java does it (trailing empty strings dropped)."""
    parts = key.split("@")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def group_topic_map(table_keys: list[str]) -> dict:
    """``getGroupTopicMap()`` over the table's keys in their iteration order."""
    groups: dict[str, list[str]] = {}
    for key in table_keys:
        parts = _java_split_at(key)
        if len(parts) == 2:
            groups.setdefault(parts[1], []).append(parts[0])
    return {g: JavaSet(hashmap_order(groups[g], TOPIC_SET_CAPACITY))
            for g in hashmap_order(list(groups), GROUP_MAP_CAPACITY)}


def broker_consumer_offsets(value: dict, loaded: dict | None, *, keep_order: bool = False) -> dict:
    """The document the broker would persist with ``value``'s table (and ``dataVersion``; its presence makes
    it the 5.x layout). ``loaded``: the ``offsetTable`` the broker loaded from the file it started with (None:
    no file, the table was built by commits), whose keys keep their places in front of new ones.
    ``keep_order``: the entries stay in the order given (a copy the broker wrote, put back as it was)."""
    table = value.get("offsetTable") if isinstance(value.get("offsetTable"), dict) else {}
    loaded = loaded if isinstance(loaded, dict) else None
    if keep_order:
        loaded = table
    keys = list(loaded or ()) + [k for k in table if not loaded or k not in loaded]
    keys = [k for k in keys if k in table]
    order = keys if keep_order else concurrent_hashmap_order(keys, None if loaded is not None else OFFSET_TABLE_CAPACITY)
    out_table = {}
    for k in order:
        queues = table[k] if isinstance(table[k], dict) else {}
        ints = {as_long(q): as_long(o) for q, o in queues.items() if as_long(q) is not None and as_long(o) is not None}
        old = loaded.get(k) if loaded is not None and isinstance(loaded.get(k), dict) else None
        first = [as_long(q) for q in old if as_long(q) in ints] if old is not None else []
        qkeys = list(dict.fromkeys(first + list(ints)))
        qorder = qkeys if keep_order else concurrent_hashmap_order(qkeys, None if old is not None else QUEUE_MAP_CAPACITY)
        out_table[k] = {q: ints[q] for q in qorder}
    if "dataVersion" not in value:
        return {"offsetTable": out_table}
    return {"dataVersion": value["dataVersion"], "groupTopicMap": group_topic_map(order), "offsetTable": out_table}
