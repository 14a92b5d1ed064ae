"""The compiled walker / header gather / CRC check give exactly what a plain reference gives.

References here are written independently of formats.fast (a struct loop, per-field struct
reads, zlib CRC). tests/test_kernel.py compares the kernels with the construct declarations.
"""

from __future__ import annotations

import random
import struct
import zlib

import numpy as np
import pytest

from rmqstore_cli.formats import fast
from rmqstore_cli.formats.message import encode_message
from rmqstore_cli.formats.records import MAGIC_BLANK, MAGIC_V1, MAGIC_V2, MIN_MESSAGE_SIZE, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6
from rmqstore_cli.engine.store import Store

from .conftest import CLEAN_STORES, STORE_NAMES, broker_read, shared_store

BOTH = (MAGIC_V1, MAGIC_V2)


def ref_walk(buf, pos, end, magics, max_records=1 << 62):
    """(offsets, stop, kind, size, magic) by reading one record at a time."""
    out = []
    while True:
        if pos + 8 > end:
            return out, pos, fast.STOP_EOF, 0, 0
        if len(out) >= max_records:
            return out, pos, fast.STOP_CHUNK, 0, 0
        size, magic = struct.unpack_from(">ii", buf, pos)
        if magic in magics:
            if size < MIN_MESSAGE_SIZE:
                return out, pos, fast.STOP_BAD_SIZE, size, magic
            if pos + size > end:
                return out, pos, fast.STOP_TORN, size, magic
            out.append(pos)
            pos += size
            continue
        if magic == MAGIC_BLANK:
            return out, pos, fast.STOP_BLANK, size, magic
        if magic == 0 and size == 0:
            return out, pos, fast.STOP_ZERO, size, magic
        return out, pos, fast.STOP_BAD_MAGIC, size, magic


def check_walk(buf, pos=0, end=None, magics=BOTH, max_records=1 << 62):
    end = len(buf) if end is None else end
    w = fast.walk(buf, pos, end, magics, max_records)
    got = (w.offsets.tolist(), w.stop, w.kind, w.size, w.magic)
    assert w.offsets.dtype == np.int64
    assert got == ref_walk(buf, pos, end, magics, max_records)
    return w


def _record(rng: random.Random, body: bytes, phy: int, v2: bool = False, v6: bool = False) -> bytes:
    topic = b"T" * rng.randint(1, 40)
    sysflag = (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6) if v6 else 0
    host = (bytes(16), 1) if v6 else (bytes([10, 0, 0, 1]), 2)
    props = b"KEYS\x01k%d\x02UNIQ_KEY\x01X" % rng.randint(0, 10**6)
    return encode_message(topic=topic, queue_id=rng.randint(0, 7), flag=0, queue_offset=rng.randint(0, 99),
                          physical_offset=phy, sysflag=sysflag, born_timestamp=1, born_host=host, store_timestamp=2,
                          store_host=host, reconsume_times=0, prepared_offset=0, body=body, properties=props,
                          magic=MAGIC_V2 if v2 else MAGIC_V1)


def synthetic(seed: int, n: int, tail: str, magic_bodies: bool = False) -> tuple[bytes, list[int]]:
    """n records of many sizes, then a tail: blank | zeros | torn | garbage | badsize | eof."""
    rng = random.Random(seed)
    out = bytearray()
    starts = []
    for _ in range(n):
        size = rng.choice([0, 1, 7, 100, 300, 1024, 3000, rng.randint(0, 6000)])
        body = bytearray(rng.randbytes(size))
        if magic_bodies and size >= 16:
            # magic codes (and whole fake records) inside bodies: false record starts
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(0, size - 8)
                body[at : at + 8] = struct.pack(">ii", rng.randint(91, 400), rng.choice(BOTH))
            if size > 400 and rng.random() < 0.5:
                fake = _record(rng, b"fake", 0)
                at = rng.randrange(0, size - len(fake))
                body[at : at + len(fake)] = fake
        starts.append(len(out))
        out += _record(rng, bytes(body), len(out), v2=rng.random() < 0.2, v6=rng.random() < 0.1)
    if tail == "blank":
        out += struct.pack(">ii", 4096, MAGIC_BLANK) + bytes(4088)
    elif tail == "zeros":
        out += bytes(rng.randint(8, 500))
    elif tail == "torn":
        out += _record(rng, rng.randbytes(200), len(out))[: rng.randint(8, 250)]
    elif tail == "garbage":
        out += rng.randbytes(64)
    elif tail == "badsize":
        out += struct.pack(">ii", 50, MAGIC_V1) + bytes(100)
    elif tail == "partial8":
        out += b"\x00\x00\x01"
    return bytes(out), starts


