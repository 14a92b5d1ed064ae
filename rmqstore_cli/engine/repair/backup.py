"""Backup folders: every byte a repair removes or overwrites, kept with a journal to undo it.

Layout of a backup folder (never inside the store)::

    manifest.jsonl   the journal: one JSON object per step, fsynced before the step runs
    blobs/NNNNNN     saved byte ranges and whole files
    moved/<rel>      files moved out of the store (deleted, stray, or blocking files)

``restore`` plays the journal back in reverse, so the oldest copy of any byte wins and the
store gets its original bytes back exactly. A step is journaled only after its copy is on
disk, and the step itself runs after the journal line is fsynced, so a kill at any point
leaves a journal that describes at most what happened.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

from ..errors import UsageError
from ..log.mappedfile import fsync_path

MANIFEST = "manifest.jsonl"
BACKUP_SUFFIX = ".rmqstore-backup"


def default_backup_parent(root: str) -> str:
    root = os.path.abspath(root).rstrip(os.sep)
    return os.path.join(os.path.dirname(root), os.path.basename(root) + BACKUP_SUFFIX)


def _inside(child: str, parent: str) -> bool:
    child, parent = os.path.realpath(child), os.path.realpath(parent)
    return child == parent or child.startswith(parent + os.sep)


class Backup:
    """One backup folder being written (append-only journal)."""

    def __init__(self, directory: str, store_root: str):
        self.dir = os.path.abspath(directory)
        self.root = os.path.abspath(store_root)
        self.entries: list[dict] = read_manifest(self.dir) if os.path.exists(os.path.join(self.dir, MANIFEST)) else []
        self._blob = len(os.listdir(os.path.join(self.dir, "blobs"))) if os.path.isdir(os.path.join(self.dir, "blobs")) else 0

    @classmethod
    def create(cls, store_root: str, backup_dir: str | None, command: str, info: dict) -> "Backup":
        store_root = os.path.abspath(store_root)
        if backup_dir is None:
            parent = default_backup_parent(store_root)
            backup_dir = os.path.join(parent, time.strftime("%Y%m%dT%H%M%S") + f"-{command}")
            n = 1
            while os.path.exists(backup_dir):
                backup_dir = os.path.join(parent, time.strftime("%Y%m%dT%H%M%S") + f"-{command}-{n}")
                n += 1
        if _inside(backup_dir, store_root):
            raise UsageError(f"backup folder {backup_dir} is inside the store; choose one outside it")
        if os.path.exists(os.path.join(backup_dir, MANIFEST)):
            raise UsageError(f"{backup_dir} already holds a backup; choose a new folder")
        os.makedirs(os.path.join(backup_dir, "blobs"), exist_ok=True)
        os.makedirs(os.path.join(backup_dir, "moved"), exist_ok=True)
        fsync_path(os.path.dirname(os.path.abspath(backup_dir)), True)
        b = cls(backup_dir, store_root)
        b.record({"op": "begin", "command": command, "store": store_root, "time": time.time(), **info})
        return b

    # --- journal --------------------------------------------------------------------

    def record(self, entry: dict) -> None:
        path = os.path.join(self.dir, MANIFEST)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if len(self.entries) == 0:
            fsync_path(self.dir, True)
        self.entries.append(entry)

    @property
    def complete(self) -> bool:
        return any(e["op"] == "complete" for e in self.entries)

    def rel(self, path: str) -> str:
        rel = os.path.relpath(os.path.abspath(path), self.root)
        if rel.startswith(".."):
            raise UsageError(f"{path} is outside the store {self.root}")
        return rel

    def _new_blob(self, data_iter) -> tuple[str, str, int]:
        name = "%06d" % self._blob
        self._blob += 1
        path = os.path.join(self.dir, "blobs", name)
        h = hashlib.sha256()
        n = 0
        with open(path, "wb") as f:
            for chunk in data_iter:
                f.write(chunk)
                h.update(chunk)
                n += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        fsync_path(os.path.join(self.dir, "blobs"), True)
        return name, h.hexdigest(), n

    # --- steps ----------------------------------------------------------------------

    def save_range(self, path: str, offset: int, length: int) -> None:
        """Copy ``length`` bytes at ``offset`` of ``path`` before they are overwritten."""

        def chunks():
            with open(path, "rb") as f:
                f.seek(offset)
                left = length
                while left > 0:
                    b = f.read(min(left, 1 << 20))
                    if not b:
                        break
                    left -= len(b)
                    yield b

        blob, sha, n = self._new_blob(chunks())
        self.record({"op": "range", "path": self.rel(path), "offset": offset, "length": n, "blob": blob, "sha256": sha})

    def save_file(self, path: str) -> None:
        """Copy a whole file (the dispatcher or checkpoint writer will change it in place)."""

        def chunks():
            with open(path, "rb") as f:
                while True:
                    b = f.read(1 << 20)
                    if not b:
                        return
                    yield b

        blob, sha, n = self._new_blob(chunks())
        self.record({"op": "file", "path": self.rel(path), "length": n, "blob": blob, "sha256": sha})

    def move(self, path: str, why: str = "") -> None:
        """Move a file or directory out of the store into ``moved/`` (never deleted)."""
        rel = self.rel(path)
        dest = os.path.join(self.dir, "moved", rel)
        if os.path.exists(dest):
            dest = dest + ".%d" % self._blob
            self._blob += 1
        self.record({"op": "move", "path": rel, "to": os.path.relpath(dest, self.dir), "why": why})
        _move(path, dest)

    def snapshot_tree(self, rel_dirs: list[str]) -> None:
        """Names of every file under these store folders, so files created later can be undone."""
        files = []
        dirs = []
        for rd in rel_dirs:
            base = os.path.join(self.root, rd)
            for dp, dn, fn in os.walk(base):
                dirs.append(os.path.relpath(dp, self.root))
                files.extend(os.path.relpath(os.path.join(dp, f), self.root) for f in fn)
        self.record({"op": "tree", "dirs": rel_dirs, "existingDirs": sorted(dirs), "files": sorted(files)})

    def mark(self, op: str, **kw) -> None:
        self.record({"op": op, **kw})


def _move(src: str, dest: str) -> None:
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    try:
        os.rename(src, dest)
    except OSError:
        # another filesystem: copy, make the copy durable, then remove the original
        if os.path.isdir(src):
            shutil.copytree(src, dest, symlinks=True)
            for dp, _, fn in os.walk(dest):
                for f in fn:
                    fsync_path(os.path.join(dp, f))
            shutil.rmtree(src)
        else:
            shutil.copy2(src, dest)
            fsync_path(dest)
            os.unlink(src)
    fsync_path(os.path.dirname(dest), True)
    fsync_path(os.path.dirname(src), True)


def read_manifest(directory: str) -> list[dict]:
    path = os.path.join(directory, MANIFEST)
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    break  # a torn last line: the step it describes never ran
    except FileNotFoundError:
        raise UsageError(f"{directory} is not an rmqstore backup folder (no {MANIFEST})") from None
    return out


def find_unfinished(store_root: str) -> str | None:
    """The newest backup folder of this store (default location) whose journal is not complete."""
    parent = default_backup_parent(store_root)
    try:
        names = sorted(os.listdir(parent), reverse=True)
    except OSError:
        return None
    for n in names:
        d = os.path.join(parent, n)
        try:
            entries = read_manifest(d)
        except UsageError:
            continue
        if entries and entries[0].get("op") == "begin" and not any(e["op"] in ("complete", "restored") for e in entries):
            return d
    return None


def undo_entries(root: str, backup_dir: str, entries: list[dict]) -> list[str]:
    """Play journal entries back in reverse; returns what was done (one line each)."""
    done = []
    for e in reversed(entries):
        op = e["op"]
        if op in ("range", "file"):
            path = os.path.join(root, e["path"])
            blob = os.path.join(backup_dir, "blobs", e["blob"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if op == "file":
                tmp_mode = os.O_RDWR | os.O_CREAT
                fd = os.open(path, tmp_mode, 0o644)
                try:
                    os.ftruncate(fd, e["length"])
                finally:
                    os.close(fd)
            with open(blob, "rb") as src, open(path, "r+b") as dst:
                dst.seek(e.get("offset", 0))
                shutil.copyfileobj(src, dst, 1 << 20)
                dst.flush()
                os.fsync(dst.fileno())
            done.append(f"restored {e['length']} bytes of {e['path']}")
        elif op == "move":
            src = os.path.join(backup_dir, e["to"])
            dest = os.path.join(root, e["path"])
            if os.path.exists(src) and not os.path.exists(dest):
                _move(src, dest)
                done.append(f"moved back {e['path']}")
        elif op == "tree":
            keep = set(e["files"])
            keep_dirs = set(e["existingDirs"])
            for rd in e["dirs"]:
                base = os.path.join(root, rd)
                for dp, dn, fn in os.walk(base, topdown=False):
                    for f in fn:
                        rel = os.path.relpath(os.path.join(dp, f), root)
                        if rel not in keep:
                            os.unlink(os.path.join(dp, f))
                            done.append(f"removed created file {rel}")
                    reld = os.path.relpath(dp, root)
                    if reld not in keep_dirs and not os.listdir(dp):
                        os.rmdir(dp)
                    fsync_path(dp, True)
        elif op == "swapped-in":
            path = os.path.join(root, e["path"])
            if os.path.isdir(path):
                shutil.rmtree(path)
                fsync_path(os.path.dirname(path), True)
                done.append(f"removed rebuilt {e['path']}")
        elif op == "created":
            path = os.path.join(root, e["path"])
            if os.path.exists(path):
                os.unlink(path)
                fsync_path(os.path.dirname(path), True)
                done.append(f"removed created file {e['path']}")
    return done


def restore(backup_dir: str, store_root: str | None = None) -> tuple[str, list[str]]:
    """Undo everything a backup folder's journal recorded; returns (store root, steps)."""
    backup_dir = os.path.abspath(backup_dir)
    entries = read_manifest(backup_dir)
    if not entries or entries[0].get("op") != "begin":
        raise UsageError(f"{backup_dir}: journal has no begin entry")
    if any(e["op"] == "restored" for e in entries):
        raise UsageError(f"{backup_dir} was already restored")
    root = os.path.abspath(store_root or entries[0]["store"])
    if not os.path.isdir(root):
        raise UsageError(f"store {root} does not exist")
    for e in entries:
        if e["op"] in ("range", "file"):
            blob = os.path.join(backup_dir, "blobs", e["blob"])
            h = hashlib.sha256()
            with open(blob, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            if h.hexdigest() != e["sha256"]:
                raise UsageError(f"backup blob {e['blob']} is damaged (sha256 differs); nothing restored")
    done = undo_entries(root, backup_dir, entries)
    b = Backup(backup_dir, root)
    b.record({"op": "restored", "time": time.time()})
    return root, done
