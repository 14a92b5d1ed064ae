"""The geometry a store's files imply (engine.config.storeconfig.infer_geometry), worked by hand on files made here:
which commitlog file size wins, what is not a segment file, the consume queues' size over every queue."""

from __future__ import annotations

import os

from rmqstore_cli.engine.config.storeconfig import StoreConfig, infer_geometry


def _files(d, sizes: dict) -> None:
    os.makedirs(d, exist_ok=True)
    for name, size in sizes.items():
        with open(os.path.join(d, name), "wb") as f:
            f.truncate(size)


def test_the_most_common_commitlog_size_wins_and_the_larger_on_a_tie(tmp_path):
    cl = tmp_path / "a" / "commitlog"
    _files(cl, {"%020d" % (i * 65536): 65536 for i in range(3)} | {"%020d" % (3 * 65536): 32768})
    cfg = infer_geometry(StoreConfig(), str(tmp_path / "a"))
    assert cfg.mappedFileSizeCommitLog == 65536 and "mappedFileSizeCommitLog" in cfg.inferred
    cl = tmp_path / "b" / "commitlog"  # one file of each size: the larger (a torn stray is the shorter one)
    _files(cl, {"%020d" % 0: 32768, "%020d" % 32768: 65536, "%020d" % 98304: 0})
    os.makedirs(cl / "00000000000000131072")  # a folder with a segment's name is no segment
    _files(cl, {"notes": 4096, "00000000000000196608.tmp": 4096})
    assert infer_geometry(StoreConfig(), str(tmp_path / "b")).mappedFileSizeCommitLog == 65536
    cl = tmp_path / "c" / "commitlog"  # three small files against two: the count decides, not the size
    _files(cl, {"%020d" % (i * 4096): 4096 for i in range(3)} | {"%020d" % (i * 8192 + 65536): 8192 for i in range(2)})
    assert infer_geometry(StoreConfig(), str(tmp_path / "c")).mappedFileSizeCommitLog == 4096


def test_the_consume_queue_size_is_the_largest_over_every_queue(tmp_path):
    root = tmp_path / "s"
    _files(root / "commitlog", {"%020d" % 0: 65536})
    _files(root / "consumequeue" / "A" / "0", {"%020d" % 0: 6000})
    _files(root / "consumequeue" / "A" / "1", {"%020d" % 0: 6000, "%020d" % 6000: 1000})  # 1000: a torn file
    _files(root / "consumequeue" / "B" / "0", {"%020d" % 0: 12000, "%020d" % 12000: 0})
    _files(root / "consumequeue" / "B" / "1", {"%020d" % 0: 12345})  # not a multiple of the unit size
    cfg = infer_geometry(StoreConfig(), str(root))
    assert cfg.mappedFileSizeConsumeQueue == 12000 and "mappedFileSizeConsumeQueue" in cfg.inferred
    given = StoreConfig(mappedFileSizeCommitLog=1 << 20, explicit={"mappedFileSizeCommitLog"})
    assert infer_geometry(given, str(root)).mappedFileSizeCommitLog == 1 << 20  # a given size is kept
