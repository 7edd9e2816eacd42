#!/usr/bin/env bash
# The fuzz smoke the test command runs: every target for 10 s (50 s of fuzzing in all) from the
# seed corpora, on the nightly toolchain. Building the instrumented targets is extra: see
# docs/fuzzing.md for what it costs on a fresh machine. Fails on any crash, hang or invariant.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/fuzz.sh "${CC_FUZZ_SMOKE_SECONDS:-10}"