TAILS = ["blank", "zeros", "torn", "garbage", "badsize", "partial8", "eof"]


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("magic_bodies", [False, True])
def test_walk_matches_reference_on_synthetic(tail, magic_bodies):
    for seed in range(4):
        buf, starts = synthetic(seed * 31 + len(tail), 300, tail, magic_bodies)
        w = check_walk(buf)
        assert w.offsets.tolist() == starts
        check_walk(buf, magics=(MAGIC_V1,))  # v2 records end the walk as bad magic
        for max_records in (1, 2, 50, 299, 300, 301):
            check_walk(buf, max_records=max_records)
        mid = starts[100]
        check_walk(buf, pos=mid)
        check_walk(buf, pos=mid, end=starts[200] + 5)  # an end inside a record: torn
        check_walk(buf, end=starts[150])  # an end exactly on a boundary
        check_walk(buf, pos=mid + 3)  # not a record start: stops at once


def test_walk_blank_at_various_positions():
    rng = random.Random(5)
    buf, starts = synthetic(9, 120, "eof")
    for k in (0, 1, 2, 59, 60, 118, 119):
        cut = starts[k]
        data = buf[:cut] + struct.pack(">ii", rng.randint(8, 999), MAGIC_BLANK) + buf[cut + 8 :]
        w = check_walk(data)
        assert w.kind == fast.STOP_BLANK and w.stop == cut


def test_walk_with_fake_records_in_bodies_and_buffer_types():
    # Bodies full of magic codes and whole fake records: only the chain from the start counts.
    buf, starts = synthetic(77, 400, "zeros", magic_bodies=True)
    assert check_walk(buf).offsets.tolist() == starts
    assert check_walk(bytearray(buf)).offsets.tolist() == starts
    assert check_walk(memoryview(buf)).offsets.tolist() == starts


def test_walk_on_a_large_buffer():
    rng = random.Random(3)
    parts, starts, pos = [], [], 0
    while pos < (3 << 20):
        rec = _record(rng, rng.randbytes(rng.choice([10, 100, 900])), pos)
        starts.append(pos)
        parts.append(rec)
        pos += len(rec)
    buf = b"".join(parts) + bytes(64)
    assert check_walk(buf).offsets.tolist() == starts
    check_walk(buf, max_records=10_000)
    check_walk(buf, pos=starts[5000], max_records=4096)


def test_walk_on_shared_stores():
    for name in STORE_NAMES:
        st = Store.open(str(shared_store(name)))
        try:
            for seg in st.commitlog.segments:
                buf = seg.buffer()
                check_walk(buf)
                check_walk(buf, magics=(MAGIC_V1,))
                check_walk(bytes(buf), max_records=7)
        finally:
            st.close()


# --- header gather ------------------------------------------------------------------------------

def assert_headers_equal(a: fast.Headers, b: fast.Headers):
    for name in fast.Headers.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        assert np.array_equal(x, y), name


def test_decode_headers_matches_reference_on_shared_stores():
    for name in STORE_NAMES:
        st = Store.open(str(shared_store(name)))
        try:
            for seg in st.commitlog.segments:
                buf = seg.buffer()
                if not len(buf):
                    continue
                offs = np.array(ref_walk(buf, 0, len(buf), BOTH)[0], dtype=np.int64)
                assert_headers_equal(fast.decode_headers(buf, offs), fast.decode_headers_reference(buf, offs))
        finally:
            st.close()


def test_decode_headers_on_arbitrary_offsets():
    buf, starts = synthetic(11, 200, "torn", magic_bodies=True)
    rng = np.random.default_rng(1)
    cases = [np.array(starts), rng.integers(0, len(buf), 500), np.array([len(buf) - 1, len(buf) - 50, 0]),
             np.array([], dtype=np.int64)]
    for offs in cases:
        offs = np.asarray(offs, dtype=np.int64)
        assert_headers_equal(fast.decode_headers(buf, offs), fast.decode_headers_reference(buf, offs))


def test_decode_headers_fields_against_struct_reads():
    buf, starts = synthetic(12, 150, "eof")
    h = fast.decode_headers(buf, np.array(starts, dtype=np.int64))
    for i, p in enumerate(starts):
        total, magic, crc, qid = struct.unpack_from(">iiii", buf, p)
        sysflag = struct.unpack_from(">i", buf, p + 36)[0]
        bh = 20 if sysflag & SYSFLAG_BORNHOST_V6 else 8
        sh = 20 if sysflag & SYSFLAG_STOREHOST_V6 else 8
        st = p + 48 + bh
        blen = struct.unpack_from(">i", buf, st + 8 + sh + 12)[0]
        bstart = st + 8 + sh + 16
        tl = struct.unpack_from(">h" if magic == MAGIC_V2 else ">b", buf, bstart + blen)[0]
        assert (h.totalSize[i], h.magicCode[i], h.bodyCRC[i], h.queueId[i]) == (total, magic, crc, qid)
        assert h.storeTimestamp[i] == struct.unpack_from(">q", buf, st)[0]
        assert (h.bodyStart[i], h.bodyLength[i], h.topicLength[i]) == (bstart, blen, tl)
        assert h.reason[i] == fast.R_OK


