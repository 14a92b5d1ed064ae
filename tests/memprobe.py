"""Anonymous resident memory of a command run as a subprocess: RssAnon sampled every 10 ms (not ru_maxrss,
which counts the mapped file pages a scan touches)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time


def rss_anon(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_peak(args: list[str], out_path: str, prelude: str = "", ok=(0, 1)) -> tuple[int, int]:
    """(sampled RssAnon high-water mark, exit code) of ``rmqstore ARGS``, stdout into ``out_path``; ``prelude``
    is Python run first in the child (a seam such as a lowered window size)."""
    code = "\n".join(["import sys", prelude, f"sys.argv = ['rmqstore'] + {args!r}", "from rmqstore_cli.app import main",
                      "main()"])
    with open(out_path, "wb") as out:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.PIPE)
        peak = [0]

        def sample():
            while p.poll() is None:
                peak[0] = max(peak[0], rss_anon(p.pid))
                time.sleep(0.01)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        _, err = p.communicate(timeout=300)
        t.join()
    assert p.returncode in ok, err.decode()
    return peak[0], p.returncode
