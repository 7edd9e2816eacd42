#!/usr/bin/env bash
# Rollout crash soak: 1,000 SIGKILL cut points per store (JSONL and SQLite), each followed by a
# reopen, a full chain verification and a check that every acknowledged event survived.
# Not part of the test command (it takes minutes). Usage: scripts/rollout_crash_soak.sh [cuts]
set -euo pipefail
cd "$(dirname "$0")/.."
export ROLLOUT_CRASH_CUTS="${1:-1000}"
cargo test -p cc-app-server --release --test rollout_crash -- --nocapture --test-threads=1 2>&1 \
  | grep -E "crash test|test result|panicked|cut [0-9]+"
