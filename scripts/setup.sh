#!/usr/bin/env bash
# Create .venv (if missing) and install rmqstore with its Spark, test and RocksDB extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[spark,test,rocksdb]' 2>&1 | grep -v "is ignored: it is neither" || true
.venv/bin/python -c "import rmqstore_cli.app, rmqstore_cli.formats, rmqstore_cli.commands"
# Compile the numba read kernels once now (cached per environment) rather than in the first command; this also
# caches numba's runtime (NRT) machine code beside them, which every record-reading start would compile (formats/numbastart.py).
# The kernels in two halves, compiled by two processes at once (~2.7 min in one on a slow 2-core host; numba's
# cache files are written atomically, so a helper both halves compile is simply written twice).
.venv/bin/python -m rmqstore_cli.formats.warmup --part 1 &
warm_writers=$!
.venv/bin/python -m rmqstore_cli.formats.warmup --part 0
wait "$warm_writers"
# Then compile the same kernels ahead of time into C extensions (formats/aotbuild.py, numba's pycc; ~2.5 min of CPU,
# in parts compiled by one process per core, at most 4):
# a start that finds it current imports no numba (~0.15 s less per command, docs/start.md). Without it (no C
# compiler, a failed build) everything runs as before through numba; RMQSTORE_AOT=0 skips building it.
# Beside it, the class-data archive of Spark's driver JVM (rmqstore_cli/spark/cdsbuild.py: a spark command's JVM then
# starts in about half the time; ~1 min, mostly the JVM's; it runs numba's cached kernels, not the ones being built).
cds_builder=
if [ "${RMQSTORE_SPARK_CDS:-1}" != "0" ]; then
  RMQSTORE_AOT=0 .venv/bin/python -m rmqstore_cli.spark.cdsbuild 2> >(grep -v "incubator modules" >&2) &
  cds_builder=$!
fi
if [ "${RMQSTORE_AOT:-1}" != "0" ]; then
  .venv/bin/python -m rmqstore_cli.formats.aotbuild \
    || echo "setup: the ahead-of-time kernels were not built; commands use numba's JIT kernels (slower start)" >&2
fi
if [ -n "$cds_builder" ]; then
  wait "$cds_builder" || echo "setup: spark commands start without the class-data archive (slower)" >&2
fi
# Byte-compile the sources: PYTHONDONTWRITEBYTECODE (set on some machines) would otherwise make every command
# start compile ~120 modules from source (0.15-0.2 s of CPU each time).
.venv/bin/python -m compileall -q -j 0 rmqstore_cli formats commands bench tests > /dev/null || true
