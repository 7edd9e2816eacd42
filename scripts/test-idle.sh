#!/usr/bin/env bash
# Zero idle wake-ups (issue 26; docs/engine.md, "Idle"): an in-process server with every host-side
# listener attached and a `serve` child, both idle for CC_IDLE_SECS (default 30) seconds; fails
# above 0 wake-ups in-process or 1/s in the child. Prints each thread's count and
# "idle: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -q -p cc-app-server-cli --test idle
