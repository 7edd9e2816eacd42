#!/usr/bin/env bash
# Builds the pinned uniffi-bindgen (ffi/bindgen, outside the workspace, same uniffi version as the
# library) into the workspace's target dir and prints its path: `scripts/bindgen.sh [--release]`.
# Run the printed binary from the checkout (uniffi-bindgen reads the workspace's cargo metadata).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
profile=debug args=()
if [ "${1:-}" = "--release" ]; then profile=release args=(--release); fi
cargo build -q --locked "${args[@]}" --manifest-path ffi/bindgen/Cargo.toml --target-dir "$target" >&2
echo "$target/$profile/uniffi-bindgen"
