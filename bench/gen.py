"""Fixed synthetic benchmark stores (issue #6): 1 GiB commitlog, 64 MiB segments, 2 topics x 8
queues, KEYS + UNIQ_KEY on every message, default-geometry index, 4.9.3 layout.

Stand-in writer until ``rmqstore append`` lands: records are laid out by
:func:`formats.message.encode_message` (one template per store, fields patched per record with
numpy, every record of a store has the same size), and a sample of records is re-encoded with
``encode_message`` and compared byte for byte, so the patching cannot drift from the codec.
Consume queues and the index are written with the rules of FORMAT.md §7 and §10.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import time

import numpy as np

from formats.hashing import crc31, index_key_hash, java_hash
from formats.java_hashmap import broker_properties_string
from formats.message import encode_message
from formats.records import MAGIC_BLANK

SEGMENT_SIZE = 64 << 20
TOTAL_SIZE = 1 << 30
CQ_FILE_SIZE = 6_000_000
HASH_SLOTS = 5_000_000
INDEX_NUM = 20_000_000
TOPICS = (b"BenchTopicA", b"BenchTopicB")
QUEUES = 8
BASE_TS = 1_700_000_000_000
BORN_HOST = (bytes([10, 0, 0, 7]), 51234)
STORE_HOST = (bytes([10, 0, 0, 1]), 10911)
BODY_SIZES = {"100B": 100, "1KiB": 1024, "4KiB": 4096}
VERSION = 1  # bump when the layout below changes: invalidates bench/.cache
KEY_DIGITS = 12


def _fields(i: int):
    """Per-record values: round-robin over the 16 (topic, queue) pairs."""
    pair = i % (len(TOPICS) * QUEUES)
    topic = TOPICS[pair // QUEUES]
    st = BASE_TS + i // 64
    return topic, pair % QUEUES, i // (len(TOPICS) * QUEUES), st


def _props(i: int, topic: bytes) -> bytes:
    tag = "TagA" if topic == TOPICS[0] else "TagB"
    props = {"KEYS": f"key{i:0{KEY_DIGITS}d}", "UNIQ_KEY": f"0A0000070C3B1B6D3B2E{i:0{KEY_DIGITS}X}",
             "TAGS": tag, "CLUSTER": "DefaultCluster"}
    return broker_properties_string(props, 4).encode("utf-8")


def _body(i: int, size: int) -> bytes:
    text = (b"%012d " % i) + b"lorem ipsum dolor sit amet consectetur adipiscing elit " * (size // 50 + 1)
    return text[:size]


def encode(i: int, phy: int, body_size: int) -> bytes:
    topic, qid, qoff, st = _fields(i)
    return encode_message(topic=topic, queue_id=qid, flag=0, queue_offset=qoff, physical_offset=phy, sysflag=0,
                          born_timestamp=st - 1, born_host=BORN_HOST, store_timestamp=st, store_host=STORE_HOST,
                          reconsume_times=0, prepared_offset=0, body=_body(i, body_size), properties=_props(i, topic))


def _digits(values: np.ndarray, n: int, base: int) -> np.ndarray:
    """ASCII digits (upper-case hex for base 16), most significant first: shape (len, n)."""
    out = np.empty((len(values), n), np.uint8)
    v = values.astype(np.int64).copy()
    for k in range(n - 1, -1, -1):
        d = v % base
        out[:, k] = np.where(d < 10, d + 48, d + 55)
        v //= base
    return out


def _put(arr: np.ndarray, col: int, values: np.ndarray, fmt: str) -> None:
    width = np.dtype(fmt).itemsize
    arr[:, col : col + width] = np.ascontiguousarray(values.astype(fmt)).view(np.uint8).reshape(-1, width)


class _Layout:
    """Byte positions of the patched fields inside the fixed-size record."""

    def __init__(self, body_size: int):
        rec0 = encode(0, 0, body_size)
        self.template = np.frombuffer(rec0, np.uint8).copy()
        self.size = len(rec0)
        self.body = 88  # IPv4 hosts: 48 + 8 + 8 + 8 + 4 + 8 + 4
        self.topic = self.body + body_size + 1
        props_at = self.topic + len(TOPICS[0]) + 2
        raw = rec0[props_at:]
        self.key = props_at + raw.index(b"key") + 3
        self.uniq = props_at + raw.index(b"3B2E") + 4
        self.tag = props_at + raw.index(b"TagA") + 3


def _records(lay: _Layout, first: int, n: int, seg_start: int, body_size: int) -> np.ndarray:
    idx = np.arange(first, first + n, dtype=np.int64)
    arr = np.tile(lay.template, (n, 1))
    pair = idx % (len(TOPICS) * QUEUES)
    st = BASE_TS + idx // 64
    _put(arr, 12, pair % QUEUES, ">i4")
    _put(arr, 20, idx // (len(TOPICS) * QUEUES), ">i8")
    _put(arr, 28, seg_start + np.arange(n, dtype=np.int64) * lay.size, ">i8")
    _put(arr, 40, st - 1, ">i8")
    _put(arr, 56, st, ">i8")
    second = (pair // QUEUES).astype(np.uint8)
    arr[:, lay.topic + len(TOPICS[0]) - 1] = ord("A") + second
    arr[:, lay.tag] = ord("A") + second
    arr[:, lay.body : lay.body + KEY_DIGITS] = _digits(idx, KEY_DIGITS, 10)
    arr[:, lay.key : lay.key + KEY_DIGITS] = _digits(idx, KEY_DIGITS, 10)
    arr[:, lay.uniq : lay.uniq + KEY_DIGITS] = _digits(idx, KEY_DIGITS, 16)
    flat = memoryview(arr).cast("B")
    s, b, size = lay.body, body_size, lay.size
    crcs = np.array([crc31(flat[r * size + s : r * size + s + b]) for r in range(n)], dtype=np.int64)
    _put(arr, 8, crcs, ">i4")
    return arr


def _write_cq(root: str, meta: dict) -> None:
    phy, size, idx = meta["phy"], meta["size"], meta["idx"]
    pair = idx % (len(TOPICS) * QUEUES)
    tags = {t: java_hash("TagA" if t == TOPICS[0] else "TagB") for t in TOPICS}
    per_file = CQ_FILE_SIZE // 20
    unit = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
    for p in range(len(TOPICS) * QUEUES):
        topic = TOPICS[p // QUEUES]
        sel = pair == p
        units = np.zeros(int(sel.sum()), unit)
        units["phy"] = phy[sel]
        units["size"] = size
        units["tags"] = tags[topic]
        d = os.path.join(root, "consumequeue", topic.decode(), str(p % QUEUES))
        os.makedirs(d, exist_ok=True)
        for k in range(0, len(units), per_file):
            with open(os.path.join(d, "%020d" % (k * 20)), "wb") as f:
                f.write(units[k : k + per_file].tobytes())
                f.truncate(CQ_FILE_SIZE)


def _write_index(root: str, meta: dict) -> None:
    idx, phy, st = meta["idx"], meta["phy"], meta["st"]
    n = len(idx)
    # Keys per message, in broker order: UNIQ_KEY then KEYS (§10.3).
    key_hash = np.empty(2 * n, np.int64)
    topics = [_fields(i)[0].decode() for i in range(len(TOPICS) * QUEUES)]
    pairs = len(topics)
    uniq = [f"{topics[i % pairs]}#0A0000070C3B1B6D3B2E{i:0{KEY_DIGITS}X}" for i in idx.tolist()]
    keys = [f"{topics[i % pairs]}#key{i:0{KEY_DIGITS}d}" for i in idx.tolist()]
    key_hash[0::2] = _java_hash_fixed(uniq)
    key_hash[1::2] = _java_hash_fixed(keys)
    assert key_hash[0] == index_key_hash(uniq[0]) and key_hash[-1] == index_key_hash(keys[-1])
    entries = 2 * n
    assert entries < INDEX_NUM
    ephy = np.repeat(phy, 2)
    est = np.repeat(st, 2)
    slot = key_hash % HASH_SLOTS
    order = np.argsort(slot, kind="stable")
    prev = np.zeros(entries, np.int64)
    same = slot[order[1:]] == slot[order[:-1]]
    prev[order[1:][same]] = order[:-1][same] + 1
    slots = np.zeros(HASH_SLOTS, ">i4")
    last = np.ones(entries, bool)
    last[:-1] = ~same
    slots[slot[order[last]]] = order[last] + 1
    begin = int(est[0])
    ent = np.zeros(entries + 1, np.dtype([("h", ">i4"), ("phy", ">i8"), ("diff", ">i4"), ("prev", ">i4")]))
    ent["h"][1:] = key_hash
    ent["phy"][1:] = ephy
    ent["diff"][1:] = (est - begin) // 1000
    ent["prev"][1:] = prev
    header = struct.pack(">qqqqii", begin, int(est[-1]), int(ephy[0]), int(ephy[-1]), int(last.sum()), entries + 1)
    d = os.path.join(root, "index")
    os.makedirs(d, exist_ok=True)
    name = time.strftime("%Y%m%d%H%M%S", time.localtime(BASE_TS / 1000)) + "000"
    with open(os.path.join(d, name), "wb") as f:
        f.write(header)
        f.write(slots.tobytes())
        f.write(ent.tobytes())
        f.truncate(40 + HASH_SLOTS * 4 + INDEX_NUM * 20)


def _java_hash_fixed(names: list[str]) -> np.ndarray:
    """abs(String.hashCode) of equal-length ASCII strings, vectorised (§10.3)."""
    length = len(names[0])
    chars = np.frombuffer("".join(names).encode("ascii"), np.uint8).reshape(-1, length)
    h = np.zeros(len(names), np.uint64)
    for k in range(length):
        h = (h * np.uint64(31) + chars[:, k]) & np.uint64(0xFFFFFFFF)
    s = h.astype(np.int64)
    s = np.where(s >= 1 << 31, s - (1 << 32), s)
    return np.where(s == -(1 << 31), 0, np.abs(s))


def generate(root: str, body_size: int, total: int = TOTAL_SIZE, seg_size: int = SEGMENT_SIZE) -> dict:
    """Write a clean store at ``root`` (replaced if present); returns a summary."""
    tmp = root + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "commitlog"))
    lay = _Layout(body_size)
    per_seg = (seg_size - 8) // lay.size
    nseg = total // seg_size
    phys, idxs = [], []
    first = 0
    for s in range(nseg):
        start = s * seg_size
        arr = _records(lay, first, per_seg, start, body_size)
        if s == 0:
            for r in (0, 1, 17, per_seg - 1):
                assert arr[r].tobytes() == encode(r, r * lay.size, body_size), "template patching drifted"
        with open(os.path.join(tmp, "commitlog", "%020d" % start), "wb") as f:
            f.write(memoryview(arr).cast("B"))
            if s + 1 < nseg:  # every full segment ends in a BLANK; the last one ends in zeros
                f.write(struct.pack(">ii", seg_size - per_seg * lay.size, MAGIC_BLANK))
            f.truncate(seg_size)
        phys.append(start + np.arange(per_seg, dtype=np.int64) * lay.size)
        idxs.append(np.arange(first, first + per_seg, dtype=np.int64))
        first += per_seg
    last = encode(first + 1, 0, body_size)  # spot-check a late record too
    assert len(last) == lay.size
    meta = {"phy": np.concatenate(phys), "idx": np.concatenate(idxs), "size": lay.size}
    meta["st"] = BASE_TS + meta["idx"] // 64
    _write_cq(tmp, meta)
    _write_index(tmp, meta)
    last_st = int(meta["st"][-1])
    with open(os.path.join(tmp, "checkpoint"), "wb") as f:
        f.write(struct.pack(">qqq", last_st, last_st, 0))
        f.truncate(4096)
    os.makedirs(os.path.join(tmp, "config"), exist_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    os.rename(tmp, root)
    return {"records": first, "record_size": lay.size, "bytes": first * lay.size, "segments": nseg,
            "first_store_timestamp": BASE_TS, "last_store_timestamp": last_st}


def make_crash_copy(src: str, dest: str) -> None:
    """A crash store: abort present, checkpoint at the start (recovery walks everything)."""
    shutil.rmtree(dest, ignore_errors=True)
    # Commitlog files hard-linked (the harness never writes them: recover runs on a copy of
    # this copy whose last segment is real), the rest copied sparsely: the cache stays lean.
    os.makedirs(os.path.join(dest, "commitlog"))
    for name in os.listdir(os.path.join(src, "commitlog")):
        os.link(os.path.join(src, "commitlog", name), os.path.join(dest, "commitlog", name))
    for part in ("consumequeue", "index", "config", "checkpoint"):
        subprocess.run(["cp", "-a", "--sparse=always", os.path.join(src, part), os.path.join(dest, part)], check=True)
    open(os.path.join(dest, "abort"), "wb").close()
    with open(os.path.join(dest, "checkpoint"), "r+b") as f:
        f.write(struct.pack(">qqq", BASE_TS, BASE_TS, 0))
