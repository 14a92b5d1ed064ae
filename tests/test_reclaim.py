"""``rmqstore reclaim``: the broker's next expired-file cleanup (FORMAT.md 13.10) and the offline policies.

Copies of the broker-written stores; the commitlog files' modification times are set here (os.utime), the
cleaner's "now" is a fixed local time (``--at``) and the disk usage is given (``--assume-disk``): nothing
depends on today's date or the real disk. Expected files come from the scenario itself (which files are old,
how full the disk is) and from what the broker read back (broker-read.jsonl.gz: every consume-queue unit's
commitlog offset and every index file's endPhyOffset), never from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from tests import fuzzlib
from tests.conftest import STORES, broker_read, copy_store, tree_digest

VERSIONED = [("4.9.3-clean", 4), ("5.3.3-clean", 5)]
HOUR_MS = 3600 * 1000
SAMPLES = STORES / "config-samples"


def run(*args):
    return fuzzlib.run_cli([str(a) for a in args])


def local_ms(hour: int, minute: int = 0) -> int:
    """A fixed local time (the broker reads deleteWhen in its local zone)."""
    return int(time.mktime((2026, 11, 24, hour, minute, 0, 0, 0, -1)) * 1000)


def commitlog_names(root: Path) -> list[str]:
    return sorted(os.listdir(root / "commitlog"))


def age_files(root: Path, now_ms: int, ages_h: list[float]) -> None:
    """Set the commitlog files' modification times: file i was last written ages_h[i] hours before now (the rest 1 h)."""
    for i, n in enumerate(commitlog_names(root)):
        t = (now_ms - (ages_h[i] if i < len(ages_h) else 1) * HOUR_MS) / 1000
        os.utime(root / "commitlog" / n, (t, t))


def dry_run(root: Path, now_ms: int, disk: str, *extra):
    r = run("reclaim", "--dry-run", "--json", "--at", now_ms, "--assume-disk", disk, *extra, root)
    assert r.exit_code in (0, 1), r.stderr
    return json.loads(r.stdout.splitlines()[0])


def deleted_names(plan: dict) -> list[str]:
    return [f["name"] for f in plan["commitlogFiles"]]


def expected_derived(name: str, root: Path, new_min: int) -> tuple[set, set]:
    """The consume-queue and index files the broker's cleaner removes for ``new_min``, from what the broker
    read: per queue, oldest first and never the last file, while the unit at fileSize-20 points below new_min;
    index files (never the last) while their endPhyOffset < new_min."""
    units: dict = {}
    for e in broker_read(name)["cqe"]:
        units.setdefault((e["topic"], e["queueId"]), {})[e["queueOffset"]] = e["phyOffset"]
    cq = set()
    for (t, q), by_offset in units.items():
        d = root / "consumequeue" / t / str(q)
        files = sorted(os.listdir(d))
        per_file = os.path.getsize(d / files[0]) // 20
        for k, f in enumerate(files[:-1]):
            last = int(f) // 20 + per_file - 1
            if by_offset.get(last, 0) >= new_min:
                break
            cq.add(f"consumequeue/{t}/{q}/{f}")
    idx = set()
    files = broker_read(name)["index"][0]["files"]
    for f in files[:-1]:
        if f["endPhyOffset"] >= new_min:
            break
        idx.add(f"index/{f['name']}")
    return cq, idx


def rel_derived(plan: dict, root: Path, kind: str) -> set:
    return {os.path.relpath(d["path"], root) for d in plan["derivedFiles"] if d["kind"] == kind}


# --- the broker's cleanup, predicted --------------------------------------------------------------------------


@pytest.mark.parametrize("name,version", VERSIONED)
def test_expired_files_at_the_delete_hour_stop_at_the_first_kept_file(store_copy, name, version):
    root = store_copy(name)
    now = local_ms(4)  # deleteWhen "04"
    age_files(root, now, [100] * 5)
    plan = dry_run(root, now, "10%/100G")
    names = commitlog_names(root)
    assert deleted_names(plan) == names[:5]
    assert {f["reason"] for f in plan["commitlogFiles"]} == {"expired"}
    assert plan["minPhyOffsetAfter"] == int(names[5])
    # a young file in the middle: nothing after it goes (no hole)
    age_files(root, now, [100, 100, 1, 100, 100, 100])
    assert deleted_names(dry_run(root, now, "10%/100G")) == names[:2]
    # not the delete hour, disk below diskMaxUsedSpaceRatio: the cleaner does nothing
    age_files(root, now, [100] * 5)
    r = run("reclaim", "--dry-run", "--at", local_ms(10), "--assume-disk", "10%/100G", root)
    assert r.exit_code == 0 and "nothing to remove" in r.stderr
    # disk above diskMaxUsedSpaceRatio (75 %) but below the forced ratio: the expired files only, at any hour
    plan = dry_run(root, local_ms(10), "80%/100G")
    assert deleted_names(plan) == names[:5] and plan["prediction"]["rounds"][0]["trigger"] == ["disk usage"]


