"""The DLedger layouts declared once (formats.dledger) and the compiled entry walk derived from them,
checked against a construct parse of every entry and index unit of a broker-written sample."""

from __future__ import annotations

import numpy as np

from tests.conftest import STORES, require_shared
from rmqstore_cli.formats import dledger as dl
from rmqstore_cli.formats import dledgerkernel as k
from rmqstore_cli.engine.log.dledger import walk_entries
from rmqstore_cli.engine.store import Store


def test_declared_sizes_and_dtypes():
    assert dl.ENTRY_HEADER_SIZE == 48 and dl.INDEX_UNIT_SIZE == 32
    assert dl.ENTRY_HEADER_DTYPE.itemsize == 48 and dl.INDEX_UNIT_DTYPE.itemsize == 32
    assert [k.O_MAGIC, k.O_SIZE, k.O_INDEX, k.O_TERM, k.O_POS, k.O_CHANNEL, k.O_CHAIN, k.O_BODYCRC, k.O_BODYLEN] == \
        [0, 4, 8, 16, 24, 32, 36, 40, 44]
    assert dl.encode_blank(16) == b"\xff\xff\xff\xff\x00\x00\x00\x10" + bytes(8)
    assert dl.INDEX_UNIT.parse(dl.encode_index_unit(1, 467, 326, 1, 0)) == dict(magic=1, pos=467, size=326, index=1, term=0)
    assert dl.parse_properties("#c\ncommittedIndex=1999\nendIndex=1999\n") == {"committedIndex": "1999", "endIndex": "1999"}


def test_kernel_walk_equals_construct_parse_of_every_entry():
    require_shared()
    with Store.open(str(STORES / "dledger-4.9.3-clean" / "store")) as st:
        segs = st.commitlog.segments.segments
        walked = 0
        for ec in walk_entries(segs, chunk=97):  # small chunks: the resumption between kernel calls too
            buf = ec.buf
            for j in range(len(ec)):
                at = int(ec.cols["at"][j])
                e = dl.ENTRY.parse(bytes(buf[at:at + int(ec.cols["size"][j])]))
                assert [e.magic, e.size, e.index, e.term, e.pos, e.channel, e.chainCrc, e.bodyCrc, e.bodyLength] == \
                    [int(ec.cols[c][j]) for c in ("magic", "size", "index", "term", "pos", "channel", "chainCrc",
                                                   "bodyCrc", "bodyLength")]
                assert e.pos == ec.segment.start + at and len(e.body) == e.bodyLength
                walked += 1
        assert walked == 2000
        units = st.commitlog.files.index_units(0, 2000)
        raw = b"".join(bytes(s.buffer()) for s in st.commitlog.files.index.segments)
        for i in (0, 1, 777, 1999):
            u = dl.INDEX_UNIT.parse(raw[i * 32:(i + 1) * 32])
            assert [u.magic, u.pos, u.size, u.index, u.term] == [int(units[n][i]) for n in ("magic", "pos", "size", "index", "term")]
        assert np.array_equal(units["index"], np.arange(2000))
