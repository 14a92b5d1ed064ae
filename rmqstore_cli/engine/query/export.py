"""Commitlog records to files for one machine without Spark: Parquet, CSV, JSON Lines.

Parquet rows and schema are the Spark export's (``formats.arrow``: the same batch builder the
``rocketmq`` data source uses), written with pyarrow a chunk at a time, so memory stays one
chunk whatever the log size. JSON Lines are exactly ``dump commitlog --json``. CSV carries the
flat columns of the Parquet schema (``keys`` joined by spaces; no property map, no body).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from rmqstore_cli.formats import fast

from ..log.commitlog import RecordFilter, ScanResult
from ..errors import UsageError
from ..findings import WALK_STOP_CODES
from ..verify.pipeline import REASON_CODES

EXPORT_FORMATS = ("jsonl", "csv", "parquet")
CSV_DROPPED = ("properties", "body")


@dataclass
class ExportResult:
    path: str
    format: str
    records: int = 0
    bytes_written: int = 0
    findings: list = field(default_factory=list)  # [offset, code, message]
    scan: ScanResult = field(default_factory=ScanResult)

    def as_json(self) -> dict:
        stop = self.scan.stop
        return {"out": self.path, "format": self.format, "records": self.records, "bytes": self.bytes_written,
                "findings": [{"offset": o, "code": c, "message": m} for o, c, m in self.findings],
                "endOffset": stop.offset if stop else None, "endKind": stop.kind if stop else None}


def export_commitlog(store, path: str, fmt: str, *, body: bool = True, topic: str | None = None,
                     queue: int | None = None, start: int | None = None, end: int | None = None,
                     since: int | None = None, until: int | None = None, limit: int | None = None,
                     json_body: str = "hex", progress=None, jobs: int = 1) -> ExportResult:
    """Write the selected records of ``store`` to ``path`` (written to ``path.tmp``, fsynced, renamed); with
    ``jobs`` > 1 worker processes render whole segments (:mod:`.dumpjobs`), the file is the same."""
    if fmt not in EXPORT_FORMATS:
        raise UsageError(f"--format must be one of {', '.join(EXPORT_FORMATS)}")
    res = ExportResult(os.path.abspath(path), fmt)
    tmp = path + ".tmp"
    try:
        if fmt == "jsonl":
            _jsonl(store, tmp, res, body=json_body, topic=topic, queue=queue, start=start, end=end, since=since,
                   until=until, limit=limit, progress=progress, jobs=jobs)
        else:
            _arrow(store, tmp, res, fmt, body=body, topic=topic, queue=queue, start=start, end=end, since=since,
                   until=until, limit=limit, progress=progress, jobs=jobs)
        os.replace(tmp, path)
    except OSError as e:
        _unlink(tmp)
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        _unlink(tmp)
        raise
    res.bytes_written = os.path.getsize(path)
    return res


def _unlink(p: str) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


def _jsonl(store, tmp, res, *, body, topic, queue, start, end, since, until, limit, progress, jobs=1):
    from . import dumpjobs

    sel = RecordFilter(start=start, end=end, topic=topic, queue=queue, since=since, until=until, limit=limit)
    blocks = dumpjobs.json_pieces(store.commitlog, sel, body, jobs, res.scan)
    with open(tmp, "wb") as f:
        for data, n, walked in blocks:
            f.write(data)
            res.records += n
            if progress:
                progress(walked)
        f.flush()
        os.fsync(f.fileno())
    _note_stop(res)


def _arrow(store, tmp, res, fmt, *, body, topic, queue, start, end, since, until, limit, progress, jobs=1):
    from rmqstore_cli.formats.arrow import arrow_schema, finding_batch

    from . import dumpjobs

    cl = store.commitlog
    with_body = body and fmt == "parquet"
    schema = arrow_schema(with_body)
    sel = RecordFilter(start=start, end=end, topic=topic, queue=queue, since=since, until=until, limit=limit)
    render = _batch_render(store.root, schema, with_body)
    if jobs > 1 and dumpjobs.splits(cl):
        batches = dumpjobs.selected_pieces(cl, sel, render, lambda b, k: b.slice(0, k), jobs, check_crc=True,
                                           result=res.scan)
    else:
        batches = _batches(cl, sel, render, res.scan)
    writer = _writer(fmt, tmp, schema)
    try:
        for batch, n, walked in batches:
            if progress:
                progress(walked)
            if n:
                _write(writer, fmt, batch)
                res.records += n
        _note_stop(res)
        for off, code, msg in res.findings:
            seg = cl.segments.find(off)
            _write(writer, fmt, finding_batch(schema, store=store.root, segment=seg.name if seg else "",
                                              offset=off, code=code, message=msg))
    finally:
        writer.close()
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())


def _batch_render(root: str, schema, with_body: bool):
    """Chunk -> the record batch of its kept records (the Spark export's rows)."""
    from rmqstore_cli.formats.arrow import build_batch

    def render(chunk, idx):
        h = chunk.headers
        part = h if len(idx) == len(h) else h.select(idx)
        yield build_batch(schema, store=root, segment=chunk.segment.name, seg_start=chunk.segment.start,
                          buf=chunk.buf, u8=fast.as_u8(chunk.buf), h=part, crc_ok=np.ones(len(part), bool),
                          findings=[None] * len(part), messages=[None] * len(part), with_body=with_body), len(part)

    return render


def _batches(cl, sel, render, scan):
    """(batch, records, log bytes walked) of one walk."""
    for chunk, idx, _ in cl.selected(sel, check_crc=True, result=scan):
        walked = int(chunk.headers.totalSize.sum())
        if len(idx):
            (batch, n), = render(chunk, idx)
            yield batch, n, walked
        else:
            yield None, 0, walked


def _writer(fmt, path, schema):
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetWriter(path, schema)
    import pyarrow.csv as pcsv

    return pcsv.CSVWriter(path, _csv_schema(schema))


def _csv_schema(schema):
    import pyarrow as pa

    fields = []
    for f in schema:
        if f.name in CSV_DROPPED:
            continue
        fields.append(pa.field(f.name, pa.string()) if f.name == "keys" else f)
    return pa.schema(fields)


def _write(writer, fmt, batch) -> None:
    if fmt == "parquet":
        writer.write_batch(batch)
        return
    import pyarrow as pa
    import pyarrow.compute as pc

    cols, names = [], []
    for f in batch.schema:
        if f.name in CSV_DROPPED:
            continue
        col = batch.column(f.name)
        if f.name == "keys":
            col = pc.binary_join(col, " ")
        cols.append(col)
        names.append(f.name)
    writer.write_batch(pa.RecordBatch.from_arrays(cols, names=names))


def _note_stop(res: ExportResult) -> None:
    """The log does not simply end: say where, with verify's finding code (as Spark's export does)."""
    stop = res.scan.stop
    if stop is None or stop.clean:
        return
    if stop.kind == fast.STOP_INVALID:
        code = REASON_CODES.get(stop.reason, "CL_GARBAGE")
        msg = fast.REASON_TEXT.get(stop.reason, "invalid record")
    else:
        code, msg = WALK_STOP_CODES.get(stop.kind, ("CL_GARBAGE", stop.kind))
    res.findings.append([stop.offset, code, f"{msg}; the broker stops reading here"])
