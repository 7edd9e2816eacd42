#!/usr/bin/env bash
# The full test command (README line 2). Installs what it needs, builds Rust once, runs every suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

step() { printf '\n=== %s\n' "$*"; }

step "rust: format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

step "rust: build once, then every test"
cargo test --workspace --no-run
cargo test --workspace

step "generated code is fresh"
cargo run -q -p cc-agent-protocol -- generate --check

echo
echo "all suites passed"
