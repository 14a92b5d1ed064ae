"""The timer store read in bounded memory: verify's TM_* checks, stats' timer section and ``dump timer
[--pending] --json`` walk the timerlog a window of units at a time (compiled walk and wheel replay),
keep only per-slot / per-topic aggregates, and write dump lines a window at a time.

Stores come from tests/timergen.py (the broker-written timer-5.3.3 sample with a generated timerlog
of 100k and 400k units, prevPos chains, wheel and timercheck written with numpy per FORMAT.md appendix
C, the last half of the units after the flush position of a store that did not shut down). The commands run as
subprocesses whose anonymous resident memory (RssAnon, not ru_maxrss: mapped file pages are not the
process's memory) is sampled; the window is lowered (a seam: files.CHUNK_UNITS) so that both stores
cross many windows. The dump lines encoded a window at a time are compared with json_line of the rows
report.py builds one by one (the broker-read truth of those rows is checked in tests/test_timer.py).
"""

from __future__ import annotations

import json
import os

import pytest

from rmqstore_cli.commands.output import json_line
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.timer import files as timer_files
from rmqstore_cli.engine.timer.lines import pending_lines, unit_lines
from rmqstore_cli.engine.timer.report import pending_rows, unit_rows
from rmqstore_cli.engine.timer.store import TimerStore
from tests.conftest import shared_store
from tests.memprobe import run_peak
from tests.timergen import generate

WINDOW = 4096  # units per window in these tests (the default is 65536)
SIZES = (100_000, 400_000)
MARGIN = 8 << 20  # four times the units may not cost this much more (one int64 column of the extra units: 2.4 MB)


