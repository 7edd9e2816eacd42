#!/usr/bin/env bash
# The full rollout tamper matrix: every single-byte flip of every log and anchor (every byte of
# every event column for SQLite), every line/row deleted, every adjacent pair swapped, truncation
# at every line/row, anchor damage, cross-thread transplants and recomputed-hash forgeries, in
# unkeyed and keyed mode, on both stores. Prints detected/undetected counts per class and mode
# (figures recorded in docs/rollout-format.md). Takes minutes; not part of the test command
# (scripts/test-tamper.sh runs a sample). Usage: scripts/tamper_matrix.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "python3 is required (scripts/verify_rollout.py)" >&2; exit 1; }
TAMPER_MATRIX=full nice -n 10 cargo test -q --release -p cc-app-server --test rollout_tamper_matrix \
  -- --ignored --nocapture --test-threads=2 2>&1 | grep -vE '^(running|$)'
