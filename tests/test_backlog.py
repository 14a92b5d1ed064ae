"""``dump consumequeue --group G``: each queue from the group's committed offset to its end, compared with
what the broker read back from its own consume queues (broker-read ``cqe`` lines), on consumerOffset.json
files in the broker's exact layout (../shared/stores/config-samples, written by its ConsumerOffsetManager)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from .conftest import REPO, STORES, broker_read, tree_digest
from .configfixtures import consumer_offsets_text

SAMPLES = STORES / "config-samples"
# the committed offsets of the sample files (their README): (group, topic, queue) -> offset
SAMPLE_OFFSETS = {("GroupA", "OracleTopicA", 0): 100, ("GroupA", "OracleTopicA", 1): 57, ("GroupA", "OracleTopicA", 3): 0,
                  ("GroupB", "oracle_topic-B%x", 2): 12, ("GroupB", "OracleTopicA", 0): 831}


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rmqstore_cli", *map(str, args)], capture_output=True, cwd=REPO,
                          text=True)


def with_offsets(store_copy, name: str, text: str):
    root = store_copy(name)
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "consumerOffset.json").write_text(text)
    return root


def expected(name: str, committed: dict) -> list[tuple]:
    """(topic, queueId, queueOffset, phyOffset, size, tagsCode) of every unit at or after each committed offset,
    as the broker read its queues."""
    units = broker_read(name)["cqe"]
    return sorted((u["topic"], u["queueId"], u["queueOffset"], u["phyOffset"], u["size"], u["tagsCode"])
                  for u in units if (u["topic"], u["queueId"]) in committed and u["queueOffset"] >= committed[(u["topic"], u["queueId"])])


def got(stdout: str) -> list[tuple]:
    rows = [json.loads(line) for line in stdout.splitlines()]
    return sorted((r["topic"], r["queueId"], r["queueOffset"], r["phyOffset"], r["size"], r["tagsCode"]) for r in rows)


@pytest.mark.parametrize("name,sample", [("4.9.3-clean", "consumerOffset-4.9.3.json"),
                                         ("5.3.3-clean", "consumerOffset-5.3.3.json")])
@pytest.mark.parametrize("group", ["GroupA", "GroupB"])
def test_backlog_is_the_units_from_the_committed_offset(name, sample, group, store_copy):
    root = with_offsets(store_copy, name, (SAMPLES / sample).read_text())
    committed = {(t, q): o for (g, t, q), o in SAMPLE_OFFSETS.items() if g == group}
    before = tree_digest(root)
    r = cli("dump", "consumequeue", root, "--group", group, "--json")
    assert r.returncode == 0, r.stderr
    want = expected(name, committed)
    assert want, "the sample offsets leave a backlog on these stores"
    assert got(r.stdout) == want
    assert all(json.loads(line)["group"] == group for line in r.stdout.splitlines())
    assert tree_digest(root) == before


def test_backlog_of_one_queue_with_messages(store_copy):
    name = "4.9.3-clean"
    root = with_offsets(store_copy, name, (SAMPLES / "consumerOffset-4.9.3.json").read_text())
    r = cli("dump", "consumequeue", root, "--group", "GroupA", "--topic", "OracleTopicA", "--queue", 1, "--msg",
            "--body", "hex", "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    truth = {u["queueOffset"]: u for u in broker_read(name)["cqe"] if (u["topic"], u["queueId"]) == ("OracleTopicA", 1)}
    assert [x["queueOffset"] for x in rows] == [o for o in sorted(truth) if o >= 57]
    for x in rows:
        assert x["msg"]["commitLogOffset"] == truth[x["queueOffset"]]["phyOffset"]
        assert x["msg"]["bodyHex"] == truth[x["queueOffset"]]["msg"]["bodyHex"]


def test_backlog_with_the_fixture_layout_and_a_caught_up_queue(store_copy):
    """The fixture file (5.x, with a broadcast entry, a queue caught up and an offset above max)."""
    name = "5.3.3-clean"
    text, cases = consumer_offsets_text(name, 5)
    root = with_offsets(store_copy, name, text)
    r = cli("dump", "consumequeue", root, "--group", "group_a", "--json")
    assert r.returncode == 0, r.stderr
    committed = {(t, q): o for case, (g, t, q, o) in cases.items() if g == "group_a"}
    mx = {(c["topic"], c["queueId"]): c["maxOffset"] for c in broker_read(name)["cq"]}
    committed[("OracleTopicA", 0)] = mx[("OracleTopicA", 0)] - 5  # the fixture's queue 0 (not among its cases)
    committed[("oracle_topic-B%x", 1)] = mx[("oracle_topic-B%x", 1)]
    assert got(r.stdout) == expected(name, committed)
    table = cli("dump", "consumequeue", root, "--group", "group_a")
    assert table.returncode == 0 and "backlog of group group_a" in table.stdout
    assert f"{len(r.stdout.splitlines())} unit(s) not consumed yet" in table.stderr


def test_unknown_group_and_missing_file(store_copy):
    root = with_offsets(store_copy, "4.9.3-clean", (SAMPLES / "consumerOffset-4.9.3.json").read_text())
    r = cli("dump", "consumequeue", root, "--group", "Nobody")
    assert r.returncode == 1 and "GroupA, GroupB" in r.stderr and "Traceback" not in r.stderr
    shutil.rmtree(root / "config")
    r = cli("dump", "consumequeue", root, "--group", "GroupA")
    assert r.returncode == 1 and "consumerOffset.json" in r.stderr and "Traceback" not in r.stderr