@pytest.mark.parametrize("name,version", VERSIONED)
def test_a_full_disk_forces_every_file_but_the_last_in_batches(store_copy, name, version):
    root = store_copy(name)
    now = local_ms(10)
    age_files(root, now, [])  # every file written an hour ago: none expired
    names = commitlog_names(root)
    plan = dry_run(root, now, "95%/100G")  # the freed megabytes leave the disk above 90 %
    assert deleted_names(plan) == names[:-1]  # never the last file
    assert {f["reason"] for f in plan["commitlogFiles"]} == {"forced (disk full)"}
    rounds = [len(r["commitlogFiles"]) for r in plan["prediction"]["rounds"]]
    n = len(names) - 1
    assert rounds == [10] * (n // 10) + ([n % 10] if n % 10 else [])  # DELETE_FILES_BATCH_MAX / deleteFileBatchMax
    cq, idx = expected_derived(name, root, int(names[-1]))
    assert rel_derived(plan, root, "consumequeue") == cq and rel_derived(plan, root, "index") == idx
    assert cq and idx
    # forced cleaning switched off: a full disk deletes only expired files
    conf = root.parent / f"{name}.conf"
    conf.write_text("cleanFileForciblyEnable=false\n")
    assert deleted_names(dry_run(root, now, "95%/100G", "--config", conf)) == []


@pytest.mark.parametrize("name,version", VERSIONED)
def test_forced_cleaning_stops_once_the_disk_is_below_the_forced_ratio(store_copy, name, version):
    root = store_copy(name)
    now = local_ms(10)
    age_files(root, now, [])
    names = commitlog_names(root)
    block = sum(os.stat(root / "commitlog" / n).st_blocks * 512 for n in names[:10])
    total = 5 * block  # 87 % used; the first round frees 20 % (10 files) and more: 67 %, below 75 % too
    plan = dry_run(root, now, f"{int(0.87 * total)}/{total}")
    assert deleted_names(plan) == names[:10]
    assert len([r for r in plan["prediction"]["rounds"] if r["commitlogFiles"]]) == 1


def test_the_batch_setting_and_the_ratio_clamps_are_5_3_3s(store_copy):
    conf_text = "deleteFileBatchMax=4\ndiskSpaceCleanForciblyRatio=95\n"
    now = local_ms(10)
    for name, version in VERSIONED:
        root = store_copy(name)
        age_files(root, now, [])
        conf = root.parent / f"{name}.conf"
        conf.write_text(conf_text)
        plan = dry_run(root, now, "87%/100G", "--config", conf)
        rounds = [len(r["commitlogFiles"]) for r in plan["prediction"]["rounds"] if r["commitlogFiles"]]
        if version >= 5:  # 95 is clamped to 85 %: 87 % forces; batches of 4
            assert rounds[:3] == [4, 4, 4] and len(deleted_names(plan)) == len(commitlog_names(root)) - 1
        else:  # 4.9.3 has neither setting in MessageStoreConfig: forced at 85 % (the system property's default), batches of 10
            assert rounds[:3] == [10, 10, 10]
        # the system property, a fraction: 4.9.3 takes it as it is (87 % is not forced), 5.3.3 clamps it to 85 % too
        conf.write_text("rocketmq.broker.diskSpaceCleanForciblyRatio=0.95\n")
        forced = deleted_names(dry_run(root, now, "87%/100G", "--config", conf))
        assert forced == ([] if version < 5 else commitlog_names(root)[:-1])


@pytest.mark.parametrize("name,version", VERSIONED)
def test_a_full_consume_queue_disk_forces_only_on_5_3_3(store_copy, name, version):
    """Commitlog disk at 80 % (above diskMaxUsedSpaceRatio), consume-queue disk at 87 % (above the forced ratio):
    4.9.3 returns from the commitlog check before looking at the consume queue's disk, so nothing is forced;
    5.3.3 checks both forced ratios first."""
    root = store_copy(name)
    now = local_ms(10)
    age_files(root, now, [100, 100])
    plan = dry_run(root, now, "80%/100G,87%/100G")
    expect = commitlog_names(root)[:2] if version < 5 else commitlog_names(root)[:-1]
    assert deleted_names(plan) == expect


@pytest.mark.parametrize("name,version", VERSIONED)
def test_consumers_lose_what_they_had_not_consumed(store_copy, name, version):
    root = store_copy(name)
    write_offsets(root, version, {"OracleTopicA@GroupA": {0: 100, 1: 57, 3: 0}, "OracleTopicA@GroupB": {0: 831}})
    now = local_ms(4)
    age_files(root, now, [100] * 20)
    plan = dry_run(root, now, "10%/100G")
    new_min = plan["minPhyOffsetAfter"]
    assert new_min == int(commitlog_names(root)[20])
    units: dict = {}
    for e in broker_read(name)["cqe"]:
        units.setdefault((e["topic"], e["queueId"]), []).append((e["queueOffset"], e["phyOffset"]))
    lost = {(r["group"], r["topic"], r["queueId"]): r["unconsumedLost"] for r in plan["consumerLoss"]}
    for group, q, committed in (("GroupA", 0, 100), ("GroupA", 1, 57), ("GroupA", 3, 0), ("GroupB", 0, 831),
                                ("GroupA", 2, 0), ("GroupB", 1, 0)):  # a group's queue without an offset: nothing consumed
        u = sorted(units[("OracleTopicA", q)])
        new_qmin = next((o for o, p in u if p >= new_min), len(u))
        assert lost[(group, "OracleTopicA", q)] == max(0, new_qmin - committed), (group, q)
    assert plan["unconsumedLost"] == sum(lost.values()) > 0
    # applied as the broker would: dump offsets shows each group's new position and what it skips
    r = run("reclaim", "--as-broker", "--at", now, "--assume-disk", "10%/100G", "--yes", root)
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(x) for x in run("dump", "offsets", "--json", root).stdout.splitlines() if x.startswith("{")]
    rows = {(x["group"], x["queueId"]): x for x in rows if x.get("type") == "offset"}
    for (group, _, q), n in lost.items():
        if (group, q) in rows:  # the committed ones (the lost counts above also cover queues without an offset)
            x = rows[(group, q)]
            u = sorted(units[("OracleTopicA", q)])
            assert x["minOffset"] == next((o for o, p in u if p >= new_min), len(u))
            assert x["skipped"] == n and x["nextOffset"] == max(x["committed"], x["minOffset"]), x


