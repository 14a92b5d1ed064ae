"""The class-data archive of Spark's driver JVM (rmqstore_cli/spark/cds.py, cdsbuild.py): set-up makes it, a
session start maps it only when it is the file that was checked when it was made (a JVM that maps a cut-short
archive crashes), and a JVM that must map it (-Xshare:on) starts and runs a job."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pyspark", reason="pyspark is an optional extra (pip install -e .[spark])")

from rmqstore_cli.spark import cds, cdsbuild  # noqa: E402


def _fake_archive(monkeypatch, tmp_path, size: int, sealed: int | None):
    path = tmp_path / "spark-cds-test.jsa"
    path.write_bytes(b"\0" * size)
    if sealed is not None:
        (tmp_path / "spark-cds-test.jsa.ok").write_text(f"{sealed}\n")
    monkeypatch.setattr(cds, "archive_path", lambda: str(path))
    monkeypatch.delenv(cds.ENV, raising=False)
    return path


def test_flags_map_a_sealed_archive(monkeypatch, tmp_path):
    path = _fake_archive(monkeypatch, tmp_path, 4096, 4096)
    flags = cds.java_flags()
    assert f"-XX:SharedArchiveFile={path}" in flags.split()
    assert "-Xlog:cds=off" in flags.split()  # an archive the JVM cannot use is ignored without a word
    monkeypatch.setenv(cds.ENV, "0")
    assert cds.java_flags() == ""


@pytest.mark.parametrize("size,sealed", [(4096, None), (4000, 4096), (4096, 5000)])
def test_no_flags_for_an_unsealed_or_cut_archive(monkeypatch, tmp_path, size, sealed):
    _fake_archive(monkeypatch, tmp_path, size, sealed)
    assert cds.java_flags() == ""


def test_no_flags_without_an_archive(monkeypatch, tmp_path):
    monkeypatch.setattr(cds, "archive_path", lambda: str(tmp_path / "none.jsa"))
    monkeypatch.delenv(cds.ENV, raising=False)
    assert cds.java_flags() == ""


def test_session_start_passes_the_flags(monkeypatch):
    """build_session hands cds.java_flags() to the driver JVM (checked on the conf it builds, without a JVM)."""
    from pyspark.sql import SparkSession

    from rmqstore_cli.spark import session

    seen = {}

    class Stop(Exception):
        pass

    def get_or_create(builder):
        seen.update(builder._options)
        raise Stop

    monkeypatch.setattr(cds, "java_flags", lambda: "-XX:SharedArchiveFile=/x/y.jsa -Xlog:cds=off")
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", get_or_create)
    with pytest.raises(Stop):
        session.build_session("local[1]")
    assert "-XX:SharedArchiveFile=/x/y.jsa" in seen["spark.driver.extraJavaOptions"].split()


@pytest.mark.spark
def test_setup_made_an_archive_a_jvm_maps():
    """scripts/setup.sh made the archive for this pyspark and JDK; a JVM made to map it (-Xshare:on, or it does
    not start) runs a job, and a cut copy of it is refused."""
    path = cds.archive_path()
    assert path and os.path.isfile(path), f"no Spark class-data archive at {path}: scripts/setup.sh makes it"
    assert cds.java_flags(), "the archive is not sealed as the one set-up checked"
    cdsbuild.check_archive(path)


@pytest.mark.spark
def test_a_cut_archive_fails_the_check(tmp_path):
    path = cds.archive_path()
    assert path and os.path.isfile(path), f"no Spark class-data archive at {path}: scripts/setup.sh makes it"
    cut = tmp_path / "cut.jsa"
    with open(path, "rb") as src:
        cut.write_bytes(src.read(1 << 20))
    with pytest.raises(RuntimeError, match="could not start"):
        cdsbuild.check_archive(str(cut))
