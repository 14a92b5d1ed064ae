#!/usr/bin/env bash
# Set up, then run the whole test suite: the default suite, then the Spark cluster suite.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 3
export SPARK_LOCAL_IP=127.0.0.1
# One test process per core (RMQSTORE_TEST_WORKERS to choose, 0 for one process); tests of one xdist_group
# (a session fixture too costly to build twice) stay in one worker.
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${RMQSTORE_TEST_WORKERS:-auto}" --maxprocesses 4 \
  --dist loadgroup --durations 15 "$@"
rc=$?
[ $rc -ne 0 ] && exit $rc
.venv/bin/python -m pytest -q -p no:cacheprovider -m cluster "$@"
rc=$?
[ $rc -eq 5 ] && rc=0   # no cluster tests selected is not a failure
exit $rc
