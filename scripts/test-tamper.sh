#!/usr/bin/env bash
# Rollout tamper matrix, sampled (seconds): every class of damage (byte flips, line/row deletion,
# adjacent swaps, truncation, anchor damage, cross-thread transplants, forgeries with every hash
# recomputed) on both stores, unkeyed and keyed, with the independent Python verifier alongside.
# Fails if keyed mode misses anything, or unkeyed mode misses anything outside the threat model of
# docs/rollout-format.md. Prints the table. Full run: scripts/tamper_matrix.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "python3 is required (scripts/verify_rollout.py)" >&2; exit 1; }
cargo test -q -p cc-app-server --test rollout_tamper_matrix -- --ignored --nocapture 2>&1 \
  | grep -vE '^(running|$)'
