#!/usr/bin/env bash
# Set up, then run the whole test suite: the default suite, then the Spark cluster suite.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 3
export SPARK_LOCAL_IP=127.0.0.1
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
[ $rc -ne 0 ] && exit $rc
.venv/bin/python -m pytest -q -p no:cacheprovider -m cluster "$@"
rc=$?
[ $rc -eq 5 ] && rc=0   # no cluster tests selected is not a failure
exit $rc
