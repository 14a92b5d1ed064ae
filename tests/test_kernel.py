"""The compiled commitlog kernels (formats/kernel.py) against the construct declarations and an
independent reference of the read path they replaced.

The reference here is the pre-kernel algorithm written plainly: a struct walk (``ref_walk``), the
clipped numpy gather (``fast.decode_headers_reference``), zlib CRCs and the §4.2 property rule, then
"first invalid record ends the walk". Every record that reference calls valid is also decoded with
``records.MESSAGE`` (construct) and every column compared, field positions included.
Damaged inputs come from tests/fuzzlib.py's generators with a fixed seed (printed).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from construct import Struct, Tell

from rmqstore_cli.formats import fast, kernel, records
from rmqstore_cli.formats.hashing import parse_crc_property_digits
from rmqstore_cli.formats.message import encode_message
from rmqstore_cli.engine.store import Store

from . import fuzzlib
from .conftest import REPO, STORE_NAMES, shared_store
from .test_fast_paths import ref_walk, synthetic

BOTH = (records.MAGIC_V1, records.MAGIC_V2)
FUZZ_SEED = int(os.environ.get("RMQSTORE_KERNEL_FUZZ_SEED", "20261124"))
FUZZ_CASES = int(os.environ.get("RMQSTORE_KERNEL_FUZZ_CASES", "60"))  # commitlog-damage cases

# --- layout constants of the kernel == the declarations -------------------------------------------


def test_kernel_layout_matches_records():
    offsets, at = {}, 0
    for name, ctype in records.MESSAGE_PREFIX_FIELDS:
        offsets[name] = at
        at += ctype.sizeof()
    assert (kernel.OFF_TOTALSIZE, kernel.OFF_MAGIC, kernel.OFF_BODYCRC, kernel.OFF_QUEUEID, kernel.OFF_FLAG,
            kernel.OFF_QUEUEOFFSET, kernel.OFF_PHYSICALOFFSET, kernel.OFF_SYSFLAG, kernel.OFF_BORNTIMESTAMP) == tuple(
        offsets[n] for n in ("totalSize", "magicCode", "bodyCRC", "queueId", "flag", "queueOffset", "physicalOffset",
                             "sysFlag", "bornTimestamp"))
    assert kernel.OFF_BORNHOST == at == fast.PREFIX_SIZE
    # what follows the born host, relative to its end: storeTimestamp, storeHost, then (after the
    # store host) reconsumeTimes, preparedTransactionOffset, bodyLength, body
    mid = dict(records.MESSAGE_MIDDLE_FIELDS)
    assert [n for n, _ in records.MESSAGE_MIDDLE_FIELDS] == ["storeTimestamp", "storeHost", "reconsumeTimes",
                                                            "preparedTransactionOffset", "bodyLength"]
    assert (kernel.MID_STOREHOST, kernel.TAIL_PREPARED, kernel.TAIL_BODYLENGTH, kernel.TAIL_BODY) == (
        mid["storeTimestamp"].sizeof(), mid["reconsumeTimes"].sizeof(),
        mid["reconsumeTimes"].sizeof() + mid["preparedTransactionOffset"].sizeof(),
        mid["reconsumeTimes"].sizeof() + mid["preparedTransactionOffset"].sizeof() + mid["bodyLength"].sizeof())
    assert (kernel.HOST_V4_WIDTH, kernel.HOST_V6_WIDTH) == (records.HOST_V4.sizeof(), records.HOST_V6.sizeof())
    assert (kernel.SYSFLAG_BORNHOST_V6, kernel.SYSFLAG_STOREHOST_V6) == (records.SYSFLAG_BORNHOST_V6,
                                                                      records.SYSFLAG_STOREHOST_V6)
    assert (kernel.MAGIC_V2, kernel.MAGIC_BLANK) == (records.MAGIC_V2, records.MAGIC_BLANK)
    assert kernel.MIN_MESSAGE_SIZE == records.MIN_MESSAGE_SIZE
    assert kernel.SIZE_BASE + 8 + 8 + 1 == records.message_total_size(0, records.MAGIC_V1, 0, 0, 0)
    assert kernel.CRC32_RESERVED_LEN == records.CRC32_RESERVED_LEN
    assert kernel.CRC_PROP_PREFIX == fast.CRC_PROP_PREFIX
    assert (kernel.R_OK, kernel.R_BODY_CRC, kernel.R_TOPIC_LENGTH, kernel.R_LENGTHS, kernel.R_TOTALSIZE,
            kernel.R_PROP_CRC) == (fast.R_OK, fast.R_BODY_CRC, fast.R_TOPIC_LENGTH, fast.R_LENGTHS, fast.R_TOTALSIZE,
                                   fast.R_PROP_CRC)
    assert (kernel.PROP_NONE, kernel.PROP_IF_PRESENT, kernel.PROP_REQUIRED) == (
        fast.PROP_NONE, fast.PROP_IF_PRESENT, fast.PROP_REQUIRED)
    assert set(kernel.I32_COLUMNS) | set(kernel.I64_COLUMNS) | {"reason"} == set(fast.Headers.__slots__)


# --- references ------------------------------------------------------------------------------------

# MESSAGE with a Tell before every field: the declaration itself says where each field starts.
_TOLD = Struct(*[x for sc in records.MESSAGE.subcons for x in (("at_" + sc.name) / Tell, sc)])


def construct_row(data: bytes, off: int, total: int) -> dict:
    """Every Headers column of the record at ``off``, from the construct declaration alone."""
    c = _TOLD.parse(data[off:off + total])
    return {
        "offsets": off, "totalSize": c.totalSize, "magicCode": c.magicCode, "bodyCRC": c.bodyCRC,
        "queueId": c.queueId, "flag": c.flag, "queueOffset": c.queueOffset, "physicalOffset": c.physicalOffset,
        "sysFlag": c.sysFlag, "bornTimestamp": c.bornTimestamp, "bornHostStart": off + c.at_bornHost,
        "bornHostLen": c.at_storeTimestamp - c.at_bornHost, "storeTimestamp": c.storeTimestamp,
        "storeHostStart": off + c.at_storeHost, "storeHostLen": c.at_reconsumeTimes - c.at_storeHost,
        "reconsumeTimes": c.reconsumeTimes, "preparedTransactionOffset": c.preparedTransactionOffset,
        "bodyStart": off + c.at_body, "bodyLength": c.bodyLength, "topicStart": off + c.at_topic,
        "topicLength": c.topicLength, "propsStart": off + c.at_properties, "propsLength": c.propertiesLength,
        "computedSize": len(_TOLD.build(c)), "reason": fast.R_OK,
        "_body": c.body,
    }


def ref_prop_crc_ok(data: bytes, off: int, total: int) -> bool:
    tail = data[off + total - records.CRC32_RESERVED_LEN:off + total]
    if not tail.startswith(fast.CRC_PROP_PREFIX) or tail[-1:] != b"\x02":
        return False
    try:
        expected = parse_crc_property_digits(tail[len(fast.CRC_PROP_PREFIX):-1].decode("ascii"))
    except UnicodeDecodeError:
        return False
    return expected >= 0 and zlib.crc32(data[off:off + total - records.CRC32_RESERVED_LEN]) & 0x7FFFFFFF == expected


def ref_validate(data: bytes, h: fast.Headers, check_crc: bool, prop: int) -> np.ndarray:
    """The pre-kernel CommitLog.validate: body CRC (replacing any reason), then the property CRC."""
    reason = h.reason.copy()
    for i in range(len(h)):
        s, n = int(h.bodyStart[i]), int(h.bodyLength[i])
        if check_crc and n > 0:
            if s + n > len(data) or zlib.crc32(data[s:s + n]) & 0x7FFFFFFF != int(h.bodyCRC[i]):
                reason[i] = fast.R_BODY_CRC
        if prop != fast.PROP_NONE and reason[i] == fast.R_OK:
            pl = int(h.propsLength[i])
            q = int(h.propsStart[i]) + max(pl, 0) - records.CRC32_RESERVED_LEN
            has = pl >= records.CRC32_RESERVED_LEN and data[q:q + len(fast.CRC_PROP_PREFIX)] == fast.CRC_PROP_PREFIX
            if (has or prop == fast.PROP_REQUIRED) and not (
                    has and ref_prop_crc_ok(data, int(h.offsets[i]), int(h.totalSize[i]))):
                reason[i] = fast.R_PROP_CRC
    return reason


def ref_scan(data: bytes, pos: int, end: int, magics, check_crc: bool, prop: int):
    """(valid record headers, (stop, kind, size, magic, reason)) the way the read path worked
    before the kernel: walk the chain, decode, validate, cut at the first invalid record."""
    offs, stop, kind, size, magic = ref_walk(data, pos, end, magics)
    h = fast.decode_headers_reference(data, np.array(offs, dtype=np.int64))
    h.reason = ref_validate(data, h, check_crc, prop)
    bad = np.flatnonzero(h.reason != fast.R_OK)
    if len(bad):
        b = int(bad[0])
        return h.take(b), (int(h.offsets[b]), fast.STOP_INVALID, int(h.totalSize[b]), int(h.magicCode[b]),
                           int(h.reason[b]))
    return h, (stop, kind, size, magic, fast.R_OK)


def kernel_scan(data, pos: int, end: int, magics, check_crc: bool, prop: int, chunk: int):
    parts = []
    while True:
        step = fast.scan_records(data, pos, end, magics, chunk, check_crc, prop)
        parts.append(step.headers)
        assert len(step.headers) <= chunk
        pos = step.stop
        if step.kind != fast.STOP_CHUNK:
            break
    h = fast.Headers()
    for name in fast.Headers.__slots__:
        setattr(h, name, np.concatenate([getattr(p, name) for p in parts]))
    return h, (step.stop, step.kind, step.size, step.magic, step.reason)


def assert_headers_equal(a: fast.Headers, b: fast.Headers, where: str = ""):
    assert len(a) == len(b), where
    for name in fast.Headers.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, (where, name)
        assert np.array_equal(x, y), (where, name, np.flatnonzero(x != y)[:5])


STOPS_SEEN: set = set()


def check_segment(data: bytes, where: str, magics=BOTH, check_crc=True, prop=fast.PROP_NONE, chunk=97,
                  with_construct=True) -> int:
    """Kernel scan == reference scan (all columns, stop); every valid record == construct. Returns
    the number of valid records; the stop kind (and reason) goes into STOPS_SEEN."""
    want, want_stop = ref_scan(data, 0, len(data), magics, check_crc, prop)
    got, got_stop = kernel_scan(data, 0, len(data), magics, check_crc, prop, chunk)
    assert got_stop == want_stop, where
    assert_headers_equal(got, want, where)
    STOPS_SEEN.add((got_stop[1], got_stop[4]))
    if with_construct:
        u8 = fast.kernel_view(data)
        for i, off in enumerate(got.offsets.tolist()):
            row = construct_row(data, off, int(got.totalSize[i]))
            body = row.pop("_body")
            assert {n: getattr(got, n)[i].item() for n in row} == row, (where, off)
            # the CRC value itself, not only the comparison: java.util.zip.CRC32 == zlib.crc32
            assert int(kernel.crc32_of(u8, int(got.bodyStart[i]), len(body))) == zlib.crc32(body), (where, off)
            if body:
                assert zlib.crc32(body) & 0x7FFFFFFF == row["bodyCRC"]
    return len(got)


# --- every record of every broker-written store -----------------------------------------------------

@pytest.mark.parametrize("name", STORE_NAMES)
def test_kernel_equals_construct_on_broker_stores(name):
    st = Store.open(str(shared_store(name)))
    checked = 0
    try:
        prop = st.commitlog.prop_crc_policy(True)
        for k, seg in enumerate(st.commitlog.segments):
            data = bytes(seg.buffer())
            chunk = (7, 97, 8192)[k % 3]
            checked += check_segment(data, f"{name} {seg.name}", prop=prop, chunk=chunk)
            # 4.x magic only: a v2 record ends the walk as bad magic
            check_segment(data, f"{name} {seg.name} v1", magics=(records.MAGIC_V1,), chunk=chunk, with_construct=False)
            check_segment(data, f"{name} {seg.name} nocrc", check_crc=False, chunk=chunk, with_construct=False)
    finally:
        st.close()
    assert checked == sum(1 for _ in _broker_records(name))


def _broker_records(name):
    from .conftest import broker_read

    return broker_read(name)["clmsg"]


def test_kernel_reads_v2_topics_and_ipv6_hosts():
    """The stores hold magic v2 (2-byte topic length) and IPv6 hosts: both decoded, not skipped."""
    seen = set()
    for name in ("5.3.3-v2topic", "4.9.3-clean"):
        st = Store.open(str(shared_store(name)))
        try:
            for chunk in st.commitlog.scan():
                h = chunk.headers
                seen |= {"v2"} if (h.magicCode == records.MAGIC_V2).any() else set()
                seen |= {"v6"} if ((h.bornHostLen == 20) | (h.storeHostLen == 20)).any() else set()
        finally:
            st.close()
    assert seen == {"v2", "v6"}


# --- fuzz-damaged copies ---------------------------------------------------------------------------

def test_kernel_on_fuzz_damaged_commitlogs(tmp_path):
    print(f"kernel fuzz seed {FUZZ_SEED} (RMQSTORE_KERNEL_FUZZ_SEED), {FUZZ_CASES} commitlog cases")
    rng = random.Random(FUZZ_SEED)
    STOPS_SEEN.clear()
    names = sorted(STORE_NAMES)
    done = attempts = 0
    kinds = set()
    while done < FUZZ_CASES:
        attempts += 1
        assert attempts < FUZZ_CASES * 20
        name = names[attempts % len(names)]
        m = fuzzlib.model(name)
        template = fuzzlib.make_template(name, tmp_path / f"template-{name}")
        case_dir = tmp_path / f"case{attempts}"
        case_seed = rng.randrange(1 << 30)
        dmg = fuzzlib.plan_and_apply(random.Random(case_seed), m,
                                     lambda private, d=case_dir, t=template: fuzzlib.clone(t, d, private))
        if dmg.kind != "commitlog":
            continue
        where = f"seed {case_seed}: {dmg.describe()} on {name}"
        for rel in dmg.files:
            path = case_dir / rel
            data = path.read_bytes() if path.exists() else b""
            cfg_prop = fast.PROP_IF_PRESENT if name.startswith("5") else fast.PROP_NONE
            check_segment(data, where, prop=cfg_prop, chunk=rng.choice([1, 5, 64, 8192]), with_construct=True)
            check_segment(data, where + " v1", magics=(records.MAGIC_V1,), chunk=13, with_construct=False)
            check_segment(data, where + " nocrc", check_crc=False, chunk=8192, with_construct=False)
            offs = np.array([rng.randrange(-5, len(data) + 5) for _ in range(200 if data else 0)], dtype=np.int64)
            assert_headers_equal(fast.decode_headers(data, offs), fast.decode_headers_reference(data, offs), where)
        _check_whole_log_scan(case_dir, where)
        kinds.add(dmg.op)
        done += 1
    print(f"damage ops covered: {sorted(kinds)}; stops seen: {sorted(STOPS_SEEN)}")
    # the damage reached the cases that matter (deterministic for the fixed seed)
    assert {fast.STOP_TORN, fast.STOP_INVALID, fast.STOP_BAD_MAGIC} <= {k for k, _ in STOPS_SEEN}
    assert {fast.R_BODY_CRC, fast.R_LENGTHS} <= {r for k, r in STOPS_SEEN if k == fast.STOP_INVALID}


def _check_whole_log_scan(root: Path, where: str):
    """CommitLog.scan over the damaged store == the reference scan chained over segments."""
    st = Store.open(str(root))
    try:
        cl = st.commitlog
        res = __import__("rmqstore_cli.engine.log.commitlog", fromlist=["ScanResult"]).ScanResult()
        got = [c.phy for c in cl.scan(check_crc=True, chunk_records=50, result=res)]
        got = np.concatenate(got).tolist() if got else []
        want, stop, blanks = [], None, []
        segs = cl.segments.segments
        prop = cl.prop_crc_policy(True)
        i = pos = 0
        while segs:
            seg = segs[i]
            data = bytes(seg.buffer())
            limit = min(seg.size, cl.segments.file_size)
            h, (p, kind, size, magic, reason) = ref_scan(data, pos, limit, BOTH, True, prop)
            want += (h.offsets + seg.start).tolist()
            if kind == fast.STOP_BLANK:
                blanks.append((seg.start + p, size))
                if i + 1 < len(segs):
                    i, pos = i + 1, 0
                    continue
            stop = (seg.start + p, kind, reason, size, magic)
            break
        assert got == want, where
        if stop is not None:
            s = res.stop
            assert (s.offset, s.kind, s.reason, s.size, s.magic) == stop, where
        assert res.blanks == blanks, where
        assert res.records == len(want)
    finally:
        st.close()


# --- property CRC (5.2+ __CRC32#), synthetic: no broker-written store carries it ----------------------

def _prop_records(seed: int) -> tuple[bytes, list[str]]:
    rng = random.Random(seed)
    out = bytearray()
    kinds = []
    for _ in range(120):
        kind = rng.choice(["none", "good", "good", "bad_digit", "non_digit", "bad_crc", "no_etx", "high_bit"])
        rec = bytearray(encode_message(
            topic=b"T", queue_id=0, flag=0, queue_offset=0, physical_offset=len(out), sysflag=0, born_timestamp=1,
            born_host=(bytes(4), 1), store_timestamp=2, store_host=(bytes(4), 2), reconsume_times=0,
            prepared_offset=0, body=rng.randbytes(rng.randint(0, 300)), properties=b"a\x01b\x02",
            magic=records.MAGIC_V2 if rng.random() < 0.3 else records.MAGIC_V1,
            append_crc_property=kind != "none"))
        digits = len(rec) - 11
        if kind == "bad_digit":
            rec[digits] = 0x30 + (rec[digits] - 0x30 + 1) % 10
        elif kind == "non_digit":
            rec[digits + 3] = ord("x")
        elif kind == "bad_crc":
            rec[60] ^= 0x40  # inside the fixed header: body CRC still fine, record CRC not
        elif kind == "no_etx":
            rec[-1] = 0x03
        elif kind == "high_bit":
            rec[digits:digits + 10] = b"9999999999"  # > 2^31 after wrap-around: -1 in Java terms
        kinds.append(kind)
        out += rec
    return bytes(out) + bytes(16), kinds


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_property_crc_policies_equal_reference(seed):
    data, kinds = _prop_records(seed)
    for prop in (fast.PROP_NONE, fast.PROP_IF_PRESENT, fast.PROP_REQUIRED):
        for check_crc in (True, False):
            check_segment(data, f"prop {prop} crc {check_crc}", check_crc=check_crc, prop=prop, chunk=16,
                          with_construct=False)
    # the policies really differ on this data (so the comparison above can fail)
    offs = fast.walk(data).offsets
    h = fast.decode_headers(data, offs)
    results = {}
    for prop in (fast.PROP_NONE, fast.PROP_IF_PRESENT, fast.PROP_REQUIRED):
        hh = fast.decode_headers(data, offs)
        fast.validate(data, hh, True, prop)
        results[prop] = hh.reason.copy()
        assert np.array_equal(hh.reason, ref_validate(data, h, True, prop))
    assert not results[fast.PROP_NONE].any()
    good = np.array([k == "good" for k in kinds])
    bad_prop = np.array([k not in ("none", "good") for k in kinds])
    assert (results[fast.PROP_IF_PRESENT][bad_prop] == fast.R_PROP_CRC).all()
    assert (results[fast.PROP_IF_PRESENT][~bad_prop] == fast.R_OK).all()
    assert (results[fast.PROP_REQUIRED][~good] == fast.R_PROP_CRC).all()
    for i, off in enumerate(offs.tolist()):
        assert fast.check_property_crc(data, off, int(h.totalSize[i])) == (kinds[i] == "good")


# --- pieces of the kernels ---------------------------------------------------------------------------

def test_walk_gathers_pieces(monkeypatch):
    buf, starts = synthetic(21, 300, "zeros")
    monkeypatch.setattr(fast, "WALK_PIECE", 7)
    for max_records in (1, 7, 8, 14, 299, 300, 1 << 62):
        w = fast.walk(buf, max_records=max_records)
        assert (w.offsets.tolist(), w.stop, w.kind, w.size, w.magic) == ref_walk(buf, 0, len(buf), BOTH, max_records)


def test_crc_symbol_and_fallback_equal_zlib():
    rng = random.Random(4)
    data = rng.randbytes(70000)
    u8 = fast.kernel_view(data)
    table = kernel._table_crc32_cfunc().ctypes
    for n in (0, 1, 3, 15, 16, 17, 100, 1024, 4095, 65536):
        s = rng.randrange(0, len(data) - n)
        assert int(kernel.crc32_of(u8, s, n)) == zlib.crc32(data[s:s + n])
        buf = np.frombuffer(data, dtype=np.uint8)
        assert table(0, buf.ctypes.data + s, n) == zlib.crc32(data[s:s + n])
    assert kernel.CRC_IMPLEMENTATION.startswith("isal")  # the fast path is the one in use here


# --- cache: compiled once per environment, found again from a read-only install ----------------------

_PROBE = """
import json, sys
from rmqstore_cli.formats import fast, kernel
fast.walk(bytes(64))
s = kernel.walk_offsets.stats
print(json.dumps({"hits": sum(s.cache_hits.values()), "misses": sum(s.cache_misses.values()),
                  "path": s.cache_path}))
