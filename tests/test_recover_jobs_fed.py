"""recover -j: verify's workers also run the derived-file check on the segments they walk (one walk for both, as
with -j 1), and the broker's walk hands over only the records past each queue's last unit.

Each case runs -j 1 and -j 2 on fresh copies at the same path and compares the output, the exit code and every
file afterwards (tests/test_recover_jobs.py's ``_same_with_jobs``), and checks which path answered: the fed check
where it can, the check's own walk where verify's CRC walk read other records (an invalid record before the
recovered end) or a unit lies. The consume-queue units the re-dispatch adds are compared with the broker's own
read-back of the store (its queue lengths), not with anything this code computes. Seeds are printed."""

from __future__ import annotations

import json
import os
import random

import pytest

from tests.conftest import STORES, broker_read, copy_store
from tests.fuzzlib import add_crash
from tests.test_recover_jobs import SEED, _records, _same_with_jobs, used  # noqa: F401 (used: a fixture)

pytestmark = pytest.mark.skipif(not STORES.is_dir(), reason="needs the broker-written stores")

UNIT = 20


def _plan(out: str) -> dict:
    return next(o for o in map(json.loads, out.splitlines()) if o.get("type") == "recover-plan")


def _queue_files(case, topic: str, qid: int) -> list[str]:
    d = case / "consumequeue" / topic / str(qid)
    return sorted(str(p) for p in d.iterdir() if p.name.isdigit())


def _cut_queue(case, topic: str, qid: int, keep: int) -> None:
    """The queue keeps its first ``keep`` units: the rest of their file zeroed (the broker's recovery stops at the
    first zero unit), later files removed."""
    files = _queue_files(case, topic, qid)
    size = os.path.getsize(files[0])
    per_file = size // UNIT
    k = keep // per_file
    for path in files[k + 1:]:
        os.unlink(path)
    path = files[k]
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        at = (keep % per_file) * UNIT
        f.seek(at)
        f.write(b"\0" * (size - at))


