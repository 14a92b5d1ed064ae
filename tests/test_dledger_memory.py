"""DLedger stores read in bounded memory: the commands that walk every entry (verify with its DL_* checks,
stats, dump commitlog / dump dledger --json, recover's plan, diff of two replicas) keep per-window state only,
so their anonymous resident memory does not grow with the log.

Two synthetic DLedger stores of ~100k and ~400k entries (bench/gen.py writes a classic store of 100 B
messages, bench/gendledger.py turns each record into an entry in 1 MiB data files, then `rebuild all` writes
the consume queues and index files). The commands run as subprocesses whose RssAnon is sampled
(tests/memprobe.py); what they print shows they did the work on every entry.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.memprobe import run_peak

SIZES = (100_000, 400_000)
RECORD = 297  # bytes of one generated 100 B message (bench/gen.py)
MARGIN = 8 << 20  # four times the entries may not cost this much more (one int64 column of the extra entries: 2.4 MB)


@pytest.fixture(scope="module")
def dledger_stores(tmp_path_factory):
    from bench import gen
    from bench.gendledger import convert

    base = tmp_path_factory.mktemp("dlmem")
    out = {}
    for n in SIZES:
        classic = str(base / f"classic{n}")
        gen.generate(classic, 100, total=n * RECORD, seg_size=1 << 20)
        info = convert(classic, str(base / f"dl{n}"), 1 << 20)
        shutil.rmtree(classic)
        replica = str(base / f"dl{n}-replica")
        shutil.copytree(str(base / f"dl{n}"), replica, copy_function=os.link)  # diff's other side: same bytes
        out[n] = (str(base / f"dl{n}"), replica, info["entries"])
    return out


COMMANDS = {
    "verify": ["verify", "{root}", "--json"],
    "stats": ["stats", "{root}", "--json"],
    "dump-commitlog": ["dump", "commitlog", "{root}", "--json"],
    "dump-dledger": ["dump", "dledger", "{root}", "--json"],
    "recover-dry-run": ["recover", "{root}", "--dry-run", "--json"],
    "diff": ["diff", "{root}", "{replica}", "--json"],
}


def _lines(path: str, prefix: bytes) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.startswith(prefix))


@pytest.mark.parametrize("what", list(COMMANDS))
def test_dledger_commands_memory_does_not_grow_with_the_log(dledger_stores, tmp_path, what):
    peaks = {}
    for n, (root, replica, entries) in dledger_stores.items():
        assert entries > n * 0.95
        out = str(tmp_path / f"{what}-{n}.jsonl")
        peaks[n], code = run_peak([a.format(root=root, replica=replica) for a in COMMANDS[what]], out)
        if what == "dump-commitlog":
            assert _lines(out, b'{"topic"') == entries
        elif what == "dump-dledger":
            assert _lines(out, b'{"type":"entry"') == entries
        elif what == "diff":
            with open(out) as f:
                d = json.loads(f.readline())
            assert d["relation"] == "identical" and d["comparedEntries"] == entries, d
        elif what == "verify":
            assert code == 0, open(out).read()[-2000:]
        elif what == "stats":
            with open(out) as f:
                s = json.loads(f.readline())
            assert json.dumps(s).count(str(entries)) >= 1, s
    small, large = (peaks[n] for n in SIZES)
    print(f"{what}: RssAnon peak {small >> 20} MiB at {SIZES[0]} entries, {large >> 20} MiB at {SIZES[1]}")
    assert large - small < MARGIN, (small, large)