"""


def _probe(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kernel_cache_dir_from_numba_cache_dir(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    first = _probe(env)
    assert first["path"].startswith(str(tmp_path / "nc"))
    second = _probe(env)
    assert (second["hits"], second["misses"]) == (1, 0)


def test_kernel_cache_without_a_writable_package_dir(tmp_path):
    # A read-only site-packages leaves numba the user cache dir ($XDG_CACHE_HOME/numba).
    env = {"NUMBA_CACHE_LOCATOR_CLASSES": "UserWideCacheLocator", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    _probe(env)
    second = _probe(env)
    assert second["path"].startswith(str(tmp_path / "xdg" / "numba"))
    assert (second["hits"], second["misses"]) == (1, 0)
    # ... and when that is not writable either: a private directory under the temp dir.
    (tmp_path / "not-a-dir").write_text("")
    env = {"NUMBA_CACHE_LOCATOR_CLASSES": "UserWideCacheLocator", "XDG_CACHE_HOME": str(tmp_path / "not-a-dir"),
           "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    _probe(env)
    second = _probe(env)
    assert second["path"].startswith(str(tmp_path / "tmp" / "rmqstore-numba-cache-"))
    assert (second["hits"], second["misses"]) == (1, 0)


_NO_ISAL = """
import sys, zlib, json
sys.modules["isal"] = None  # an isal build without the symbol: the kernels must fall back, same values
from rmqstore_cli.formats import fast, kernel
data = bytes(range(256)) * 40
u8 = fast.kernel_view(data)
print(json.dumps({"impl": kernel.CRC_IMPLEMENTATION,
                  "same": all(int(kernel.crc32_of(u8, s, n)) == zlib.crc32(data[s:s + n])
                              for s, n in ((0, 0), (3, 1), (5, 100), (1, 4000), (0, len(data)))),
                  "hits": sum(kernel.crc32_of.stats.cache_hits.values())}))