# --- policies ----------------------------------------------------------------------------------------------------


def write_offsets(root: Path, version: int, table: dict, delay: dict | None = None) -> None:
    """consumerOffset.json in the broker's own layout (../shared/stores/config-samples): tabs, bare integer keys,
    the map's entries on the line of its brace; delayOffset.json likewise."""
    sample = (SAMPLES / f"consumerOffset-{'4.9.3' if version < 5 else '5.3.3'}.json").read_text()
    head, _, _ = sample.partition('\t"offsetTable":{')
    body = ",\n".join(f'\t\t"{k}":{{' + ",".join(f"{q}:{o}" for q, o in v.items()) + "\n\t\t}" for k, v in table.items())
    tail = sample[sample.index("\n\t}", sample.index('"offsetTable"')):]
    cfg = root / "config"
    cfg.mkdir(exist_ok=True)
    (cfg / "consumerOffset.json").write_text(head + '\t"offsetTable":{\n' + body + tail)
    if delay is not None:
        (cfg / "delayOffset.json").write_text('{\n\t"offsetTable":{' + ",".join(f"{k}:{v}" for k, v in delay.items())
                                              + "\n\t}\n}")


def test_the_config_sample_as_written_by_the_broker_protects_everything(store_copy):
    """GroupA committed 0 on OracleTopicA queue 3 and GroupB read nothing of queues 1-3: nothing can go."""
    root = store_copy("4.9.3-clean")
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "consumerOffset.json").write_bytes((SAMPLES / "consumerOffset-4.9.3.json").read_bytes())
    r = run("reclaim", "--consumed", "--ignore-unread-queues", "--dry-run", "--json", root)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["commitlogFiles"] == []


