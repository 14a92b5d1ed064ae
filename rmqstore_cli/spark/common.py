"""What the distributed jobs share: the reader of the ``rocketmq`` data source, the Parquet codecs and
output paths of the exports, the rows findings are written as, and the size of a store's log."""

from __future__ import annotations

import os

from rmqstore_cli.engine.errors import UsageError

EXPORT_FORMATS = ("parquet", "json")


def read_records(spark, roots: list[str], *, body: bool = True, mode: str = "permissive", options: dict | None = None):
    reader = spark.read.format("rocketmq").option("body", str(body).lower()).option("mode", mode)
    for k, v in (options or {}).items():
        if v is not None:
            reader = reader.option(k, str(v))
    return reader.load(",".join(roots))


# Parquet codecs of both writers: our name -> pyarrow's name; SPARK_CODECS where Spark's differs (Spark's
# "lz4" is Hadoop's framed LZ4; Arrow's "lz4" writes LZ4_RAW, which Spark calls "lz4_raw").
CODECS = {"snappy": "snappy", "zstd": "zstd", "gzip": "gzip", "lz4": "lz4", "none": "none"}
SPARK_CODECS = {"lz4": "lz4_raw"}
DEFAULT_CODEC = "snappy"  # Spark's own default (spark.sql.parquet.compression.codec): same files, same size


def is_local_path(path: str) -> bool:
    """A path Arrow's local file system can write (no ``scheme://`` other than ``file:``)."""
    return "://" not in path or path.startswith("file:")


def local_path(path: str) -> str:
    for prefix in ("file://", "file:"):
        if path.startswith(prefix):
            path = path[len(prefix):]
            break
    return os.path.abspath(os.path.expanduser(path))


def finding_rows(roots: list[str], results: list) -> list[dict]:
    """Findings as the rows ``--json`` prints and ``--out`` writes."""
    rows = []
    for st_root, res in zip(roots, results):
        for f in res.findings:
            d = f.as_json()
            rows.append({"store": os.path.abspath(st_root), "code": d.pop("code"), "severity": d.pop("severity"),
                         "path": d.pop("path"), "offset": d.pop("offset"), "message": d.pop("message"),
                         "phyOffset": d.pop("phyOffset", None), "count": d.pop("count", None),
                         "extra": {k: str(v) for k, v in d.items()}})
    return rows


FINDINGS_DDL = ("store string, code string, severity string, path string, offset bigint, message string, "
                "phyOffset bigint, count bigint, extra map<string,string>")


def _write_findings(spark, rows: list[dict], out: str, fmt: str) -> None:
    if fmt not in EXPORT_FORMATS:
        raise UsageError(f"--out-format must be one of {', '.join(EXPORT_FORMATS)}")
    df = spark.createDataFrame([tuple(r[k] for k in ("store", "code", "severity", "path", "offset", "message",
                                                     "phyOffset", "count", "extra")) for r in rows], FINDINGS_DDL)
    getattr(df.coalesce(1).write.mode("overwrite"), fmt)(out)


def commitlog_bytes(root: str) -> int:
    """Bytes of the commitlog files (of a DLedger store: its data files)."""
    return sum(commitlog_file_sizes(root))


def commitlog_file_sizes(root: str) -> list[int]:
    """The size of each commitlog file (of a DLedger store: each data file)."""
    import glob

    dirs = [os.path.join(root, "commitlog")] + sorted(glob.glob(os.path.join(root, "dledger-*", "data")))
    for d in dirs:
        try:
            sizes = [os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.isdigit()]
        except OSError:
            continue
        if sum(sizes):
            return sizes
    return []
