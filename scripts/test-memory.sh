#!/usr/bin/env bash
# Memory a watch can afford (issue 26; docs/engine.md, "Small devices"; docs/bench/mobile.md,
# "Memory"): a release build of the soak harness's memory check fills a state directory with
# 1,000 threads, then opens it under each ServerOptions profile in fresh processes, lists every
# thread, resumes and turns 10 of them, and fails when the compact profile's resident growth over
# the process's own baseline passes 8 MiB (median of 3 runs) or a profile breaks its bounds.
# Prints a CSV line per run and "memory: N passed, N failed". Args are passed to the harness
# (`--threads N --loaded N --runs N --budget-kib N`).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p cc-app-server-cli --example soak_memory
target=${CARGO_TARGET_DIR:-target}
"$target/release/examples/soak_memory" "$@"
