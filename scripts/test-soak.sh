#!/usr/bin/env bash
# The soak as the test command runs it: 60 s on the debug build the test step already made.
# CC_SOAK_ALLOW lists the findings this soak still meets on main (docs/bench/soak.md): after the
# issue-10 engine fixes only in-process RSS growth with the thread count remains;
# they are printed as KNOWN. Empty it once their fixes have landed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CC_SOAK_PROFILE=${CC_SOAK_PROFILE:-debug}
export CC_SOAK_ALLOW=${CC_SOAK_ALLOW-rss}
exec bash scripts/soak.sh "${CC_SOAK_SECONDS:-60}"