"""


def test_kernels_fall_back_to_a_compiled_table_crc_without_isal(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    for run in range(2):
        out = subprocess.run([sys.executable, "-c", _NO_ISAL], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["impl"].startswith("compiled table") and got["same"], got
    assert got["hits"] == 1  # the cached kernel binds to the fallback by symbol name, no re-compile


@pytest.mark.parametrize("data,crc,stored", [(b"", 0x00000000, 0), (b"hello", 0x3610A686, 907060870),
                                             (b"123456789", 0xCBF43926, 1274296614),
                                             (b"rocketmq", 0x3E7ADDDD, 1048239581)])
def test_kernel_crc_format_vectors(data, crc, stored):
    """FORMAT.md §18.3: the kernel's CRC32 and the BODYCRC comparison it makes."""
    u8 = fast.kernel_view(b"xx" + data)
    assert int(kernel.crc32_of(u8, 2, len(data))) == crc
    assert int(kernel.crc32_of(u8, 2, len(data))) & 0x7FFFFFFF == stored


@pytest.mark.parametrize("body_len", [0, 1, 2, 7, 100])
def test_scan_body_crc_on_short_bodies(body_len):
    """Any non-empty body is checked (a wrong BODYCRC fails it); an empty body never is (§4.1)."""
    rec = bytearray(encode_message(
        topic=b"T", queue_id=0, flag=0, queue_offset=0, physical_offset=0, sysflag=0, born_timestamp=1,
        born_host=(bytes(4), 1), store_timestamp=2, store_host=(bytes(4), 2), reconsume_times=0, prepared_offset=0,
        body=bytes(range(body_len)), properties=b"", magic=records.MAGIC_V1))
    assert fast.scan_records(bytes(rec) + bytes(8), 0, len(rec) + 8).kind == fast.STOP_ZERO
    struct_crc = int.from_bytes(rec[8:12], "big") ^ 0x1
    rec[8:12] = struct_crc.to_bytes(4, "big")
    step = fast.scan_records(bytes(rec) + bytes(8), 0, len(rec) + 8)
    assert (step.kind, step.reason) == ((fast.STOP_ZERO, fast.R_OK) if body_len == 0 else
                                        (fast.STOP_INVALID, fast.R_BODY_CRC))
    assert fast.scan_records(bytes(rec) + bytes(8), 0, len(rec) + 8, check_crc=False).kind == fast.STOP_ZERO


