"""Hostile input: topic names that are paths, crafted commitlog records, symlinks inside the store,
backup folders inside the store. Nothing may be written outside the store (or into it by a refused command).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import fuzzlib
from tests.conftest import copy_store

NAME = "4.9.3-clean"
SMALL = "5.3.3-v2topic"

BAD_TOPICS = {
    "slash": "a/b",
    "dotdot": "..",
    "dotdot-path": "../../escaped",
    "dot": ".",
    "nul": "a\x00b",
    "absolute": "/tmp/rmqstore-escaped",
    "too-long-4x": "T" * 128,
    "too-long-5x": "T" * 32768,
    "empty": "",
}


def tree(root: Path) -> dict:
    return fuzzlib.digest(root)


# a NUL or an empty string cannot travel as a command-line argument: those go through --from only
APPEND_CASES = [(c, h) for c in sorted(BAD_TOPICS) for h in ("option", "from")
                if h == "from" or ("\x00" not in BAD_TOPICS[c] and BAD_TOPICS[c])]


@pytest.mark.parametrize("case,how", APPEND_CASES)
def test_append_refuses_path_like_topics(tmp_path, case, how):
    root = copy_store(NAME if case != "too-long-5x" else SMALL, tmp_path / "s" / "store")
    topic = BAD_TOPICS[case]
    before = tree(tmp_path)
    if how == "option":
        args = ["append", "--topic", topic, "--body", "x", str(root)]
    else:
        src = tmp_path / "m.jsonl"
        src.write_text(json.dumps({"topic": topic, "queueId": 0, "bodyText": "x"}) + "\n")
        before = tree(tmp_path)
        args = ["append", "--from", str(src), str(root)]
    r = fuzzlib.run_cli(args)
    assert not fuzzlib.problems_of(r, {3}), (fuzzlib.problems_of(r, {3}), r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert tree(tmp_path) == before, "a refused append changed files"
    assert not Path("/tmp/rmqstore-escaped").exists()


# --- a commitlog crafted with a topic that is a path -----------------------------------------------

CRAFTED = {
    "dotdot": b"../../escape",
    "absolute": b"/tmp/rmqesc0",
    "slash": b"aaaaa/bbbbbb",
    "nul": b"aaaaa\x00bbbbbb"[:12],
    "dotdot-only": b"..",  # consumequeue/../0 would be the store root
}


def crafted_store(tmp_path: Path, bad: bytes) -> tuple[Path, int]:
    """A broker store plus three appended records; the middle one's topic bytes replaced by ``bad``.

    The topic is not covered by BODYCRC (and 4.x has no record CRC), so the record stays valid to the
    broker's check (§13.3): only the name is hostile.
    """
    root = copy_store(NAME, tmp_path / "box" / "store")
    placeholder = "P" * len(bad)
    for t in ("SafeTopic", placeholder, "SafeTopic"):
        r = fuzzlib.run_cli(["append", "--topic", t, "--body", "hostile", "--json", str(root)])
        assert r.exit_code == 0, r.stderr
    recs = fuzzlib.json_lines(fuzzlib.run_cli(["dump", "commitlog", "--json", "--topic", placeholder, str(root)]).stdout)
    assert len(recs) == 1
    off = recs[0]["offset"]
    size = recs[0]["storeSize"]
    seg = off - off % 65536
    path = root / "commitlog" / ("%020d" % seg)
    data = bytearray(path.read_bytes())
    rec = bytes(data[off - seg: off - seg + size])
    i = rec.index(placeholder.encode())
    data[off - seg + i: off - seg + i + len(bad)] = bad
    path.write_bytes(data)
    # the consume queue and index built by append name the placeholder; remove them so that
    # recover/rebuild have to dispatch the crafted record themselves
    import shutil

    shutil.rmtree(root / "consumequeue" / placeholder, ignore_errors=True)
    return root, off


def outside_snapshot(tmp_path: Path, root: Path) -> dict:
    """Every path under tmp_path except the store itself, plus a few absolute places an escape could reach."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(tmp_path):
        if Path(dirpath) == root or root in Path(dirpath).parents:
            continue
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            if p != root:
                out[str(p)] = p.is_dir()
    for p in ("/tmp/rmqesc0", "/tmp/consumequeue", "/escape"):
        out[p] = os.path.exists(p)
    return out


