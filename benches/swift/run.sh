#!/usr/bin/env bash
# The Swift SDK benchmark, one run on one release build: the Rust client's figures
# (ffi/examples/roundtrip.rs, ffi/examples/notification_rate.rs) next to the SDK's
# (benches/swift/SwiftBench, `swift build -c release` in the toolchain of scripts/swift.sh).
# Usage: bash benches/swift/run.sh [REQUESTS] [NOTIFICATIONS] [REPEAT]   (docs/bench/swift.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-10000}
# 30,000 one-character deltas stay inside the per-turn output bound (8 MiB at 256 bytes per event).
notes=${2:-30000}
repeat=${3:-5}
repo=$(pwd -P)
cargo build -q --release -p cc-app-server-ffi --lib --example roundtrip --example notification_rate
lib="$repo/target/release"
scripts/swift.sh build -c release --product SwiftBench --scratch-path "$repo/target/swift-release" \
    -Xlinker -L"$lib" -Xlinker -rpath -Xlinker "$lib" >&2
echo "# $(scripts/swift.sh --version 2>/dev/null | head -n 1)"
echo "# start: $(uptime)"
target/release/examples/roundtrip "$n"
target/release/examples/notification_rate "$notes" "$repeat"
# The bench binary runs on the host: trixie-built Swift binaries need the toolchain's runtime,
# so it runs inside the root too.
scripts/swift.sh run --skip-build -c release --scratch-path "$repo/target/swift-release" SwiftBench "$n" "$notes" "$repeat"
echo "# end: $(uptime)"
