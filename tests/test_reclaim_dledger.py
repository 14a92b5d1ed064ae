"""``rmqstore reclaim`` on DLedger stores: DLedger's own cleaner (``DLedgerMmapFileStore.CleanSpaceService``) deletes
the data files, ``reviseLedgerBeginIndex`` the index files behind the new begin index, and the broker's consume-queue
cleaner the derived files behind the new min offset.

Copies of the broker-written DLedger stores; data-file modification times are set here (os.utime), the clock is a
fixed local time (``--at``) and the disk usage is given (``--assume-disk``). Expected files come from the scenario and
from what the broker read back (broker-read.jsonl.gz: every entry's index and pos, every consume-queue unit) or the
files' own headers read with ``struct`` here, never from the code under test.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from tests.conftest import broker_read, shared_store, tree_digest
from tests.test_reclaim import HOUR_MS, _digest, deleted_names, dry_run, local_ms, rel_derived, run, write_offsets

VERSIONED = [("dledger-4.9.3-clean", 4), ("dledger-5.3.3-clean", 5)]


def data_dir(root: Path) -> Path:
    return root / "dledger-n0" / "data"


def data_names(root: Path) -> list[str]:
    return sorted(os.listdir(data_dir(root)))


def age_data(root: Path, now_ms: int, ages_h: list[float]) -> None:
    for i, n in enumerate(data_names(root)):
        t = (now_ms - (ages_h[i] if i < len(ages_h) else 1) * HOUR_MS) / 1000
        os.utime(data_dir(root) / n, (t, t))


def expected_behind(name: str, root: Path, first_kept: str) -> dict[str, set]:
    """Per kind, the files removed once the data files start at ``first_kept``: DLedger index files ending at or
    before the first kept entry's unit; per queue, oldest first and never the last, the consume-queue files whose
    last unit points below the new min; index files (never the last) whose endPhyOffset is below it."""
    read = broker_read(name)
    new_min = int(first_kept)
    begin = next(e["index"] for e in read["dledger_entry"] if e["pos"] == new_min)
    idir = root / "dledger-n0" / "index"
    dl_index = {f"dledger-n0/index/{n}" for n in sorted(os.listdir(idir))
                if int(n) + os.path.getsize(idir / n) <= begin * 32}
    units: dict = {}
    for e in read["cq_unit"]:
        units.setdefault((e["topic"], e["queueId"]), {})[e["queueOffset"]] = e["phyOffset"]
    cq = set()
    for (t, q), by_offset in units.items():
        d = root / "consumequeue" / t / str(q)
        files = sorted(os.listdir(d))
        per_file = os.path.getsize(d / files[0]) // 20
        for f in files[:-1]:
            if by_offset.get(int(f) // 20 + per_file - 1, 0) >= new_min:
                break
            cq.add(f"consumequeue/{t}/{q}/{f}")
    idx = set()
    files = sorted(os.listdir(root / "index"))
    for f in files[:-1]:
        with open(root / "index" / f, "rb") as fh:
            end = struct.unpack(">q", fh.read(32)[24:32])[0]  # IndexHeader.endPhyOffset
        if end >= new_min:
            break
        idx.add(f"index/{f}")
    return {"dledger_index": dl_index, "consumequeue": cq, "index": idx}


def derived_of(plan: dict, root: Path) -> dict[str, set]:
    return {k: rel_derived(plan, root, k) for k in ("dledger_index", "consumequeue", "index")}


# --- DLedger's cleaner, predicted -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,version", VERSIONED)
def test_files_expire_an_hour_after_the_brokers_reserved_time(store_copy, name, version):
    """DLedgerCommitLog hands DLedger fileReservedTime + 1 hours: 72.5 h old files stay at the delete hour."""
    root = store_copy(name)
    now = local_ms(4)
    names = data_names(root)
    age_data(root, now, [72.5] * len(names))
    assert deleted_names(dry_run(root, now, "10%/100G")) == []
    age_data(root, now, [73.5] * len(names))
    plan = dry_run(root, now, "10%/100G")
    assert deleted_names(plan) == names[:-1] and {f["reason"] for f in plan["commitlogFiles"]} == {"expired"}
    assert plan["minPhyOffsetAfter"] == int(names[-1]) and plan["dledger"] is True
    assert derived_of(plan, root) == expected_behind(name, root, names[-1])
    # a young file in the middle ends the walk (no hole)
    age_data(root, now, [100, 1, 100, 100])
    assert deleted_names(dry_run(root, now, "10%/100G")) == names[:1]
    # not the delete hour and a disk below the ratios: nothing
    age_data(root, now, [100] * len(names))
    r = run("reclaim", "--dry-run", "--at", local_ms(10), "--assume-disk", "10%/100G", root)
    assert r.exit_code == 0 and "nothing to remove" in r.stderr


@pytest.mark.parametrize("name,version", VERSIONED)
def test_the_disk_ratio_that_starts_a_round_is_the_versions(store_copy, name, version):
    """4.9.3 (DLedger 0.2.3): 0.70 (-Ddledger.disk.ratio.check); 5.3.3: the broker's diskMaxUsedSpaceRatio."""
    root = store_copy(name)
    now = local_ms(10)
    names = data_names(root)
    age_data(root, now, [100] * len(names))
    plan = dry_run(root, now, "72%/100G")
    assert deleted_names(plan) == (names[:-1] if version < 5 else [])
    conf = root.parent / "broker.conf"
    conf.write_text("diskMaxUsedSpaceRatio=71\n")
    assert deleted_names(dry_run(root, now, "72%/100G", "--config", conf)) == names[:-1]
    conf.write_text("diskMaxUsedSpaceRatio=71\ndledger.disk.ratio.check=0.80\n")
    assert deleted_names(dry_run(root, now, "72%/100G", "--config", conf)) == []