@pytest.fixture(scope="module")
def timer_stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("timermem")
    src = str(shared_store("timer-5.3.3"))
    return {n: generate(src, str(base / f"u{n}"), n, file_size=1 << 20, late=n // 2) for n in SIZES}


def _run_peak(args: list[str], out_path: str) -> tuple[int, int]:
    """(sampled RssAnon high-water mark, exit code) of ``rmqstore ARGS`` with the lowered window."""
    return run_peak(args, out_path, f"import rmqstore_cli.engine.timer.files as f; f.CHUNK_UNITS = {WINDOW}")


COMMANDS = {
    "verify": ["verify", "{root}", "--json"],
    "stats": ["stats", "{root}", "--json"],
    "dump-pending": ["dump", "timer", "{root}", "--pending", "--json"],
    "dump": ["dump", "timer", "{root}", "--json"],
}


@pytest.mark.parametrize("what", list(COMMANDS))
def test_timer_commands_memory_does_not_grow_with_the_timerlog(timer_stores, tmp_path, what):
    peaks, outputs = {}, {}
    for n, root in timer_stores.items():
        out = str(tmp_path / f"{what}-{n}.jsonl")
        peaks[n], _ = _run_peak([a.format(root=root) for a in COMMANDS[what]], out)
        outputs[n] = out
    small, large = (peaks[n] for n in SIZES)
    print(f"{what}: RssAnon peak {small >> 20} MiB at {SIZES[0]} units, {large >> 20} MiB at {SIZES[1]}")
    # the commands did the work on every unit: what they print counts them
    for n, out in outputs.items():
        if what == "dump":
            with open(out, "rb") as f:
                assert sum(1 for line in f if line.startswith(b'{"type":"timerlog_unit"')) == n
        elif what == "stats":
            with open(out) as f:
                timer = [json.loads(line) for line in f if '"timer"' in line]
            assert timer and sum(timer[-1]["timer"]["pendingByTopic"].values()) > n // 3, timer
        elif what == "verify":
            with open(out) as f:
                codes = {json.loads(line).get("code") for line in f}
            assert "TM_WHEEL_BEHIND" in codes and not {"TM_SLOT_POS", "TM_SLOT_NUM", "TM_PREV_POS"} & codes, codes
    assert large - small < MARGIN, (small, large)


def _rows_as_lines(rows, kind: str) -> bytes:
    return "".join(json_line({"type": kind, **r}) + "\n" for r in rows).encode()


@pytest.mark.parametrize("case", ["timer-5.3.3", "timer-5.3.3-crash", "synthetic"])
def test_lines_encoded_per_window_equal_the_rows(case, tmp_path, monkeypatch):
    """``dump timer --json`` bytes are what json_line gives for each row, with every filter, across windows."""
    monkeypatch.setattr(timer_files, "CHUNK_UNITS", 1000 if case == "synthetic" else 7)
    if case == "synthetic":
        root = generate(str(shared_store("timer-5.3.3")), str(tmp_path / "store"), 12_000, file_size=1 << 16, late=3000)
    else:
        root = str(shared_store(case))
    with Store.open(root) as st:
        ts = TimerStore(st)
        try:
            first = json.loads(next(unit_lines(ts)).split(b"\n")[0])
            t0 = first["deliverTimeMs"]
            options = [{}, {"since": t0 + 5000}, {"until": t0 + 20000}, {"topic": "TimerTopicA"},
                       {"topic": "nope"}, {"limit": 13}]
            for opt in options:
                limit = opt.pop("limit", None)
                rows = list(unit_rows(ts, **opt))[:limit]
                assert b"".join(unit_lines(ts, limit=limit, **opt)) == _rows_as_lines(rows, "timerlog_unit"), opt
                prow = list(pending_rows(ts, **opt))[:limit]
                assert b"".join(pending_lines(ts, limit=limit, **opt)) == _rows_as_lines(prow, "pending"), opt
                if limit is None and not opt:
                    assert len(rows) > 100 and len(prow) > 10
        finally:
            ts.close()


def _reference_chain(files: dict[int, bytes], floor: int, last_pos: int, slot_units: int, precision: int, limit: int):
    """A slot's chain walked with struct per FORMAT.md appendix C (size @0, prevPos @4, currWriteTime @16,
    delay @24), one unit at a time."""
    import struct

    out, pos = [], last_pos
    while pos != -1:
        if len(out) >= limit:
            return out, "limit"
        if out and pos >= out[-1]:
            return out, "loop"
        if 0 <= pos < floor:
            return out, "history"
        start = max((s for s in files if s <= pos), default=None)
        if start is None or pos - start + 52 > len(files[start]):
            return out, "outside"
        size, prev, _, cwt, delay = struct.unpack_from(">iqiqi", files[start], pos - start)
        if size != 52:
            return out, "outside"
        if (cwt + delay) // precision != slot_units:
            return out, "other slot"
        out.append(pos)
        pos = prev
    return out, "-1"


def test_compiled_chain_walk_equals_a_unit_by_unit_walk(tmp_path, monkeypatch):
    """Chains across files, with prevPos damaged to point at another slot's unit, forward (a loop), past the
    timerlog, into a unit's middle at a file end, before the first file (history), and a low chain limit."""
    import random
    import struct

    from rmqstore_cli.engine.timer import report

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    root = generate(str(shared_store("timer-5.3.3")), str(tmp_path / "store"), 20_000, file_size=1 << 16, slots=40)
    tl = os.path.join(root, "timerlog")
    names = sorted(os.listdir(tl))
    os.remove(os.path.join(tl, names[0]))  # the first file deleted: chains run into history
    names = names[1:]
    fsize = 1 << 16
    for _ in range(60):
        name = rng.choice(names)
        unit = rng.randrange((fsize - 16) // 52)
        what = rng.choice(["other", "forward", "past", "file-end", "zero"])
        base = int(name)
        target = {"other": base + 52 * rng.randrange(1000), "forward": base + fsize * 3,
                  "past": 10 ** 12, "file-end": base + fsize - 30, "zero": 0}[what]
        with open(os.path.join(tl, name), "r+b") as f:
            f.seek(52 * unit + 4)
            f.write(struct.pack(">q", target))
    # and one chain per kind of end for sure: the last unit of five slots points where each kind begins
    with Store.open(root) as st:
        ts = TimerStore(st)
        lasts = sorted(int(p) for _, recs in ts.wheel.nonempty() for p in recs["lastPos"])[-5:]
        ts.close()
    for last, target in zip(lasts, (lambda p: p + 52, lambda p: p - 52, lambda p: 100, lambda p: -7,
                                    lambda p: p - p % fsize - 30)):
        name = max(n for n in names if int(n) <= last)
        with open(os.path.join(tl, name), "r+b") as f:
            f.seek(last - int(name) + 4)
            f.write(struct.pack(">q", target(last)))
    files = {int(n): open(os.path.join(tl, n), "rb").read() for n in names}
    with Store.open(root) as st:
        ts = TimerStore(st)
        try:
            for limit in (100_000, 37):
                monkeypatch.setattr(report, "CHAIN_LIMIT", limit)
                seen = set()
                for idx, recs in ts.wheel.nonempty():
                    for rec in recs:
                        ms = int(rec["timeUnits"]) * ts.precision_ms
                        got = report.walk_chain(ts, int(rec["lastPos"]), ms)
                        want = _reference_chain(files, int(names[0]), int(rec["lastPos"]), int(rec["timeUnits"]),
                                                ts.precision_ms, limit)
                        assert got == want, (seed, int(rec["lastPos"]), ms)
                        seen.add(want[1])
                assert seen >= ({"limit"} if limit < 100 else {"loop", "other slot", "history", "outside"}), (seed, seen)
        finally:
            ts.close()


def test_terminal_tables_come_in_blocks_with_every_row(monkeypatch):
    """Without --json the units, pending messages and slots print as tables of TABLE_ROWS rows (nothing
    held whole): every unit of the broker's read-back is still listed, once."""
    from rmqstore_cli.commands import dump_timer
    from tests.conftest import broker_read
    from tests.test_timer import run

    monkeypatch.setattr(dump_timer, "TABLE_ROWS", 7)
    sizes = []
    table = dump_timer.Output.table

    def counted(self, rows, *args, **kw):
        rows = list(rows)
        sizes.append(len(rows))
        return table(self, rows, *args, **kw)

    monkeypatch.setattr(dump_timer.Output, "table", counted)
    root = shared_store("timer-5.3.3")
    units = broker_read("timer-5.3.3")["timerlog_unit"]
    p = run("dump", "timer", root)
    assert p.returncode == 0, p.stderr
    listed = [int(line.split()[1]) for line in p.stdout.splitlines() if line.startswith("pos ")]
    assert listed[:len(units)] == [u["pos"] for u in units]
    assert max(sizes) == 7 and sum(sizes) > len(units)


def test_superseded_roll_units_match_the_brokers_keys(store_copy):
    """Roll units whose message already has a later unit (matched on UNIQ_KEY hashes, confirmed on the text):
    the checkpoint's read clock moved back to the first slot makes the clean sample's fired roll units
    pending, and the expected set is computed from the broker's read-back (every unit with its message's
    uniqKey). (The crashed sample stopped before any roll slot fired: it has no such pair.)"""
    import struct

    name = "timer-5.3.3"
    root = store_copy(name)
    units = broker_read_units(name)
    read = min(u["currWriteTime"] + u["delayTimeMs"] for u in units)
    with open(os.path.join(root, "config", "timercheck"), "r+b") as f:
        f.write(struct.pack(">q", read))
    newest = max(u["currWriteTime"] for u in units)
    olds, news = [], []
    for u in units:
        slot = u["currWriteTime"] + u["delayTimeMs"]
        if slot < read or u["magic"] & 4 or not u.get("message"):
            continue
        old = bool(u["magic"] & 2) and slot <= newest
        if old:
            olds.append((u["message"]["uniqKey"], u["pos"]))
        elif u["currWriteTime"] >= read:
            news.append((u["message"]["uniqKey"], u["pos"]))
    want = sorted({p for k, p in olds if any(k == k2 and p < p2 for k2, p2 in news)})
    assert len(want) > 10
    with Store.open(root) as st:
        ts = TimerStore(st)
        try:
            assert ts.superseded().tolist() == want
        finally:
            ts.close()


def broker_read_units(name: str) -> list:
    from tests.conftest import broker_read

    return broker_read(name)["timerlog_unit"]


def test_capped_findings_are_the_same_as_listing_every_unit(tmp_path):
    """verify lists the first DETAIL_LIMIT units of a code and counts the rest without a finding each: on a
    timerlog whose units all point past the log (every one TM_MSG_GONE or TM_MSG_EXPIRED) and whose
    prevPos are all wrong, the counts are every unit's."""
    import struct

    from rmqstore_cli.engine.timer import check

    root = generate(str(shared_store("timer-5.3.3")), str(tmp_path / "store"), 5000, file_size=1 << 16)
    tl = os.path.join(root, "timerlog")
    for name in os.listdir(tl):
        data = bytearray(open(os.path.join(tl, name), "rb").read())
        for p in range(0, len(data) - 52 + 1, 52):
            if struct.unpack_from(">i", data, p)[0] != 52:
                break
            struct.pack_into(">q", data, p + 28, 1 << 40)  # offsetPy past the commitlog
            struct.pack_into(">q", data, p + 4, 1 << 41)  # prevPos nowhere
        open(os.path.join(tl, name), "wb").write(bytes(data))
    with Store.open(root) as st:
        findings: list = []
        check.check_timer_store(st, findings)
    counts: dict = {}
    for f in findings:
        counts.setdefault(f.code, []).append(f)
    assert len(counts["TM_PREV_POS"]) == check.DETAIL_LIMIT + 1
    assert counts["TM_PREV_POS"][-1].extra["count"] == 5000
    gone, expired = counts.get("TM_MSG_GONE", []), counts.get("TM_MSG_EXPIRED", [])
    assert gone and expired  # slots on both sides of the read clock
    summed = {c: (fs[-1].extra["count"] if "count" in fs[-1].extra else len(fs)) for c, fs in
              (("g", gone), ("e", expired)) if fs}
    assert sum(summed.values()) == 5000, summed
