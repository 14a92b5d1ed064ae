"""``config/*.json`` files for copies of the broker-written stores.

The shared stores in ../shared/stores have no broker-written ``config/`` files (the one
``delayOffset.json`` there came from a stand-in JSON library, see ../shared/stores/README.md), so these
files are built here from the format (FORMAT.md §15, checked against ConfigManager / MixAll.string2File
and fastjson 1.2.x's MapSerializer): tabs, a line break before every string key and before the closing
brace of a non-empty object, integer map keys bare and unbroken. They are written as literal text, not
through our writer, so the parser is tested on the layout itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import broker_read

A, B = "OracleTopicA", "oracle_topic-B%x"


def queue_max(name: str) -> dict[tuple[str, int], int]:
    """Every queue's max offset as the broker read it (broker-read.jsonl.gz ``cq`` lines)."""
    return {(c["topic"], c["queueId"]): c["maxOffset"] for c in broker_read(name)["cq"]}


def consumer_offsets_text(name: str, version: int) -> tuple[str, dict]:
    """consumerOffset.json in the broker's layout, and the cases it holds: {case: (group, topic, queue, offset)}."""
    mx = queue_max(name)
    cases = {
        "in_range": ("group_a", A, 2, mx[(A, 2)] // 2),
        "caught_up": ("group_a", A, 1, mx[(A, 1)]),
        "above_max": ("group_a", B, 0, mx[(B, 0)] + 7),
        "zero": ("group_a", A, 3, 0),
        "unknown_topic": ("group_gone", "GoneTopic", 0, 42),
        "unknown_queue": ("group_b", A, 9, 3),
    }
    in0 = mx[(A, 0)] - 5
    a = f'{{0:{in0},1:{cases["caught_up"][3]},2:{cases["in_range"][3]},3:0\n\t\t}}'
    lines = ['{']
    if version >= 5:
        lines += ['\t"dataVersion":{', '\t\t"counter":12,', '\t\t"stateVersion":0,', '\t\t"timestamp":1763777608704', '\t},']
        # getGroupTopicMap(): HashMap(128) by group (bins 52, 92, 95), HashSet(8) topics (bins 0, 4), written inline;
        # "topic@group@broadcast" does not split into two parts and is left out
        lines += ['\t"groupTopicMap":{', '\t\t"group_gone":["GoneTopic"],', f'\t\t"group_a":["{A}","{B}"],',
                  f'\t\t"group_b":["{A}"]', '\t},']
    lines += [
        '\t"offsetTable":{',
        f'\t\t"{A}@group_a":{a},',
        f'\t\t"{B}@group_a":{{0:{cases["above_max"][3]},1:{mx[(B, 1)]}\n\t\t}},',
        '\t\t"GoneTopic@group_gone":{0:42\n\t\t},',
        f'\t\t"{A}@group_b":{{0:0,9:3\n\t\t}}' + (',' if version >= 5 else ''),
    ]
    if version >= 5:  # BroadcastOffsetManager commits under "topic@group@broadcast"
        lines.append(f'\t\t"{A}@group_bc@broadcast":{{0:10\n\t\t}}')
    lines += [
        '\t}',
        '}',
    ]
    return "\n".join(lines), cases


def delay_offsets_text(version: int, level18: int) -> str:
    lines = ['{']
    if version >= 5:
        lines += ['\t"dataVersion":{', '\t\t"counter":3,', '\t\t"stateVersion":0,', '\t\t"timestamp":1763777608704', '\t},']
    lines += ['\t"offsetTable":{1:0,2:0,18:' + str(level18) + '\n\t}', '}']
    return "\n".join(lines)


def topics_text(version: int, topics: dict[str, int]) -> str:
    lines = ['{', '\t"dataVersion":{', '\t\t"counter":5,']
    if version >= 5:
        lines.append('\t\t"stateVersion":0,')
    lines += ['\t\t"timestamp":1763777608704', '\t},', '\t"topicConfigTable":{']
    items = []
    for t, n in topics.items():
        items.append('\n'.join([f'\t\t"{t}":{{', '\t\t\t"order":false,', '\t\t\t"perm":6,', f'\t\t\t"readQueueNums":{n},',
                                '\t\t\t"topicFilterType":"SINGLE_TAG",', f'\t\t\t"topicName":"{t}",',
                                '\t\t\t"topicSysFlag":0,', f'\t\t\t"writeQueueNums":{n}', '\t\t}']))
    lines.append(",\n".join(items))
    lines += ['\t}', '}']
    return "\n".join(lines)


def write_config(root: Path, name: str, version: int, *, with_topics: bool = True) -> dict:
    """Writes config/consumerOffset.json, delayOffset.json and (optionally) topics.json into a store copy."""
    cfg = root / "config"
    cfg.mkdir(exist_ok=True)
    text, cases = consumer_offsets_text(name, version)
    (cfg / "consumerOffset.json").write_text(text)
    mx = queue_max(name)
    (cfg / "delayOffset.json").write_text(delay_offsets_text(version, mx.get(("SCHEDULE_TOPIC_XXXX", 17), 0) + 3))
    if with_topics:
        # every topic on disk but the long one: that one must be reported as missing from topics.json
        topics = {t: 4 for (t, _q) in mx if t not in ("SCHEDULE_TOPIC_XXXX",) and not t.startswith("LongTopic")}
        topics["SCHEDULE_TOPIC_XXXX"] = 18
        (cfg / "topics.json").write_text(topics_text(version, topics))
    return cases


def set_mtime(path: Path, ms: int) -> None:
    os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))
