"""Helpers for the reliability suites: cheap store clones, seeded damage, in-process command runs.

The ground truth for every check comes from the broker-written stores (their files and their
``broker-read.jsonl.gz``), never from what rmqstore itself reads back.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import stat
import struct
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tests.conftest import broker_read, shared_store

MAX_INT = 2**31 - 1
READ_EXIT_CODES = {0, 1, 2, 3}  # documented codes a read command may use on an unlocked store
COMMAND_TIMEOUT = int(os.environ.get("RMQSTORE_FUZZ_TIMEOUT", "20"))
# A run may grow the resident set by at most this much: a corrupt length field must never make a
# reader allocate (and touch) a buffer of that length.
RSS_BUDGET = 256 << 20
TRACED_BUDGET = 64 << 20  # Python/numpy allocations under tracemalloc for the huge-length cases


# --- the stores' layout, from the broker-written files and broker-read.jsonl.gz ----------------------


def stream_of(rel: str) -> tuple[tuple, int]:
    """(stream id, start offset of this file in the stream) of a store-relative path.

    A stream is one offset space: the commitlog, one consume queue, one ext queue, one index file...
    Global location = file start + position, so "at or before" can compare across segments.
    """
    parts = rel.split("/")
    name = parts[-1]
    if parts[0] == "commitlog" and len(parts) == 2:
        return ("commitlog",), int(name) if name.isdigit() else 0
    if parts[0] in ("consumequeue", "consumequeue_ext") and len(parts) == 4:
        return (parts[0], parts[1], parts[2]), int(name) if name.isdigit() else 0
    if parts[0] in ("consumequeue", "consumequeue_ext", "commitlog") and len(parts) < 4:
        return tuple(parts[:3]) if parts[0] != "commitlog" else ("commitlog",), 0
    return tuple(parts), 0


@dataclass
class Region:
    """Byte ranges of one file whose damage the spec makes detectable (half-open, file positions)."""

    ranges: list = field(default_factory=list)

    def add(self, a: int, b: int) -> None:
        if b > a:
            self.ranges.append((a, b))

    def first_hit(self, changed: list[int]) -> int | None:
        """Smallest changed position that falls in a checked range."""
        if not self.ranges or not changed:
            return None
        import bisect

        rs = sorted(self.ranges)
        starts = [r[0] for r in rs]
        for p in changed:
            i = bisect.bisect_right(starts, p) - 1
            # ranges may overlap; look back a little
            for j in range(max(0, i - 3), i + 1):
                if rs[j][0] <= p < rs[j][1]:
                    return p
        return None


class StoreModel:
    """One shared store: its files, and which bytes of each are covered by a check the spec defines."""

    def __init__(self, name: str):
        self.name = name
        self.root = shared_store(name)
        self.files: list[str] = []
        self.dirs: list[str] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            if rel != ".":
                self.dirs.append(rel)
            for fn in filenames:
                self.files.append(os.path.normpath(os.path.join(rel, fn)))
        self.files.sort()
        self.dirs.sort()
        self.sizes = {f: os.path.getsize(self.root / f) for f in self.files}
        br = broker_read(name)
        self.store_info = br["store"][0]
        self.clmsg = [(m["offset"], m["size"], m["msg"]) for m in br["clmsg"]]
        self.blanks = [(b["offset"], b["totalSize"]) for b in br.get("blank", [])]
        self.cl_file_size = self.sizes[self.by_kind("commitlog")[0]]
        self.cl_files = self.by_kind("commitlog")
        self.cl_end = max(o + s for o, s, _ in self.clmsg)
        self.checked: dict[str, Region] = {}
        # The last reference of a queue / index file: pointed past the log end, it reads as a lost tail
        # (reported at the log end), which is as right as "corrupt reference".
        self.tail_refs: dict[str, tuple[int, int]] = {}
        self._commitlog_regions()
        self._cq_regions(br)
        self._ext_regions()
        self._index_regions()

    def by_kind(self, kind: str) -> list[str]:
        if kind == "commitlog":
            return [f for f in self.files if f.startswith("commitlog/")]
        if kind == "cq":
            return [f for f in self.files if f.startswith("consumequeue/")]
        if kind == "ext":
            return [f for f in self.files if f.startswith("consumequeue_ext/")]
        if kind == "index":
            return [f for f in self.files if f.startswith("index/")]
        if kind == "checkpoint":
            return [f for f in self.files if f == "checkpoint"]
        if kind == "config":
            return [f for f in self.files if f.startswith("config/")]
        if kind == "lock":
            return [f for f in self.files if f in ("lock", "abort")]
        raise KeyError(kind)

    def cl_file_for(self, phy: int) -> tuple[str, int]:
        start = phy - phy % self.cl_file_size
        return "commitlog/%020d" % start, start

    def _commitlog_regions(self) -> None:
        """TOTALSIZE, MAGIC, BODYCRC (body non-empty), BODYLENGTH, body, TOPICLEN, PROPERTIESLENGTH:

        §13.3 fails a record when any of them changes (magic test, CRC, TOTALSIZE formula)."""
        for off, size, m in self.clmsg:
            rel, start = self.cl_file_for(off)
            reg = self.checked.setdefault(rel, Region())
            p = off - start
            bh = 20 if m["sysFlag"] & 0x10 else 8
            sh = 20 if m["sysFlag"] & 0x20 else 8
            body = m["bodyLen"]
            topic = len(m["topic"].encode())
            props = len(m["propertiesRaw"].encode())
            tw = size - (74 + bh + sh + body + topic + props)
            assert tw in (1, 2), (self.name, off, tw)
            reg.add(p, p + (12 if body > 0 else 8))
            blen = p + 68 + bh + sh
            reg.add(blen, blen + 4 + body + tw)  # body length, body, topic length
            plen = blen + 4 + body + tw + topic
            reg.add(plen, plen + 2)
        for off, _ in self.blanks:
            rel, start = self.cl_file_for(off)
            self.checked.setdefault(rel, Region()).add(off - start, off - start + 8)

    def _cq_regions(self, br: dict) -> None:
        """phyOffset and size of every used unit: each must name a record start of that size (§7)."""
        cq_size = None
        for f in self.by_kind("cq"):
            cq_size = self.sizes[f]
            break
        last: dict = {}
        for e in br.get("cqe", []):
            qo = e["queueOffset"]
            pos = qo * 20
            start = pos - pos % cq_size
            rel = f"consumequeue/{e['topic']}/{e['queueId']}/{start:020d}"
            self.checked.setdefault(rel, Region()).add(pos - start, pos - start + 12)
            last[(e["topic"], e["queueId"])] = max(last.get((e["topic"], e["queueId"]), (0, "", 0)), (qo, rel, pos - start))
        for _, rel, p in last.values():
            self.tail_refs[rel] = (p, p + 12)

    def _ext_regions(self) -> None:
        """size and bitMapSize of every unit up to the end marker (§8.1): the walk depends on them."""
        for rel in self.by_kind("ext"):
            data = (self.root / rel).read_bytes()
            reg = self.checked.setdefault(rel, Region())
            p = 0
            while p + 2 <= len(data):
                (size,) = struct.unpack_from(">h", data, p)
                if size <= 0:
                    break
                reg.add(p, p + 2)
                reg.add(p + 18, p + 20)
                p += size

    def _index_regions(self) -> None:
        """indexCount, and the phyOffset of every used entry (must name a record start, §10)."""
        info = broker_read(self.name)["index"][0]["files"]
        for fi in info:
            rel = f"index/{fi['name']}"
            if rel not in self.sizes:
                continue
            reg = self.checked.setdefault(rel, Region())
            reg.add(36, 40)
            slots = self.index_slots(fi["size"])
            base = 40 + slots * 4
            for n in range(1, fi["indexCount"]):
                e = base + n * 20
                reg.add(e + 4, e + 12)
            e = base + (fi["indexCount"] - 1) * 20
            self.tail_refs[rel] = (e + 4, e + 12)

    def index_slots(self, size: int) -> int:
        return int(self.store_info["maxHashSlotNum"])

    def original(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()


@lru_cache(maxsize=None)
def model(name: str) -> StoreModel:
    return StoreModel(name)


# --- cheap clones ---------------------------------------------------------------------------------


def make_template(name: str, dest: Path) -> Path:
    """One private copy of a shared store per session; case clones hard-link to it."""
    if dest.exists():
        return dest
    shutil.copytree(shared_store(name), dest, symlinks=True)
    for dirpath, _, filenames in os.walk(dest):
        os.chmod(dirpath, 0o755)
        for fn in filenames:
            os.chmod(os.path.join(dirpath, fn), 0o444)
    return dest


def clone(template: Path, dest: Path, private: set[str] = frozenset()) -> Path:
    """Hard-link every file of ``template`` into ``dest``; files in ``private`` get their own copy."""
    for dirpath, dirnames, filenames in os.walk(template):
        rel = os.path.relpath(dirpath, template)
        out = dest / rel if rel != "." else dest
        out.mkdir(parents=True, exist_ok=True)
        for fn in filenames:
            r = os.path.normpath(os.path.join(rel, fn))
            src = os.path.join(dirpath, fn)
            if r in private:
                shutil.copyfile(src, out / fn)
                os.chmod(out / fn, 0o644)
            else:
                os.link(src, out / fn)
    return dest


def digest(root: Path) -> dict[str, tuple]:
    """{relative path: (sha256, size, mtime_ns)} of every file, plus every directory (mtime)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out[rel + "/"] = ("dir", 0, os.stat(dirpath).st_mtime_ns)
        for fn in filenames:
            p = os.path.join(dirpath, fn)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[os.path.normpath(os.path.join(rel, fn))] = ("link:" + os.readlink(p), 0, st.st_mtime_ns)
                continue
            with open(p, "rb") as f:
                h = hashlib.sha256(f.read()).hexdigest()
            out[os.path.normpath(os.path.join(rel, fn))] = (h, st.st_size, st.st_mtime_ns)
    return out


