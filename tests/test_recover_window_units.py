"""Recovery's derived check, window by window, tests every queue's units pointing into a window in one go (a
broker's thousands of queues hold a few units each per window). It must still tell each unit's queue apart: on
the broker-written stores it finds no lie, and one lying unit in any queue among many makes it give way to the
whole-table check, with the same plan as that check."""

from __future__ import annotations

import os
import random
import struct

import pytest

from rmqstore_cli.engine.repair import derived_windows, windowunits
from rmqstore_cli.engine.repair.recovery import plan_recovery
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify import commitlog as verify_commitlog

SEED = int(os.environ.get("RMQSTORE_WINDOW_UNITS_SEED", random.randrange(1 << 30)))


def _plans(root, monkeypatch, chunk: int) -> tuple:
    """(what each window's check answered (False: a unit lies), the windowed verdicts (None after a lie, none
    when the plan stopped at the lie), the plan with the windowed check, the plan without it)."""
    def plan():
        with Store.open(str(root)) as st:
            p = plan_recovery(st)
            return [a.__dict__ for a in p.actions], p.notes, p.dispatch, p.summary

    monkeypatch.setattr(verify_commitlog, "WINDOW_BYTES", 4096)  # every window holds units of several queues
    monkeypatch.setattr(derived_windows, "CHECK_UNITS", chunk)  # a file's units at a time, a few files', or all
    # a file's window read in rounds from one unit on (doubling) or from two, samples of every 1st, 3rd or 1024th
    # unit's window, or the defaults
    guess, margin, step = {1: (1, 0, 1), 7: (2, 0, 3)}.get(chunk, (windowunits._GUESS, windowunits._MARGIN, 1024))
    monkeypatch.setattr(windowunits, "_GUESS", guess)
    monkeypatch.setattr(windowunits, "_MARGIN", margin)
    monkeypatch.setattr(windowunits, "SAMPLE_STEP", step)
    answers, windows = [], []
    finish, window = derived_windows.WindowedCheck.finish, derived_windows.WindowedCheck.window
    monkeypatch.setattr(derived_windows.WindowedCheck, "finish", lambda self: answers.append(finish(self)) or answers[-1])
    monkeypatch.setattr(derived_windows.WindowedCheck, "window", lambda self, *a: windows.append(window(self, *a)) or windows[-1])
    windowed = plan()
    monkeypatch.setattr(derived_windows.WindowedCheck, "finish", finish)
    monkeypatch.setattr(derived_windows.WindowedCheck, "window", window)
    monkeypatch.setattr(derived_windows.WindowedCheck, "start", classmethod(lambda cls, planner, **kw: None))
    whole = plan()
    return windows, answers, windowed, whole


def _crash(root) -> None:
    (root / "abort").write_bytes(b"")


CHUNKS = (1, 7, 1 << 16)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("name", ["4.9.3-crash", "5.3.3-clean", "5.3.3-v2topic"])
def test_no_lie_found_on_broker_stores(store_copy, monkeypatch, name, chunk):
    """Every window holds units of several queues: the check tells them apart and finds no lie."""
    root = store_copy(name)
    _crash(root)
    windows, answers, windowed, whole = _plans(root, monkeypatch, chunk)
    assert len(windows) > 4 and all(windows)
    assert answers and answers[0] is not None
    assert windowed == whole


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("field", ["size", "queue", "topic", "tags"])
def test_a_lying_unit_in_any_queue_is_found(store_copy, monkeypatch, field, chunk):
    """One unit of a seeded queue made to lie: about its size, its queue offset (a unit of another queue's record),
    or its tags code. The windowed check gives way (None) and the plan is the whole-table check's."""
    print(f"seed {SEED} (RMQSTORE_WINDOW_UNITS_SEED)")
    rng = random.Random(SEED)
    root = store_copy("4.9.3-crash")
    _crash(root)
    files = sorted(p for p in (root / "consumequeue").rglob("0000*") if p.is_file() and p.stat().st_size >= 20 * 4)
    # a file with another to take a unit from: of the same topic (another queue) for "queue", of another topic for "topic"
    same = field == "queue"
    path = rng.choice([f for f in files if any(o != f and (o.parent.parent == f.parent.parent) == same for o in files)])
    data = bytearray(path.read_bytes())
    used = next((i for i in range(len(data) // 20) if not any(data[i * 20:i * 20 + 20])), len(data) // 20)
    u = rng.randrange(1, used)
    if field == "size":
        struct.pack_into(">i", data, u * 20 + 8, struct.unpack_from(">i", data, u * 20 + 8)[0] + 1)
    elif field == "tags":
        struct.pack_into(">q", data, u * 20 + 12, struct.unpack_from(">q", data, u * 20 + 12)[0] ^ 0x5A5A)
    else:  # the unit names a record of another queue (same topic, or another topic)
        others = [p for p in files if p != path and (p.parent.parent == path.parent.parent) == same]
        other = rng.choice(others).read_bytes()
        data[u * 20:u * 20 + 20] = other[0:20]
    path.write_bytes(bytes(data))
    print(f"{field}: {path.relative_to(root)} unit {u}")
    windows, answers, windowed, whole = _plans(root, monkeypatch, chunk)
    assert windows and windows[-1] is False and all(windows[:-1])
    assert all(a is None for a in answers)
    assert windowed == whole
