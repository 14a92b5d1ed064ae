"""Commitlog mappings kept across the passes of one command (engine/log/segments.kept_mappings): recover walks
the log four times, each pass through its own Store; a kept mapping keeps its pages in place between them."""

import gc
import os
import re
import shutil

from rmqstore_cli.engine.log.commitlog import _release
from rmqstore_cli.engine.log.segments import is_kept, kept_mappings
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.verify.pipeline import verify_store

from .conftest import shared_store


def _mapped(directory: str) -> set[str]:
    """Address ranges of this process's mappings of a segment file in ``directory``."""
    pattern = re.compile(re.escape(directory) + r"/\d+$")
    with open("/proc/self/maps") as f:
        return {fields[0] for fields in (line.split() for line in f) if pattern.search(fields[-1])}


def _buffers(st: Store) -> list:
    return [s.buffer() for s in st.commitlog.segments.segments]


def test_two_stores_share_the_mappings_and_verify_finds_the_same():
    root = str(shared_store("4.9.3-crash"))
    with Store.open(root) as st:
        plain = verify_store(st)
    gc.collect()
    before = _mapped(root + "/commitlog")
    with kept_mappings() as kept:
        with Store.open(root) as a:
            first = verify_store(a)
            bufs_a = _buffers(a)
        # closed store: its kept mappings stay open and readable
        assert all(len(bytes(b[:8])) == 8 for b in bufs_a)
        with Store.open(root) as b:
            second = verify_store(b)
            bufs_b = _buffers(b)
        assert [id(x) for x in bufs_a] == [id(x) for x in bufs_b]
        assert all(is_kept(x) for x in bufs_a)
        n_segs = len(bufs_a)
        assert len(_mapped(root + "/commitlog") - before) == n_segs  # one mapping per file, not one per pass
        assert kept.bytes == sum(os.path.getsize(os.path.join(root, "commitlog", n))
                                 for n in os.listdir(os.path.join(root, "commitlog")))
        del bufs_a, bufs_b
    gc.collect()
    assert _mapped(root + "/commitlog") <= before  # unmapped when the block ends
    for r in (first, second):
        assert [f.as_json() for f in r.findings] == [f.as_json() for f in plain.findings]
        assert r.summary == plain.summary


def test_budget_keeps_the_first_files_only_and_others_are_mapped_per_store():
    root = str(shared_store("4.9.3-clean"))
    with Store.open(root) as st:
        segs = st.commitlog.segments.segments
        sizes = [s.size for s in segs]
    assert len(sizes) >= 4
    with kept_mappings(max_bytes=sizes[0] + sizes[1]) as kept:
        with Store.open(root) as a:
            ba = _buffers(a)
        with Store.open(root) as b:
            bb = _buffers(b)
        assert [is_kept(x) for x in ba] == [True, True] + [False] * (len(sizes) - 2)
        assert ba[0] is bb[0] and ba[1] is bb[1]
        assert all(x is not y for x, y in zip(ba[2:], bb[2:]))
        assert kept.bytes == sizes[0] + sizes[1]
    assert not any(is_kept(x) for x in ba)  # the block is over: nothing is kept any more


def test_a_replaced_or_shortened_file_is_mapped_afresh(tmp_path):
    src = shared_store("4.9.3-clean") / "commitlog"
    names = sorted(os.listdir(src))[:2]
    d = tmp_path / "commitlog"
    d.mkdir()
    for n in names:
        shutil.copyfile(src / n, d / n)
    from rmqstore_cli.engine.log.segments import SegmentQueue

    size = os.path.getsize(d / names[0])
    with kept_mappings() as kept:
        q1 = SegmentQueue(str(d), size, "commitlog")
        old = q1.segments[0].buffer()
        head = bytes(old[:16])
        # replaced by a file with other bytes (a new inode under the same name): not the old mapping
        tmp = d / "new"
        tmp.write_bytes(b"\x01" * size)
        os.replace(tmp, d / names[0])
        q2 = SegmentQueue(str(d), size, "commitlog")
        new = q2.segments[0].buffer()
        assert new is not old and bytes(new[:16]) == b"\x01" * 16 and bytes(old[:16]) == head
        # a file now shorter than the segment it was listed as is never given a kept mapping (it would reach
        # past the end of the file); mapping it fails as it does without kept mappings
        q3 = SegmentQueue(str(d), size, "commitlog")
        with open(d / names[1], "r+b") as f:
            f.truncate(size // 2)
        assert kept.open(q3.segments[1]) is None


def test_release_keeps_the_pages_of_a_kept_mapping_only():
    root = str(shared_store("4.9.3-clean"))
    with kept_mappings(max_bytes=1):  # nothing fits: every mapping is the usual one
        with Store.open(root) as st:
            buf = st.commitlog.segments.segments[0].buffer()
            assert not is_kept(buf)
            _release(buf)  # dropped as before; the mapping stays readable
            assert bytes(buf[:4]) == open(st.commitlog.segments.segments[0].path, "rb").read(4)
