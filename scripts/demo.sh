#!/usr/bin/env bash
# The README's main job: an in-process server, one scripted turn with an approval answered by the
# Rust client's handler, every notification printed, and the rollout verified (by the store and,
# when python3 is present, by scripts/verify_rollout.py). Exits non-zero if anything fails.
# Extra arguments go to `cc-app-server demo` (try --help, --decision decline, --state-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run -q -p cc-app-server-cli -- demo "$@"