@pytest.mark.parametrize("name,version", VERSIONED)
def test_consumed_never_deletes_an_unconsumed_message(store_copy, name, version):
    root = store_copy(name)
    table = {"OracleTopicA@GroupA": {0: 400, 1: 60, 2: 50, 3: 55}, "OracleTopicA@GroupB": {0: 500, 1: 70, 2: 52, 3: 61},
             "oracle_topic-B%x@GroupB": {0: 45, 1: 40, 2: 12, 3: 33}}
    write_offsets(root, version, table, delay={18: 9})
    units: dict = {}
    for e in broker_read(name)["cqe"]:
        units.setdefault((e["topic"], e["queueId"]), []).append((e["queueOffset"], e["phyOffset"]))
    committed: dict = {}
    for key, queues in table.items():
        for q, o in queues.items():
            t = key.split("@")[0]
            committed[(t, q)] = min(o, committed.get((t, q), o))
    committed[("SCHEDULE_TOPIC_XXXX", 17)] = 9
    unconsumed = min(p for k, c in committed.items() for o, p in units[k] if o >= c)
    names = commitlog_names(root)
    sizes = os.path.getsize(root / "commitlog" / names[0])
    expect = [n for n in names[:-1] if int(n) + sizes <= unconsumed]
    expect = expect[:next((i for i, n in enumerate(expect) if n != names[i]), len(expect))]
    r = run("reclaim", "--consumed", "--ignore-unread-queues", "--dry-run", "--json", root)
    plan = json.loads(r.stdout.splitlines()[0])
    assert deleted_names(plan) == expect and len(expect) > 2, (unconsumed, expect)
    assert plan["unconsumedLost"] == 0
    # without --ignore-unread-queues the LongTopic queues (no group reads them) keep their files
    r2 = run("reclaim", "--consumed", "--dry-run", "--json", root)
    first_long = min(p for (t, q), u in units.items() if t.startswith("LongTopic") for _, p in u)
    assert all(f["start"] + f["size"] <= first_long for f in json.loads(r2.stdout.splitlines()[0])["commitlogFiles"])
    # applied: verify clean, and no group is moved by the next pull
    r3 = run("reclaim", "--consumed", "--ignore-unread-queues", "--yes", root)
    assert r3.exit_code == 0, r3.stderr
    assert commitlog_names(root) == names[len(expect):]
    rows = [json.loads(x) for x in run("dump", "offsets", "--json", root).stdout.splitlines() if x.startswith("{")]
    rows = [x for x in rows if x.get("type") == "offset"]
    assert rows and all(x["skipped"] == 0 for x in rows), rows


