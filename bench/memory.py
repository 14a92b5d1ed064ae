"""Run one child process and measure it: wall time, peak anonymous memory, ru_maxrss.

Memory is judged by *RssAnon* (``/proc/PID/status``): the anonymous pages the process
holds. ``ru_maxrss`` (VmHWM) also counts every mapped file page the process touched, so a scan
of a 1 GiB commitlog or a 420 MB index file shows up there although the kernel can drop those
pages at any time (NOTES-performance). There is no kernel high-water counter for RssAnon, so a
thread samples it every ``every`` seconds (default 20 ms) while the child runs; the peak is a
lower bound of the true peak (a spike shorter than the interval can be missed). The child's own
descendants (``-j`` workers) are sampled too, each on its own: ``worker_rss_anon_peak`` is the
highest RssAnon any one of them reached (they are judged one by one, like the main process).

A child that runs longer than ``timeout`` seconds is killed and reported as timed out; one whose
RssAnon passes ``kill_above`` bytes is killed as well (the machine is shared: a command that
grows without bound must not take the others' memory). Both are failures, never estimates.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

SAMPLE_EVERY = 0.02


def rss_anon_bytes(pid: int) -> int | None:
    """RssAnon of ``pid`` now, or None once the process is gone (or /proc lacks the field)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (``/proc/PID/task/TID/children``, recursively)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


@dataclass
class ChildRun:
    """What one measured child did."""

    cmd: list[str]
    seconds: float
    rss_anon_peak: int  # bytes, sampled
    ru_maxrss: int  # bytes (VmHWM: includes touched file pages; informational)
    returncode: int | None
    timed_out: bool = False
    killed_rss: bool = False  # killed because RssAnon passed kill_above
    samples: int = 0
    stderr: bytes = b""
    worker_rss_anon_peak: int = 0  # bytes, sampled: the highest of any one descendant process (-j workers), a JVM aside
    workers_seen: int = 0  # descendant processes sampled at least once
    jvm_rss_anon_peak: int = 0  # bytes, sampled: the highest of any descendant JVM (Spark's heap is its own setting)


def run_sampled(cmd: list[str], *, stdout=subprocess.DEVNULL, cwd: str | None = None, env=None,
                timeout: float | None = None, kill_above: int | None = None,
                every: float = SAMPLE_EVERY) -> ChildRun:
    """Run ``cmd``, sampling its RssAnon every ``every`` seconds until it exits (see module doc)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True)
    state = {"peak": 0, "samples": 0, "timed_out": False, "killed_rss": False, "worker_peak": 0, "workers": set(),
             "jvm_peak": 0}
    done = threading.Event()

    def kill():
        try:  # its own session: forked workers (-j) go with it
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass

    def sample():
        while not done.is_set():
            v = rss_anon_bytes(p.pid)
            if v is not None:
                state["peak"] = max(state["peak"], v)
                state["samples"] += 1
                if kill_above is not None and v > kill_above and not state["killed_rss"]:
                    state["killed_rss"] = True
                    kill()
            for w in descendants(p.pid):
                # the name read at each sample (a JVM is started by a script that execs it: its name changes), before
                # and after its RssAnon: a process gone in between (Spark's JVM at the end) has no name to judge it
                # by, and its last reading is not counted as a worker's
                before = _command_name(w)
                wv = rss_anon_bytes(w)
                after = _command_name(w)
                if wv is not None and before is not None and after is not None:
                    state["workers"].add(w)
                    key = "jvm_peak" if _is_jvm(before) or _is_jvm(after) else "worker_peak"
                    state[key] = max(state[key], wv)
                    if kill_above is not None and wv > kill_above and not state["killed_rss"]:
                        state["killed_rss"] = True
                        kill()
            if timeout is not None and time.perf_counter() - t0 > timeout and not state["timed_out"]:
                state["timed_out"] = True
                kill()
            done.wait(every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    err = p.stderr.read()  # until the child (and anything holding its stderr) closes it
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its pid cannot be reused yet
    dt = time.perf_counter() - t0
    done.set()
    sampler.join()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return ChildRun(cmd, dt, state["peak"], usage.ru_maxrss * 1024, p.returncode, state["timed_out"],
                    state["killed_rss"], state["samples"], err, state["worker_peak"], len(state["workers"]),
                    state["jvm_peak"])


def _command_name(pid: int) -> str | None:
    """``/proc/PID/comm`` and the name of the program the process runs (``/proc/PID/exe``), or None once the process
    is gone. A child a JVM thread has just forked (to start a Python worker) shares the JVM's memory, so its RssAnon
    is the JVM's, and is named after that thread (``Executor task l``) until it runs its own program; its program is
    still java, so it is judged a JVM."""
    comm = _comm(pid)
    if comm is None:
        return None
    return f"{comm} {_program(pid)}".strip()


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def _program(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def _is_jvm(name: str) -> bool:
    """``java`` as the process's name (a JVM started by a script that execs it) or as its program."""
    return "java" in name.split()
