"""Shared test fixtures: the broker-written stores in ../shared/stores and safe copies of them."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shutil
import stat
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
STORES = SHARED / "stores"
FIXTURES = REPO / "fixtures"
STORE_NAMES = ["4.9.3-clean", "4.9.3-crash", "4.9.3-ext", "5.3.3-clean", "5.3.3-v2topic"]
CLEAN_STORES = ["4.9.3-clean", "4.9.3-ext", "5.3.3-clean", "5.3.3-v2topic"]


def _cache_click_commands() -> None:
    """typer's CliRunner builds the Click command tree of the app on every invoke (~20-25 ms for rmqstore's, more
    than many of the commands the suite runs); it is built once per app here. The tree holds no per-run state:
    each invoke makes its own Click context."""
    import typer.testing

    built: dict[int, tuple] = {}
    build = typer.testing._get_command

    def get_command(app):
        hit = built.get(id(app))
        if hit is None or hit[0] is not app:
            hit = built[id(app)] = (app, build(app))
        return hit[1]

    typer.testing._get_command = get_command


_cache_click_commands()


def json_lines(text: str) -> list[dict]:
    """The JSON objects of a command's ``--json`` output (lines starting with ``{``)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def recover_plan(text: str) -> dict:
    """The ``recover-plan`` object of ``recover --json`` output."""
    return next(o for o in json_lines(text) if o.get("type") == "recover-plan")


def files_of(root, sub: str = "consumequeue") -> dict[str, bytes]:
    """Every file under ``root/sub`` (relative path -> bytes)."""
    out = {}
    base = os.path.join(root, sub)
    for dp, _, fn in os.walk(base):
        for f in fn:
            p = os.path.join(dp, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, base)] = fh.read()
    return out


def require_shared() -> None:
    if not STORES.is_dir():
        pytest.fail(f"broker-written stores not found at {STORES}: CI must have ../shared beside the checkout")


@lru_cache(maxsize=None)
def broker_read(name: str) -> dict:
    """broker-read.jsonl.gz of a shared store, grouped by line type."""
    require_shared()
    out: dict[str, list] = {}
    with gzip.open(STORES / name / "broker-read.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            o = json.loads(line)
            out.setdefault(o["type"], []).append(o)
    return out


@lru_cache(maxsize=None)
def broker_puts(name: str) -> list[dict]:
    require_shared()
    with gzip.open(STORES / name / "puts.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def shared_store(name: str) -> Path:
    require_shared()
    return STORES / name / "store"


def copy_store(name: str, dest: Path) -> Path:
    """A writable copy of a shared store's root (never modify the originals)."""
    src = shared_store(name)
    shutil.copytree(src, dest, symlinks=True)
    for dirpath, dirnames, filenames in os.walk(dest):
        os.chmod(dirpath, os.stat(dirpath).st_mode | stat.S_IWUSR)
        for fn in filenames:
            p = os.path.join(dirpath, fn)
            os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)
    return dest


def tree_digest(root: Path) -> dict[str, tuple[str, int]]:
    """{relative path: (sha256, mtime_ns)} of every file under root (read-only checks)."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for fn in filenames:
            p = os.path.join(dirpath, fn)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = (hashlib.sha256(f.read()).hexdigest(), os.stat(p).st_mtime_ns)
    return out


@pytest.fixture
def store_copy(tmp_path):
    """Factory: store_copy("4.9.3-clean") -> Path of a writable copy in tmp_path."""

    def make(name: str, sub: str | None = None) -> Path:
        return copy_store(name, tmp_path / (sub or name))

    return make


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the whole run (the cluster tests override it with their own)."""
    from rmqstore_cli.spark.session import build_session

    s = build_session("local[2]", "rmqstore-tests", fast_jvm=True, conf={"spark.sql.shuffle.partitions": "2"})
    yield s
    s.stop()


def seed_params(drawn: int, *fixed: int, draw=None) -> list:
    """Parametrize values for seeded tests: ``drawn`` seeds drawn for this run (``draw`` or the system's randomness;
    the test prints its seed) and the ``fixed`` ones. Their ids do not show the drawn values, so every process of
    a parallel run (pytest-xdist) collects the same tests."""
    rng = random.SystemRandom()
    values = draw if draw is not None else [rng.randrange(2**32) for _ in range(drawn)]
    return ([pytest.param(v, id=f"drawn{i}") for i, v in enumerate(values)]
            + [pytest.param(v, id=f"seed{v}") for v in fixed])