@pytest.mark.parametrize("name,version", VERSIONED)
def test_a_full_disk_forces_every_data_file_but_the_last(store_copy, name, version):
    root = store_copy(name)
    now = local_ms(10)
    names = data_names(root)
    age_data(root, now, [])  # an hour old: none expired
    plan = dry_run(root, now, "90%/100G")
    assert deleted_names(plan) == names[:-1]
    assert {f["reason"] for f in plan["commitlogFiles"]} == {"forced (disk full)"}
    expect = expected_behind(name, root, names[-1])
    assert derived_of(plan, root) == expect and expect["dledger_index"] and expect["consumequeue"]
    rounds = plan["prediction"]["rounds"]
    assert rounds[0]["cleaner"] == "DLedger" and rounds[0]["cleanImmediately"]
    assert {d["kind"] for r in rounds if r["cleaner"] != "DLedger" for d in r["derivedFiles"]} <= {"consumequeue", "index"}
    assert rounds[-1]["time"] >= now + 60_000  # the broker's consume-queue cleaner: 60 s after the start
    conf = root.parent / "broker.conf"
    for text in ("cleanFileForciblyEnable=false\n", "dledger.disk.ratio.clean=0.95\n"):
        conf.write_text(text)  # forced cleaning off, or DLedger's own forced ratio above the usage
        assert deleted_names(dry_run(root, now, "90%/100G", "--config", conf)) == []


def test_dledger_0_3_rounds_the_usage_up_to_a_whole_percent():
    """DLedgerUtils.getDiskPartitionSpaceUsedPercent: 0.2.3 (total - free) / total; 0.3.1.2 used over used + usable,
    rounded up to a percent."""
    from rmqstore_cli.engine.repair.cleanup import Partition
    from rmqstore_cli.engine.repair.dledgercleanup import partition_ratio, time_up

    p = Partition(total=300, used=100, avail=150)  # 50 bytes reserved for root
    assert partition_ratio(p, 4) == 100 / 300
    assert partition_ratio(p, 5) == 0.40  # 100 * 100 / 250 = 40 exactly
    assert partition_ratio(Partition(total=300, used=100, avail=200), 5) == 0.34  # 33.3 % rounded up
    assert time_up("04;10", 10) is True and time_up("04", 10) is False
    assert time_up("x;10", 10) is None  # Integer.parseInt throws before the match: the round fails
    assert time_up("10;x", 10) is True


