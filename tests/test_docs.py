"""The documentation keeps up with the product: docs/commands.md is what the CLI says, every finding
code the product can emit is in a finding table of docs/, the README stays a short tour, links
between the documents resolve, and no issue number or session history is left in them or in the code."""

from __future__ import annotations

import ast
import importlib.util
import os
import re

from .conftest import REPO

DOCS = REPO / "docs"
CODE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
FAMILIES = ("CL", "CQ", "EXT", "IDX", "CP", "SEG", "STORE", "CFG", "CO", "DO", "LOST", "DISPATCH", "DL", "TM", "RDB", "LMQ",
            "BCQ")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_commands_doc", REPO / "scripts" / "gen_commands_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_commands_md_is_what_the_cli_says():
    gen = _generator()
    text = gen.render()
    assert (DOCS / "commands.md").read_text(encoding="utf-8") == text, \
        "docs/commands.md is out of date: run python scripts/gen_commands_doc.py"
    # and it is the CLI: every command of the app, every one of its options
    from typer.main import get_command

    from rmqstore_cli.app import app

    root = get_command(app)
    for path, cmd in gen._commands(root, []):
        assert f"## rmqstore {' '.join(path)}\n" in text
        for p in cmd.params:
            if p.param_type_name == "option" and not p.hidden and p.name != "help":
                assert f"`{p.opts[0]}`" in text


def test_gen_check_fails_on_a_stale_file(tmp_path, monkeypatch):
    gen = _generator()
    stale = tmp_path / "commands.md"
    stale.write_text(gen.render().replace("## rmqstore verify", "## rmqstore verify-old"))
    monkeypatch.setattr(gen, "OUT", str(stale))
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0


def emitted_codes() -> dict[str, str]:
    """{code: file} of every finding code in the product: Finding("CODE", ...) and agg.add(group, "CODE", ...)
    calls, {"code": "CODE"} dicts, and string constants of the known code families."""
    found = {}
    for top in ("rmqstore_cli", "commands"):
        for dirpath, _, files in os.walk(REPO / top):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, REPO)
                for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                    cands = []
                    if isinstance(node, ast.Call):
                        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                        if name == "Finding" and node.args:
                            cands.append(node.args[0])
                        elif name == "add" and len(node.args) >= 2:
                            cands.append(node.args[1])
                    elif isinstance(node, ast.Dict):
                        cands += [v for k, v in zip(node.keys, node.values)
                                  if isinstance(k, ast.Constant) and k.value == "code"]
                    elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                            and CODE.match(node.value) and node.value.split("_")[0] in FAMILIES:
                        cands.append(node)
                    for c in cands:
                        if isinstance(c, ast.Constant) and isinstance(c.value, str) and CODE.match(c.value):
                            found.setdefault(c.value, rel)
    return found


def documented_codes() -> set[str]:
    """Codes in the first cell of a table row of any docs/*.md (``| `CODE` | severity | ... |``)."""
    out = set()
    for md in DOCS.glob("*.md"):
        for line in md.read_text(encoding="utf-8").splitlines():
            if line.startswith("|"):
                first = line.split("|")[1]
                out.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", first))
    return out


def test_every_finding_code_is_documented():
    codes = emitted_codes()
    assert len(codes) > 70  # the checker sees the product's codes (not an empty walk)
    missing = sorted(f"{c} ({where})" for c, where in codes.items() if c not in documented_codes())
    assert not missing, "finding codes with no row in a docs/*.md finding table:\n" + "\n".join(missing)


def test_readme_is_a_short_tour():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    first_block = text.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:] if line.strip()]
    assert commands[:2] == ["./scripts/demo.sh", "./scripts/test.sh"]
    assert "pipx install ." in text


def test_links_between_documents_resolve():
    bad = []
    for md in [REPO / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", md.read_text(encoding="utf-8")):
            path = (md.parent / target).resolve()
            if not path.exists():
                bad.append(f"{md.relative_to(REPO)} -> {target}")
    assert not bad, "\n".join(bad)


ISSUE_REF = re.compile(r"(?<![\w&])#[0-9]{1,3}\b|\b[Ii]ssue #?[0-9]+|\b(this|last|previous|first|second|third) session\b")


def test_no_issue_numbers_or_session_history():
    bad = []
    paths = [REPO / "README.md", REPO / "pyproject.toml", *DOCS.glob("*.md"), *(REPO / "scripts").iterdir()]
    for top in ("rmqstore_cli", "formats", "commands", "tests", "bench"):
        paths += [p for p in (REPO / top).rglob("*.py")]
    for p in paths:
        if p.is_file():
            for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                for m in ISSUE_REF.finditer(line):
                    if m.group(0).startswith("#") and line[:m.start()].rstrip().endswith(("&", "'", '"')):
                        continue
                    bad.append(f"{p.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not bad, "issue numbers or session history:\n" + "\n".join(bad)
