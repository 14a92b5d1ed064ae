"""The DLedger walk that decodes each entry's message in the same compiled pass (``walk_entries(decode=...)``,
formats.dledgerkernel.walk_messages) against the header walk followed by the classic kernels over the chunk
(decode_headers, then validate): the same entries, the same stop, the same decoded columns and reasons, on every
broker-written DLedger store and on copies with seeded damage (seed printed)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.conftest import STORES, require_shared
from rmqstore_cli.engine.log.dledger import HEADER, EntryWalk, walk_entries
from rmqstore_cli.engine.store import Store
from rmqstore_cli.formats import fast

DLEDGER_STORES = ["dledger-4.9.3-clean", "dledger-4.9.3-crash", "dledger-4.9.3-torn/store-torn",
                  "dledger-4.9.3-torn/store-corrupt", "dledger-5.3.3-clean", "dledger-4.9.3-group/store-n0"]


def _root(name: str) -> str:
    require_shared()
    base = STORES / name
    return str(base if "/" in name else base / "store")


def _both_ways(segs, start: int, check_crc: bool, prop_crc: int, chunk: int):
    """(entry columns, headers, stop) of the file walk from ``start``: the fused pass, and the two-step one."""
    got = []
    for decode in ((check_crc, prop_crc), None):
        walk = EntryWalk()
        cols, heads = [], []
        for ec in walk_entries(segs, start_index=start, result=walk, chunk=chunk, decode=decode):
            cols.append({k: v.copy() for k, v in ec.cols.items()})
            if decode is None:
                u8 = fast.kernel_view(ec.buf)
                h = fast.decode_headers(ec.buf, ec.cols["at"] + HEADER, u8)
                fast.validate(ec.buf, h, check_crc, prop_crc, u8)
            else:
                h = ec.headers
            heads.append(h)
        s = walk.stop
        got.append((cols, heads, (s.offset, s.kind, s.rule, s.size, s.magic) if s else None, walk.blanks))
    return got


def _assert_same(fused, twostep) -> int:
    (c1, h1, s1, b1), (c2, h2, s2, b2) = fused, twostep
    assert s1 == s2 and b1 == b2 and len(c1) == len(c2)
    n = 0
    for a, b, ha, hb in zip(c1, c2, h1, h2):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]), k
        for name in fast.Headers.__slots__:
            x, y = getattr(ha, name), getattr(hb, name)
            assert np.array_equal(np.asarray(x), np.asarray(y)), name
        n += len(a["at"])
    return n


@pytest.mark.parametrize("name", DLEDGER_STORES)
def test_fused_walk_equals_two_step_walk_on_broker_stores(name):
    with Store.open(_root(name)) as st:
        segs = st.commitlog.segments.segments
        prop = st.commitlog.prop_crc_policy(True)
        total = 0
        for start in range(len(segs)):
            for crc in (True, False):
                total += _assert_same(*_both_ways(segs, start, crc, prop, chunk=97))
        assert total > 0


def test_fused_walk_equals_two_step_walk_on_seeded_damage(tmp_path):
    """Bytes flipped anywhere in the data files (entry headers, message headers, bodies, properties): the fused
    pass must stop where the header walk stops and decode every message exactly as the classic kernels do."""
    import shutil

    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    bad_messages = 0
    for round_ in range(6):
        dest = tmp_path / f"r{round_}"
        shutil.copytree(_root("dledger-4.9.3-clean"), dest)
        data = sorted(next(dest.glob("dledger-*")).joinpath("data").iterdir())
        for _ in range(rng.randrange(1, 40)):
            f = rng.choice(data)
            size = f.stat().st_size
            if not size:
                continue
            with open(f, "r+b") as fh:
                at = rng.randrange(min(size, 1 << 20))
                fh.seek(at)
                b = fh.read(1)
                fh.seek(at)
                fh.write(bytes([(b[0] ^ (1 << rng.randrange(8))) if b else 1]))
        with Store.open(str(dest)) as st:
            segs = st.commitlog.segments.segments
            for start in range(len(segs)):
                for crc, prop in ((True, fast.PROP_IF_PRESENT), (True, fast.PROP_REQUIRED), (False, fast.PROP_NONE)):
                    fused, twostep = _both_ways(segs, start, crc, prop, chunk=rng.choice((1, 7, 500, 8192)))
                    _assert_same(fused, twostep)
                    bad_messages += sum(int((h.reason != fast.R_OK).sum()) for h in fused[1])
    assert bad_messages > 0  # the damage reached messages the header walk accepts, not only entry headers