def test_reset_offset_removes_an_index_file_that_ends_exactly_at_the_begin_unit(tmp_path):
    """MmapFileList.resetOffset: a file goes when the offset is at or past its tail."""
    from types import SimpleNamespace

    from rmqstore_cli.engine.repair.dledgercleanup import index_files_behind

    segs = []
    for k in range(3):
        p = tmp_path / f"{k * 64:020d}"
        p.write_bytes(bytes(64))
        segs.append(SimpleNamespace(path=str(p), name=p.name, start=k * 64))
    files = SimpleNamespace(index=SimpleNamespace(segments=segs, file_size=64))
    assert [d.name for d in index_files_behind(files, 4)] == [segs[0].name, segs[1].name]  # unit 4 at 128: file 64's tail
    assert [d.name for d in index_files_behind(files, 3)] == [segs[0].name]  # unit 3 at 96: inside file 64


# --- policies applied ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,version", VERSIONED)
@pytest.mark.parametrize("policy", [["--keep-files", "1"], ["--free", "1M"], ["--before", "BEFORE"],
                                    ["--as-broker", "--at", "AT", "--assume-disk", "90%/100G"]])
def test_every_policy_ends_consistent_and_loadable(store_copy, name, version, policy):
    root = store_copy(name)
    now = local_ms(10)
    age_data(root, now, [])
    entries = broker_read(name)["dledger_entry"]
    mid = entries[len(entries) * 3 // 4]["message"]["storeTimestamp"]
    args = [str(now) if a == "AT" else str(mid) if a == "BEFORE" else a for a in policy]
    names = data_names(root)
    before = _digest(root)
    r = run("reclaim", *args, root)
    assert r.exit_code == 2 and "--yes" in r.stderr and _digest(root) == before
    r = run("reclaim", *args, "--yes", root)
    assert r.exit_code == 0, r.stderr
    kept = data_names(root)
    assert kept == names[len(names) - len(kept):] and 1 <= len(kept) < len(names)
    gone = set(before) - set(_digest(root))
    expect = expected_behind(name, shared_store(name), kept[0])  # the rules applied to the untouched store
    assert gone == {f"dledger-n0/data/{n}" for n in names[:-len(kept)]} | set().union(*expect.values())
    if policy[0] == "--before":
        first = int(kept[0])
        assert all(e["message"]["storeTimestamp"] < mid for e in entries if e["pos"] < first)
    v = run("verify", root)
    assert v.exit_code == 0, v.stdout + v.stderr
    s = json.loads(run("dump", "store", "--json", root).stdout)
    assert s["minPhyOffset"] == int(kept[0])
    rec = [json.loads(x) for x in run("recover", "--dry-run", "--json", root).stdout.splitlines() if x.startswith("{")]
    plan = next(o for o in rec if "actions" in o)
    assert all(a.get("housekeeping") for a in plan["actions"]) and not plan.get("queueRepairs"), plan


@pytest.mark.parametrize("name,version", VERSIONED)
def test_the_removed_files_are_the_cleaners_and_move_to_then_restore_is_byte_for_byte(store_copy, tmp_path, name, version):
    root = store_copy(name)
    before = _digest(root)
    names = data_names(root)
    expect = expected_behind(name, root, names[-1])
    dest = tmp_path / "elsewhere"
    r = run("reclaim", "--keep-files", 1, "--move-to", dest, root)
    assert r.exit_code == 0, r.stderr
    assert data_names(root) == names[-1:]
    gone = set(before) - set(_digest(root))
    assert gone == {f"dledger-n0/data/{n}" for n in names[:-1]} | set().union(*expect.values())
    r = run("restore", dest)
    assert r.exit_code == 0, r.stderr
    assert _digest(root) == before


@pytest.mark.parametrize("name,version", VERSIONED)
def test_consumed_keeps_every_message_a_group_has_not_consumed(store_copy, name, version):
    root = store_copy(name)
    units: dict = {}
    for e in broker_read(name)["cq_unit"]:
        units.setdefault((e["topic"], e["queueId"]), []).append((e["queueOffset"], e["phyOffset"]))
    # every group has read 90 % of each queue it reads
    table = {}
    for (t, q), u in sorted(units.items()):
        table.setdefault(f"{t}@G1", {})[q] = len(u) * 9 // 10
    write_offsets(root, version, table)
    unconsumed = min(p for k, u in units.items() for o, p in sorted(u) if o >= table[f"{k[0]}@G1"][k[1]])
    names = data_names(root)
    size = os.path.getsize(data_dir(root) / names[0])
    expect = [n for n in names[:-1] if int(n) + size <= unconsumed]
    r = run("reclaim", "--consumed", "--dry-run", "--json", root)
    plan = json.loads(r.stdout.splitlines()[0])
    assert deleted_names(plan) == expect and expect, (unconsumed, expect)
    assert plan["unconsumedLost"] == 0
    r = run("reclaim", "--consumed", "--yes", root)
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(x) for x in run("dump", "offsets", "--json", root).stdout.splitlines() if x.startswith("{")]
    rows = [x for x in rows if x.get("type") == "offset"]
    assert rows and all(x["skipped"] == 0 for x in rows), rows