def content_digest(root: Path) -> dict[str, tuple]:
    """Like ``digest`` without times: what a byte-for-byte restore must reproduce."""
    return {k: v[:2] for k, v in digest(root).items() if not k.endswith("/")}


# --- damage ---------------------------------------------------------------------------------------

KINDS = ("commitlog", "cq", "ext", "index", "checkpoint", "config")
OPS = ("bitflip", "overwrite", "zero", "huge", "truncate", "delete", "swap")


@dataclass
class Damage:
    op: str
    kind: str
    files: list[str]
    detail: str
    changed: dict = field(default_factory=dict)  # rel -> sorted changed positions (byte-level ops)
    truncated: dict = field(default_factory=dict)  # rel -> new length
    deleted: list = field(default_factory=list)
    swapped: tuple = ()

    def describe(self) -> str:
        return f"{self.op} {self.kind} {','.join(self.files)} {self.detail}"

    def first_global(self, m: StoreModel) -> dict:
        """{stream: first damaged global offset} over every touched file."""
        out: dict = {}

        def put(rel, pos):
            s, start = stream_of(rel)
            g = start + pos
            if s not in out or g < out[s]:
                out[s] = g

        for rel, pos in self.changed.items():
            if pos:
                put(rel, pos[0])
        for rel, n in self.truncated.items():
            put(rel, n)
        for rel in self.deleted:
            put(rel, 0)
        for rel in self.swapped:
            put(rel, 0)
        return out

    def first_checked(self, m: StoreModel) -> dict:
        """{stream: first damaged global offset inside a checked region} (what verify must catch)."""
        out: dict = {}
        for rel, pos in self.changed.items():
            if self.swapped:
                break  # swapped files are each intact; only the cross-references can tell
            reg = m.checked.get(rel)
            hit = reg.first_hit(pos) if reg else None
            if hit is not None:
                s, start = stream_of(rel)
                tail = m.tail_refs.get(rel)
                if tail and tail[0] <= hit < tail[1]:
                    s, start, hit = ("anywhere",), 0, 0
                out[s] = min(out.get(s, 1 << 62), start + hit)
        for rel, n in self.truncated.items():
            if rel.split("/")[0] in ("commitlog", "consumequeue", "consumequeue_ext", "index"):
                s, start = stream_of(rel)
                out[s] = min(out.get(s, 1 << 62), start)  # wrong size: reported at the file start
        for rel in self.deleted:
            if rel.startswith("commitlog/") and rel != m.cl_files[0]:
                # a gap is reported where it is noticed: at the end of the missing range at the latest
                end = stream_of(rel)[1] + m.cl_file_size
                out[("commitlog",)] = min(out.get(("commitlog",), 1 << 62), end)
        if self.swapped and self.swapped[0].split("/")[0] in ("commitlog", "consumequeue"):
            out[("anywhere",)] = 0
        return out


