#!/usr/bin/env bash
# JVM benchmark (docs/bench/jvm.md): builds the jar (scripts/build-jar.sh, tests skipped; its
# release cdylib has the `jni` feature), compiles kotlin/bench/JvmBench.kt with kotlinc and runs
# it once: every path interleaved per round.
# Usage: bash scripts/bench-jvm.sh [rounds] [requests per round] [notifications per drain]
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/jvm
cargo_out=${CARGO_TARGET_DIR:-target}  # cargo's artifacts, wherever the caller keeps them (as build-jar.sh)
# CC_BENCH_REUSE_JAR=1 skips rebuilding the jar (and the library) when only the bench changed.
[ "${CC_BENCH_REUSE_JAR:-0}" = 1 ] || CC_JVM_SKIP_TESTS=1 bash scripts/build-jar.sh
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
jar=$out/maven/cc-app-server-$version.jar

mkdir -p "$out/bench-natives"
cp "$cargo_out/release/libcc_app_server_ffi.so" "$out/bench-natives/libcc_app_server_ffi.so"

kotlin_home="${CC_TOOLS_DIR:-$PWD/.tools}/kotlin-2.2.0"
[ -x "$kotlin_home/bin/kotlinc" ] || { echo "run scripts/test-jvm.sh once first (it installs kotlinc)" >&2; exit 1; }
deps=$(find "$out/deps" -name '*.jar' | sort | tr '\n' ':' | sed 's/:$//')
"$kotlin_home/bin/kotlinc" -Werror -jvm-target 17 -cp "$jar:$deps" -d "$out/bench.jar" kotlin/bench/JvmBench.kt kotlin/bench/TypedRate.kt
# One library for both paths: JNA loads it from jna.library.path ahead of the jar's copy, and
# System.load maps the same file, so both paths drive the same build.
nice -n 10 java -Xmx2g -Djna.library.path="$out/bench-natives" -cp "$jar:$out/deps/*:$out/bench.jar" \
  com.chainlesschain.appserver.bench.JvmBenchKt "$PWD/$out/bench-natives/libcc_app_server_ffi.so" "$@"
# The typed notification rate of one long text turn (raw text vs the SDK's typed flows), from the
# jar on a plain classpath: CC_BENCH_TYPED_ROUNDS rounds (5) of CC_BENCH_TYPED_DELTAS deltas (20000).
nice -n 10 java -Xmx2g -cp "$jar:$out/deps/*:$out/bench.jar" com.chainlesschain.appserver.bench.TypedRateKt \
  "${CC_BENCH_TYPED_ROUNDS:-5}" "${CC_BENCH_TYPED_DELTAS:-20000}"
