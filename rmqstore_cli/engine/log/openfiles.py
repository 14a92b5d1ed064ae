"""The process's limit on open files (``ulimit -n``), met by commands that keep many files mapped.

Every file a command keeps mapped holds a descriptor: Python's mmap keeps a copy of the one it was made from, as
each of the broker's MappedFiles keeps its FileChannel open. A store with thousands of queue files therefore needs
more than the 1024 a login shell often allows. The broker's JVM raises its soft limit to the hard one at its start;
the command line does the same (``app.run``), and :func:`open_files_error` says which limit was met and how to
raise it.
"""

from __future__ import annotations

import errno


def open_files_error(path: str | None, e: OSError) -> OSError:
    """What to raise when opening or mapping ``path`` failed with ``e``: EMFILE said as the limit it is, with
    the limits and how to raise them, still an OSError (a repair that meets it undoes its steps); any other
    error unchanged."""
    if e.errno != errno.EMFILE or "ulimit -n" in str(e):
        return e
    soft, hard = open_files_limits()
    if soft is None:
        return e
    raise_soft = (f"raise it to the hard limit with `ulimit -n {hard}`" if hard is not None and soft < hard
                  else "raise the hard limit (as root `ulimit -Hn 655350`, or a `nofile` line in "
                       "/etc/security/limits.conf; RocketMQ's bin/os.sh sets 655350)")
    shown = "unlimited" if hard is None else str(hard)
    return OSError(errno.EMFILE, f"{e.strerror or e}: this process may keep {soft} files open (ulimit -n; hard limit "
                                 f"{shown}). A store with many queue and commitlog files needs one per file in use, "
                                 f"as the broker does: {raise_soft}, and run the command again",
                   path if path is not None else e.filename)


def open_files_limits() -> tuple[int | None, int | None]:
    """(soft, hard) limit on this process's open files; None for unlimited or where it cannot be told."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None, None
    inf = resource.RLIM_INFINITY
    return (None if soft == inf else soft), (None if hard == inf else hard)