def _pick_file(rng: random.Random, m: StoreModel, kind: str) -> str | None:
    fs = m.by_kind(kind)
    if kind == "commitlog":
        # the files holding data matter more than the pre-allocated tail
        fs = [f for f in fs if int(f.split("/")[1]) < m.cl_end] or fs
    return rng.choice(fs) if fs else None


def _structural_pos(rng: random.Random, m: StoreModel, rel: str, size: int) -> int:
    reg = m.checked.get(rel)
    if reg and reg.ranges and rng.random() < 0.7:
        a, b = rng.choice(reg.ranges)
        return rng.randrange(a, b)
    return rng.randrange(max(size, 1))


def _huge(rng: random.Random, m: StoreModel, rel: str, data: bytearray) -> str:
    """Write the largest value into a length or count field (memory must stay bounded)."""
    kind = rel.split("/")[0]
    if kind == "commitlog":
        _, start = m.cl_file_for(int(rel.split("/")[1]))
        recs = [(o - start, s, msg) for o, s, msg in m.clmsg if start <= o < start + m.cl_file_size]
        if not recs:
            struct.pack_into(">i", data, 0, MAX_INT)
            return "TOTALSIZE@0"
        p, s, msg = rng.choice(recs)
        bh = 20 if msg["sysFlag"] & 0x10 else 8
        sh = 20 if msg["sysFlag"] & 0x20 else 8
        which = rng.choice(["totalSize", "bodyLength", "topicLength", "propertiesLength"])
        if which == "totalSize":
            struct.pack_into(">i", data, p, MAX_INT)
        elif which == "bodyLength":
            struct.pack_into(">i", data, p + 68 + bh + sh, MAX_INT)
        elif which == "topicLength":
            q = p + 72 + bh + sh + msg["bodyLen"]
            data[q] = 0x7F
        else:
            q = p + s - len(msg["propertiesRaw"].encode()) - 2
            struct.pack_into(">h", data, q, 0x7FFF)
        return f"{which}@{p}"
    if kind == "consumequeue":
        n = len(data) // 20
        u = rng.randrange(max(n, 1)) if rng.random() < 0.5 else 0
        if rng.random() < 0.5:
            struct.pack_into(">i", data, u * 20 + 8, MAX_INT)
            return f"unit-size@{u}"
        struct.pack_into(">q", data, u * 20, 2**63 - 1)
        return f"unit-phyOffset@{u}"
    if kind == "consumequeue_ext":
        struct.pack_into(">h", data, 0, 0x7FFF)
        struct.pack_into(">h", data, 18, 0x7FFF)
        return "ext-size@0"
    if kind == "index":
        f = rng.choice([32, 36, 40, 40 + 4 * rng.randrange(8)])
        struct.pack_into(">i", data, f, MAX_INT)
        return f"index-int@{f}"
    struct.pack_into(">q", data, 0, 2**63 - 1)
    return "max@0"


