"""Driver memory stays flat: `spark verify` and `spark rebuild` on a ~0.5 M- and a ~1.5 M-message store
(100 B bodies, written by our own Appender through bench/gen.py; 3 and 8 segments of 64 MiB) peak at the
same driver RssAnon.

The driver is the `rmqstore` process (the Python side that plans the jobs and receives their
results; local[2] executors' records live in the JVM and Python workers, not here). Its anonymous
resident memory (RssAnon in /proc/<pid>/status) is sampled every 20 ms by a thread, and the
high-water mark of the larger store must be within 10 % (+20 MB) of the smaller's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is an optional extra (pip install -e .[spark])")
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.xdist_group("spark-memory")]  # one worker makes big_stores

SEGMENT = 64 << 20
# three times the records: a driver that kept ~15 bytes a record would exceed the margin below (+20 MB)
SIZES = {"small": 500_000, "large": 1_500_000}
RMQSTORE = str(Path(sys.executable).with_name("rmqstore"))


def _generate(root: Path, messages: int) -> dict:
    """Whole 64 MiB segments of 297-byte records, at least ``messages`` of them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import gen
    from rmqstore_cli.engine.log.messages import MessageBuilder

    size = gen._Messages(MessageBuilder(gen.config()), 100)(0).total_size
    per_seg = (SEGMENT - 8) // size
    segments = -(-messages // per_seg)
    return gen.generate(str(root), 100, total=segments * SEGMENT, seg_size=SEGMENT)


@pytest.fixture(scope="session")
def big_stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("memstores")
    out = {}
    for name, n in SIZES.items():
        info = _generate(base / name, n)
        out[name] = (str(base / name), info["records"])
    return out


def _rss_anon_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_anon(argv: list[str]) -> tuple[int, subprocess.CompletedProcess]:
    """Run ``argv``; return (high-water RssAnon of that process in bytes, the finished process)."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peak = [0]

    def sample():
        while p.poll() is None:
            v = _rss_anon_kb(p.pid)
            if v is not None:
                peak[0] = max(peak[0], v)
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = p.communicate()
    t.join()
    return peak[0] * 1024, subprocess.CompletedProcess(argv, p.returncode, out, err)


def _flat(kind: str, peaks: dict) -> None:
    small, large = peaks["small"], peaks["large"]
    print(f"{kind}: driver RssAnon peak {SIZES['small']:,} records {small / 1e6:.1f} MB, "
          f"{SIZES['large']:,} records {large / 1e6:.1f} MB")
    assert large <= small * 1.10 + 20e6, f"{kind}: driver memory grows with the store: {small} -> {large} bytes"


def test_spark_verify_driver_memory_is_flat(big_stores):
    peaks = {}
    for name, (root, records) in big_stores.items():
        peak, r = peak_rss_anon([RMQSTORE, "spark", "verify", root, "--master", "local[2]", "--driver-memory", "1g", "--json"])
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        assert f"{records} records".encode() in r.stderr  # every record was verified
        peaks[name] = peak
    _flat("spark verify", peaks)


def test_spark_rebuild_driver_memory_is_flat(big_stores, tmp_path):
    """``--what all``: the consume queues, then the index files, in one driver (one JVM start and warm-up, not two);
    its peak is the higher of the two jobs'."""
    peaks = {}
    for name, (root, records) in big_stores.items():
        out = tmp_path / name
        peaks[name], r = peak_rss_anon([RMQSTORE, "spark", "rebuild", root, "--what", "all", "--out", str(out),
                                        "--master", "local[2]", "--driver-memory", "1g", "--json"])
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        # what was rebuilt is what our Appender wrote
        for what in ("consumequeue", "index"):
            src, dst = Path(root) / what, out / what
            assert sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file()) == \
                sorted(p.relative_to(dst) for p in dst.rglob("*") if p.is_file())
        cq_src = Path(root) / "consumequeue"
        for p in cq_src.rglob("*"):
            if p.is_file():
                assert p.read_bytes() == (out / "consumequeue" / p.relative_to(cq_src)).read_bytes()
    _flat("spark rebuild", peaks)
