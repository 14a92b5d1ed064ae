"""verify notices a dropped index entry (IDX_MISSING): every record the broker indexes (transaction type NOT,
PREPARED, COMMIT; one entry per UNIQ_KEY and KEYS token) below the last index file's endPhyOffset must hold all
its entries, since the broker never indexes such a record again (IndexService.buildIndex). An entry is removed
here the way a writer that skipped it would have left the file (later entries renumbered, chains and slots
relinked, counts fixed), so no other check sees anything; broker-written stores get no IDX_MISSING; -j 2 says
what -j 1 says; recover and rebuild whose index writer drops a key end with the finding."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from rmqstore_cli.engine.derived import indexwriter
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify import commitlog as verify_commitlog
from rmqstore_cli.engine.verify import filechecks
from rmqstore_cli.engine.verify import pipeline
from rmqstore_cli.engine.verify.pipeline import verify_store, verify_store_jobs
from tests.conftest import STORES, json_lines, tree_digest
from tests.fuzzlib import _make_runner

_HEADER = struct.Struct(">qqqqii")  # begin/end timestamp, begin/end phyOffset, hashSlotCount, indexCount (§10.1)
_ENTRY = np.dtype([("keyHash", ">i4"), ("phyOffset", ">i8"), ("timeDiff", ">i4"), ("prevIndex", ">i4")])
ALL_STORE_ROOTS = sorted(str(p.relative_to(STORES)) for p in STORES.glob("*/store*") if p.is_dir()) if STORES.is_dir() else []

_runner = None


def _cli(*args) -> tuple[int, str]:
    global _runner
    if _runner is None:
        _runner = _make_runner()
    res = _runner.invoke(None, list(args), env={"COLUMNS": "200"})
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.stdout


def _geometry(root) -> list[tuple[str, int, int]]:
    """(path, hash slots, entries) of each index file, in name order."""
    with Store.open(str(root)) as st:
        return [(f.path, f.slots, f.entries) for f in st.index.files]


def _drop_entry(path: str, slots: int, entries: int, e: int) -> int:
    """Remove entry ``e`` (not the first or last) of an index file as if it had never been put: the later entries
    move down one number, links and slot heads to ``e`` go to ``e``'s own predecessor, links and heads above ``e``
    drop by one, the freed last entry is zeroed, indexCount and hashSlotCount follow. Returns the phyOffset the
    entry pointed at."""
    data = bytearray(open(path, "rb").read())
    begin_ts, end_ts, begin_phy, end_phy, _, count = _HEADER.unpack_from(data, 0)
    assert 1 < e < count - 1
    base = _HEADER.size + slots * 4
    slot = np.frombuffer(data, ">i4", slots, _HEADER.size).astype(np.int64)
    ent = np.frombuffer(data, _ENTRY, count, base).copy()
    gone = ent[e].copy()
    ent = np.delete(ent, e)

    def relink(v: np.ndarray) -> np.ndarray:
        return np.where(v == e, int(gone["prevIndex"]), np.where(v > e, v - 1, v))

    ent["prevIndex"] = relink(ent["prevIndex"].astype(np.int64))
    slot = relink(slot)
    data[_HEADER.size:base] = slot.astype(">i4").tobytes()
    data[base:base + count * _ENTRY.itemsize] = ent.tobytes() + bytes(_ENTRY.itemsize)
    _HEADER.pack_into(data, 0, begin_ts, end_ts, begin_phy, end_phy, int(np.count_nonzero(slot)), count - 1)
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    return int(gone["phyOffset"])


def _dropped(store_copy, name: str = "4.9.3-clean", which: int = -1) -> tuple:
    """A copy of ``name`` with one entry removed from the middle of index file ``which`` (never the first of
    several: a file left behind full is where the index geometry is read from); (root, the record's phyOffset)."""
    root = store_copy(name, f"{name}-dropped")
    files = _geometry(root)
    path, slots, entries = files[which if len(files) == 1 or which % len(files) else -1]
    count = _HEADER.unpack_from(open(path, "rb").read(_HEADER.size), 0)[5]
    return root, _drop_entry(path, slots, entries, count // 2)


def _codes(findings) -> set:
    return {f["code"] if isinstance(f, dict) else f.code for f in findings}


def test_a_removed_entry_is_reported(store_copy):
    root, phy = _dropped(store_copy, which=3)
    before = tree_digest(root)
    code, out = _cli("verify", str(root), "--json")
    assert code == 1
    found = [o for o in json_lines(out) if o.get("code") == "IDX_MISSING"]
    assert len(found) == 1, out
    f = found[0]
    assert f["severity"] == "error" and f["phyOffset"] == phy and f["missingEntries"] == 1 and f["count"] == 1, f
    # the entry was removed cleanly: nothing but the coverage check notices
    assert _codes(o for o in json_lines(out) if "code" in o) == {"IDX_MISSING"}, out
    assert tree_digest(root) == before


@pytest.mark.parametrize("name", ["5.3.3-clean", "lmq-5.3.3", "dledger-4.9.3-clean"])
def test_a_removed_entry_is_reported_on_other_layouts(store_copy, name):
    root, phy = _dropped(store_copy, name)
    with Store.open(str(root)) as st:
        res = verify_store(st)
    found = [f for f in res.findings if f.code == "IDX_MISSING"]
    assert len(found) == 1 and found[0].extra["phyOffset"] == phy and res.exit_code == 1, res.findings


def test_every_broker_written_store_is_covered():
    assert {"4.9.3-clean/store", "4.9.3-crash/store", "5.3.3-clean/store", "lmq-5.3.3/store", "batchcq-5.3.3/store",
            "timer-5.3.3-crash/store", "dledger-4.9.3-torn/store-torn"} <= set(ALL_STORE_ROOTS)


@pytest.mark.parametrize("rel", ALL_STORE_ROOTS)
def test_broker_written_stores_lack_no_entry(rel):
    with Store.open(str(STORES / rel)) as st:
        res = verify_store(st)
    assert "IDX_MISSING" not in _codes(res.findings), [f.as_json() for f in res.findings if f.code == "IDX_MISSING"]


@pytest.mark.parametrize("shared_checks", [False, True])
def test_jobs_equal_one_process(store_copy, monkeypatch, shared_checks):
    """Several windows per segment (the dropped record's window checked in a worker), and two dropped entries in
    different files: the first one and the totals are the same as in one process; with the index files' own
    checks built here or shared out among the workers."""
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 7000)
    monkeypatch.setattr(filechecks, "MIN_PARALLEL_BYTES", 0 if shared_checks else 1 << 62)
    root, phy = _dropped(store_copy, which=5)
    path, slots, entries = _geometry(root)[12]
    count = _HEADER.unpack_from(open(path, "rb").read(_HEADER.size), 0)[5]
    _drop_entry(path, slots, entries, count // 3)

    def run(jobs):
        with Store.open(str(root)) as st:
            res = verify_store_jobs(st, jobs)
        return [f.as_json() for f in res.findings], res.summary, res.exit_code

    one = run(1)
    assert run(2) == one
    found = [f for f in one[0] if f["code"] == "IDX_MISSING"]
    assert found and found[0]["phyOffset"] == phy and found[0]["missingEntries"] == 2 and found[0]["count"] == 2


def test_whole_log_formulation_agrees(store_copy):
    """The formulation a distributed verify (or overlapping segments) takes reports the same finding."""
    root, phy = _dropped(store_copy)
    with Store.open(str(root)) as st:
        whole = pipeline._verify_whole_log(st)
    with Store.open(str(root)) as st:
        windows = verify_store(st)
    pick = lambda res: [f.as_json() for f in res.findings if f.code == "IDX_MISSING"]  # noqa: E731
    assert pick(whole) == pick(windows) and pick(whole)[0]["phyOffset"] == phy


def _drop_one_key(monkeypatch) -> list:
    """The index writer skips one key: the middle one of the first batch of keys it writes at once."""
    real = indexwriter._OpenIndex.put_many
    done: list = []

    def put_many(self, hashes, phys, tss):
        if not done and len(hashes) >= 3:
            k = len(hashes) // 2
            done.append(int(phys[k]))
            hashes, phys, tss = (np.delete(np.asarray(v), k) for v in (hashes, phys, tss))
        return real(self, hashes, phys, tss)

    monkeypatch.setattr(indexwriter._OpenIndex, "put_many", put_many)
    return done


def test_recover_whose_writer_drops_a_key_ends_in_findings(store_copy, monkeypatch):
    import shutil

    root = store_copy("4.9.3-crash", "crash")
    shutil.rmtree(root / "consumequeue")  # every record re-dispatched: the index writer is called
    done = _drop_one_key(monkeypatch)
    code, out = _cli("recover", str(root), "--backup-dir", f"{root}.bak", "--json")
    assert done, "the index writer was never called"
    verify = next(o for o in json_lines(out) if o.get("type") == "verify")
    assert code == 1, verify
    missing = [f for f in verify["findings"] if f["code"] == "IDX_MISSING"]
    assert missing and missing[0]["phyOffset"] == done[0], verify


def test_rebuild_whose_writer_drops_a_key_ends_in_findings(store_copy, monkeypatch):
    root = store_copy("5.3.3-clean", "rebuild")
    done = _drop_one_key(monkeypatch)
    code, out = _cli("rebuild", "index", str(root), "--backup-dir", f"{root}.bak", "--yes", "--json")
    assert done, "the index writer was never called"
    assert code == 1, out
    verify = next(o for o in json_lines(out) if o.get("type") == "verify")
    missing = [f for f in verify["findings"] if f["code"] == "IDX_MISSING"]
    assert missing and missing[0]["phyOffset"] == done[0], verify


def test_rebuild_without_a_fault_is_clean(store_copy):
    root = store_copy("5.3.3-clean", "rebuild-control")
    code, out = _cli("rebuild", "index", str(root), "--backup-dir", f"{root}.bak", "--yes", "--json")
    assert code == 0, out


def test_with_abort_the_files_the_next_start_deletes_are_not_needed(store_copy):
    """4.9.3-crash (abort left): the broker's abnormal start deletes the index files newer than the checkpoint's
    indexMsgTimestamp and indexes again from the end of the last one it keeps (§10.6). An entry missing from a
    doomed file is no loss; one missing from a kept file is."""
    root = store_copy("4.9.3-crash", "doomed")
    index_ts = struct.unpack_from(">q", open(root / "checkpoint", "rb").read(24), 16)[0]
    files = _geometry(root)
    ends = [_HEADER.unpack_from(open(p, "rb").read(_HEADER.size), 0)[1] for p, _, _ in files]
    doomed = [k for k, t in enumerate(ends) if t > index_ts]
    assert doomed and doomed[0] > 1, (index_ts, ends)
    path, slots, entries = files[doomed[-1]]
    count = _HEADER.unpack_from(open(path, "rb").read(_HEADER.size), 0)[5]
    _drop_entry(path, slots, entries, count // 2)
    with Store.open(str(root)) as st:
        assert "IDX_MISSING" not in _codes(verify_store(st).findings)
    path, slots, entries = files[1]
    count = _HEADER.unpack_from(open(path, "rb").read(_HEADER.size), 0)[5]
    phy = _drop_entry(path, slots, entries, count // 2)
    with Store.open(str(root)) as st:
        found = [f for f in verify_store(st).findings if f.code == "IDX_MISSING"]
    assert len(found) == 1 and found[0].extra["phyOffset"] == phy


def test_an_index_behind_the_log_is_not_missing_entries(store_copy):
    """The newest index files deleted: the records after the end of the last one left are what the broker's next
    start indexes (they are past its endPhyOffset), not entries missing."""
    root = store_copy("4.9.3-clean", "behind")
    files = _geometry(root)
    for path, _, _ in files[-3:]:
        (root / "index" / path.rsplit("/", 1)[1]).unlink()
    with Store.open(str(root)) as st:
        res = verify_store(st)
    assert "IDX_MISSING" not in _codes(res.findings), [f.as_json() for f in res.findings]


@pytest.mark.parametrize("name,jobs", [("4.9.3-clean", "1"), ("5.3.3-clean", "1"), ("4.9.3-clean", "2")])
def test_recover_rebuilds_an_index_file_that_lacks_an_entry(store_copy, name, jobs):
    """The broker never indexes a record below the index's end again: recover rebuilds the file that lacks the
    entry (and the ones after it) from the commitlog, and the store verifies clean after it."""
    root, phy = _dropped(store_copy, name, which=0)
    code, out = _cli("recover", str(root), "--backup-dir", f"{root}.bak", "--json", "-j", jobs)
    assert code == 0, out
    verify = next(o for o in json_lines(out) if o.get("type") == "verify")
    assert not verify["findings"], verify
    with Store.open(str(root)) as st:
        res = verify_store(st)
    assert res.exit_code == 0 and not res.findings, res.findings


def test_recover_indexes_what_the_crash_start_leaves_out(store_copy):
    """An abnormal start deletes the index files newer than indexMsgTimestamp but indexes again only what its walk
    re-dispatches (from the checkpoint's file): the records between the last kept file's end and the walk would be
    in no index file. recover indexes them again from the kept files' end; the store verifies clean after it."""
    import os
    import struct as st_

    root = store_copy("5.3.3-v2topic", "crash-index")
    with Store.open(str(root)) as st:
        files = [f for f in st.index.files if f.complete]
        last = files[-1].header()
        walk_from = st.commitlog.segments.segments[-1].start
    assert len(files) > 1 and last.beginPhyOffset < walk_from  # the deleted file reaches back before the walk
    open(root / "abort", "wb").close()
    with open(root / "checkpoint", "r+b") as f:
        # physic/logics past every record (the walk starts at the last file); indexMsgTimestamp just before the last
        # index file's end (the crash start deletes it)
        f.write(st_.pack(">qqq", last.endTimestamp + 60_000, last.endTimestamp + 60_000, last.endTimestamp - 1))
    code, out = _cli("recover", str(root), "--backup-dir", f"{root}.bak", "--json")
    plan = next(o for o in json_lines(out) if o.get("type") == "recover-plan")
    assert plan["indexDeleted"] == [os.path.basename(files[-1].path)]
    assert plan["commitlog"]["startOffset"] == walk_from, plan["commitlog"]  # the broker re-dispatches from there
    assert plan["dispatch"]["from"] <= last.beginPhyOffset, plan["dispatch"]  # ours indexes again from the kept end
    verify = next(o for o in json_lines(out) if o.get("type") == "verify")
    assert code == 0 and not verify["findings"], verify
    with Store.open(str(root)) as st:
        res = verify_store(st)
    assert res.exit_code == 0 and not res.findings, res.findings
