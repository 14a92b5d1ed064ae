"""formats/fastjson.py: the JSON dialect of the broker's config/*.json files (fastjson 1.2.x pretty format).

The texts below are written by hand in the broker's layout (FORMAT.md §15; fastjson's MapSerializer /
JavaBeanSerializer with PrettyFormat: tabs, a line break before every string key and before the closing
brace of a non-empty object, non-string keys bare with no line break), not by the writer under test.
"""

from __future__ import annotations

import json

import pytest

from rmqstore_cli.formats import fastjson

OFFSETS_4 = ('{\n\t"offsetTable":{\n\t\t"%RETRY%group_a@group_a":{0:0\n\t\t},\n'
             '\t\t"TopicTest@group_a":{0:123,1:456,2:250,3:250\n\t\t}\n\t}\n}')
OFFSETS_5 = ('{\n\t"dataVersion":{\n\t\t"counter":7,\n\t\t"stateVersion":0,\n\t\t"timestamp":1700000000000\n\t},\n'
             '\t"offsetTable":{\n\t\t"TopicTest@group_a":{0:123,1:456\n\t\t},\n'
             '\t\t"TopicTest@group_b@clientA":{0:9\n\t\t}\n\t}\n}')
DELAY = '{\n\t"offsetTable":{1:0,2:17,18:4\n\t}\n}'
TOPICS = ('{\n\t"dataVersion":{\n\t\t"counter":2,\n\t\t"timestamp":1700000000000\n\t},\n\t"topicConfigTable":{\n'
          '\t\t"TopicTest":{\n\t\t\t"order":false,\n\t\t\t"perm":6,\n\t\t\t"readQueueNums":4,\n'
          '\t\t\t"topicFilterType":"SINGLE_TAG",\n\t\t\t"topicName":"TopicTest",\n\t\t\t"topicSysFlag":0,\n'
          '\t\t\t"writeQueueNums":4\n\t\t}\n\t}\n}')
EMPTY_TABLE = '{\n\t"offsetTable":{}\n}'
# a bean key is written by the map's serializer at the map's inner indent: its fields one tab deeper
OBJECT_KEYS = ('{\n\t"offsetTable":{{\n\t\t\t"brokerName":"broker-a",\n\t\t\t"queueId":0,\n\t\t\t"topic":"TopicTest"\n\t\t}:12,{\n'
               '\t\t\t"brokerName":"broker-a",\n\t\t\t"queueId":1,\n\t\t\t"topic":"TopicTest"\n\t\t}:7\n\t}\n}')


@pytest.mark.parametrize("text", [OFFSETS_4, OFFSETS_5, DELAY, TOPICS, EMPTY_TABLE, OBJECT_KEYS])
def test_broker_layout_parses_and_writes_back_byte_for_byte(text):
    value = fastjson.loads(text)
    assert fastjson.dumps(value) == text


def test_bare_integer_keys_are_ints_and_standard_json_rejects_the_file():
    with pytest.raises(ValueError):
        json.loads(OFFSETS_4)  # what the broker writes is not standard JSON
    v = fastjson.loads(OFFSETS_4)
    assert v["offsetTable"]["TopicTest@group_a"] == {0: 123, 1: 456, 2: 250, 3: 250}
    assert json.loads(json.dumps(fastjson.to_standard(v)))["offsetTable"]["TopicTest@group_a"]["1"] == 456
    assert fastjson.loads(DELAY)["offsetTable"] == {1: 0, 2: 17, 18: 4}


def test_object_keys():
    v = fastjson.loads(OBJECT_KEYS)
    keys = list(v["offsetTable"])
    assert all(isinstance(k, fastjson.ObjectKey) for k in keys)
    assert [k.value["queueId"] for k in keys] == [0, 1]
    assert list(v["offsetTable"].values()) == [12, 7]
    assert fastjson.to_standard(v)["offsetTable"][keys[0].text] == 12


def test_standard_json_and_the_stand_in_layout_parse_too():
    assert fastjson.loads('{\n  "offsetTable" : { }\n}') == {"offsetTable": {}}
    assert fastjson.loads('{"offsetTable":{"T@g":{"0":5}}}') == {"offsetTable": {"T@g": {"0": 5}}}
    assert fastjson.loads("{'a':'b',c:1,}") == {"a": "b", "c": 1}  # fastjson's lenient reader accepts these


@pytest.mark.parametrize("cut", [1, 10, 30, 45, len(OFFSETS_4) - 1])
def test_cut_off_text_fails_with_its_position(cut):
    text = OFFSETS_4[:cut]
    with pytest.raises(fastjson.FastjsonError) as e:
        fastjson.loads(text)
    assert e.value.pos <= len(text)
    line, col = e.value.line, e.value.column
    assert line == text[:e.value.pos].count("\n") + 1
    assert col == e.value.pos - (text[:e.value.pos].rfind("\n") + 1) + 1


@pytest.mark.parametrize("text, where", [("", 0), ("   \n", 4), ("\x00\x00\x00", 0), ('{"a":1}garbage', 7),
                                          ('{"a":{0:1,1:\x00}}', 12), ('{"a" 1}', 5)])
def test_garbage_is_a_positioned_error(text, where):
    with pytest.raises(fastjson.FastjsonError) as e:
        fastjson.loads(text)
    assert e.value.pos == where


def test_partial_keeps_only_entries_that_were_complete():
    cut = OFFSETS_4[:OFFSETS_4.index("456") + 2]  # "45" of 456: a cut-off number is not kept
    v, complete = fastjson.loads_partial(cut)
    assert not complete
    assert v["offsetTable"]["%RETRY%group_a@group_a"] == {0: 0}
    assert v["offsetTable"]["TopicTest@group_a"] == {0: 123}
    assert fastjson.loads_partial("garbage") == (None, False)
    assert fastjson.loads_partial(OFFSETS_4) == (fastjson.loads(OFFSETS_4), True)


def test_strings_are_escaped_like_fastjson():
    v = {"t": 'a"b\\c\n\u00e9\u4e2d\x01'}
    text = fastjson.dumps(v)
    assert text == '{\n\t"t":"a\\"b\\\\c\\n\u00e9\u4e2d\\u0001"\n}'
    assert fastjson.loads(text) == v


def test_partial_keeps_complete_array_members_and_inner_objects():
    assert fastjson.loads_partial('{"a":[1,2,{"b":3,"c":') == ({"a": [1, 2, {"b": 3}]}, False)
    assert fastjson.loads_partial('{"a":[1,2],"b":7 x') == ({"a": [1, 2]}, False)  # 7 not followed by , or }
    assert fastjson.loads_partial('[1,[2,3') == ([1, [2]], False)


def test_trailing_commas_are_accepted_as_fastjson_does():
    assert fastjson.loads('{"a":1,}') == {"a": 1}
    assert fastjson.loads('[1,2,]') == [1, 2]
    assert fastjson.loads('{"a":[],"b":{}}') == {"a": [], "b": {}}