# --- body CRC ----------------------------------------------------------------------------------

def test_check_body_crc_matches_zlib():
    buf, starts = synthetic(13, 200, "eof")
    data = bytearray(buf)
    h0 = fast.decode_headers(buf, np.array(starts, dtype=np.int64))
    flip = [3, 50, 199]
    for i in flip:
        if h0.bodyLength[i] > 0:
            data[int(h0.bodyStart[i])] ^= 0xFF
    h = fast.decode_headers(bytes(data), np.array(starts, dtype=np.int64))
    expect = np.array([b <= 0 or (zlib.crc32(data[s : s + b]) & 0x7FFFFFFF) == c
                       for s, b, c in zip(h.bodyStart.tolist(), h.bodyLength.tolist(), h.bodyCRC.tolist())])
    assert not expect.all()
    assert np.array_equal(fast.check_body_crc(bytes(data), h), expect)
    mask = np.zeros(len(h), dtype=bool)
    mask[::2] = True
    assert np.array_equal(fast.check_body_crc(bytes(data), h, mask), expect | ~mask)
    # a body that runs past the buffer never matches
    short = bytes(data[: starts[-1] + 100])
    last = fast.decode_headers(short, np.array([starts[-1]], dtype=np.int64))
    if last.bodyLength[0] > 12:
        assert not fast.check_body_crc(short, last)[0]


# --- the scan against the broker's own read-back ------------------------------------------------

@pytest.mark.parametrize("name", CLEAN_STORES + ["4.9.3-crash"])
def test_scan_offsets_are_the_brokers(name):
    st = Store.open(str(shared_store(name)))
    try:
        got = []
        for chunk in st.commitlog.scan(check_crc=True, chunk_records=37):
            got += chunk.phy.tolist()
            assert 0 < len(chunk.headers) <= 37
    finally:
        st.close()
    assert got == [m["offset"] for m in broker_read(name)["clmsg"]]


# --- -j: per-segment work in forked processes, merged in order -----------------------------------

@pytest.mark.parametrize("name", ["4.9.3-crash", "5.3.3-clean"])
def test_verify_jobs_gives_the_single_process_result(name):
    from rmqstore_cli.engine.verify.pipeline import verify_store, verify_segments_parallel

    st = Store.open(str(shared_store(name)))
    try:
        one = verify_store(st)
        two = verify_store(st, reports=verify_segments_parallel(st.commitlog, 2))
    finally:
        st.close()
    assert [f.as_json() for f in two.findings] == [f.as_json() for f in one.findings]
    assert two.summary == one.summary


def test_scan_split_into_ranges_equals_one_scan():
    from rmqstore_cli.engine.log.commitlog import ScanResult
    from rmqstore_cli.engine.parallel import split

    st = Store.open(str(shared_store("4.9.3-clean")))
    try:
        whole = [c.phy.tolist() for c in st.commitlog.scan()]
        parts = []
        ranges = split(len(st.commitlog.segments.segments), 5)
        for r in ranges[:-1]:
            res = ScanResult()
            parts += [c.phy.tolist() for c in st.commitlog.scan(start_index=r.start, end_index=r.stop, result=res)]
            assert res.stop.kind == fast.STOP_BLANK and res.stop.segment is st.commitlog.segments.segments[r.stop - 1]
        parts += [c.phy.tolist() for c in st.commitlog.scan(start_index=ranges[-1].start, end_index=ranges[-1].stop)]
    finally:
        st.close()
    assert sum(parts, []) == sum(whole, [])


def test_rebuild_jobs_gives_the_single_process_files(store_copy):
    from rmqstore_cli.engine.repair.rebuild import rebuild

    from .conftest import tree_digest

    digests = []
    for jobs in (1, 2):
        root = store_copy("4.9.3-ext", f"j{jobs}")
        st = Store.open(str(root))
        try:
            rebuild(st, "all", jobs=jobs)
        finally:
            st.close()
        digests.append({rel: d for rel, (d, _) in tree_digest(root).items()})
    assert digests[0] == digests[1]
    broker = tree_digest(shared_store("4.9.3-ext"))
    queues = [rel for rel in broker if rel.startswith("consumequeue")]
    assert queues and all(digests[1][rel] == broker[rel][0] for rel in queues)


