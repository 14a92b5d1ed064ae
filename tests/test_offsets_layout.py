"""``consumerOffset.json`` as rmqstore writes it, byte for byte against the file the broker's own
``ConsumerOffsetManager`` wrote (``../shared/stores/config-samples``, both versions), after the same commits.

Only the values of ``dataVersion`` may differ (its timestamp is a clock; ``offsets set`` also counts its
change): they are taken from the broker's file before comparing. Everything else (field set and order,
tabs, inline topic sets, bare integer keys, the hash-map order of the entries, no final newline) must be
the broker's bytes.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from rmqstore_cli.formats import fastjson
from rmqstore_cli.formats.java_concurrent_map import concurrent_hashmap_order
from rmqstore_cli.app import app

from .conftest import SHARED

SAMPLES = SHARED / "stores" / "config-samples"
# the commits the samples were made with (their README), in order: group, topic, queue, offset
COMMITS = [("GroupA", "OracleTopicA", 0, 100), ("GroupA", "OracleTopicA", 1, 57), ("GroupA", "OracleTopicA", 3, 0),
           ("GroupB", "oracle_topic-B%x", 2, 12), ("GroupB", "OracleTopicA", 0, 831)]
DATA_VERSION = re.compile(r'"dataVersion":\{[^}]*\}')


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def sample(version: str) -> bytes:
    return (SAMPLES / f"consumerOffset-{version}.json").read_bytes()


def with_dataversion_of(ours: bytes, theirs: bytes) -> bytes:
    """``ours`` with the broker's ``dataVersion`` values (the block keeps our layout: it is compared too)."""
    mine, broker = DATA_VERSION.search(ours.decode()), DATA_VERSION.search(theirs.decode())
    if mine is None:
        return ours
    assert broker is not None
    a, b = fastjson.loads("{" + mine.group(0) + "}"), fastjson.loads("{" + broker.group(0) + "}")
    assert list(a["dataVersion"]) == list(b["dataVersion"])  # same fields, same order
    return ours.decode().replace(mine.group(0), broker.group(0)).encode()


@pytest.mark.parametrize("name,version", [("4.9.3-clean", "4.9.3"), ("5.3.3-clean", "5.3.3")])
def test_offsets_set_writes_the_brokers_bytes(store_copy, name, version):
    root = store_copy(name)
    path = root / "config" / "consumerOffset.json"
    for p in (path, path.with_name(path.name + ".bak")):
        p.unlink(missing_ok=True)  # an empty table, as the samples started with
    for group, topic, queue, offset in COMMITS:
        r = run("offsets", "set", root, "--group", group, "--topic", topic, "--queue", queue, "--to-offset", offset)
        assert r.exit_code == 0, r.output
    assert with_dataversion_of(path.read_bytes(), sample(version)) == sample(version)


@pytest.mark.parametrize("name,version", [("4.9.3-clean", "4.9.3"), ("5.3.3-clean", "5.3.3")])
def test_a_rewritten_broker_file_keeps_the_brokers_bytes(store_copy, name, version):
    """The broker's file, loaded and written again with one offset changed: the broker's bytes with that offset."""
    root = store_copy(name)
    path = root / "config" / "consumerOffset.json"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(sample(version))
    r = run("offsets", "set", root, "--group", "GroupA", "--topic", "OracleTopicA", "--queue", 1, "--to-offset", 58)
    assert r.exit_code == 0, r.output
    expected = sample(version).replace(b"{0:100,1:57,3:0", b"{0:100,1:58,3:0")
    assert expected != sample(version)
    assert with_dataversion_of(path.read_bytes(), expected) == expected
    assert path.with_name(path.name + ".bak").read_bytes() == sample(version)


def test_a_new_group_joins_the_inline_topic_sets(store_copy):
    root = store_copy("5.3.3-clean")
    path = root / "config" / "consumerOffset.json"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(sample("5.3.3"))
    r = run("offsets", "set", root, "--group", "GroupA", "--topic", "oracle_topic-B%x", "--queue", 0, "--to-offset", 5)
    assert r.exit_code == 0, r.output
    text = path.read_text()
    assert '\t\t"GroupA":["OracleTopicA","oracle_topic-B%x"],\n' in text  # HashSet(8): bins 0 and 4
    assert '"oracle_topic-B%x@GroupA":{0:5\n\t\t}' in text
    assert not text.endswith("\n")


def test_concurrent_hashmap_order_follows_the_java_transfer():
    """Integer keys (hashCode = value) in a default 16-bin map: 0, 16, 32, 48, 64 share bin 0. The 12th key
    doubles the table; ``transfer`` keeps the tail run [64] (bit 16 clear) and pushes the nodes before it in
    front of their half: bin 0 becomes 32, 0, 64 and bin 16 becomes 48, 16."""
    fillers = [1, 2, 3, 4, 5, 6, 7]
    keys = [0, 16, 32, 48, 64] + fillers
    assert concurrent_hashmap_order(keys[:11]) == [0, 16, 32, 48, 64] + fillers[:6]  # 11 keys: no resize yet
    assert concurrent_hashmap_order(keys) == [32, 0, 64] + fillers + [48, 16]
    # new ConcurrentHashMap(512): 1024 bins; the sample's keys land in bins 38, 954 and 955
    assert concurrent_hashmap_order(["OracleTopicA@GroupA", "oracle_topic-B%x@GroupB", "OracleTopicA@GroupB"], 512) == [
        "oracle_topic-B%x@GroupB", "OracleTopicA@GroupB", "OracleTopicA@GroupA"]
