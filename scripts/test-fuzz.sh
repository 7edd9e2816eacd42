#!/usr/bin/env bash
# The fuzz smoke the test command runs: every target for 8 s (56 s of fuzzing for the 7 targets; the first 5 measured 68 s with
# seeding and start-up) from fresh seed corpora, on the nightly toolchain. Building the
# instrumented targets is extra: see docs/fuzzing.md for what it costs on a fresh machine. Fails on any crash, hang or invariant.
set -euo pipefail
cd "$(dirname "$0")/.."
# Fresh seed corpora, so the smoke costs the same wherever it runs: libFuzzer replays a whole
# corpus before its time limit applies, and a corpus grown by long runs takes minutes to replay.
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
CC_FUZZ_CORPUS=$corpus bash scripts/fuzz.sh "${CC_FUZZ_SMOKE_SECONDS:-8}"