def test_rebuild_jobs_topic_reads_the_strings_of_packed_batches(store_copy):
    """``-j`` batches travel without their decoded strings (engine/rebuild._SegmentStrings): a --topic
    rebuild reads every record's topic and keys in the parent, from the segment it maps itself; same files
    as one process."""
    from rmqstore_cli.engine.repair.rebuild import rebuild

    from .conftest import tree_digest

    digests = []
    for jobs in (1, 2):
        root = store_copy("4.9.3-clean", f"t{jobs}")
        st = Store.open(str(root))
        try:
            rebuild(st, "consumequeue", topic="OracleTopicA", jobs=jobs)
        finally:
            st.close()
        digests.append({rel: d for rel, (d, _) in tree_digest(root).items()})
    assert digests[0] == digests[1]


def test_a_packed_batch_reads_like_the_scanned_one(tmp_path):
    """What a ``-j`` worker sends for a scanned batch: its columns and the value spans of its strings (numpy
    arrays, not a Python string per record); unpacked against the store it reads as the same requests."""
    import pickle

    from rmqstore_cli.engine.derived.dispatch import Dispatcher
    from rmqstore_cli.engine.repair.rebuild import _pack_batch, _unpack_batch

    with Store.open(str(shared_store("4.9.3-clean"))) as st:
        d = Dispatcher(str(tmp_path / "never-written"), st.config)
        chunk = next(iter(st.commitlog.scan(check_crc=False)))
        b = d.requests_from_chunk(chunk)
        raw = pickle.dumps(_pack_batch(b, 0))
        back = _unpack_batch(pickle.loads(raw), st)
        assert back._uniq is None and back._keys is None  # nothing decoded on the way
        assert list(back) == list(b) and any(r.keys for r in b) and any(r.uniq_key for r in b)
        d.close(flush=False)


def test_a_packed_batch_keeps_every_column_exactly(tmp_path):
    """The int64 columns of a ``-j`` batch travel as int32 differences from their smallest value when they
    span less than 2^31 (half the bytes through the pipe): unpacked, every column has its dtype and values
    back, also far past 2^31 (a later segment's offsets) and when a column spans more (sent as it is)."""
    import pickle

    import numpy as np

    from rmqstore_cli.engine.derived.dispatch import Dispatcher
    from rmqstore_cli.engine.repair.rebuild import _narrow, _pack_batch, _unpack_batch, _widen

    for a in (np.asarray([2**40 + 7, 2**40, 2**40 + 2**31 - 1], np.int64), np.asarray([-5, 3], np.int64),
              np.asarray([0, 2**31], np.int64), np.asarray([-(2**63), 2**63 - 1], np.int64)):
        back = _widen(pickle.loads(pickle.dumps(_narrow(a))))
        assert back.dtype == np.int64 and np.array_equal(back, a), a
    with Store.open(str(shared_store("4.9.3-clean"))) as st:
        d = Dispatcher(str(tmp_path / "never-written"), st.config)
        for chunk in st.commitlog.scan(check_crc=False):
            b = d.requests_from_chunk(chunk)
            state = _pack_batch(b, chunk.segment.start // st.commitlog.segments.file_size)
            back = _unpack_batch(pickle.loads(pickle.dumps(state)), st)
            for k in ("phy", "size", "queue_id", "queue_offset", "sysflag", "store_timestamp", "tags_code",
                      "topic_ids", "key_count", "key_hashes", "_rows"):
                x, y = getattr(b, k), getattr(back, k)
                assert x.dtype == y.dtype and np.array_equal(x, y), k
            numbers = ("phy", "size", "queue_id", "queue_offset", "sysflag", "store_timestamp", "tags_code")
            sent = len(pickle.dumps({k: state[k] for k in numbers}))
            assert sent < len(pickle.dumps({k: getattr(b, k) for k in numbers}))
        d.close(flush=False)


def test_rebuild_jobs_loads_the_scan_kernels_before_forking():
    """``rebuild -j``: the parent loads the compiled scan and dispatch kernels before its workers are forked,
    so the workers inherit them instead of each paying numba's start-up. Checked in a fresh interpreter
    (in this one the kernels may be loaded already)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import tempfile
        from rmqstore_cli.engine.store import Store
        from rmqstore_cli.engine.derived.dispatch import Dispatcher
        from rmqstore_cli.engine.repair.rebuild import _warm_kernels
        from rmqstore_cli.formats import kernel, propkernel
        loaded = lambda: (len(kernel.scan_records.signatures), len(propkernel.find_props.signatures))
        assert loaded() == (0, 0), loaded()
        with Store.open({str(shared_store("4.9.3-clean"))!r}) as st:
            d = Dispatcher(tempfile.mkdtemp(), st.config)
            _warm_kernels(st, d)
            d.close(flush=False)
        assert min(loaded()) > 0, loaded()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
