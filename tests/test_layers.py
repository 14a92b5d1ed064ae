"""The layering the guide asks for, read from the sources (every import, also those inside functions):
commands -> rmqstore_cli.engine -> formats, and inside the engine its subpackages bottom up
(engine/__init__.py draws them). The few imports that still point up are listed by name below,
so a new one fails here instead of slipping in."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.path.join(ROOT, "rmqstore_cli", "engine")

# bottom up; verify and query are side by side (both read what log/ and derived/ hold)
# timer/ reads the commitlog and the timer queue (log/, derived/) and is read by verify, query, repair
RANK = {"config": 0, "log": 1, "derived": 2, "timer": 2.5, "verify": 3, "query": 3, "repair": 4}

# (importing module, imported subpackage): each kept for a reason
KNOWN_UPWARD = {
    # append dispatches what it wrote, as the broker's putMessage is followed by its reput service
    ("log/appender.py", "derived"),
    # export reports a record it cannot read with verify's code for the same damage
    ("query/export.py", "verify"),
}


def _imports(path: str, package: list[str]):
    """(line, absolute dotted module) of every import in a file, relative imports resolved."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield node.lineno, mod


def _modules(top: str):
    for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)
                package = rel[:-3].replace(os.sep, ".").split(".")[:-1]
                yield rel, path, package


def test_engine_subpackages_import_down_only():
    bad, seen = [], set()
    for rel, path, package in _modules(os.path.join("rmqstore_cli", "engine")):
        parts = os.path.relpath(path, ENGINE).split(os.sep)
        if len(parts) < 2 or parts[0] not in RANK:
            continue
        here = f"{parts[0]}/{parts[-1]}"
        for line, mod in _imports(path, package):
            m = mod.split(".")
            if m[:2] != ["rmqstore_cli", "engine"] or len(m) < 3 or m[2] not in RANK:
                continue
            up = RANK[m[2]] > RANK[parts[0]] or (m[2] != parts[0] and RANK[m[2]] == RANK[parts[0]])
            if up:
                seen.add((here, m[2]))
                if (here, m[2]) not in KNOWN_UPWARD:
                    bad.append(f"{rel}:{line} imports {mod}")
    assert not bad, "imports that point up the engine's layers:\n" + "\n".join(bad)
    assert seen == KNOWN_UPWARD, f"listed as known but no longer there (drop them): {KNOWN_UPWARD - seen}"


def test_one_way_between_top_level_packages():
    """formats knows nothing of the engine or the CLI; the engine knows nothing of the commands, and
    neither prints through rich or exits through typer."""
    bad = []
    for top, banned in (("formats", ("rmqstore_cli", "commands", "rich", "typer")),
                        (os.path.join("rmqstore_cli", "engine"), ("commands", "rich", "typer", "rmqstore_cli.app"))):
        for rel, path, package in _modules(top):
            for line, mod in _imports(path, package):
                if any(mod == b or mod.startswith(b + ".") for b in banned):
                    bad.append(f"{rel}:{line} imports {mod}")
    assert not bad, "\n".join(bad)
