#!/usr/bin/env bash
# Memory soak for the engine (issue 10): 100,000 threads with one turn each (tool + approval +
# streamed answer, idempotency keys on both requests), then 100,000 more turns on 16 threads,
# through one in-process connection on a SQLite store (buffered durability: the soak measures
# memory, not fsync). Prints CSV: phase, count, RSS in KiB, loaded threads, idempotency entries,
# used nonces, seconds. CC_SOAK_THREADS=N runs a smaller soak. Figures: docs/engine.md.
set -euo pipefail
cd "$(dirname "$0")/.."
nice -n 10 cargo test --release -q -p cc-app-server --test engine_soak -- --ignored --nocapture \
  | grep -E '^(phase|start|threads|turns|store-start|store-threads),'