def plan_and_apply(rng: random.Random, m: StoreModel, case_dir_for, kind: str | None = None) -> Damage:
    """Choose a damage (of ``kind`` if given), make the case clone (private copies of touched files) and apply it."""
    kinds = [k for k in KINDS if m.by_kind(k)]
    weights = {"commitlog": 40, "cq": 20, "ext": 12, "index": 16, "checkpoint": 7, "config": 5}
    if kind is None:
        kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
    op = rng.choices(OPS, [24, 16, 14, 12, 14, 9, 11])[0]
    rel = _pick_file(rng, m, kind)
    files = [rel]
    if op == "swap":
        others = [f for f in m.by_kind(kind) if f != rel and m.sizes[f] == m.sizes[rel]]
        if kind == "commitlog":
            others = [f for f in others if int(f.split("/")[1]) < m.cl_end] or others
        if not others:
            op = "bitflip"
        else:
            files.append(rng.choice(others))
    root = case_dir_for(set(files))
    dmg = Damage(op, kind, files, "")
    if op == "delete":
        os.unlink(root / rel)
        dmg.deleted = [rel]
        dmg.detail = ""
        return dmg
    if op == "swap":
        a, b = files
        tmp = root / (a + ".swap")
        os.rename(root / a, tmp)
        os.rename(root / b, root / a)
        os.rename(tmp, root / b)
        dmg.swapped = (a, b) if stream_of(a)[1] <= stream_of(b)[1] else (b, a)
        for r in files:  # content positions that differ (for the "first damage" of the repair check)
            old, new = m.original(r), (root / r).read_bytes()
            dmg.changed[r] = _diff(old, new)
        return dmg
    path = root / rel
    data = bytearray(path.read_bytes())
    size = len(data)
    if op == "truncate":
        n = rng.choice([0, rng.randrange(max(size, 1)), max(size - rng.randrange(1, 64), 0)])
        with open(path, "r+b") as f:
            f.truncate(n)
        dmg.truncated[rel] = n
        dmg.detail = f"to {n}"
        return dmg
    if size == 0:
        data = bytearray(b"\xff" * 16)
        dmg.detail = "fill empty file"
    elif op == "bitflip":
        p = _structural_pos(rng, m, rel, size)
        nbits = rng.choice([1, 1, 1, 2, 3, 8])
        for _ in range(nbits):
            q = min(size - 1, p + rng.randrange(0, 8))
            data[q] ^= 1 << rng.randrange(8)
        dmg.detail = f"{nbits} bits near {p}"
    elif op in ("overwrite", "zero"):
        p = _structural_pos(rng, m, rel, size)
        n = rng.choice([1, 4, 8, rng.randrange(1, 64), rng.randrange(1, 4096)])
        n = min(n, size - p)
        data[p : p + n] = bytes(n) if op == "zero" else rng.randbytes(n)
        dmg.detail = f"{n} bytes at {p}"
    else:  # huge
        dmg.detail = _huge(rng, m, rel, data)
    with open(path, "wb") as f:
        f.write(data)
    dmg.changed[rel] = _diff(m.original(rel), bytes(data))
    return dmg


