"""parallel.stream_segments: items of every segment in segment order, whatever the number of workers."""

import os
import time

import pytest

from rmqstore_cli.engine.parallel import Background, stream_segments


def _items(i: int, per: int):
    for k in range(per + i % 3):  # segments of different lengths, some empty
        yield (i, k)


def _failing(i: int):
    yield i
    if i == 3:
        raise ValueError("segment 3 is damaged")


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_items_come_in_segment_order_with_a_done_call_per_segment(jobs):
    done = []
    got = list(stream_segments(_items, 7, jobs, 0, done=done.append))
    assert got == [(i, k) for i in range(7) for k in range(i % 3)]
    assert done == list(range(7))


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_consumer_may_stop_early(jobs):
    gen = stream_segments(_items, 50, jobs, 1000)  # far more items than the queues hold
    first = [next(gen) for _ in range(5)]
    gen.close()  # the workers blocked on full queues are stopped
    assert first == [(0, k) for k in range(5)]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_worker_error_reaches_the_consumer_after_the_items_before_it(jobs):
    got = []
    with pytest.raises(ValueError, match="segment 3 is damaged"):
        for item in stream_segments(_failing, 6, jobs):
            got.append(item)
    assert got == [0, 1, 2, 3]


def _touching(i, folder):
    open(os.path.join(folder, f"started-{i}"), "w").close()
    yield i


def test_workers_start_before_the_first_item_is_asked_for(tmp_path):
    """verify -j prepares its per-file checks while the workers walk: making the stream starts them."""
    gen = stream_segments(_touching, 4, 2, str(tmp_path))
    deadline = time.monotonic() + 120  # only a worker that never starts waits this out
    while not os.path.exists(tmp_path / "started-0") and time.monotonic() < deadline:
        time.sleep(0.05)
    started = os.path.exists(tmp_path / "started-0")
    assert list(gen) == [0, 1, 2, 3]
    assert started


def _pid_and(x):
    return os.getpid(), x * 2


def _raises():
    raise ValueError("the timerlog is damaged")


def test_background_computes_in_another_process_and_hands_back_its_result_or_error():
    pid, got = Background(_pid_and, 21).result()
    assert got == 42 and pid != os.getpid()
    with pytest.raises(ValueError, match="timerlog is damaged"):
        Background(_raises).result()


def _with_nones(i: int):
    yield None
    yield i
    yield None


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_a_task_may_yield_none(jobs):
    assert list(stream_segments(_with_nones, 5, jobs)) == [x for i in range(5) for x in (None, i, None)]


def _pid_then_sleep(i: int):
    yield os.getpid()
    time.sleep(120)
    yield None


