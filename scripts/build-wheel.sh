#!/usr/bin/env bash
# Builds the `cc-app-server` wheel (python/pyproject.toml, maturin, bindings = "uniffi") into
# target/wheels and prints its path on the last line. Release profile, debug info stripped. Reuses the
# workspace target dir, so the release cdylib is the same one the benches build.
#
# The generated protocol types are copied from bindings/python/cc_agent_protocol into
# python/src/cc_app_server/protocol/ (git-ignored) right before the build: bindings/ stays the one
# checked-in copy (freshness-checked by `generate --check`), and the wheel carries exactly it.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

tools=${CC_WHEEL_TOOLS:-target/wheel-tools}
bash scripts/wheel-prep.sh "$tools"

# The pinned uniffi-bindgen, in release next to the wheel's own artifacts, on PATH: maturin takes
# it from there because no workspace package has a bin of that name (ffi/bindgen/Cargo.toml says
# why). So the workspace compiles once, in release; before, maturin's `cargo run --bin
# uniffi-bindgen` compiled the whole library a second time in debug.
bindgen=$(bash scripts/bindgen.sh --release)
mkdir -p "$tools/bindgen"
ln -sfn "$(cd "$(dirname "$bindgen")" && pwd -P)/uniffi-bindgen" "$tools/bindgen/uniffi-bindgen"

rm -f target/wheels/cc_app_server-*.whl
# `-C strip=debuginfo` applies to the final crate only (maturin hands it to `cargo rustc`), so the
# dependencies' release artifacts are shared with every other release build of the workspace.
(cd python && PATH="$PWD/../$tools/bindgen:$PATH" "../$tools/bin/maturin" build --release --out ../target/wheels -- -C strip=debuginfo >&2)
wheel=$(ls target/wheels/cc_app_server-*.whl)
echo "$wheel"