def _diff(old: bytes, new: bytes) -> list[int]:
    import numpy as np

    n = min(len(old), len(new))
    a = np.frombuffer(old, np.uint8, n)
    b = np.frombuffer(new, np.uint8, n)
    pos = np.flatnonzero(a != b).tolist()
    if len(old) != len(new):
        pos.append(n)
    return pos


# --- running commands in-process ------------------------------------------------------------------


class CommandTimeout(BaseException):
    """Raised by SIGALRM inside a command: BaseException so no handler can swallow it."""


@dataclass
class Run:
    args: list
    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None
    rss_growth: int = 0
    traced_peak: int = 0


_status_fd: tuple[int, int] | None = None  # (pid, fd of /proc/self/status): kept open, re-read from offset 0


def _rss_anon() -> int:
    """Anonymous resident memory (RssAnon): what the process really holds. VmHWM/VmRSS also count the
    file pages it has mapped and touched (a default-geometry index file is 420 MB of them), which the
    kernel can drop at any time (NOTES-performance)."""
    global _status_fd
    pid = os.getpid()
    if _status_fd is None or _status_fd[0] != pid:  # a forked worker opens its own
        _status_fd = (pid, os.open("/proc/self/status", os.O_RDONLY))
    text = os.pread(_status_fd[1], 8192, 0)
    at = text.find(b"RssAnon:")
    return int(text[at + 8 : text.index(b"kB", at)]) * 1024 if at >= 0 else 0


class _Sampler:
    """One thread per process that samples RssAnon every ``every`` seconds while a command runs (armed). Made
    once, not per command: a thread started and joined for each of the fuzz's ~25,000 commands cost more than
    many of the commands. ``gen`` numbers the runs, so a sample taken during one run never lands in the next."""

    def __init__(self, every: float):
        import threading

        self.every, self.pid = every, os.getpid()
        self.lock = threading.Lock()
        self.armed = threading.Event()
        self.gen, self.peak = 0, 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.armed.wait()
            gen = self.gen
            v = _rss_anon()
            with self.lock:
                if gen == self.gen and self.armed.is_set():
                    self.peak = max(self.peak, v)
            time.sleep(self.every)

    def start(self) -> int:
        base = _rss_anon()
        with self.lock:
            self.gen += 1
            self.peak = base
            self.armed.set()
        return base

    def stop(self) -> int:
        with self.lock:
            self.armed.clear()
            self.gen += 1
            peak = self.peak
        return max(peak, _rss_anon())