@pytest.mark.parametrize("case", sorted(CRAFTED))
@pytest.mark.parametrize("command", ["rebuild", "recover", "salvage"])
def test_crafted_topic_never_escapes(tmp_path, case, command):
    assert not os.path.exists("/tmp/rmqesc0"), "/tmp/rmqesc0 exists: an earlier run escaped the store (remove it)"
    root, off = crafted_store(tmp_path, CRAFTED[case])
    before = outside_snapshot(tmp_path, root)
    bk = tmp_path / "bk"
    if command == "rebuild":
        args = ["rebuild", "all", "--backup-dir", str(bk), "--json", str(root)]
    elif command == "recover":
        args = ["recover", "--backup-dir", str(bk), "--json", str(root)]
    else:
        args = ["salvage", "--to", str(tmp_path / "rescued"), "--json", str(root)]
    r = fuzzlib.run_cli(args)
    assert not fuzzlib.problems_of(r, {0, 1, 2}), (fuzzlib.problems_of(r, {0, 1, 2}), r.stderr[-800:])
    after = outside_snapshot(tmp_path, root)
    created = sorted(set(after) - set(before) | {p for p in before if before[p] != after.get(p)})
    allowed = {str(bk), str(tmp_path / "rescued")}
    escaped = [p for p in created if not any(p == a or p.startswith(a + "/") for a in allowed)]
    assert not escaped, f"{command} created paths outside the store: {escaped}"
    for base in [root] + ([tmp_path / "rescued"] if command == "salvage" else []):
        for dirpath, dirnames, filenames in os.walk(base):
            for n in dirnames + filenames:
                assert "escape" not in n and "rmqesc" not in n and "\x00" not in n, f"{command} created {dirpath}/{n}"
        cq = base / "consumequeue"
        if cq.is_dir():
            assert sorted(os.listdir(cq)) == sorted(d for d in os.listdir(cq) if "/" not in d and d not in (".", ".."))
    # the record is skipped with a finding of the command itself that names its offset
    # (not verify's report after the apply: that one runs in every case)
    own = [o for o in fuzzlib.json_lines(r.stdout) if o.get("type") != "verify"]
    assert str(off) in json.dumps(own), f"{command} did not report the hostile record at {off}: {r.stdout[-800:]}"


# --- symlinks inside the store ----------------------------------------------------------------------


def test_symlinked_queue_directory_is_not_written_through(tmp_path):
    root = copy_store(SMALL, tmp_path / "store")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"outside data")
    os.symlink(outside, root / "consumequeue" / "LinkTopic")
    before = tree(outside)
    r = fuzzlib.run_cli(["append", "--topic", "LinkTopic", "--body", "x", str(root)])
    assert not fuzzlib.problems_of(r, {0, 1, 2, 3}), r.stderr
    assert tree(outside) == before, "append wrote through a symlink to outside the store"


@pytest.mark.parametrize("what", ["commitlog-segment", "checkpoint", "index-dir"])
@pytest.mark.parametrize("command", ["append", "recover", "rebuild"])
def test_symlinked_store_files_are_not_written_through(tmp_path, what, command):
    root = copy_store(SMALL, tmp_path / "store")
    outside = tmp_path / "outside"
    outside.mkdir()
    if what == "commitlog-segment":
        last = sorted(os.listdir(root / "commitlog"))[-1]
        target = outside / last
        os.rename(root / "commitlog" / last, target)
        os.symlink(target, root / "commitlog" / last)
    elif what == "checkpoint":
        os.rename(root / "checkpoint", outside / "checkpoint")
        os.symlink(outside / "checkpoint", root / "checkpoint")
    else:
        os.rename(root / "index", outside / "index")
        os.symlink(outside / "index", root / "index")
    before = tree(outside)
    if command == "append":
        args = ["append", "--topic", "ShortTopic", "--queue", "1", "--body", "x", str(root)]
    elif command == "recover":
        (root / "abort").write_bytes(b"")
        args = ["recover", "--backup-dir", str(tmp_path / "bk"), str(root)]
    else:
        args = ["rebuild", "all", "--backup-dir", str(tmp_path / "bk"), str(root)]
    r = fuzzlib.run_cli(args)
    assert not fuzzlib.problems_of(r, {0, 1, 2, 3}), r.stderr
    assert tree(outside) == before, f"{command} wrote through the {what} symlink to outside the store: {r.stderr[-300:]}"


# --- backup folders inside the store ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["recover", "truncate", "rebuild"])
@pytest.mark.parametrize("where", ["inside", "inside-via-symlink", "store-itself"])
def test_backup_dir_inside_the_store_is_refused(tmp_path, command, where):
    root = copy_store(SMALL, tmp_path / "store")
    if command == "recover":
        (root / "abort").write_bytes(b"")  # give recover something to do
    if where == "inside":
        bk = root / "bk"
    elif where == "store-itself":
        bk = root
    else:
        os.symlink(root / "commitlog", tmp_path / "alias")
        bk = tmp_path / "alias" / "bk"
    last = fuzzlib.model(SMALL).clmsg[-1][0]
    args = {"recover": ["recover"], "truncate": ["truncate", "--offset", str(last)], "rebuild": ["rebuild", "all"]}[command]
    before = tree(root)
    r = fuzzlib.run_cli(args + ["--backup-dir", str(bk), str(root)])
    assert not fuzzlib.problems_of(r, {3}), (fuzzlib.problems_of(r, {3}), r.stderr)
    assert tree(root) == before


def test_salvage_target_inside_the_source_is_refused(tmp_path):
    root = copy_store(SMALL, tmp_path / "store")
    before = tree(root)
    r = fuzzlib.run_cli(["salvage", "--to", str(root / "rescued"), str(root)])
    assert not fuzzlib.problems_of(r, {3}), (fuzzlib.problems_of(r, {3}), r.stderr)
    assert tree(root) == before
