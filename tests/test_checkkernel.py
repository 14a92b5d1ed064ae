"""formats.checkkernel, verify's compiled window cross-checks, against the rules it filters for.

The kernels decide which consume-queue units and index entries of a window reach the Python rules
(``verify.queues.check_found_units``, ``verify.index.check_found_entries``) and which found no record.
Reference here: numpy's offset lookup (``_Records.lookup``, what the whole-log formulation uses) and the
rules themselves, run on every reference of every window of the broker-written stores, undamaged and with
seeded damage (the verify-memory damage and the fuzz suite's derived-file classes), in small windows:
- the same references found no record, the same records are marked, the same highest queue offset / entry
  and end of the furthest record;
- the rules report nothing for all the references the kernel let pass, taken together;
- the rules report something for each flagged one on its own (except the kernel's documented extras:
  units whose tagsCode is an ext address, entries whose time offset is 2**53 ms or more).
Reproduce with RMQSTORE_CHECKKERNEL_SEED=<seed>; RMQSTORE_FUZZ_CASES bounds the fuzz cases.
"""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest

from rmqstore_cli.formats import checkkernel, entrykernel
from rmqstore_cli.formats.extaddr import MAX_ADDR
from rmqstore_cli.formats.indexchain import chain_block_reference
from rmqstore_cli.formats.records import CQ_FILLER, CQ_UNIT_SIZE, INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify import commitlog as verify_commitlog
from rmqstore_cli.engine.verify.index import check_found_entries
from rmqstore_cli.engine.verify.queues import _QueueFiles, _QueueScan, check_found_units
from rmqstore_cli.engine.verify.records import _Agg, _Records
from rmqstore_cli.engine.verify.windows import Windows
from tests import fuzzlib
from tests.conftest import STORE_NAMES, copy_store
from tests.test_verify_memory import _damage_index, _damage_queues

SEED = int(os.environ.get("RMQSTORE_CHECKKERNEL_SEED", random.randrange(1 << 30)))
FUZZ_CASES = min(int(os.environ.get("RMQSTORE_FUZZ_CASES", "12")), 12)
WINDOW = 1 << 20  # several windows per broker-written segment


def _queue_problems(st, windows: Windows, w: int, recs: _Records) -> list[str]:
    probs = []
    ext_on = st.config.enableConsumeQueueExt
    marks_k = np.zeros(len(recs), bool)
    marks_ref = np.zeros(len(recs), bool)
    for topic, qid in st.queues():
        cq = st.queue(topic, qid)
        ext = st.ext(topic, qid) if ext_on else None
        files = _QueueFiles(cq)
        for seg, n in files.valid_files():
            if not n:
                continue
            qofs, phy, size, tags = files.units(seg, n)
            where = f"{topic}/{qid} file {seg.name} window {w}"
            nf, fl, fr, last_q, end = checkkernel.queue_window(files.unit_bytes(seg), 0, n, seg.start // CQ_UNIT_SIZE,
                                                               *windows.bounds(w), recs, recs.topic_ids.get(topic, -1), qid,
                                                               ext is not None, MAX_ADDR, marks_k)
            filler = (phy == CQ_FILLER[0]) & (size == CQ_FILLER[1]) & (tags == CQ_FILLER[2])
            sel = np.flatnonzero(~filler & (windows.of(phy) == w))
            idx, found = recs.lookup(phy[sel])
            if nf.tolist() != sel[~found].tolist():
                probs.append(f"{where}: units without a record {nf.tolist()}, numpy {sel[~found].tolist()}")
            u, ri = sel[found], idx[found]
            marks_ref[ri] = True
            want_q = int(qofs[u].max()) if len(u) else -1
            want_end = int((phy[u] + recs.c["size"][ri]).max()) if len(u) else -1
            if (last_q, end) != (want_q, want_end):
                probs.append(f"{where}: last queue offset / end {(last_q, end)}, numpy {(want_q, want_end)}")
            by_unit = dict(zip(u.tolist(), ri.tolist()))
            if any(by_unit.get(j) != r for j, r in zip(fl.tolist(), fr.tolist())):
                probs.append(f"{where}: flagged units' records {list(zip(fl.tolist(), fr.tolist()))} differ from numpy's")
                continue
            passed = np.asarray(sorted(set(u.tolist()) - set(fl.tolist())), np.int64)
            scan = _QueueScan(topic, qid, ext)
            check_found_units(cq, scan, qofs[passed], phy[passed], size[passed], tags[passed],
                              np.asarray([by_unit[j] for j in passed.tolist()], np.int64), recs)
            if scan.agg.first:
                probs.append(f"{where}: units the kernel let pass have findings {[f.as_json() for f in scan.agg.findings()]}")
            for j, r in zip(fl.tolist(), fr.tolist()):
                one = _QueueScan(topic, qid, ext)
                check_found_units(cq, one, qofs[[j]], phy[[j]], size[[j]], tags[[j]], np.asarray([r]), recs)
                via_ext = ext is not None and tags[j] <= MAX_ADDR and not recs.c["tagsBad"][r]
                if not one.agg.first and not via_ext:
                    probs.append(f"{where}: unit {int(qofs[j])} flagged, but the rules find nothing")
    if not np.array_equal(marks_k, marks_ref):
        probs.append(f"window {w}: marked records differ at {np.flatnonzero(marks_k != marks_ref)[:10].tolist()}")
    return probs