_sampler: _Sampler | None = None


class _AnonPeak:
    """High-water mark of RssAnon while a command runs (there is no kernel counter for it): sampled."""

    def __init__(self, every: float = 0.002):
        global _sampler
        if _sampler is None or _sampler.pid != os.getpid():  # threads do not survive a fork
            _sampler = _Sampler(every)
        self.sampler = _sampler
        self.base = self.peak = 0

    def __enter__(self):
        self.base = self.peak = self.sampler.start()
        return self

    def __exit__(self, *exc):
        self.peak = self.sampler.stop()

    @property
    def growth(self) -> int:
        return self.peak - self.base


_runner = None
_cli = None


def _make_runner():
    """A CliRunner that builds the Click command tree once (typer rebuilds it per invoke: ~60 ms)."""
    import typer.main
    from typer.testing import CliRunner, Result

    from rmqstore_cli.app import app

    global _cli
    _cli = typer.main.get_command(app)

    class CachedRunner(CliRunner):
        def invoke(self, _app, args=None, env=None):
            exception = None
            exit_code = 0
            with self.isolation(input=None, env=env, color=False) as streams:
                try:
                    _cli.main(args=list(args or ()), prog_name="rmqstore")
                except SystemExit as e:
                    code = e.code if e.code is not None else 0
                    if code != 0:
                        exception = e
                    exit_code = code if isinstance(code, int) else 1
                except Exception as e:  # noqa: BLE001 - reported as an escaped exception
                    exception = e
                    exit_code = 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    out, err, mixed = (s.getvalue() for s in streams[:3])
            return Result(runner=self, stdout_bytes=out, stderr_bytes=err, output_bytes=mixed, return_value=None,
                          exit_code=exit_code, exception=exception, exc_info=None)

    return CachedRunner()