def _cut_crash(tmp_path, rng: random.Random, at_file_end: bool, monkeypatch) -> tuple:
    """A crash (checkpoint zeroed: the whole log walked and re-dispatched) of a copy of 4.9.3-clean whose queues were
    cut at seeded places (``at_file_end``: one of them right after a full file, its next file all zeros), recovered
    with -j 1 and -j 2 (the same output and files); (the cuts, the broker's queue lengths, the plan)."""
    from rmqstore_cli.engine.repair import dispatchspill

    # the re-dispatch's own workers (not the columns the plan's walk keeps, tests/test_recover_dispatch_spill.py)
    monkeypatch.setattr(dispatchspill.DispatchSpill, "create", classmethod(lambda cls, *a: None))
    name = "4.9.3-clean"
    lengths = {(q["topic"], q["queueId"]): q["maxOffset"] for q in broker_read(name)["cq"]}
    case = copy_store(name, tmp_path / "case")
    per_file = os.path.getsize(_queue_files(case, *next(iter(sorted(lengths))))[0]) // UNIT
    keys = rng.sample(sorted(k for k, n in lengths.items() if n > 1), 3)
    if at_file_end:  # the first one cut at the end of a full file
        longer = sorted(k for k, n in lengths.items() if n > per_file)
        keys = [rng.choice(longer)] + [k for k in keys if k not in longer][:2]
    cut = {}
    for n, key in enumerate(keys):
        if at_file_end and n == 0:
            keep = per_file * rng.randrange(1, (lengths[key] - 1) // per_file + 1)
        else:
            keep = rng.choice([k for k in range(1, lengths[key]) if k % per_file])
        _cut_queue(case, *key, keep)
        cut[key] = keep
    add_crash(case, zero_checkpoint=True)
    code, out, err, _ = _same_with_jobs(case, tmp_path / "w", ["recover", "--json"])
    assert code in (0, 1), f"cuts {cut}: {err}"
    return cut, lengths, _plan(out)


def test_cut_queues_fed_check_and_broker_counts(tmp_path, used, monkeypatch):
    """Queues cut inside a file: -j 2 equals -j 1, the derived check answered from verify's workers, and each cut
    queue gains exactly the units the broker had past the cut (its maxOffset in the broker's read-back)."""
    print("seed", SEED)
    cut, lengths, plan = _cut_crash(tmp_path, random.Random(SEED * 13 + 1), False, monkeypatch)
    gaining = plan["dispatch"]["queuesGaining"]
    assert gaining == {f"{t}-{q}": lengths[(t, q)] - keep for (t, q), keep in sorted(cut.items())}, cut
    assert used["walk"] and used["dispatch"], used
    assert used["fed"] and not used["derived"] - used["fed"], used  # no walk of the derived check's own
    assert used["pruned"], used  # the re-dispatch's workers left out units the queues held


def test_queue_cut_after_a_full_file_broker_counts(tmp_path, used, monkeypatch):
    """A queue cut right after a full file (its next file all zeros): the plan's view of that queue can move during
    the walk (the derived check then walks on its own instead of taking verify's workers' answer, a seed found it);
    -j 2 still equals -j 1 and each cut queue gains exactly the broker's units past the cut."""
    print("seed", SEED)
    cut, lengths, plan = _cut_crash(tmp_path, random.Random(SEED * 13 + 4), True, monkeypatch)
    gaining = plan["dispatch"]["queuesGaining"]
    assert gaining == {f"{t}-{q}": lengths[(t, q)] - keep for (t, q), keep in sorted(cut.items())}, cut
    assert used["walk"] and used["dispatch"] and used["derived"], used


def test_invalid_record_before_the_end_takes_the_checks_own_walk(tmp_path, used):
    """checkCRCOnRecover=false: the broker's walk goes past a record whose body CRC is wrong, verify's walk (CRC
    checked) reads it as invalid, so the records it fed the derived check are not those of the recovered log: the
    check walks on its own (no CRC), and the result is still -j 1's."""
    print("seed", SEED)
    rng = random.Random(SEED * 13 + 2)
    name = "4.9.3-crash"
    case = copy_store(name, tmp_path / "case")
    recs = _records(case)
    segs = sorted({r[0] for r in recs})
    path, pos, size, body, blen = rng.choice([r for r in recs if r[0] in segs[1:-1] and r[4] > 0])
    at = body + rng.randrange(blen)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ (1 << rng.randrange(8))]))
    add_crash(case, zero_checkpoint=True)
    conf = tmp_path / "broker.conf"
    conf.write_text("checkCRCOnRecover=false\n")
    code, out, err, _ = _same_with_jobs(case, tmp_path / "w", ["recover", "--json", "--config", str(conf)])
    assert code in (0, 1, 2), f"{os.path.basename(path)}@{at}: {err}"
    assert _plan(out)["commitlog"]["recoveredEnd"] > int(os.path.basename(path)) + pos  # the walk went past it
    assert used["derived"] and not used["fed"], used


