"""A DLedger store holding the same messages as a classic bench store (the "verify (DLedger)" row).

    python -m bench.gendledger CLASSIC_ROOT DEST

Each classic record becomes one entry (FORMAT.md appendix D): the 48-byte entry header (magic 1, size, index,
term 0, pos, channel/chainCrc/bodyCrc 0, body length) followed by the record, whose PHYSICALOFFSET field now
names where the message lies (entry pos + 48), as the broker writes it. Entries fill data files of the
classic segment size; where the next one does not fit with the 8 bytes of a blank after it, a blank ends the
file (DLedger's MmapFileList rule). Every entry gets its 32-byte index unit; the checkpoint and currterm say
the log ends at the last entry. Consume queues, index files and the store checkpoint are then written by
``rmqstore rebuild all`` (they point at the new offsets). Memory stays one scan chunk.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np

from rmqstore_cli.formats import dledger as dl
from rmqstore_cli.formats.records import MESSAGE_PREFIX_FIELDS, field_offsets

SELF_ID = "n0"
CHUNK = 1024  # records per step: the gather indexes below are 16 bytes per message byte
HEADER = dl.ENTRY_HEADER_SIZE
PHY_FIELD = field_offsets(MESSAGE_PREFIX_FIELDS)["physicalOffset"]  # 28


class _Files:
    """Fixed-size files named by their first offset, written at absolute offsets (created sparse on first use)."""

    def __init__(self, directory: str, file_size: int):
        os.makedirs(directory)
        self.directory, self.file_size = directory, file_size
        self.fds: dict[int, int] = {}

    def write(self, offset: int, data: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(data)).cast("B")
        while len(data):
            base = offset - offset % self.file_size
            n = min(len(data), base + self.file_size - offset)
            fd = self.fds.get(base)
            if fd is None:
                fd = self.fds[base] = os.open(os.path.join(self.directory, "%020d" % base), os.O_RDWR | os.O_CREAT, 0o644)
                os.ftruncate(fd, self.file_size)
            os.pwrite(fd, data[:n], offset - base)
            data, offset = data[n:], offset + n

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def _entries(buf, offs: np.ndarray, sizes: np.ndarray, pos: np.ndarray, first_index: int) -> np.ndarray:
    """The bytes of entries ``first_index``.. holding the records at ``offs`` (of ``sizes``), at absolute ``pos``."""
    u8 = np.frombuffer(buf, np.uint8)
    total = int(sizes.sum()) + HEADER * len(sizes)
    out = np.empty(total, np.uint8)
    starts = pos - pos[0]
    hdr = np.zeros(len(sizes), dl.ENTRY_HEADER_DTYPE)
    hdr["magic"], hdr["size"], hdr["pos"], hdr["bodyLength"] = dl.ENTRY_MAGIC, sizes + HEADER, pos, sizes
    hdr["index"] = np.arange(first_index, first_index + len(sizes))
    out[(starts[:, None] + np.arange(HEADER)).ravel()] = hdr.view(np.uint8)
    before = np.cumsum(sizes) - sizes
    within = np.arange(int(sizes.sum())) - np.repeat(before, sizes)
    out[np.repeat(starts + HEADER, sizes) + within] = u8[np.repeat(offs, sizes) + within]
    phy = (pos + HEADER).astype(">i8").view(np.uint8).reshape(-1, 8)
    out[(starts + HEADER + PHY_FIELD)[:, None] + np.arange(8)] = phy
    return out


def convert(classic_root: str, dest: str, file_size: int | None = None) -> dict:
    """Write the DLedger store at ``dest`` (built in ``dest.tmp``, then swapped in); returns a summary."""
    from rmqstore_cli.engine.store import Store

    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    home = os.path.join(tmp, f"dledger-{SELF_ID}")
    with Store.open(classic_root) as st:
        file_size = file_size or st.commitlog.segments.file_size
        data, units = _Files(os.path.join(home, dl.DATA_DIR), file_size), _Files(os.path.join(home, dl.INDEX_DIR),
                                                                                  dl.DEFAULT_INDEX_FILE_SIZE)
        at, n, blanks = 0, 0, 0  # write position, entries so far
        try:
            for chunk in st.commitlog.scan(check_crc=False, chunk_records=CHUNK):
                offs = chunk.headers.offsets.astype(np.int64)
                sizes = chunk.headers.totalSize.astype(np.int64)
                while len(offs):
                    in_file = at % file_size
                    ends = in_file + np.cumsum(sizes + HEADER)
                    k = int(np.searchsorted(ends + dl.BLANK_MIN_LENGTH, file_size, side="right"))
                    if k == 0:  # the rest of this file is a blank; the log goes on in the next one
                        data.write(at, np.frombuffer(dl.encode_blank(file_size - in_file), np.uint8))
                        at, blanks = at + file_size - in_file, blanks + 1
                        continue
                    pos = at + np.r_[0, ends[:k - 1] - in_file]
                    data.write(at, _entries(chunk.buf, offs[:k], sizes[:k], pos, n))
                    unit = np.zeros(k, dl.INDEX_UNIT_DTYPE)
                    unit["magic"], unit["pos"], unit["size"], unit["index"] = dl.ENTRY_MAGIC, pos, sizes[:k] + HEADER, \
                        np.arange(n, n + k)
                    units.write(n * dl.INDEX_UNIT_SIZE, unit.view(np.uint8))
                    at, n = int(ends[k - 1]) - in_file + at, n + k
                    offs, sizes = offs[k:], sizes[k:]
        finally:
            data.close()
            units.close()
    with open(os.path.join(home, dl.CHECKPOINT_FILE), "w") as f:
        f.write(dl.format_properties({"committedIndex": n - 1, "endIndex": n - 1}))
    with open(os.path.join(home, dl.CURRTERM_FILE), "w") as f:
        f.write(dl.format_properties({"voteLeader": SELF_ID, "currTerm": 0}))
    os.makedirs(os.path.join(tmp, "config"))
    # consume queues, index files and the store checkpoint, at the messages' new offsets
    subprocess.run([sys.executable, "-m", "rmqstore_cli", "rebuild", "all", tmp, "--yes"], check=True,
                   capture_output=True)
    for leftover in os.listdir(tmp):
        if "backup" in leftover:
            shutil.rmtree(os.path.join(tmp, leftover))
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    return {"entries": n, "bytes": at, "blanks": blanks, "data_file_size": file_size}


if __name__ == "__main__":
    print(convert(sys.argv[1], sys.argv[2]))
