"""Fixed synthetic benchmark stores, written by our own :class:`Appender`.

1 GiB of commitlog in 64 MiB segments, 2 topics x 8 queues, ``KEYS`` + ``UNIQ_KEY`` on every
message, default consume-queue and index geometry, 4.9.3 rules.  Messages go through the replay
path (``MessageBuilder.from_json`` with a fixed ``storeTimestamp``) and ``Appender.put`` in
process, so the commitlog, consume queues, index and checkpoint are what ``rmqstore append``
writes.  Index files are named after the store time (``store_time_namer``), the bodies come from
a fixed seed: two runs give the same bytes (the index file name is local time, as the broker's).

Building each message with ``from_json`` (~50 us) would dominate the 3.6 M-message 100 B store,
so one message per topic is built that way, with marker values, and the others are derived
from it by substituting their key digits; a sample of derived messages is compared with a full
``from_json`` build, so the shortcut cannot drift from the builder.

    python -m bench.gen          # generate (or reuse) the cached stores, print what was done

``MEMORY_STORES_LAYOUT`` adds the memory rows' stores: 1 GiB and 4 GiB of 100 B messages in the
broker's default 1 GiB segments (a per-segment table then holds ~3.6 M records, as on a real
broker; the throughput stores keep 64 MiB segments so that ``-j`` rows have many segments).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

import numpy as np

from rmqstore_cli.engine.log.appender import Appender
from rmqstore_cli.engine.config.storeconfig import StoreConfig
from rmqstore_cli.engine.derived.indexwriter import store_time_namer
from rmqstore_cli.engine.log.messages import MessageBuilder, OutMessage

SEGMENT_SIZE = 64 << 20
TOTAL_SIZE = 1 << 30
TOPICS = (b"BenchTopicA", b"BenchTopicB")
QUEUES = 8
BASE_TS = 1_700_000_000_000
BORN_HOST = "10.0.0.7:51234"
STORE_HOST = "10.0.0.1:10911"
BODY_SIZES = {"100B": 100, "1KiB": 1024, "4KiB": 4096}
BROKER_SEGMENT_SIZE = 1 << 30  # the broker's default mappedFileSizeCommitLog
# The text of the keys and tags: ASCII ("key000000000042", "TagA"), or Chinese, as many brokers' producers write them
# ("订单000000000042 支付", "标签A": well-formed UTF-8, hashed over UTF-16 code units). The stores named here hold
# the 100 B store's messages with the other text.
TEXTS = {"ascii": ("key", "", "Tag"), "zh": ("\u8ba2\u5355", " \u652f\u4ed8", "\u6807\u7b7e")}
TEXT_STORES = {"100B-zh": (100, "zh")}
# The memory rows: (body size, commitlog bytes, segment size). The same layout as the
# 100 B store but in the broker's 1 GiB segments: 1 GiB (one segment, ~3.6 M records) and four
# times that (4 segments, ~14.5 M messages, two index files): memory must grow with neither the
# records per segment nor the store.
MEMORY_STORES_LAYOUT = {"100B-1GiB-1Gseg": (100, 1 << 30, BROKER_SEGMENT_SIZE),
                        "100B-4GiB-1Gseg": (100, 4 << 30, BROKER_SEGMENT_SIZE)}
# bump when the layout below changes: invalidates bench/.cache (2: written by Appender; 3: memory
# stores in 1 GiB segments)
VERSION = 3
KEY_DIGITS = 12
SEED = 6
UNIQ_PREFIX = "0A0000070C3B1B6D3B2E"
_KEY_MARK = b"@" * KEY_DIGITS
_UNIQ_MARK = b"#" * KEY_DIGITS


def _fields(i: int):
    """Per-record values: round-robin over the 16 (topic, queue) pairs, 64 messages per store ms."""
    pair = i % (len(TOPICS) * QUEUES)
    topic = TOPICS[pair // QUEUES]
    st = BASE_TS + i // 64
    return topic, pair % QUEUES, i // (len(TOPICS) * QUEUES), st


def store_time(i: int) -> int:
    """storeTimestamp of message ``i`` (64 messages per ms): ``--until`` of a record prefix."""
    return _fields(i)[3]


def config() -> StoreConfig:
    return StoreConfig(version=4, mappedFileSizeCommitLog=SEGMENT_SIZE)


def _filler() -> bytes:
    rng = np.random.default_rng(SEED)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", np.uint8)
    return rng.choice(alphabet, size=max(BODY_SIZES.values()) + 1024).tobytes()


_FILLER = _filler()


def _body(i: int, size: int) -> bytes:
    start = (i * 7) % 1024  # bodies differ beyond their number prefix
    return ((b"%012d " % i) + _FILLER[start : start + size])[:size]


def _json(i: int, size: int, key: str | None = None, uniq: str | None = None, text: str = "ascii") -> dict:
    """The ``dump commitlog --json``-style object of message ``i`` (the replay input; ``text``: see TEXTS)."""
    topic, qid, _, st = _fields(i)
    head, tail, tag_text = TEXTS[text]
    tag = tag_text + ("A" if topic == TOPICS[0] else "B")
    return {"topic": topic.decode(), "queueId": qid, "bornTimestamp": st - 1, "storeTimestamp": st,
            "bornHost": BORN_HOST, "storeHost": STORE_HOST,
            "properties": {"KEYS": (key or f"{head}{i:0{KEY_DIGITS}d}") + tail,
                           "UNIQ_KEY": uniq or f"{UNIQ_PREFIX}{i:0{KEY_DIGITS}X}",
                           "TAGS": tag, "CLUSTER": "DefaultCluster"},
            "bodyHex": _body(i, size).hex()}


class _Messages:
    """Message ``i`` of a store, derived from one ``from_json`` template per topic."""

    def __init__(self, builder: MessageBuilder, size: int, text: str = "ascii"):
        self.size = size
        self.builder = builder
        self.text = text
        self.tpl = {}
        head = TEXTS[text][0]
        for t in range(len(TOPICS)):
            m = builder.from_json(_json(t * QUEUES, size, head + _KEY_MARK.decode(), UNIQ_PREFIX + _UNIQ_MARK.decode(),
                                        text))
            assert m.props_b.count(_KEY_MARK) == 1 and m.props_b.count(_UNIQ_MARK) == 1
            self.tpl[TOPICS[t]] = m

    def __call__(self, i: int) -> OutMessage:
        topic, qid, _, st = _fields(i)
        t = self.tpl[topic]
        key = b"%012d" % i
        uniq = b"%012X" % i
        pm = dict(t.props_map)
        head, tail, _ = TEXTS[self.text]
        pm["KEYS"] = head + key.decode() + tail
        pm["UNIQ_KEY"] = UNIQ_PREFIX + uniq.decode()
        return OutMessage(t.topic, t.topic_b, qid, t.flag, t.sysflag, st - 1, t.born_host, t.store_host,
                          t.reconsume_times, t.prepared_offset, _body(i, self.size),
                          t.props_b.replace(_KEY_MARK, key).replace(_UNIQ_MARK, uniq), t.crc_prop, t.magic, st, pm,
                          t.total_size)

    def check(self, i: int) -> None:
        assert self(i) == self.builder.from_json(_json(i, self.size, text=self.text)), f"derived message {i} drifted"


def generate(root: str, body_size: int, total: int = TOTAL_SIZE, seg_size: int = SEGMENT_SIZE, text: str = "ascii") -> dict:
    """Write a clean store at ``root`` (built in ``root.tmp``, then swapped in); returns a summary."""
    tmp = root + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    cfg = config().with_(mappedFileSizeCommitLog=seg_size)
    msgs = _Messages(MessageBuilder(cfg), body_size, text)
    size = msgs(0).total_size
    per_seg = (seg_size - 8) // size  # the Appender ends a segment with a BLANK once TOTALSIZE + 8 does not fit
    nseg = total // seg_size
    count = per_seg * nseg
    for i in (0, 1, 17, per_seg - 1, per_seg, count - 1):
        msgs.check(i)
    with Appender(tmp, cfg, index_namer=store_time_namer) as app:
        put = app.put
        for i in range(count):
            put([msgs(i)])
        end, blanks = app.offset, app.blanks
    assert blanks == nseg - 1 and end == (nseg - 1) * seg_size + per_seg * size, (blanks, end)
    os.makedirs(os.path.join(tmp, "config"), exist_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    os.rename(tmp, root)
    return {"records": count, "record_size": size, "bytes": count * size, "segments": nseg, "segment_size": seg_size,
            "first_store_timestamp": BASE_TS, "last_store_timestamp": _fields(count - 1)[3]}


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


if __name__ == "__main__":
    from bench import run

    for name in (*BODY_SIZES, *MEMORY_STORES_LAYOUT):
        run.store(name)
