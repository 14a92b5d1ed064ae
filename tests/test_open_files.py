"""The process's limit on open files (``ulimit -n``). Every file a command keeps mapped holds a descriptor, so a
store with more queue and commitlog files than the soft limit (1024 in many login shells) stopped with "Too many
open files". The command now raises its soft limit to the hard one at its start, as the broker's JVM does; where
the hard limit is met too, it says which limit it met and how to raise it (exit 3, one line).

The broker-written 4.9.3-ext store holds 56 commitlog files and 28 consume-queue and ext files, so a soft limit of
40 is met by ``verify`` (the run without the raise failed there)."""

from __future__ import annotations

import errno
import resource
import subprocess
import sys

import pytest

from rmqstore_cli.engine.log.openfiles import open_files_error
from tests.conftest import json_lines, require_shared, shared_store

RMQSTORE = [sys.executable, "-m", "rmqstore_cli"]
LOW = 40


def _run(args, soft: int | None = None, hard: int | None = None) -> subprocess.CompletedProcess:
    def limit():
        cur_soft, cur_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft or cur_soft, hard or cur_hard))

    return subprocess.run(RMQSTORE + args, capture_output=True, text=True, timeout=120, preexec_fn=limit)


def _hard_limit_room() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"this machine's hard limit on open files is {hard}: the test needs room above {LOW}")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_low_soft_limit_is_raised(jobs):
    require_shared()
    _hard_limit_room()
    store = str(shared_store("4.9.3-ext"))
    free = _run(["verify", store, "--json", "-j", jobs])
    assert free.returncode == 0, free.stderr
    low = _run(["verify", store, "--json", "-j", jobs], soft=LOW)
    assert low.returncode == 0, low.stderr
    assert json_lines(low.stdout) == json_lines(free.stdout)


def test_low_hard_limit_is_named():
    require_shared()
    store = str(shared_store("4.9.3-ext"))
    r = _run(["verify", store], soft=LOW, hard=LOW)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "Too many open files" in r.stderr and f"may keep {LOW} files open (ulimit -n; hard limit {LOW})" in r.stderr
    assert "ulimit -Hn" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_raise_reaches_the_hard_limit():
    """The entry's raise, seen from inside the command's process."""
    _hard_limit_room()
    code = ("import resource, rmqstore_cli.app as a, sys; sys.argv=['rmqstore','--version']\n"
            "import atexit; atexit.register(lambda: print('LIMITS', *resource.getrlimit(resource.RLIMIT_NOFILE), "
            "file=sys.stderr))\na.run()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                             (LOW, resource.getrlimit(resource.RLIMIT_NOFILE)[1])))
    soft, hard = (int(x) for x in r.stderr.split("LIMITS")[1].split())
    assert soft == hard != LOW


def test_error_text():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    e = open_files_error("/s/consumequeue/T/0/00000000000000000000", OSError(errno.EMFILE, "Too many open files"))
    assert isinstance(e, OSError) and e.errno == errno.EMFILE
    assert e.filename == "/s/consumequeue/T/0/00000000000000000000"
    assert f"may keep {soft} files open" in e.strerror
    assert open_files_error(None, e) is e  # said once
    other = OSError(errno.ENOSPC, "No space left on device")
    assert open_files_error("/x", other) is other


def test_any_site_is_named(capsys):
    """An open that is not a mapping (a writer's file, a config file) meets the same limit: the command line's
    error handler says it the same way."""
    import typer

    from rmqstore_cli.commands.output import handle_errors

    @handle_errors
    def command():
        raise OSError(errno.EMFILE, "Too many open files", "/s/index/20261128000000000")

    with pytest.raises(typer.Exit) as ex:
        command()
    assert ex.value.exit_code == 3
    err = capsys.readouterr().err
    assert "/s/index/20261128000000000: Too many open files: this process may keep" in " ".join(err.split())