def run_cli(args: list[str], *, trace: bool = False, timeout: int = COMMAND_TIMEOUT) -> Run:
    """Invoke ``rmqstore ARGS`` in this process (RMQSTORE_DEBUG=1: an unexpected exception escapes)."""
    global _runner
    if _runner is None:
        _runner = _make_runner()
    app = None

    def on_alarm(signum, frame):
        raise CommandTimeout(f"rmqstore {' '.join(args)} ran longer than {timeout}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    if trace:
        tracemalloc.start()
        tracemalloc.reset_peak()
    signal.alarm(timeout)
    anon = _AnonPeak()
    try:
        with anon:
            res = _runner.invoke(app, args, env={"RMQSTORE_DEBUG": "1", "COLUMNS": "200"})
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        peak = 0
        if trace:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    growth = anon.growth
    exc = res.exception if not isinstance(res.exception, SystemExit) else None
    return Run(list(args), res.exit_code, res.stdout, _stderr(res), exc, growth, peak)


def _stderr(res) -> str:
    try:
        return res.stderr
    except ValueError:
        return ""


def problems_of(run: Run, allowed: set[int] = READ_EXIT_CODES) -> list[str]:
    """Violations of the command contract shared by every case: no traceback, documented exit, bounded memory."""
    out = []
    if run.exception is not None:
        import traceback

        tb = "".join(traceback.format_exception(run.exception))
        out.append(f"exception escaped: {tb[-1500:]}")
    if "Traceback (most recent call last)" in run.stdout + run.stderr:
        out.append("traceback printed")
    if "cannot process the store:" in run.stderr:
        out.append(f"unexpected internal error (catch-all): {run.stderr.strip()[:300]}")
    if run.exit_code not in allowed:
        out.append(f"exit code {run.exit_code} not in {sorted(allowed)}: {run.stderr.strip()[:300]}")
    if run.rss_growth > RSS_BUDGET:
        out.append(f"anonymous memory grew by {run.rss_growth >> 20} MiB")
    if run.traced_peak > TRACED_BUDGET:
        out.append(f"allocated {run.traced_peak >> 20} MiB (tracemalloc peak)")
    return out


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


# --- derived-file damage (consume queues, ext, index, checkpoint that lie about the log) --------------

DERIVED_CLASSES = ("cq-random", "cq-random-valid", "cq-swap", "cq-past-log", "ext-tags", "idx-offset", "idx-hash",
                   "idx-slot-past-count", "cp-future", "cp-past")


def _cq_used_units(m: StoreModel) -> dict[str, int]:
    """{consume-queue file: units the broker wrote into it} (from broker-read, not from rmqstore)."""
    br = broker_read(m.name)
    cq_size = next((m.sizes[f] for f in m.by_kind("cq")), 0)
    used: dict[str, int] = {}
    for e in br.get("cqe", []):
        pos = e["queueOffset"] * 20
        rel = f"consumequeue/{e['topic']}/{e['queueId']}/{pos - pos % cq_size:020d}"
        used[rel] = max(used.get(rel, 0), (pos % cq_size) // 20 + 1)
    return used


def derived_damage(rng: random.Random, m: StoreModel, case_dir_for, cls: str | None = None) -> Damage:
    """One seeded lie in a derived file; the commitlog is never touched. ``case_dir_for(private)`` makes
    the case store (files in ``private`` are copies that may be written)."""
    classes = [c for c in DERIVED_CLASSES if not c.startswith("ext") or m.by_kind("ext")]
    cls = cls or rng.choice(classes)
    if cls.startswith("cq"):
        used = _cq_used_units(m)
        rel = rng.choice(sorted(f for f, n in used.items() if n >= 3))
        root = case_dir_for({rel})
        data = bytearray((root / rel).read_bytes())
        n = used[rel]
        u = rng.randrange(n)
        if cls in ("cq-random", "cq-random-valid"):
            k = min(rng.randint(1, 4), n - u)
            junk = bytearray(rng.randbytes(20 * k))
            if cls == "cq-random-valid":  # the broker's test still accepts the first unit (phy >= 0, size > 0)
                junk[0] &= 0x7F
                junk[8] &= 0x7F
                junk[11] |= 1
            data[u * 20: u * 20 + 20 * k] = junk
            detail = f"{k} random units at {u}"
        elif cls == "cq-swap":
            v = u + 1 if u + 1 < n else u - 1
            a, b = sorted((u, v))
            data[a * 20: b * 20 + 20] = data[b * 20: b * 20 + 20] + data[a * 20: a * 20 + 20]
            detail = f"units {a} and {b} swapped"
        else:  # a unit naming a record past the end of the log, size kept
            struct.pack_into(">q", data, u * 20, m.cl_end + rng.randrange(0, 1 << 20))
            detail = f"unit {u} points past the log end {m.cl_end}"
    elif cls == "ext-tags":
        rel = rng.choice(m.by_kind("ext"))
        root = case_dir_for({rel})
        data = bytearray((root / rel).read_bytes())
        units, p = [], 0
        while p + 20 <= len(data) and struct.unpack_from(">h", data, p)[0] > 0:
            units.append(p)
            p += struct.unpack_from(">h", data, p)[0]
        p = rng.choice(units)
        old = struct.unpack_from(">q", data, p + 2)[0]
        struct.pack_into(">q", data, p + 2, old ^ (1 << rng.randrange(31)))
        detail = f"ext unit at {p}: tagsCode changed"
    elif cls.startswith("idx"):
        files = [f for f in m.by_kind("index")]
        info = {f"index/{fi['name']}": fi for fi in broker_read(m.name)["index"][0]["files"]}
        rel = rng.choice([f for f in files if info.get(f, {}).get("indexCount", 0) > 2])
        root = case_dir_for({rel})
        data = bytearray((root / rel).read_bytes())
        count = info[rel]["indexCount"]
        slots = m.index_slots(len(data))
        base = 40 + slots * 4
        e = rng.randrange(1, count)
        if cls == "idx-offset":  # another record's offset (a real record start, so only the keys can tell)
            other = rng.choice(m.clmsg)[0]
            old = struct.unpack_from(">q", data, base + e * 20 + 4)[0]
            if other == old:
                other = m.clmsg[0][0] if old != m.clmsg[0][0] else m.clmsg[-1][0]
            struct.pack_into(">q", data, base + e * 20 + 4, other)
            detail = f"entry {e} of {rel}: phyOffset {old} -> {other}"
        elif cls == "idx-hash":
            old = struct.unpack_from(">i", data, base + e * 20)[0]
            struct.pack_into(">i", data, base + e * 20, (old ^ (1 << rng.randrange(30))) & 0x7FFFFFFF)
            detail = f"entry {e} of {rel}: keyHash changed"
        else:  # a slot head pointing past indexCount
            heads = [s for s in range(slots) if struct.unpack_from(">i", data, 40 + s * 4)[0] > 0]
            s = rng.choice(heads) if heads and rng.random() < 0.7 else rng.randrange(slots)
            struct.pack_into(">i", data, 40 + s * 4, count + rng.randrange(0, 1000))
            detail = f"slot {s} of {rel} points past indexCount {count}"
    else:  # checkpoint times
        rel = "checkpoint"
        root = case_dir_for({rel})
        data = bytearray((root / rel).read_bytes())
        field_pos = rng.choice([0, 8, 16])
        old = struct.unpack_from(">q", data, field_pos)[0]
        delta = rng.choice([1, 60, 3600, 86400 * 365]) * 1000
        new = old + delta if cls == "cp-future" else max(0, old - delta)
        struct.pack_into(">q", data, field_pos, new)
        detail = f"checkpoint field @{field_pos}: {old} -> {new}"
    (root / rel).write_bytes(bytes(data))
    dmg = Damage(cls, "derived", [rel], detail)
    dmg.changed[rel] = _diff(m.original(rel), bytes(data))
    return dmg


def index_content(root: Path, slots: int) -> list:
    """Every index file's header, slot table and used entries, in name order (names are not content:
    the broker names files by its clock)."""
    out = []
    d = root / "index"
    for name in sorted(os.listdir(d)) if d.is_dir() else []:
        data = (d / name).read_bytes()
        count = max(struct.unpack_from(">i", data, 36)[0], 1)
        base = 40 + slots * 4
        out.append(hashlib.sha256(data[:base + count * 20]).hexdigest() + f":{count}")
        if data[base + count * 20:].strip(b"\0"):
            out.append(f"{name}: live bytes past indexCount")
    return out


def tree_bytes(root: Path, sub: str = "") -> dict[str, str]:
    """{relative path: sha256} of every file under ``root/sub`` (the whole tree by default)."""
    out = {}
    base = root / sub
    for dirpath, _, filenames in os.walk(base):
        for fn in filenames:
            p = Path(dirpath) / fn
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def seeded_case(rng: random.Random, i: int, tmp_path: Path, kind: str | None = None) -> tuple[str, Path]:
    """Case ``i`` of the seeded recovery loops: a copy of a broker-written store (each in turn) at
    ``tmp_path/case{i}`` with derived-file damage (i % 3 == 0), planned damage of ``kind`` (any when None;
    i % 3 == 1) or none. Returns (store name, case dir); the caller adds the crash (abort, checkpoint)."""
    from tests.conftest import STORE_NAMES

    name = STORE_NAMES[i % len(STORE_NAMES)]
    template = make_template(name, tmp_path / "templates" / name)
    case = tmp_path / f"case{i}"
    m = model(name)

    def case_dir_for(private):
        return clone(template, case, set(private) | {"checkpoint"})

    if i % 3 == 0:
        derived_damage(rng, m, case_dir_for)
    elif i % 3 == 1:
        plan_and_apply(rng, m, case_dir_for, kind=kind)
    else:
        case_dir_for(set())
    return name, case


def add_crash(case: Path, zero_checkpoint: bool) -> None:
    """The broker died: ``abort`` present and, when ``zero_checkpoint``, the checkpoint's three times at 0
    (recovery walks from the first segment). A checkpoint the case's damage deleted or cut stays as it is:
    it is part of that damage."""
    (case / "abort").write_bytes(b"")
    cp = case / "checkpoint"
    if zero_checkpoint and cp.exists():
        with open(cp, "r+b") as f:
            f.write(b"\0" * min(24, cp.stat().st_size))

