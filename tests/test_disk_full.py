"""Disk full and permissions: a writing command that cannot write says so in one line, exits 3, and leaves
the store exactly as it was before the command.

"Disk full" is simulated with RLIMIT_FSIZE in a child process (writes past the limit fail with EFBIG, the
same path as ENOSPC: an OSError from write/ftruncate in the middle of the command). A read-only store is a
read-only directory tree; when the tests run as root (who ignores file modes) the child drops the
capabilities that let root override them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fuzzlib
from tests.conftest import REPO, copy_store

NAME = "5.3.3-v2topic"
RUN = "import sys; from rmqstore_cli.app import main; sys.argv = ['rmqstore'] + sys.argv[1:]; main()"
PR_CAPBSET_DROP = 24
CAPS = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def _drop_root_overrides() -> None:
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in CAPS:
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run_child(args: list[str], *, fsize: int | None = None, readonly: bool = False, timeout: int = 120):
    def pre():
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if readonly:
            _drop_root_overrides()

    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", RUN] + args, capture_output=True, text=True, env=env, preexec_fn=pre,
                          timeout=timeout)


def check_refused(p, what: str) -> None:
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.returncode == 3, f"{what}: exit {p.returncode}: {p.stderr[-600:]}"
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("rmqstore:") and "warning" not in ln]
    assert lines, f"{what}: no error line: {p.stderr[-600:]}"


def make_readonly(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o444)
        os.chmod(dirpath, 0o555)


def make_writable(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)


def writing_commands(root: Path, tmp: Path) -> dict:
    last = fuzzlib.model(NAME).clmsg[-1][0]
    src = tmp / "msgs.jsonl"
    src.write_text("".join(json.dumps({"topic": "ShortTopic", "queueId": 1, "bodyHex": os.urandom(700).hex(),
                                       "properties": {"KEYS": f"full-{i}"}}) + "\n" for i in range(40)))
    return {
        "append": ["append", "--topic", "ShortTopic", "--queue", "1", "--body", "x" * 900, str(root)],
        "append --from": ["append", "--from", str(src), str(root)],
        "truncate": ["truncate", "--offset", str(last), "--backup-dir", str(tmp / "bk-t"), str(root)],
        "rebuild all": ["rebuild", "all", "--backup-dir", str(tmp / "bk-r"), str(root)],
        "recover": ["recover", "--backup-dir", str(tmp / "bk-c"), str(root)],
    }


@pytest.mark.parametrize("command", ["append", "append --from", "truncate", "rebuild all", "recover"])
def test_read_only_store(tmp_path, command):
    root = copy_store(NAME, tmp_path / "store")
    if command == "recover":
        (root / "abort").write_bytes(b"")  # something to do
    args = writing_commands(root, tmp_path)[command]
    make_readonly(root)
    before = fuzzlib.digest(root)
    try:
        p = run_child(args, readonly=True)
        check_refused(p, command)
        assert any(w in p.stderr.lower() for w in ("permission", "read-only", "not writable")), p.stderr
        assert fuzzlib.digest(root) == before
    finally:
        make_writable(root)


def _space_cases():
    # limit: bytes any one file may grow to. 4000 < the data end of the last commitlog file (4068):
    # the first write fails. 6000 lets a few messages in, then fails in the middle of the command.
    return [("append", 4000), ("append --from", 4000), ("append --from", 6000), ("append --from", 9000),
            ("rebuild all", 700), ("truncate", 300), ("recover", 700)]


@pytest.mark.parametrize("command,limit", _space_cases())
def test_out_of_space_leaves_the_store_as_it_was(tmp_path, command, limit):
    root = copy_store(NAME, tmp_path / "store")
    if command == "recover":
        (root / "abort").write_bytes(b"")
    args = writing_commands(root, tmp_path)[command]
    before = fuzzlib.content_digest(root)
    p = run_child(args, fsize=limit)
    check_refused(p, f"{command} with files limited to {limit} bytes")
    assert any(w in p.stderr.lower() for w in ("too large", "no space", "space", "efbig", "enospc")), p.stderr[-600:]
    after = fuzzlib.content_digest(root)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"{command}: store changed although the command failed: {changed[:6]}\n{p.stderr[-600:]}"
    # and it is still a store the tool reads cleanly (nothing half-written is left behind)
    v = fuzzlib.run_cli(["verify", "--json", str(root)])
    assert not fuzzlib.problems_of(v, {0, 1})


# --- a really full filesystem: a small tmpfs of fixed size (root mounts it; the tests run as root) -------

TMPFS_SIZE = "1m"


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs mounted at tmp_path/fs for the test, unmounted afterwards."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    assert p.returncode == 0, f"cannot mount a {TMPFS_SIZE} tmpfs (these tests run as root): {p.stderr.strip()}"
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(fs: Path) -> None:
    """Take every free block of the filesystem."""
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def _one_enospc_line(p, what: str) -> None:
    assert p.returncode != -signal.SIGBUS, f"{what}: killed by SIGBUS"
    check_refused(p, what)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("rmqstore:")]
    assert len(lines) == 1 and "ENOSPC" in lines[0], f"{what}: {p.stderr[-600:]}"


def test_append_more_than_the_filesystem_holds(small_fs, tmp_path):
    root = copy_store(NAME, small_fs / "store")
    src = tmp_path / "big.jsonl"
    # ~1.6 MB of bodies into a 1 MiB filesystem
    src.write_text("".join(json.dumps({"topic": "ShortTopic", "queueId": 1, "bodyHex": os.urandom(8000).hex(),
                                       "properties": {"KEYS": f"big-{i}"}}) + "\n" for i in range(200)))
    before = fuzzlib.content_digest(root)
    p = run_child(["append", "--from", str(src), "--quiet", str(root)])
    _one_enospc_line(p, "append --from on a full filesystem")
    assert fuzzlib.content_digest(root) == before


@pytest.mark.parametrize("command", ["append", "recover", "rebuild all"])
def test_full_filesystem_is_enospc_not_sigbus(small_fs, tmp_path, command):
    """Writes that go through mmap into holes (a new consume-queue file, a re-dispatch, a rebuild): with
    no block left, each must fail with ENOSPC before any byte is written, never die of SIGBUS."""
    root = copy_store(NAME, small_fs / "store")
    if command == "recover":
        import shutil

        shutil.rmtree(root / "consumequeue" / "ShortTopic")  # re-dispatch must create its files again
        (root / "abort").write_bytes(b"")
    args = {"append": ["append", "--topic", "BrandNewTopic", "--queue", "0", "--body", "hello", str(root)],
            "recover": ["recover", "--backup-dir", str(tmp_path / "bk"), str(root)],
            "rebuild all": ["rebuild", "all", "--backup-dir", str(tmp_path / "bk"), str(root)]}[command]
    before = fuzzlib.content_digest(root)
    _fill(small_fs)
    p = run_child(args)
    assert p.returncode != -signal.SIGBUS, f"{command}: killed by SIGBUS"
    check_refused(p, f"{command} on a full filesystem")
    assert "ENOSPC" in p.stderr or "No space left" in p.stderr, p.stderr[-600:]
    assert fuzzlib.content_digest(root) == before, f"{command}: the store changed"
