"""verify on the broker-written stores (clean: nothing to report) and on copies the tests corrupt.

Expected locations come from the broker's own read-back (record offsets and sizes of
broker-read.jsonl.gz) and from the FORMAT.md layouts, never from the code under test.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify.pipeline import verify_store
from tests.conftest import CLEAN_STORES, broker_read, shared_store

RMQSTORE = [sys.executable, "-m", "rmqstore_cli"]
NAME = "4.9.3-clean"
FILE_SIZE = 65536  # mappedFileSizeCommitLog of the shared 4.9.3 stores (broker-read "store" line)


def run_verify(root) -> list:
    with Store.open(str(root)) as st:
        return verify_store(st).findings


def problems(findings) -> set:
    """(code, relative path, offset) of every error and warning."""
    return {(f.code, f.path, f.offset) for f in findings if f.severity != "info"}


def cl_path(root, phy: int) -> str:
    return str(root / "commitlog" / ("%020d" % (phy - phy % FILE_SIZE)))


def patch(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def record(i: int) -> dict:
    return broker_read(NAME)["clmsg"][i]


@pytest.mark.parametrize("name", CLEAN_STORES)
def test_clean_stores_have_no_finding(name):
    assert run_verify(shared_store(name)) == []


def test_clean_store_cli_exit_0():
    p = subprocess.run(RMQSTORE + ["verify", str(shared_store(NAME)), "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""


def test_crash_store_reports_abort_as_info():
    """An operator expects to hear that the broker was killed and will run abnormal recovery, but the data
    on disk is consistent, so it is info (exit 0): the abort file and the pre-allocated all-zero segment."""
    root = shared_store("4.9.3-crash")
    found = run_verify(root)
    assert {(f.code, f.severity) for f in found} == {("STORE_ABORT", "info"), ("CL_PREALLOCATED", "info")}
    pre = [f for f in found if f.code == "CL_PREALLOCATED"][0]
    assert pre.path == str(root / "commitlog" / "00000000000003670016") and pre.offset == 0
    p = subprocess.run(RMQSTORE + ["verify", str(root), "--json"], capture_output=True, text=True)
    assert p.returncode == 0
    codes = {json.loads(line)["code"] for line in p.stdout.splitlines()}
    assert codes == {"STORE_ABORT", "CL_PREALLOCATED"}


def test_body_byte_flipped(store_copy):
    root = store_copy(NAME)
    r = record(5)
    bh = 20 if r["msg"]["sysFlag"] & 0x10 else 8
    sh = 20 if r["msg"]["sysFlag"] & 0x20 else 8
    body_at = r["offset"] % FILE_SIZE + 72 + bh + sh  # BODY offset of §2.1
    assert r["msg"]["bodyLen"] > 0
    with open(cl_path(root, r["offset"]), "rb") as f:
        f.seek(body_at)
        b = f.read(1)
    patch(cl_path(root, r["offset"]), body_at, bytes([b[0] ^ 0xFF]))
    assert problems(run_verify(root)) == {("CL_BODY_CRC", cl_path(root, r["offset"]), r["offset"] % FILE_SIZE)}


def test_totalsize_changed(store_copy):
    root = store_copy(NAME)
    r = record(5)
    patch(cl_path(root, r["offset"]), r["offset"] % FILE_SIZE, struct.pack(">i", r["size"] + 4))
    assert problems(run_verify(root)) == {("CL_TOTALSIZE", cl_path(root, r["offset"]), r["offset"] % FILE_SIZE)}


def test_physicaloffset_changed(store_copy):
    root = store_copy(NAME)
    r = record(7)
    patch(cl_path(root, r["offset"]), r["offset"] % FILE_SIZE + 28, struct.pack(">q", 12345))
    assert problems(run_verify(root)) == {("CL_PHYOFFSET", cl_path(root, r["offset"]), r["offset"] % FILE_SIZE)}


def _cq_entry(topic: str, qid: int, qoff: int) -> dict:
    return next(e for e in broker_read(NAME)["cqe"] if (e["topic"], e["queueId"], e["queueOffset"]) == (topic, qid, qoff))


@pytest.mark.parametrize("field,pos,code", [("size", 8, "CQ_SIZE"), ("tagsCode", 12, "CQ_TAGS")])
def test_consume_queue_unit_changed(store_copy, field, pos, code):
    root = store_copy(NAME)
    e = _cq_entry("OracleTopicA", 1, 5)
    path = root / "consumequeue" / "OracleTopicA" / "1" / "00000000000000000000"
    patch(path, 5 * 20 + pos, struct.pack(">i", 999) if field == "size" else struct.pack(">q", e["tagsCode"] + 1))
    assert problems(run_verify(root)) == {(code, str(path), 100)}


def test_consume_queue_unit_pointing_elsewhere(store_copy):
    root = store_copy(NAME)
    e = _cq_entry("OracleTopicA", 1, 5)
    other = _cq_entry("OracleTopicA", 2, 3)
    path = root / "consumequeue" / "OracleTopicA" / "1" / "00000000000000000000"
    patch(path, 5 * 20, struct.pack(">qi", other["phyOffset"], other["size"]))
    found = problems(run_verify(root))
    # The unit now names a record of queue 2, and the record it used to name is dispatched nowhere.
    assert ("CQ_QUEUE_ID", str(path), 100) in found
    assert ("CQ_NOT_DISPATCHED", cl_path(root, e["phyOffset"]), e["phyOffset"] % FILE_SIZE) in found
    assert {c for c, _, _ in found} == {"CQ_QUEUE_ID", "CQ_NOT_DISPATCHED"}


def test_index_entry_changed(store_copy):
    root = store_copy(NAME)
    s = broker_read(NAME)["store"][0]
    slots = s["maxHashSlotNum"]
    name = broker_read(NAME)["index"][0]["files"][0]["name"]
    entry_pos = 40 + slots * 4 + 10 * 20  # entry 10 (§10.1)
    path = root / "index" / name
    patch(path, entry_pos + 4, struct.pack(">q", record(5)["offset"]))
    assert problems(run_verify(root)) == {("IDX_KEY_HASH", str(path), entry_pos)}


def test_commitlog_file_renamed(store_copy):
    root = store_copy(NAME)
    src = root / "commitlog" / "00000000000000065536"
    os.rename(src, str(src) + ".bak")
    assert problems(run_verify(root)) == {("SEG_BAD_NAME", str(src) + ".bak", None),
                                          ("SEG_GAP", str(root / "commitlog" / "00000000000000131072"), None)}


def test_commitlog_file_truncated(store_copy):
    root = store_copy(NAME)
    path = root / "commitlog" / "00000000000000065536"
    os.truncate(path, 30000)
    assert problems(run_verify(root)) == {("SEG_WRONG_SIZE", str(path), 0)}


def _last():
    r = broker_read(NAME)["clmsg"][-1]
    return r["offset"], r["size"]


def test_zero_filled_tail(store_copy):
    """The last record wiped with zeros: the log ends cleanly earlier, but queues and index still point there."""
    root = store_copy(NAME)
    off, size = _last()
    patch(cl_path(root, off), off % FILE_SIZE, bytes(size))
    assert problems(run_verify(root)) == {("CL_LOST_TAIL", cl_path(root, off), off % FILE_SIZE)}


def test_torn_tail(store_copy):
    """The last record only half written (its second half still zero), as a crash mid-write leaves it."""
    root = store_copy(NAME)
    off, size = _last()
    patch(cl_path(root, off), off % FILE_SIZE + size // 2, bytes(size - size // 2))
    assert problems(run_verify(root)) == {("CL_TORN_TAIL", cl_path(root, off), off % FILE_SIZE)}


def test_garbage_tail(store_copy):
    root = store_copy(NAME)
    off, size = _last()
    patch(cl_path(root, off), off % FILE_SIZE, b"\xab" * size)
    assert problems(run_verify(root)) == {("CL_GARBAGE", cl_path(root, off), off % FILE_SIZE)}


def test_stale_data_after_end(store_copy):
    root = store_copy(NAME)
    off, size = _last()
    at = off % FILE_SIZE + size + 1000
    patch(cl_path(root, off), at, b"\x01" * 16)
    assert problems(run_verify(root)) == {("CL_STALE_AFTER_END", cl_path(root, off), at)}


def test_cli_json_findings_and_exit_1(store_copy):
    root = store_copy(NAME)
    off, size = _last()
    patch(cl_path(root, off), off % FILE_SIZE + size // 2, bytes(size - size // 2))
    p = subprocess.run(RMQSTORE + ["verify", str(root), "--json"], capture_output=True, text=True)
    assert p.returncode == 1
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [(r["code"], r["severity"], r["path"], r["offset"]) for r in rows] == [
        ("CL_TORN_TAIL", "error", cl_path(root, off), off % FILE_SIZE)]
    assert rows[0]["phyOffset"] == off and rows[0]["message"]
    assert len(p.stderr.strip().splitlines()) == 1
