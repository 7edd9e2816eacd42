#!/usr/bin/env bash
# FFI round-trip benchmark, all paths in one run on one release build: the same request
# (thread/list, limit 1, buffered durability) through the pure-Rust client, the C ABI, and the
# uniffi surface from Python (blocking and async). Usage: bash ffi/bench/run.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-20000}
out=target/ffi-bench
mkdir -p "$out"
cargo build -q --release -p cc-app-server-ffi --lib --example roundtrip
# The bindings depend only on the library's metadata: the debug uniffi-bindgen reads the
# release cdylib fine.
bash scripts/bindgen.sh >/dev/null
rm -rf "$out/py" && mkdir -p "$out/py"
target/debug/uniffi-bindgen generate --library target/release/libcc_app_server_ffi.so --language python --out-dir "$out/py" >/dev/null
cp target/release/libcc_app_server_ffi.so "$out/py/"
gcc -O2 -std=c11 -Wall -Wextra -Werror -I ffi/include ffi/bench/bench_capi.c -o "$out/bench_capi" \
  -L target/release -lcc_app_server_ffi "-Wl,-rpath,$PWD/target/release"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
target/release/examples/roundtrip "$n"
"$out/bench_capi" "$dir/c" "$n"
python3 ffi/bench/bench_python.py "$out/py" "$n"
