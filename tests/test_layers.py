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


# formats/ and commands/ live at the top of the repository and are installed as rmqstore_cli.formats and
# rmqstore_cli.commands (the rmqstore_cli/formats and rmqstore_cli/commands links); modules are named so here.
MAPPED = ("formats", "commands")


def canonical(dotted: str) -> str:
    return f"rmqstore_cli.{dotted}" if dotted.split(".")[0] in MAPPED else dotted


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
                package = canonical(rel[:-3].replace(os.sep, ".")).split(".")[:-1]
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
    cli = ("rmqstore_cli.commands", "rmqstore_cli.app", "rich", "typer", "commands", "formats")
    for top, banned in (("formats", ("rmqstore_cli.engine", "rmqstore_cli.spark") + cli),
                        (os.path.join("rmqstore_cli", "engine"), cli)):
        for rel, path, package in _modules(top):
            for line, mod in _imports(path, package):
                if any(mod == b or mod.startswith(b + ".") for b in banned):
                    bad.append(f"{rel}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


# --- import circles ---------------------------------------------------------------------------

CIRCLE_FREE = ("rmqstore_cli", "formats", "commands")


def import_graph(root: str, tops) -> dict[str, set[str]]:
    """{module: modules of ``tops`` it imports} under ``root``, every import counted: at the top, inside
    functions, under ``if TYPE_CHECKING``; ``from P import m`` counts P.m when m is a module, else P."""
    files = {}
    for top in tops:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for f in names:
                if f.endswith(".py"):
                    dotted = canonical(os.path.relpath(os.path.join(dirpath, f), root)[:-3].replace(os.sep, "."))
                    is_pkg = dotted.endswith(".__init__")
                    files[dotted[: -len(".__init__")] if is_pkg else dotted] = (os.path.join(dirpath, f), is_pkg)
    graph = {}
    for mod, (path, is_pkg) in files.items():
        package = mod.split(".") if is_pkg else mod.split(".")[:-1]
        out = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
                src = ".".join(p for p in (base, node.module or "") if p)
                subs = [f"{src}.{a.name}" for a in node.names if f"{src}.{a.name}" in files]
                targets = subs + ([src] if len(subs) < len(node.names) else [])
            else:
                continue
            out.update(t for t in targets if t in files and t != mod)
        graph[mod] = out
    return graph


def import_circles(root: str, tops) -> list[list[str]]:
    """Every group of modules that import one another in a circle (strongly connected, size > 1)."""
    graph = import_graph(root, tops)
    index, low, stack, on_stack, circles = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:  # Tarjan's algorithm without recursion
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_import_circles():
    circles = import_circles(ROOT, CIRCLE_FREE)
    assert not circles, "modules that import one another in a circle:\n" + "\n".join(" <-> ".join(c) for c in circles)


def _write(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_an_injected_circle_is_found(tmp_path):
    """The checker on a tiny package: clean, then with a circle through an import inside a function,
    then through ``from package import module`` and a relative import."""
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "import os\n",
                      "pkg/sub/__init__.py": "", "pkg/sub/c.py": "from ..a import x\n"})
    assert import_circles(str(tmp_path), ["pkg"]) == []
    _write(tmp_path, {"pkg/b.py": "def f():\n    from .sub import c\n    return c\n"})
    assert import_circles(str(tmp_path), ["pkg"]) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    _write(tmp_path, {"pkg/b.py": "import os\n", "pkg/d.py": "from pkg import e\n", "pkg/e.py": "from . import d\n"})
    assert import_circles(str(tmp_path), ["pkg"]) == [["pkg.d", "pkg.e"]]
