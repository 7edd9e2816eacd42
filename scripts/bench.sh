#!/usr/bin/env bash
# The engine's speed figures (issue 14), each beside its floor and the ratio, in one release run:
#   scripts/bench.sh            all sections (~10 min on a shared 2-core VM)
#   scripts/bench.sh quick      smaller sizes (a smoke run, ~2 min)
#   scripts/bench.sh list read  named sections only (list read start turns many startup memory)
# The machine's load is printed at the start and the end: a loaded machine moves every figure,
# so compare ratios (measured side by side), not absolute times across runs.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "bench: $(date -u +%FT%TZ) on $(nproc) cores, $(uname -r)"
exec cargo bench -q -p cc-app-server --bench engine -- "$@"