def _queue_file_problems(st, windows: Windows, step: int) -> list[str]:
    """checkkernel.queue_file against numpy over each consume-queue file (before the walk)."""
    probs = []
    for topic, qid in st.queues():
        files = _QueueFiles(st.queue(topic, qid))
        for seg, n in files.valid_files():
            qofs, phy, size, tags = files.units(seg, n)
            got = checkkernel.queue_file(files.unit_bytes(seg), n, windows.starts, step)
            filler = (phy == CQ_FILLER[0]) & (size == CQ_FILLER[1]) & (tags == CQ_FILLER[2])
            real = np.flatnonzero(~filler)
            k = windows.of(phy[real])
            before = k < 0
            want = (int(filler.sum()), int(np.flatnonzero(filler)[0]) if filler.any() else -1, len(real),
                    int(phy[real].max()) if len(real) else None,
                    (int(k[~before].min()), int(k.max())) if not before.all() else (None, None), real[before].tolist())
            if got[:5] + (got[5].tolist(),) != want:
                probs.append(f"{topic}/{qid} {seg.name}: {got[:5]} {got[5][:5]}, numpy {want[:5]} {want[5][:5]}")
            at = np.arange(0, len(real), step)
            samples = (k[at].tolist(), real[at].tolist()) if np.all(k[1:] >= k[:-1]) else None
            if (None if got[6] is None else (got[6][0].tolist(), got[6][1].tolist())) != samples:
                probs.append(f"{topic}/{qid} {seg.name}: samples differ from numpy's")
            # the same pass finding where the valid units end (numpy's rule in valid_files) and the ext references
            arr = files.cq.file_units(seg)
            n_k, got_k, low = checkkernel.queue_file_valid(arr.view(np.uint8), len(arr), windows.starts, step, MAX_ADDR)
            low_ref = tags[tags <= MAX_ADDR]
            if n_k != n or (low, got_k[:5]) != (int(low_ref.max()) if len(low_ref) else None, got[:5]) \
                    or got_k[5].tolist() != got[5].tolist():
                probs.append(f"{topic}/{qid} {seg.name}: valid units {n_k} / ext {low} / {got_k[:5]}, numpy {n} / "
                             f"{low_ref.max() if len(low_ref) else None} / {got[:5]}")
    return probs