_LEAN = """
import json, sys
from rmqstore_cli.formats import fast, kernel
data = open(sys.argv[1], 'rb').read()
w = fast.walk(data)
h = fast.decode_headers(data, w.offsets)
s = kernel.walk_offsets.stats
print(json.dumps({"lean": kernel.LEAN_CACHED_LOADS, "hits": sum(s.cache_hits.values()),
                  "misses": sum(s.cache_misses.values()), "refreshed": "numba.np.linalg" in sys.modules,
                  "records": [w.offsets.tolist(), h.totalSize.tolist(), h.queueOffset.tolist(), h.bodyCRC.tolist()]}))
"""


def test_cached_kernels_load_without_the_full_refresh_and_give_the_same_records(tmp_path):
    """Kernels loaded from the cache skip numba's full target refresh (LEAN_CACHED_LOADS: the registries
    are not imported) and give the same output as when they were compiled in the same process. The walk's kernel
    (it makes arrays: its cached code links against the runtime) stands for all: the JSON writer, the largest,
    took ~100 s to compile here, the walk ~8 s."""
    seg = sorted((shared_store("4.9.3-clean") / "commitlog").iterdir())[0]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "nc")}

    def probe():
        out = subprocess.run([sys.executable, "-c", _LEAN, str(seg)], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    compiled, loaded = probe(), probe()  # an empty cache: compiled (and refreshed); then loaded from it
    assert compiled["misses"] > 0 and compiled["refreshed"]
    assert loaded["lean"] and loaded["hits"] > 0 and loaded["misses"] == 0
    assert not loaded["refreshed"]  # the registries were not imported to load
    assert loaded["records"] == compiled["records"] and len(loaded["records"][0]) > 10
