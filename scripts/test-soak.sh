#!/usr/bin/env bash
# The soak as the test command runs it: 60 s on the debug build the test step already made.
# CC_SOAK_ALLOW lists the issue-10 findings this soak still meets on main (docs/bench/soak.md);
# they are printed as KNOWN. Empty it once their fixes have landed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CC_SOAK_PROFILE=${CC_SOAK_PROFILE:-debug}
export CC_SOAK_ALLOW=${CC_SOAK_ALLOW-threads,slow-reader,rss,torn-line}
exec bash scripts/soak.sh "${CC_SOAK_SECONDS:-60}"