def _index_problems(st, windows: Windows, w: int, recs: _Records) -> list[str]:
    probs = []
    for f in st.index.files:
        if not f.complete:
            continue
        h = f.header()
        count = min(max(h.indexCount, 1), f.entries)
        if count <= 1:
            continue
        ent = f.entry_table(count)[1:count]
        kh, phy, diff = ent["keyHash"].astype(np.int32), ent["phyOffset"].astype(np.int64), ent["timeDiff"].astype(np.int32)
        raw = f.entry_table(count).view(np.uint8)
        where = f"{f.name} window {w}"
        # the entry pass before the walk, in blocks (the second starts mid-file), against numpy
        last = np.zeros(f.slots, np.int32)
        prev_phy, bad, neg, before, reach, ooo = None, [], [], [], [], None
        for a, b in ((1, max(2, count // 2)), (max(2, count // 2), count)):
            if a >= b:
                continue
            blk = entrykernel.index_entries(raw, a, b, f.slots, windows.starts, last, prev_phy)
            prev_phy = blk.last_phy
            bad += list(zip(blk.bad_pos.tolist(), blk.bad_exp.tolist(), blk.bad_prev.tolist()))
            neg += list(zip(blk.neg_pos.tolist(), blk.neg_kh.tolist()))
            before += list(zip(blk.before_pos.tolist(), blk.before_phy.tolist()))
            reach.append(blk.windows)
            ooo = ooo or blk.out_of_order
            if (blk.first_phy, blk.last_phy) != (int(phy[a - 1]), int(phy[b - 2])):
                probs.append(f"{f.name}: block {a}..{b} first/last offsets {(blk.first_phy, blk.last_phy)}")
        ref_bad, ref_exp, ref_table = chain_block_reference(kh, ent["prevIndex"].astype(np.int32), 1, f.slots)
        prv = ent["prevIndex"].astype(np.int64)
        if bad != list(zip((ref_bad + 1).tolist(), ref_exp.tolist(), prv[ref_bad].tolist())) or not np.array_equal(last, ref_table):
            probs.append(f"{f.name}: slot chains differ from the reference ({bad[:3]})")
        k_neg = np.flatnonzero(kh < 0)
        if neg != list(zip((k_neg + 1).tolist(), kh[k_neg].tolist())):
            probs.append(f"{f.name}: negative key hashes {neg[:3]}, numpy {k_neg[:3] + 1}")
        kw = windows.of(phy)
        b_at = np.flatnonzero(kw < 0)
        if before != list(zip((b_at + 1).tolist(), phy[b_at].tolist())):
            probs.append(f"{f.name}: entries before the first window differ from numpy's")
        down = np.flatnonzero(phy[:-1] > phy[1:])[:1].tolist()
        want_ooo = (down[0] + 1, int(phy[down[0]]), down[0] + 2, int(phy[down[0] + 1])) if down else None
        if ooo != want_ooo:
            probs.append(f"{f.name}: first entry out of order {ooo}, numpy {want_ooo}")
        half = max(1, count // 2 - 1)
        for part, rng in zip(reach, (kw[:half], kw[half:])):
            ok = rng[rng >= 0]
            if len(rng) and part != ((int(ok.min()), int(rng.max())) if len(ok) else None):
                probs.append(f"{f.name}: windows reached {part}, numpy {ok.min() if len(ok) else None}..{rng.max()}")
        # the window pass: entries 1 .. count-1 against window w, against numpy's lookup
        (nf, nf_phy), (fl, fr, fkh, fphy, fdiff), first, last_found = entrykernel.index_range(
            raw, 1, count, *windows.bounds(w), recs, h.beginTimestamp)
        nf, fl = nf - 1, fl - 1  # as positions in the columns (entry 1 is position 0)
        first = (first[0] - 1, first[1]) if first else None
        last_found = (last_found[0] - 1, last_found[1]) if last_found else None
        if (fkh.tolist(), fphy.tolist(), fdiff.tolist()) != (kh[fl].tolist(), phy[fl].tolist(), diff[fl].tolist()) \
                or nf_phy.tolist() != phy[nf].tolist():
            probs.append(f"{where}: flagged entries' fields differ from the file's")
        sel = np.flatnonzero(kw == w)
        idx, found = recs.lookup(phy[sel])
        if nf.tolist() != sel[~found].tolist():
            probs.append(f"{where}: entries without a record {nf.tolist()}, numpy {sel[~found].tolist()}")
        k, r = sel[found], idx[found]
        want = ((int(k[0]), int(r[0])), (int(k[-1]), int(r[-1]))) if len(k) else (None, None)
        if (first, last_found) != want:
            probs.append(f"{where}: first/last found {(first, last_found)}, numpy {want}")
        by_entry = dict(zip(k.tolist(), r.tolist()))
        if any(by_entry.get(j) != q for j, q in zip(fl.tolist(), fr.tolist())):
            probs.append(f"{where}: flagged entries' records differ from numpy's")
            continue
        epos = lambda e: INDEX_HEADER_SIZE + f.slots * INDEX_SLOT_SIZE + int(e) * INDEX_ENTRY_SIZE  # noqa: E731
        checked = k[kh[k] >= 0]  # negative hashes are reported before the walk, not per record
        if set(fl.tolist()) - set(checked.tolist()):
            probs.append(f"{where}: flagged entries with a negative key hash {sorted(set(fl.tolist()) - set(checked.tolist()))}")
        passed = np.asarray(sorted(set(checked.tolist()) - set(fl.tolist())), np.int64)
        agg = _Agg()
        check_found_entries(agg, f, h, epos, recs, passed + 1, np.asarray([by_entry[j] for j in passed.tolist()], np.int64),
                            kh[passed], phy[passed], diff[passed])
        if agg.first:
            probs.append(f"{where}: entries the kernel let pass have findings {[x.as_json() for x in agg.findings()]}")
        ts = recs.c["storeTimestamp"]
        for j, q in zip(fl.tolist(), fr.tolist()):
            one = _Agg()
            check_found_entries(one, f, h, epos, recs, np.asarray([j + 1]), np.asarray([q]), kh[[j]], phy[[j]], diff[[j]])
            if not one.first and abs(int(ts[q]) - h.beginTimestamp) < 1 << 53:
                probs.append(f"{where}: entry {j + 1} flagged, but the rules find nothing")
    return probs


def _targeted_lies(root) -> None:
    """One of each lie the kernels compare for, whatever the seed: in the first index file a negative key hash
    (entry 2), another key's hash (entry 3), a time difference off by one (entry 4) and a rollback record
    (entry 5's); in the first consume queue file a size (unit 1) and a tagsCode (unit 2) off by one."""
    import struct

    idx = sorted((root / "index").glob("*"))
    if idx:
        with Store.open(str(root)) as st:
            slots = st.index.files[0].slots
        data = bytearray(idx[0].read_bytes())
        base = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE
        if struct.unpack_from(">i", data, 36)[0] > 5:
            struct.pack_into(">i", data, base + 2 * INDEX_ENTRY_SIZE, -12345)
            struct.pack_into(">i", data, base + 3 * INDEX_ENTRY_SIZE, struct.unpack_from(">i", data, base + 3 * INDEX_ENTRY_SIZE)[0] ^ 1)
            at = base + 4 * INDEX_ENTRY_SIZE + 12
            struct.pack_into(">i", data, at, struct.unpack_from(">i", data, at)[0] + 1)
            # the record entry 5 points at becomes a rollback transaction record (SYSFLAG at +36)
            phy = struct.unpack_from(">q", data, base + 5 * INDEX_ENTRY_SIZE + 4)[0]
            seg = max((p for p in (root / "commitlog").iterdir() if int(p.name) <= phy), key=lambda p: int(p.name))
            log = bytearray(seg.read_bytes())
            at = phy - int(seg.name) + 36
            struct.pack_into(">i", log, at, struct.unpack_from(">i", log, at)[0] | 0xC)
            os.chmod(seg, 0o644)
            seg.write_bytes(bytes(log))
            os.chmod(idx[0], 0o644)
            idx[0].write_bytes(bytes(data))
    cq = sorted(p for p in (root / "consumequeue").rglob("*") if p.is_file())[0]
    data = bytearray(cq.read_bytes())
    struct.pack_into(">i", data, 20 + 8, struct.unpack_from(">i", data, 20 + 8)[0] + 1)
    struct.pack_into(">q", data, 40 + 12, struct.unpack_from(">q", data, 40 + 12)[0] + 1)
    os.chmod(cq, 0o644)
    cq.write_bytes(bytes(data))


def _problems(root, monkeypatch) -> tuple[list[str], int]:
    """(problems, references the rules were asked about) over every window of the store at ``root``."""
    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", WINDOW)
    probs = []
    windows_seen = 0
    with Store.open(str(root)) as st:
        windows = Windows(st.commitlog)
        for step in (1, 3, 1024):
            probs += _queue_file_problems(st, windows, step)
        for rep in verify_commitlog.iter_windows(st.commitlog, check_crc=False):
            recs = _Records(st, [rep])
            windows_seen += 1
            probs += _queue_problems(st, windows, rep.index, recs)
            probs += _index_problems(st, windows, rep.index, recs)
    return probs, windows_seen


@pytest.mark.parametrize("name", STORE_NAMES)
def test_kernel_matches_the_rules_on_broker_stores(tmp_path, monkeypatch, name):
    """Undamaged, with the targeted lies, and with seeded lies in consume-queue units and index entries."""
    print(f"seed {SEED} (RMQSTORE_CHECKKERNEL_SEED)")
    clean = copy_store(name, tmp_path / "clean")
    probs, seen = _problems(clean, monkeypatch)
    assert seen > 1
    rng = random.Random(f"{SEED}:{name}")
    for case in range(4):
        root = tmp_path / f"case{case}"
        shutil.copytree(clean, root)
        if case == 0:  # alone: seeded damage first could move the entries the lies are read from
            _targeted_lies(root)
        else:
            _damage_queues(root, rng)
            _damage_index(root, rng)
        more, _ = _problems(root, monkeypatch)
        probs += [f"case {case}: {p}" for p in more]
        shutil.rmtree(root)
    assert not probs, "\n".join(probs[:20])


def test_kernel_matches_the_rules_on_fuzzed_derived_files(tmp_path, monkeypatch):
    """The fuzz suite's derived-file damage classes (random units, swapped units, ext tags, index offsets and
    hashes), each class on a broker-written store."""
    print(f"seed {SEED} (RMQSTORE_CHECKKERNEL_SEED), {FUZZ_CASES} cases")
    classes = [c for c in fuzzlib.DERIVED_CLASSES if c.startswith(("cq", "ext", "idx"))]
    probs = []
    for case in range(FUZZ_CASES):
        cls = classes[case % len(classes)]
        name = "4.9.3-ext" if cls.startswith("ext") else ["4.9.3-crash", "5.3.3-clean"][case % 2]
        rng = random.Random(f"{SEED}:fuzz:{case}")
        m = fuzzlib.model(name)
        root = tmp_path / f"case{case}"
        shutil.copytree(m.root, root)
        dmg = fuzzlib.derived_damage(rng, m, lambda _p: root, cls)
        more, _ = _problems(root, monkeypatch)
        probs += [f"case {case} [{name}] {dmg.describe()}: {p}" for p in more]
        shutil.rmtree(root)
    assert not probs, "\n".join(probs[:20])


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-v2topic"])
def test_references_at_the_largest_offsets_reach_the_checks(tmp_path, name):
    """A consume-queue unit and an index entry pointing at 2**63 - 1 (and 2**63 - 2) belong to the last window,
    which owns every offset after its start: verify reports them as the whole-log formulation does (the
    compiled passes once dropped 2**63 - 1, the last window's exclusive end)."""
    import struct

    from rmqstore_cli.engine.verify.pipeline import _verify_whole_log, verify_store

    root = copy_store(name, tmp_path / "s")
    cq = sorted(p for p in (root / "consumequeue").rglob("*") if p.is_file())[0]
    data = bytearray(cq.read_bytes())
    struct.pack_into(">q", data, 20, (1 << 63) - 1)
    struct.pack_into(">q", data, 40, (1 << 63) - 2)
    os.chmod(cq, 0o644)
    cq.write_bytes(bytes(data))
    idx = sorted((root / "index").glob("*"))[0]
    with Store.open(str(root)) as st:
        slots = st.index.files[0].slots
    data = bytearray(idx.read_bytes())
    base = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE
    struct.pack_into(">q", data, base + 1 * INDEX_ENTRY_SIZE + 4, (1 << 63) - 1)
    os.chmod(idx, 0o644)
    idx.write_bytes(bytes(data))

    def keys(res):
        return sorted((f.code, f.path, f.offset, f.message) for f in res.findings)

    with Store.open(str(root)) as st:
        windowed = verify_store(st)
    with Store.open(str(root)) as st:
        whole = _verify_whole_log(st)
    got = keys(windowed)
    assert got == keys(whole)
    assert sum("points at 9223372036854775807" in k[3] for k in got if k[0] == "CQ_NO_RECORD") == 1
    assert any("9223372036854775807" in k[3] for k in got if k[0].startswith("IDX_")), got
