"""The broker's next expired-file cleanup as ``dump store`` and ``stats`` show it, and the cleaner's inputs
(settings, clock, disk usage) that ``reclaim`` shares with them."""

from __future__ import annotations

import os
import re
import time
from typing import Optional

from rmqstore_cli.engine.errors import UsageError

from .common import Geometry, parse_time_option
from .output import iso_ms

# Test seams (and what-if knobs) for the prediction shown by dump store and stats, which take no such options.
NOW_ENV = "RMQSTORE_CLEANUP_NOW"
DISK_ENV = "RMQSTORE_CLEANUP_DISK"
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30,
          "T": 1 << 40, "TB": 1 << 40}

def parse_size(text: str, name: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?B?)\s*", str(text).upper())
    if not m:
        raise UsageError(f"{name}: {text!r} is not a size (bytes, or with K/M/G/T)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_disk(text: str, name: str):
    """USED/TOTAL (sizes, or PERCENT%/TOTAL): the disk as the cleaner would measure it; a second one after a
    comma is the consume queue's partition when it is another disk."""

    def one(part: str) -> tuple[int, int]:
        used, sep, total = part.partition("/")
        if not sep:
            raise UsageError(f"{name}: give USED/TOTAL, e.g. 920G/1T (then ,USED/TOTAL for the consume queue's disk)")
        t = parse_size(total, name)
        u = float(used.strip()[:-1]) / 100 * t if used.strip().endswith("%") else parse_size(used, name)
        if t <= 0 or u > t:
            raise UsageError(f"{name}: used must be at most the total, and the total positive")
        return int(u), t

    from rmqstore_cli.engine.repair.cleanup import assumed_disk

    parts = str(text).split(",")
    if len(parts) > 2:
        raise UsageError(f"{name}: at most two disks (commitlog, consume queue)")
    cl = one(parts[0])
    return assumed_disk(*cl, cq=one(parts[1]) if len(parts) == 2 else None)


def cleanup_inputs(st, geometry: Geometry, at: Optional[str] = None, assume_disk: Optional[str] = None):
    """The cleaner's settings (from --config), its "now" and the disk usage (measured unless given)."""
    from rmqstore_cli.engine.config.storeconfig import read_broker_conf
    from rmqstore_cli.engine.repair.cleanup import CleanupSettings, measure_disk

    settings = CleanupSettings.from_settings(read_broker_conf(geometry.config) if geometry.config else {},
                                             st.config.version)
    at = at if at is not None else os.environ.get(NOW_ENV)
    now = parse_time_option(at, "--at") if at is not None else int(time.time() * 1000)
    assume_disk = assume_disk if assume_disk is not None else os.environ.get(DISK_ENV)
    disk = parse_disk(assume_disk, "--assume-disk") if assume_disk else measure_disk(
        st.commitlog.directory, os.path.join(st.root, "consumequeue"))
    return settings, now, disk


def next_cleanup(st, geometry: Geometry) -> dict:
    """The broker's next cleanup as one object (dump store, stats); an error is said, not raised."""
    from rmqstore_cli.engine.errors import RmqStoreError
    from rmqstore_cli.engine.repair.reclaim import plan_reclaim

    try:
        settings, now, disk = cleanup_inputs(st, geometry)
        plan = plan_reclaim(st, "as-broker", settings=settings, now_ms=now, disk=disk)
    except (RmqStoreError, OSError) as e:
        return {"error": str(e)}
    s = plan.summary()
    p = s["prediction"]
    return {"brokerStart": p["brokerStart"], "disk": p["disk"], "settings": p["settings"],
            "commitlogFiles": [f["name"] + " (" + f["reason"] + ")" for f in s["commitlogFiles"]],
            "derivedFiles": len(s["derivedFiles"]), "minPhyOffsetBefore": s["minPhyOffsetBefore"],
            "minPhyOffsetAfter": s["minPhyOffsetAfter"], "freedBytes": s["freedBytes"],
            "unconsumedLost": s["unconsumedLost"],
            "consumerLoss": [r for r in s["consumerLoss"] if r["unconsumedLost"]]}


def cleanup_lines(c: dict) -> list[str]:
    """next_cleanup() in a few lines of text."""
    if c.get("error"):
        return [f"broker's next cleanup: not predicted ({c['error']})"]
    d = c["disk"]
    head = (f"broker's next cleanup (start at {iso_ms(c['brokerStart'])}, commitlog disk "
            f"{d['commitlogRatio'] * 100:.1f} % used, {d['source']}): ")
    if not c["commitlogFiles"] and not c["derivedFiles"]:
        return [head + "deletes nothing"]
    out = [head + f"deletes {len(c['commitlogFiles'])} commitlog file(s) and {c['derivedFiles']} derived file(s), "
           f"min offset {c['minPhyOffsetBefore']} -> {c['minPhyOffsetAfter']}, {c['freedBytes']} bytes freed"]
    if c["unconsumedLost"]:
        out.append(f"  consumers lose {c['unconsumedLost']} unconsumed message(s): " + ", ".join(
            f"{r['group']} {r['topic']}/{r['queueId']}: {r['unconsumedLost']}" for r in c["consumerLoss"][:8])
            + (" …" if len(c["consumerLoss"]) > 8 else ""))
    return out
