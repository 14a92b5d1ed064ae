"""The distribution a user installs: one import package, and the README's commands work from the wheel.

The wheel is built from this checkout without build isolation (no download), installed into a fresh
virtual environment with no access to the checkout; the run-time dependencies come from the test's own
environment through a ``.pth`` line (a plain path: no editable finder of this checkout comes with it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "fixtures" / "stores" / "4.9.3-clean"


def _env() -> dict:
    """This environment without what would point a child Python at the checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    build = tmp_path_factory.mktemp("build")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-q", "-w", str(dist), str(REPO)],
                       capture_output=True, text=True, cwd=build, env=_env(), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = dist.glob("rmqstore-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, env=_env(), timeout=300)
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q",
                        "--no-deps", "--disable-pip-version-check", str(wheel)], capture_output=True, text=True,
                       env=_env(), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (env / "bin" / "rmqstore").exists(), r.stdout + r.stderr
    site = subprocess.run([str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=_env()).stdout.strip()
    Path(site, "rmqstore-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env


def _run(env: Path, *args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=_env(), timeout=600)


def test_the_wheel_holds_one_import_package(wheel):
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
        top_level = next(n for n in z.namelist() if n.endswith(".dist-info/top_level.txt"))
        assert z.read(top_level).decode().split() == ["rmqstore_cli"]
        names = set(z.namelist())
    assert {t for t in tops if not t.endswith(".dist-info")} == {"rmqstore_cli"}
    # the repository's formats/ and commands/ are inside it, every module of them
    for top in ("formats", "commands"):
        for path in (REPO / top).glob("*.py"):
            assert f"rmqstore_cli/{top}/{path.name}" in names


def test_readme_commands_work_from_the_wheel_and_the_generic_names_are_not_installed(venv, tmp_path):
    bindir = venv / "bin"
    r = _run(venv, bindir / "rmqstore", "--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("rmqstore "), r.stdout + r.stderr
    r = _run(venv, bindir / "rmqstore", "verify", DEMO, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 errors" in r.stderr + r.stdout
    where = _run(venv, bindir / "python", "-c", "import rmqstore_cli; print(rmqstore_cli.__file__)", cwd=tmp_path)
    assert str(venv) in where.stdout and str(REPO) not in where.stdout, where.stdout + where.stderr
    for name in ("formats", "commands"):
        r = _run(venv, bindir / "python", "-c", f"import {name}", cwd=tmp_path)
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, (name, r.stdout, r.stderr)


def test_no_source_imports_the_old_top_level_names():
    """Every import names rmqstore_cli.formats / rmqstore_cli.commands (an import of bare ``formats`` works in
    the checkout through the folder, and fails once installed)."""
    import ast

    bad = []
    for top in ("rmqstore_cli", "formats", "commands", "tests", "bench", "scripts"):
        for path in (REPO / top).rglob("*.py"):
            if "rmqstore_cli/formats" in str(path) or "rmqstore_cli/commands" in str(path):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                bad += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                        if n.split(".")[0] in ("formats", "commands")]
    assert not bad, "\n".join(bad)
