"""The DLedger bench store generator (bench/gendledger.py): the store it writes around a classic store's records
verifies clean (entry headers, index units, checkpoint, the messages' PHYSICALOFFSET fields, the rebuilt
consume queues and index) and holds the same messages, at their entry's pos + 48. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import gen, gendledger

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "rmqstore_cli"]
MOVED = ("commitLogOffset", "offset", "msgId")  # where the message lies, and the id made of it


def _dump(root) -> list[dict]:
    p = subprocess.run(CLI + ["dump", "commitlog", str(root), "--json", "--body", "hex"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return [json.loads(ln) for ln in p.stdout.splitlines()]


@pytest.mark.parametrize("source", ["generated", "fixture-5.3.3-v2topic"])
def test_dledger_store_verifies_clean_and_holds_the_classic_messages(tmp_path, source):
    if source == "generated":  # the bench layout, small: several segment rolls
        classic = str(tmp_path / "classic")
        info = gen.generate(classic, 100, total=3 << 20, seg_size=1 << 20)
    else:  # messages of varying sizes, v2 topics, a 5.x store
        classic, info = os.path.join(REPO, "fixtures", "stores", "5.3.3-v2topic"), None
    out = gendledger.convert(classic, str(tmp_path / "dledger"))
    v = subprocess.run(CLI + ["verify", str(tmp_path / "dledger"), "--json"], capture_output=True, text=True, timeout=300)
    assert v.returncode == 0 and v.stdout == "", (v.stdout[-3000:], v.stderr[-2000:])
    dump = subprocess.run(CLI + ["dump", "dledger", str(tmp_path / "dledger"), "--json"], capture_output=True, text=True,
                          timeout=300)
    entries = [e for e in map(json.loads, dump.stdout.splitlines()) if e["type"] == "entry"]
    want, got = _dump(classic), _dump(tmp_path / "dledger")
    assert len(got) == len(want) == len(entries) == out["entries"] > 0
    if info:
        assert len(got) == info["records"] and out["blanks"] >= info["segments"] - 1
    assert [{k: v for k, v in m.items() if k not in MOVED} for m in got] == \
        [{k: v for k, v in m.items() if k not in MOVED} for m in want]
    # each message at its entry's pos + 48; entries numbered from 0 in term 0
    assert [m["commitLogOffset"] for m in got] == [e["pos"] + 48 for e in entries]
    assert [(e["index"], e["term"]) for e in entries] == [(i, 0) for i in range(len(entries))]


@pytest.mark.parametrize("dledger_mb_s,ok", [(79.0, False), (81.0, True)])
def test_the_row_is_judged_against_the_classic_verify_measured_beside_it(dledger_mb_s, ok):
    from bench import run, targets

    # the classic verify measured earlier in the run (another minute of this host) is not the reference
    results = [{"workload": "verify", "store": "1KiB", "MB_s": 50.0, "msg_s": 1},
               {"workload": run.DLEDGER_BESIDE, "store": "1KiB", "MB_s": 100.0, "msg_s": 1},
               {"workload": run.DLEDGER_ROW, "store": "1KiB", "MB_s": dledger_mb_s, "msg_s": 1}]
    [row] = [r for r in targets.evaluate(results) if "DLedger" in r["target"]]
    assert row["measured"] == round(dledger_mb_s / 100.0, 2) and row["pass"] is ok
    assert ("PASS" if ok else "FAIL") in targets.render(results, [row])