def _digest(root: Path) -> dict:
    out = {}
    for dp, _, fn in os.walk(root):
        for f in fn:
            p = os.path.join(dp, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean", "4.9.3-ext"])
def test_move_to_then_restore_gives_back_the_store_byte_for_byte(store_copy, tmp_path, name):
    root = store_copy(name)
    before = _digest(root)
    dest = tmp_path / "elsewhere"
    names = commitlog_names(root)
    cq, idx = expected_derived(name, root, int(names[-6]))
    r = run("reclaim", "--keep-files", 6, "--move-to", dest, root)
    assert r.exit_code == 0, r.stderr
    kept = commitlog_names(root)
    assert kept == names[-6:]
    gone = set(before) - set(_digest(root))
    assert {g for g in gone if g.startswith("consumequeue/")} == cq
    assert {g for g in gone if g.startswith("index/")} == idx
    assert not any(g.startswith("consumequeue_ext/") for g in gone)  # one ext file per queue: its first unit kept lies in it
    # the broker would load the kept files: min offset = the first kept file's
    s = json.loads(run("dump", "store", "--json", root).stdout)
    assert s["minPhyOffset"] == int(kept[0])
    # the broker's next start (recover's plan): the log from the first kept file, every queue from its first unit
    # at or past it, nothing to repair (a 5.3.3 start only writes confirmPhyOffset, housekeeping)
    rec = [json.loads(x) for x in run("recover", "--dry-run", "--json", root).stdout.splitlines() if x.startswith("{")]
    plan = next(o for o in rec if "actions" in o)
    assert all(a.get("housekeeping") for a in plan["actions"]) and not plan.get("queueRepairs"), plan
    summary = next(o for o in rec if o.get("type") == "recover")
    assert summary["minPhyOffset"] == int(kept[0])
    units: dict = {}
    for e in broker_read(name)["cqe"]:
        units.setdefault((e["topic"], e["queueId"]), []).append((e["queueOffset"], e["phyOffset"]))
    for q in summary["queues"]:
        u = sorted(units[(q["topic"], q["queueId"])])
        assert q["minOffset"] == next((o for o, p in u if p >= int(kept[0])), len(u)), q
    r = run("restore", dest)
    assert r.exit_code == 0, r.stderr
    assert _digest(root) == before


@pytest.mark.parametrize("name,version", VERSIONED)
@pytest.mark.parametrize("policy", [["--as-broker", "--at", "AT", "--assume-disk", "95%/100G"], ["--keep-files", "3"],
                                    ["--free", "1M"], ["--before", "BEFORE"]])
def test_every_policy_ends_with_verify_clean(store_copy, name, version, policy):
    root = store_copy(name)
    now = local_ms(10)
    age_files(root, now, [])
    clmsg = broker_read(name)["clmsg"]
    before_ms = clmsg[len(clmsg) // 2]["msg"]["storeTimestamp"]
    args = [str(now) if a == "AT" else str(before_ms) if a == "BEFORE" else a for a in policy]
    names = commitlog_names(root)
    allocated = [os.stat(root / "commitlog" / n).st_blocks * 512 for n in names]  # what deleting a file frees
    r = run("reclaim", *args, root)
    assert r.exit_code == 2 and "--yes" in r.stderr and commitlog_names(root) == names  # nothing without a choice
    r = run("reclaim", *args, "--yes", root)
    assert r.exit_code == 0, r.stderr
    kept = commitlog_names(root)
    assert kept == names[len(names) - len(kept):] and 1 <= len(kept) < len(names)  # oldest first, no hole
    if policy[0] == "--keep-files":
        assert len(kept) == 3
    if policy[0] == "--free":
        gone = len(names) - len(kept)
        assert sum(allocated[:gone]) >= 1 << 20 > sum(allocated[:gone - 1])
    if policy[0] == "--before":  # every record of a deleted file is older; the first kept file holds a younger one
        first_kept = int(kept[0])
        assert all(m["msg"]["storeTimestamp"] < before_ms for m in clmsg if m["offset"] < first_kept)
        assert any(m["msg"]["storeTimestamp"] >= before_ms for m in clmsg if first_kept <= m["offset"] < first_kept + 65536)
    v = run("verify", root)
    assert v.exit_code == 0, v.stdout + v.stderr


# --- refusals -----------------------------------------------------------------------------------------------------


def test_a_store_a_broker_holds_is_refused(store_copy):
    from tests.test_live_broker import Broker

    root = store_copy("4.9.3-clean")
    b = Broker(root)
    try:
        before = tree_digest(root)
        for args in (["--keep-files", "2", "--yes"], ["--consumed", "--ignore-unread-queues", "--yes"],
                     ["--as-broker", "--assume-disk", "95%/1T", "--yes"], ["--free", "1M", "--move-to", root.parent / "mv"]):
            r = run("reclaim", *args, root)
            assert r.exit_code == 4, (args, r.stderr)
        assert tree_digest(root) == before and not (root.parent / "mv").exists()
    finally:
        b.stop()


def test_other_layouts_are_refused(tmp_path):
    for name, what in (("lmq-5.3.3", "LMQ"), ("timer-5.3.3", "timer"), ("batchcq-5.3.3", "batch"),
                       ("rocksdbcq-5.3.3", "RocksDB")):
        root = copy_store(name, tmp_path / name)
        before = tree_digest(root)
        r = run("reclaim", "--keep-files", "1", "--yes", root)
        assert r.exit_code == 3 and what in r.stderr, (name, r.stderr)
        assert tree_digest(root) == before


def test_dry_run_and_the_predictions_in_dump_store_and_stats_change_nothing(store_copy, monkeypatch):
    root = store_copy("5.3.3-clean")
    now = local_ms(4)
    age_files(root, now, [100] * 7)
    before = tree_digest(root)
    plan = dry_run(root, now, "40%/100G")
    monkeypatch.setenv("RMQSTORE_CLEANUP_NOW", str(now))
    monkeypatch.setenv("RMQSTORE_CLEANUP_DISK", "40%/100G")
    s = json.loads(run("dump", "store", "--json", root).stdout)["nextCleanup"]
    assert [c.split(" ")[0] for c in s["commitlogFiles"]] == deleted_names(plan) == commitlog_names(root)[:7]
    st = json.loads(run("stats", "--json", root).stdout)["nextCleanup"]
    assert st["minPhyOffsetAfter"] == plan["minPhyOffsetAfter"] == int(commitlog_names(root)[7])
    assert "broker's next cleanup" in run("dump", "store", root).stdout
    assert tree_digest(root) == before


def test_ext_files_follow_the_first_unit_kept(tmp_path):
    """ConsumeQueueExt.truncateByMinAddress, on files made here: 10-unit queue files whose units point at ext
    units 25 bytes apart in 100-byte ext files. Commitlog min 1050: the first queue file (last unit at 900) goes;
    the first unit kept (phy 1100) has its ext unit at 275, so the ext files ending at 100 and 200 go, not the
    one ending at 300."""
    import struct
    from types import SimpleNamespace

    from rmqstore_cli.formats.extaddr import decorate
    from rmqstore_cli.engine.config.storeconfig import StoreConfig
    from rmqstore_cli.engine.repair.cleanup import DerivedCleaner

    root = tmp_path / "s"
    cq = root / "consumequeue" / "T" / "0"
    ext = root / "consumequeue_ext" / "T" / "0"
    cq.mkdir(parents=True)
    ext.mkdir(parents=True)
    for f in range(2):
        units = b"".join(struct.pack(">qiq", 100 * i, 100, decorate(25 * i)) for i in range(10 * f, 10 * f + 10))
        (cq / ("%020d" % (200 * f))).write_bytes(units)
    for f in range(5):
        (ext / ("%020d" % (100 * f))).write_bytes(bytes(100))
    cfg = StoreConfig(mappedFileSizeConsumeQueue=200, mappedFileSizeConsumeQueueExt=100, enableConsumeQueueExt=True)
    store = SimpleNamespace(root=str(root), config=cfg, queues=lambda: [("T", 0)])
    got = DerivedCleaner(store).behind(1050)
    assert [(d.kind, d.name) for d in got] == [("consumequeue", "%020d" % 0), ("consumequeue_ext", "%020d" % 0),
                                               ("consumequeue_ext", "%020d" % 100)]
    # a min inside the first file: no queue file goes, the ext files before the unit at 575 do
    got = DerivedCleaner(store).behind(650)
    assert [(d.kind, d.name) for d in got] == [("consumequeue_ext", "%020d" % 0)]
    # the first file goes only once its last unit (phy 900) is below the min, not at it
    assert [d.name for d in DerivedCleaner(store).behind(900) if d.kind == "consumequeue"] == []
    assert [d.name for d in DerivedCleaner(store).behind(901) if d.kind == "consumequeue"] == ["%020d" % 0]
    # never the last queue file, whatever the min
    assert [d.name for d in DerivedCleaner(store).behind(1 << 40) if d.kind == "consumequeue"] == ["%020d" % 0]


def test_index_files_go_while_their_end_offset_is_below_the_min_never_the_last(tmp_path):
    """IndexService.deleteExpiredFile on index files made here (only the header's endPhyOffset is read)."""
    import struct
    from types import SimpleNamespace

    from rmqstore_cli.engine.config.storeconfig import StoreConfig
    from rmqstore_cli.engine.repair.cleanup import DerivedCleaner

    idx = tmp_path / "s" / "index"
    idx.mkdir(parents=True)
    names = ["20261124010000000", "20261124020000000", "20261124030000000"]
    for n, end in zip(names, (100, 200, 300)):
        (idx / n).write_bytes(struct.pack(">qqqqii", 1, 2, end - 100, end, 1, 1) + bytes(64))
    store = SimpleNamespace(root=str(tmp_path / "s"), config=StoreConfig(), queues=lambda: [])
    assert [d.name for d in DerivedCleaner(store).behind(200)] == names[:1]  # 200 is not below 200
    assert [d.name for d in DerivedCleaner(store).behind(10_000)] == names[:2]  # the last stays


def test_bad_options_are_one_line_and_change_nothing(store_copy):
    root = store_copy("4.9.3-clean")
    before = tree_digest(root)
    for args in (["--assume-disk", "foo", "--dry-run"], ["--free", "abc", "--yes"], ["--keep-files", "0", "--yes"],
                 ["--before", "garbage", "--yes"], ["--keep-files", "2", "--move-to", root / "inside"],
                 ["--keep-files", "2", "--yes", "--move-to", root.parent / "x"], ["--consumed", "--free", "1G"], []):
        r = run("reclaim", *args, root)
        assert r.exit_code == 3, (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.strip().splitlines()[-1].startswith("rmqstore: "), r.stderr
    assert tree_digest(root) == before and not (root / "inside").exists()