def test_the_prediction_in_dump_store_and_stats_and_a_held_lock(store_copy, monkeypatch):
    from tests.test_live_broker import Broker

    name = "dledger-5.3.3-clean"
    root = store_copy(name)
    now = local_ms(4)
    names = data_names(root)
    age_data(root, now, [100] * len(names))
    before = tree_digest(root)
    plan = dry_run(root, now, "40%/100G")
    monkeypatch.setenv("RMQSTORE_CLEANUP_NOW", str(now))
    monkeypatch.setenv("RMQSTORE_CLEANUP_DISK", "40%/100G")
    s = json.loads(run("dump", "store", "--json", root).stdout)["nextCleanup"]
    assert [c.split(" ")[0] for c in s["commitlogFiles"]] == deleted_names(plan) == names[:-1]
    st = json.loads(run("stats", "--json", root).stdout)["nextCleanup"]
    assert st["minPhyOffsetAfter"] == plan["minPhyOffsetAfter"] == int(names[-1])
    assert tree_digest(root) == before
    b = Broker(root)
    try:
        for args in (["--keep-files", "1", "--yes"], ["--as-broker", "--assume-disk", "95%/1T", "--yes"]):
            r = run("reclaim", *args, root)
            assert r.exit_code == 4, (args, r.stderr)
        assert tree_digest(root) == before
    finally:
        b.stop()


def test_dledger_deletes_ten_files_a_round(tmp_path):
    """MmapFileList.DELETE_FILES_BATCH_MAX on a store of many small data files (the demo store's messages as
    DLedger entries in 64 KiB files: bench/gendledger.py), then the whole cleanup applied ends verify-clean."""
    from bench.gendledger import convert

    root = tmp_path / "many"
    convert(str(Path(__file__).resolve().parent.parent / "fixtures" / "stores" / "4.9.3-clean"), str(root), 65536)
    names = data_names(root)
    assert len(names) > 25
    now = local_ms(10)
    age_data(root, now, [])
    plan = dry_run(root, now, "95%/100G")
    rounds = [len(r["commitlogFiles"]) for r in plan["prediction"]["rounds"] if r["cleaner"] == "DLedger"]
    n = len(names) - 1
    assert rounds == [10] * (n // 10) + ([n % 10] if n % 10 else [])
    assert deleted_names(plan) == names[:-1]
    r = run("reclaim", "--as-broker", "--at", now, "--assume-disk", "95%/100G", "--yes", root)
    assert r.exit_code == 0, r.stderr
    assert data_names(root) == names[-1:]
    v = run("verify", root)
    assert v.exit_code == 0, v.stdout + v.stderr
