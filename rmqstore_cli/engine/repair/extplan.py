"""Ext queues in recovery planning: the broker's ``ConsumeQueueExt.recover`` and
``truncateByMaxAddress`` (§8.5, §8.6), and ours after a queue is cut.

The broker cuts an ext queue only when a consume queue is recovered at start: after the walk of
every ext file it truncates the ext log behind the unit of the last ext address its recovery saw.
Its ``truncateDirtyLogicFiles`` (§13.7) tracks that address but returns before using it, so a cut of
the commitlog leaves the ext units of the cut units in place until the next start removes them.
A plan here cuts the ext right behind the unit the queue's last kept unit references (zero-filling
the tail, moving later files into the backup), so the store it leaves is the one the broker's next
start would make, and a plan made right after it finds nothing to do.
"""

from __future__ import annotations

import struct

import numpy as np

from rmqstore_cli.formats.extaddr import MAX_ADDR, is_ext_addr, undecorate
from rmqstore_cli.formats.records import CQ_UNIT_SIZE

from .probes import nonzero_after, queue_file_units


def ext_walk_end(segs) -> int:
    """§8.5: each file is read unit by unit up to a size <= 0; the log ends in the last file."""
    end = 0
    for seg in segs:
        buf = seg.buffer()
        pos = 0
        while pos + 2 <= seg.size:
            (size,) = struct.unpack_from(">h", buf, pos)
            if size <= 0:
                break
            pos += size
        end = seg.start + pos
    return end


def recover_ext(planner, key, qs) -> None:
    """The broker's start on one ext queue: the walk, then ``truncateByMaxAddress`` with the last ext
    address its consume-queue recovery saw (``qs.max_ext``)."""
    if key not in planner.exts:
        return
    ext, segs = planner.exts[key]
    end = ext_walk_end(segs)
    planner.ext_walk_ends[key] = end
    if is_ext_addr(qs.max_ext):
        unit = ext.get(qs.max_ext)
        if unit is not None and undecorate(qs.max_ext) + unit["size"] < end:
            end = undecorate(qs.max_ext) + unit["size"]
    for seg in segs:
        if seg.start > end:
            planner.move_aside(seg.path, "ext recovery: file after the ext end")
        elif seg.start <= end < seg.start + ext.file_size and nonzero_after(seg.path, end - seg.start):
            planner.act("zero_tail", seg.path, "ext recovery: bytes after the last ext unit zeroed", offset=end - seg.start)


def last_ext_address(qs) -> int | None:
    """The ext address of the last unit the queue keeps (its files up to ``qs.end``), newest file first."""
    for seg in reversed(qs.segments):
        if seg.start >= qs.end:
            continue
        arr = queue_file_units(seg, qs.file_size)
        n = min(len(arr), (qs.end - seg.start) // CQ_UNIT_SIZE)
        tags = arr["tagsCode"][:n]
        hit = np.flatnonzero(tags <= MAX_ADDR)
        if len(hit):
            return int(tags[hit[-1]])
    return None


def cut_exts_to_queues(planner, why: str) -> None:
    """Every ext queue ends right behind the unit its consume queue's last kept unit references (at 0
    when none does): what the broker's next start leaves, done now (§8.6: its truncation of dirty
    logic files does not cut the ext)."""
    for key, (ext, segs) in planner.exts.items():
        qs = planner.queues.get(key)
        if qs is None or not segs:
            continue
        walk_end = planner.ext_walk_ends.get(key)
        if walk_end is None:
            walk_end = planner.ext_walk_ends[key] = ext_walk_end(segs)
        addr = last_ext_address(qs) if qs.segments else None
        if addr is None:
            end = 0
        else:
            unit = ext.get(addr)
            end = undecorate(addr) + unit["size"] if unit is not None else walk_end
        cut_ext(planner, key, min(end, walk_end), why)


def cut_ext(planner, key, ext_end: int, why: str = "belong to rewritten consume-queue units") -> None:
    """The ext queue ends exactly at ``ext_end``: later files are moved into the backup and the bytes after it
    zeroed. Replaces the ext actions planned before (the §8.5 cut follows the ext address the broker's
    recovery saw last: a lying unit can name any address, a cut queue no longer references its tail)."""
    ext, segs = planner.exts[key]
    fs = ext.file_size
    paths = {seg.path for seg in segs}
    planner.plan.actions = [a for a in planner.plan.actions if a.path not in paths]
    planner.moved -= paths
    for seg in segs:
        if seg.start > ext_end or (seg.start == ext_end and seg.start > 0):
            planner.move_aside(seg.path, f"ext units from {ext_end} {why}")
        elif seg.start <= ext_end < seg.start + fs and nonzero_after(seg.path, ext_end - seg.start):
            planner.act("zero_tail", seg.path, f"ext units from {ext_end} {why}", offset=ext_end - seg.start)