def test_lying_unit_takes_the_whole_table(tmp_path, used):
    """A consume-queue unit whose size disagrees with its record (the broker's validity test keeps it): the fed check
    says a unit lies and the whole-table formulation decides, as with -j 1."""
    print("seed", SEED)
    rng = random.Random(SEED * 13 + 3)
    name = "5.3.3-clean"
    case = copy_store(name, tmp_path / "case")
    files = [p for p in sorted((case / "consumequeue").rglob("*")) if p.is_file() and p.name.isdigit()]
    path = rng.choice(files)
    data = bytearray(path.read_bytes())
    units = [i for i in range(len(data) // UNIT) if int.from_bytes(data[i * UNIT + 8:i * UNIT + 12], "big") > 0]
    i = rng.choice(units)
    size = int.from_bytes(data[i * UNIT + 8:i * UNIT + 12], "big")
    data[i * UNIT + 8:i * UNIT + 12] = (size + 1).to_bytes(4, "big")
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    add_crash(case, zero_checkpoint=rng.random() < 0.5)
    code, out, err, _ = _same_with_jobs(case, tmp_path / "w", ["recover", "--json"])
    assert code in (0, 1), f"{path.relative_to(case)} unit {i}: {err}"
    assert any(r["code"] for r in _plan(out)["queueRepairs"]), "the lying unit is repaired"
    assert not used["fed"], used


def test_window_span_matches_placing_each_unit():
    """derived_windows.window_span (binary searches of the bounds in rising offsets) against each unit placed on its
    own in plain Python: its segment (None past the segment's limit) and its window; the first and last of them."""
    import numpy as np

    from rmqstore_cli.engine.repair.derived_windows import window_span

    print("seed", SEED)
    rng = random.Random(SEED * 13 + 4)
    for _ in range(400):
        size = rng.randrange(8, 64)
        nseg = rng.randrange(1, 5)
        bounds = [k * size for k in range(nseg)]
        limits = [b + rng.randrange(1, size + 1) for b in bounds]
        wstarts = sorted({b + (0 if j == 0 else rng.randrange(1, size)) for b in bounds for j in range(rng.randrange(1, 4))})
        top = bounds[-1] + size + 4
        real = [rng.randrange(0, top) for _ in range(rng.randrange(0, 30))]
        if rng.random() < 0.3:  # a unit exactly at a segment's limit (the first offset past it)
            real.append(rng.choice(limits))
        if rng.random() < 0.7:
            real.sort()
        if rng.random() < 0.5:  # mostly inside the segments' limits
            real = [x for x in real if any(b <= x < lim for b, lim in zip(bounds, limits))]

        def place(x):
            k = max(i for i, b in enumerate(bounds) if b <= x)
            return None if x >= limits[k] else max(j for j, w in enumerate(wstarts) if w <= x)

        placed = [place(x) for x in real]
        want = None if None in placed else (min(placed), max(placed)) if placed else ()
        got = window_span(np.asarray(real, np.int64), np.asarray(bounds, np.int64), np.asarray(limits, np.int64),
                          np.asarray(wstarts, np.int64))
        assert got == want, (bounds, limits, wstarts, real)


def test_real_units_matches_each_unit_read_in_python():
    """derived_windows.real_units (no pass over a file whose first unit is real) against the queue's units read one
    by one: a pre-blank filler (§7.3) before the queue's first real unit is not real, everything after it is."""
    import numpy as np

    from rmqstore_cli.engine.derived.consumequeue import CQ_DTYPE
    from rmqstore_cli.engine.repair.derived_windows import real_units
    from rmqstore_cli.formats.records import CQ_FILLER

    print("seed", SEED)
    rng = random.Random(SEED * 13 + 5)
    for _ in range(300):
        files, first = [], rng.randrange(0, 50)
        fillers = rng.choice([0, 0, rng.randrange(0, 12)])
        for _ in range(rng.randrange(1, 4)):
            n = rng.randrange(0, 8)
            units = np.zeros(n, CQ_DTYPE)
            for j in range(n):
                at = first + j - files[0][0] if files else j
                units[j] = CQ_FILLER if at < fillers else (rng.randrange(0, 1 << 40), rng.randrange(1, 500),
                                                          rng.choice([0, CQ_FILLER[2], rng.randrange(1 << 30)]))
            files.append((first, units))
            first += n
        flat = [(q, tuple(u.tolist())) for f, units in files for q, u in zip(range(f, f + len(units)), units)]
        want_first = next((q for q, u in flat if u != CQ_FILLER), None)
        first_real = None
        for f, units in files:
            phy = units["phyOffset"].astype(np.int64)
            first_real, real = real_units(f, units, phy, first_real)
            seen = want_first is not None and want_first < f + len(units)  # the first real unit is here or before
            assert first_real == (want_first if seen else None), (files, f)
            want = [u[0] for q, u in flat if f <= q < f + len(units) and want_first is not None and q >= want_first]
            assert real.tolist() == want, (files, f)
        assert first_real == want_first
