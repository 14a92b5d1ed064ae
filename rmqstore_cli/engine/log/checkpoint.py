"""The ``checkpoint`` file (the broker's StoreCheckpoint, §11)."""

from __future__ import annotations

import os
import struct
from dataclasses import asdict, dataclass

from rmqstore_cli.formats.records import CHECKPOINT_FIELDS, CHECKPOINT_FILE_SIZE, struct_format

_FMT = struct.Struct(struct_format(CHECKPOINT_FIELDS))  # equal to records.CHECKPOINT (tests/test_formats_structs.py)


@dataclass
class Checkpoint:
    """The checkpoint file's fields (the broker's StoreCheckpoint); ``exists`` False when there is none."""

    physicMsgTimestamp: int = 0
    logicsMsgTimestamp: int = 0
    indexMsgTimestamp: int = 0
    masterFlushedOffset: int = 0
    confirmPhyOffset: int = 0
    exists: bool = True
    fileSize: int = CHECKPOINT_FILE_SIZE

    @property
    def min_timestamp(self) -> int:
        """getMinTimestamp: 3 s before the older of the commitlog and consume queue times."""
        return max(0, min(self.physicMsgTimestamp, self.logicsMsgTimestamp) - 3000)

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.indexMsgTimestamp)

    def as_json(self, version: int = 5) -> dict:
        d = asdict(self)
        if version < 5:
            d.pop("masterFlushedOffset")
            d.pop("confirmPhyOffset")
        d["minTimestamp"] = self.min_timestamp
        d["minTimestampIndex"] = self.min_timestamp_index
        return d

    def to_bytes(self) -> bytes:
        return _FMT.pack(self.physicMsgTimestamp, self.logicsMsgTimestamp, self.indexMsgTimestamp,
                         self.masterFlushedOffset, self.confirmPhyOffset)


def read_checkpoint(path: str) -> Checkpoint:
    if not os.path.isfile(path):
        return Checkpoint(exists=False, fileSize=0)
    with open(path, "rb") as f:
        head = f.read(_FMT.size)
    size = os.path.getsize(path)
    head = head.ljust(_FMT.size, b"\0")
    return Checkpoint(*_FMT.unpack(head), exists=True, fileSize=size)


def read_checkpoint_head(path: str, n: int = 24) -> bytes:
    """The first ``n`` bytes as stored (the broker's read-back shows the 4.x fields as ``hex24``)."""
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except FileNotFoundError:
        return b""
