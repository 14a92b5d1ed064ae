"""``append --from``'s pipeline: the early write-back (engine/log/writeback.py) hands the kernel only whole pages of
bytes already written, inside the files, and changes no byte (the same files as an append that never starts it);
blocks read and parsed by any number of threads give the plain route's files; an early stop closes cleanly."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from rmqstore_cli.engine.log import writeback as writeback_mod

from .test_append_batch import _dump_lines, files, replay, small


def _append(root, data: bytes, monkeypatch, early: bool) -> list:
    calls = []
    real = writeback_mod._sync_file_range()

    def record(fd, start, n, flags):
        size = os.fstat(fd).st_size
        assert start >= 0 and n > 0 and start + n <= size, (start, n, size)
        assert start % 4096 == 0 and n % 4096 == 0, (start, n)
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), start, n))
        return real(fd, start, n, flags) if real else 0

    monkeypatch.setattr(writeback_mod, "_sync_file_range", (lambda: record) if early else (lambda: None))
    monkeypatch.setattr(writeback_mod.EarlyWriteback.__init__, "__defaults__", (1, None))  # derived files: every run
    cfg = small(5, mappedFileSizeCommitLog=256 << 10, maxIndexNum=20000)
    err, batched = replay(root, cfg, data, batch=True, keep_store_times=True)
    assert err is None and batched == data.count(b"\n")
    return calls


def test_early_writeback_changes_no_byte(tmp_path, monkeypatch):
    data = _dump_lines("5.3.3-v2topic", "base64") * 10  # several 256 KiB segments, several runs
    calls = _append(tmp_path / "early", data, monkeypatch, True)
    assert not _append(tmp_path / "late", data, monkeypatch, False)
    a, b = files(tmp_path / "early"), files(tmp_path / "late")
    assert sorted(a) == sorted(b)
    assert sum(k.startswith("commitlog") for k in a) >= 2  # a BLANK and a second segment
    for k in a:
        assert a[k] == b[k], k
    touched = {os.path.relpath(p, tmp_path / "early").split(os.sep)[0] for p, _, _ in calls}
    assert touched == {"commitlog", "consumequeue", "index"}, touched
    # commitlog pages handed over hold records already written: never past the end of a file's data
    for path, start, n in calls:
        rel = os.path.relpath(path, tmp_path / "early")
        if rel.startswith("commitlog"):
            assert start + n <= len(a[rel].rstrip(b"\0")), (rel, start, n)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_stopping_early_leaves_no_reader_waiting(tmp_path, monkeypatch, threads):
    """A consumer that stops after the first results (an error downstream, say) closes the replay: the blocks
    being read and parsed finish, the ones not started are dropped, and nothing waits for a turn that never
    comes (the close returns; a deadlock would leave the thread below alive)."""
    import io
    import threading

    from rmqstore_cli.engine.log import replay as replay_mod
    from rmqstore_cli.engine.log.appender import Appender
    from rmqstore_cli.engine.log.messages import MessageBuilder

    data = _dump_lines("5.3.3-v2topic", "base64")
    monkeypatch.setattr(replay_mod, "BLOCK_BYTES", 2000)  # many blocks
    monkeypatch.setattr(replay_mod, "parse_threads", lambda: threads)
    for stop_after in (1, 2, 3, 5, 8):
        cfg = small(5, mappedFileSizeCommitLog=256 << 10)  # the default 1 GiB segment is reserved on disk (fallocate)
        app = Appender(str(tmp_path / f"s{stop_after}"), cfg)
        done = []

        def run():
            gen = replay_mod.DumpReplay(app, MessageBuilder(cfg)).feed_stream(io.BytesIO(data))
            for k, _ in enumerate(gen):
                if k + 1 == stop_after:
                    break
            gen.close()
            app.close()
            done.append(True)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(120)
        assert done, f"the replay did not close after {stop_after} results"
        shutil.rmtree(tmp_path / f"s{stop_after}", ignore_errors=True)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_number_of_parse_threads_gives_the_plain_routes_files(tmp_path, monkeypatch, threads):
    """Blocks read and parsed by 1, 2 or 3 threads (in turn, put in order; tiny blocks: a line split over
    several reads, many blocks in flight) give the files one put per line gives."""
    from rmqstore_cli.engine.log import replay as replay_mod

    from .test_append_batch import _lines, assert_same

    monkeypatch.setattr(replay_mod, "parse_threads", lambda: threads)
    monkeypatch.setattr(replay_mod, "BLOCK_BYTES", 1500)
    seed = random.randrange(1 << 30)
    print("seed", seed)
    err, batched = assert_same(tmp_path, small(5, mappedFileSizeCommitLog=16384), _lines(seed, 300, 0.3))
    assert err is None and batched > 150
