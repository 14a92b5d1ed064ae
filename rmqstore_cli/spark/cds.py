"""Class-data sharing for Spark's driver JVM: an archive of the classes a job loads, made once, mapped by every
later start.

A ``spark`` command's JVM loads ~15,000 classes from Spark's jars before its first job can run: most of a ~10 s
session start on 2 cores (shared/NOTES-spark.md). The JDK's AppCDS (a dynamic archive, JDK 13 and later) keeps
them parsed and verified in one file the JVM maps instead; a start that maps it builds its session in about half
the time. ``python -m rmqstore_cli.spark.cdsbuild`` (run by scripts/setup.sh) writes it; this module only finds it
and says how a JVM maps it.

The archive belongs to one JDK and one set of Spark jars: its name carries the pyspark version and the java
binary, and the JVM itself checks both when it maps it. One it cannot use (another JDK, jars changed) is ignored
without a word (``-Xshare:auto``, the default, with CDS logging off): the start is just as slow as without one.
RMQSTORE_SPARK_CDS=0: neither make nor use one.
"""

from __future__ import annotations

import hashlib
import os
import shutil

ENV = "RMQSTORE_SPARK_CDS"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def _cache_dir() -> str:
    """``__pycache__`` beside this module when it is writable (a checkout or a venv), else the user's cache."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
    try:
        os.makedirs(here, exist_ok=True)
        if os.access(here, os.W_OK):
            return here
    except OSError:
        pass
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rmqstore")


def archive_path() -> str | None:
    """Where the archive for this pyspark and this JDK lives (it may not exist); None without a JDK."""
    java = _java()
    if java is None:
        return None
    try:
        from importlib.metadata import version

        spark_version = version("pyspark")
    except Exception:  # noqa: BLE001 - no pyspark: no Spark JVM to start either
        return None
    key = hashlib.sha1(f"{spark_version}\0{java}".encode()).hexdigest()[:12]
    return os.path.join(_cache_dir(), f"spark-cds-{key}.jsa")


def seal_path(path: str) -> str:
    return path + ".ok"


def java_flags() -> str:
    """The driver JVM's flags that map the archive, or "" when there is none, it is not the file that was checked
    when it was made (a JVM that maps a cut-short archive crashes), or RMQSTORE_SPARK_CDS=0."""
    if os.environ.get(ENV) == "0":
        return ""
    path = archive_path()
    if path is None:
        return ""
    try:
        with open(seal_path(path)) as f:
            sealed = int(f.read().strip() or -1)
        if os.path.getsize(path) != sealed:
            return ""
    except (OSError, ValueError):
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"
