#!/usr/bin/env bash
# Zero idle wake-ups (issue 26; docs/engine.md, "Idle"): an in-process server with every host-side
# listener attached and a `serve` child, both idle for CC_IDLE_SECS (default 30) seconds; fails
# above 0 wake-ups in-process or 1/s in the child. Prints each thread's count and
# "idle: N passed, N failed". With --build-only, builds the measurement and prints its executable
# (scripts/test.sh runs that in the background beside other suites).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --build-only ]; then
  cargo test -q -p cc-app-server-cli --test idle --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "idle" and m.get("executable"):
        print(m["executable"])'
  exit 0
fi
cargo test -q -p cc-app-server-cli --test idle