def test_workers_end_when_the_process_that_forked_them_is_killed(tmp_path):
    """A -j run killed with SIGKILL (no clean-up runs in it) leaves no worker behind."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(
        "import sys\n"
        "from tests.test_parallel import _pid_then_sleep\n"
        "from rmqstore_cli.engine.parallel import stream_segments\n"
        "it = stream_segments(_pid_then_sleep, 2, 2)\n"
        "print(next(it), flush=True)\n"
        "sys.stdin.read()\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=root, env={**os.environ, "PYTHONPATH": root})
    worker = int(proc.stdout.readline())
    os.kill(worker, 0)  # alive while the main process is
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{worker}/status") as f:
                if "\nState:\tZ" in f.read():  # ended, not yet reaped by its new parent
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    os.kill(worker, signal.SIGKILL)
    pytest.fail(f"worker {worker} still ran 60 s after its parent was killed")


def _numbered(i: int, marks: str | None = None):
    if marks:
        open(os.path.join(marks, f"segment-{i}"), "w").close()
    for k in range(3 + i % 2):
        yield {"segment": i, "k": k, "payload": bytes(range(i % 7, 200))}


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_spilled_items_come_back_the_same_and_their_files_go(jobs, tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    done = []
    got = list(stream_segments(_numbered, 6, jobs, spill=str(spill), done=done.append))
    assert got == [it for i in range(6) for it in _numbered(i)]
    assert done == list(range(6))
    assert os.listdir(spill) == []


def test_spilled_workers_walk_their_segments_at_the_same_time(tmp_path):
    """With spilled items, the worker of segment 1 goes on through it while segment 0's items are still untaken
    (two queued items stopped it before)."""
    spill, marks = tmp_path / "spill", tmp_path / "marks"
    spill.mkdir()
    marks.mkdir()
    gen = stream_segments(_numbered, 4, 2, str(marks), spill=str(spill))
    first = next(gen)
    deadline = time.monotonic() + 120  # only a worker that is held back waits this out
    while not os.path.exists(marks / "segment-3") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(marks / "segment-3")  # worker 1 finished segment 1 and went on while 0 was untaken
    rest = list(gen)
    assert [first] + rest == [it for i in range(4) for it in _numbered(i)]
    assert os.listdir(spill) == []


def test_a_spilled_stream_closed_early_leaves_no_file(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    gen = stream_segments(_numbered, 8, 2, spill=str(spill))
    next(gen)
    gen.close()
    assert os.listdir(spill) == []


@pytest.mark.parametrize("jobs", [2, 3])
@pytest.mark.parametrize("spilled", [False, True])
def test_balanced_items_come_in_segment_order(jobs, spilled, tmp_path):
    spill = str(tmp_path) if spilled else None
    done = []
    got = list(stream_segments(_numbered, 9, jobs, spill=spill, done=done.append, balance=True))
    assert got == [it for i in range(9) for it in _numbered(i)]
    assert done == list(range(9))
    if spilled:
        assert os.listdir(tmp_path) == []


def test_balanced_worker_error_and_early_stop():
    got = []
    with pytest.raises(ValueError, match="segment 3 is damaged"):
        for item in stream_segments(_failing, 6, 2, balance=True):
            got.append(item)
    assert got == [0, 1, 2, 3]
    gen = stream_segments(_items, 50, 2, 1000, balance=True)
    assert [next(gen) for _ in range(3)] == [(0, k) for k in range(3)]
    gen.close()


def _slow_first(i: int, folder: str):
    """Segment 0 is not through until segment 2 has started: with k, k + 2, ... its own worker would have to
    start segment 2, so only a worker that takes whatever segment is next lets it end before the deadline."""
    open(os.path.join(folder, f"started-{i}"), "w").close()
    if i == 0:
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(folder, "started-2")) and time.monotonic() < deadline:
            time.sleep(0.01)
    yield i, os.getpid()


def test_balanced_segments_go_to_the_worker_that_is_free(tmp_path):
    got = list(stream_segments(_slow_first, 4, 2, str(tmp_path), balance=True))
    assert [i for i, _ in got] == [0, 1, 2, 3]
    pids = dict(got)
    assert pids[2] != pids[0]  # taken by the other worker while the first was still in segment 0


class _Shared:
    """An exchange (stream_segments' ``exchange``): each worker's part is its number; every worker gets the list."""

    def part(self, k: int, workers: int):
        return k

    def combine(self, parts: list):
        self.parts = parts
        return ("all", tuple(parts))

    def accept_later(self, receive) -> None:
        self._receive, self._got = receive, None

    def shared(self):
        if self._got is None:
            self._got = self._receive(True)  # sent once to each worker
        return self._got


def _slow_first_shared(i: int, folder: str, shared: _Shared):
    for got in _slow_first(i, folder):
        yield got + (shared.shared(),)


def test_balanced_segments_with_an_exchange(tmp_path):
    """With an exchange too, a worker that is free takes the next segment; every worker gets the combined parts."""
    shared = _Shared()
    got = list(stream_segments(_slow_first_shared, 4, 2, str(tmp_path), shared, exchange=shared, balance=True))
    assert shared.parts == [0, 1]
    assert [i for i, _, _ in got] == [0, 1, 2, 3]
    assert all(s == ("all", (0, 1)) for _, _, s in got)
    pids = {i: pid for i, pid, _ in got}
    assert pids[2] != pids[0]  # taken by the other worker while the first was still in segment 0
