"""Writing the ``checkpoint`` file (the broker's StoreCheckpoint, FORMAT.md §11).

The broker keeps the file mapped and updates fields in memory; they reach the disk when the
consume-queue flush thread (or shutdown) forces it.  Here the values are held in memory and
written with one ``pwrite`` + ``fsync`` on ``flush``.
"""

from __future__ import annotations

import os
from dataclasses import replace

from rmqstore_cli.formats.records import CHECKPOINT_FILE_SIZE

from .checkpoint import Checkpoint, read_checkpoint


class CheckpointWriter:
    def __init__(self, root: str, journal=None):
        self.path = os.path.join(root, "checkpoint")
        if journal is not None:
            journal.snapshot_file(self.path)
        cp = read_checkpoint(self.path)
        self.values = replace(cp) if cp.exists else Checkpoint()
        self._original = self.values.to_bytes() if cp.exists else None
        self.dirty = False

    def set(self, **fields: int) -> None:
        for k, v in fields.items():
            if getattr(self.values, k) != v:
                setattr(self.values, k, v)
                self.dirty = True

    def flush(self) -> None:
        if not self.dirty and self._original is not None:
            return
        data = self.values.to_bytes()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < CHECKPOINT_FILE_SIZE:
                os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._original = data
        self.dirty = False
