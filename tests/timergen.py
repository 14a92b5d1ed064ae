"""A synthetic timer store of any size for the memory tests and by-hand measurements: a copy of the
broker-written timer-5.3.3 sample whose timerlog is replaced by ``units`` units that point, in turn, at
the sample's own rmq_sys_wheel_timer records, spread over a few thousand wheel slots on both sides of
the checkpoint's read clock. prevPos chains, end-of-file blanks, the wheel and timercheck are written
per FORMAT.md appendix C (numpy here, independent of the engine), so verify finds only what repeating
the sample's messages implies (no TM_* errors)."""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np

UNIT, BLANK_MIN, SLOT, SLOTS = 52, 16, 32, 2 * 7 * 86400
BLANK_MAGIC = struct.unpack(">i", struct.pack(">I", 0xBBCCDDEE ^ (1880681586 + 8)))[0]
UNIT_DT = np.dtype([("size", ">i4"), ("prevPos", ">i8"), ("magic", ">i4"), ("currWriteTime", ">i8"), ("delay", ">i4"),
                    ("offsetPy", ">i8"), ("sizePy", ">i4"), ("realTopicHash", ">i4"), ("reserved", ">i8")])
SLOT_DT = np.dtype([("timeUnits", ">i8"), ("firstPos", ">i8"), ("lastPos", ">i8"), ("num", ">i4"), ("magic", ">i4")])


def _sample_units(src: str) -> np.ndarray:
    out = []
    d = os.path.join(src, "timerlog")
    for name in sorted(os.listdir(d)):
        data = open(os.path.join(d, name), "rb").read()
        n = len(data) // UNIT
        arr = np.frombuffer(data[:n * UNIT], UNIT_DT)
        k = np.flatnonzero(arr["size"] != UNIT)
        out.append(arr[:k[0]] if len(k) else arr)
    return np.concatenate(out)


def generate(src: str, dest: str, units: int, file_size: int = 4 << 20, slots: int = 4000, seed: int = 7,
             late: int = 0) -> str:
    """Write the store to ``dest`` (a copy of ``src`` without its timerlog/timerwheel); returns dest.
    ``late``: that many last units come after timercheck's lastTimerLogFlushPos of a store that did not
    shut down (an ``abort`` file), and the wheel does not hold them yet (a flush lag)."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("timerlog", "timerwheel"))
    for root, dirs, files in os.walk(dest):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    pool = _sample_units(src)
    pool = pool[pool["magic"] == 1]  # default units: no roll pairs
    rng = np.random.default_rng(seed)
    cp_path = os.path.join(dest, "config", "timercheck")
    cp = bytearray(open(cp_path, "rb").read())
    read_ms = struct.unpack_from(">q", cp, 0)[0]
    pick = rng.integers(0, len(pool), units)
    slot_ms = read_ms + (rng.integers(-slots // 2, slots // 2, units) * 1000)
    cwt = np.sort(slot_ms - rng.integers(0, 3600, units) * 1000)  # written in time order
    per_file = (file_size - BLANK_MIN) // UNIT
    i = np.arange(units, dtype=np.int64)
    pos = (i // per_file) * file_size + (i % per_file) * UNIT
    order = np.argsort(slot_ms, kind="stable")
    prev = np.full(units, -1, np.int64)
    same = slot_ms[order[1:]] == slot_ms[order[:-1]]
    prev[order[1:][same]] = pos[order[:-1][same]]
    arr = np.zeros(units, UNIT_DT)
    arr["size"], arr["prevPos"], arr["magic"] = UNIT, prev, 1
    arr["currWriteTime"], arr["delay"] = cwt, slot_ms - cwt
    for f in ("offsetPy", "sizePy", "realTopicHash"):
        arr[f] = pool[f][pick]
    os.makedirs(os.path.join(dest, "timerlog"))
    nfiles = -(-units // per_file)
    for k in range(nfiles):
        part = arr[k * per_file:(k + 1) * per_file]
        body = part.tobytes()
        if k + 1 < nfiles:
            body += struct.pack(">iqi", file_size - len(body), 0, BLANK_MAGIC)
        with open(os.path.join(dest, "timerlog", f"{k * file_size:020d}"), "wb") as f:
            f.write(body + bytes(file_size - len(body)))
    wheel = np.zeros(SLOTS, SLOT_DT)
    if late:
        order = order[order < units - late]  # the wheel as the last flush left it
        open(os.path.join(dest, "abort"), "wb").close()
    t, first_idx = np.unique(slot_ms[order], return_index=True)
    last_idx = np.r_[first_idx[1:], len(order)] - 1
    idx = (t // 1000) % SLOTS
    wheel["timeUnits"][idx] = t // 1000
    wheel["firstPos"][idx] = pos[order[first_idx]]
    wheel["lastPos"][idx] = pos[order[last_idx]]
    wheel["num"][idx] = last_idx - first_idx + 1
    with open(os.path.join(dest, "timerwheel"), "wb") as f:
        f.write(wheel.tobytes())
    end = int(pos[units - late]) if late else int(pos[-1]) + UNIT
    struct.pack_into(">q", cp, 8, end)
    with open(cp_path, "wb") as f:
        f.write(cp)
    return dest


if __name__ == "__main__":
    import sys

    generate(sys.argv[1], sys.argv[2], int(sys.argv[3]))
