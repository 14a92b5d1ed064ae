#!/usr/bin/env bash
# Set up, then run the main job on the demo store shipped in fixtures/ (a broker-written 4.9.3 store).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
STORE=fixtures/stores/4.9.3-clean
echo "== rmqstore dump store $STORE"
.venv/bin/rmqstore dump store "$STORE"
echo "== rmqstore dump commitlog $STORE --limit 5"
.venv/bin/rmqstore dump commitlog "$STORE" --limit 5
echo "== rmqstore verify $STORE"
.venv/bin/rmqstore verify "$STORE"
