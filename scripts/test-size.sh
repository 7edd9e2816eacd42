#!/usr/bin/env bash
# The mobile library's size budget (docs/bench/size.md): builds the stripped `release-mobile`
# cdylib the way the iOS and Android packages do (--no-default-features: no OpenAI kernel, no JNI;
# JSONL and SQLite stores, keyed rollouts, approvals, graph runs, the host kernel and the log
# listener are all in) and fails when it is larger than the budget. Also reports the desktop
# natives (the wheel's and the jar's) when an earlier step built them. Prints `size: N passed, N failed`.
#   CC_SIZE_BUDGET   bytes allowed (default below)
set -euo pipefail
cd "$(dirname "$0")/.."
# 4 MiB + 128 KiB: the goal was 4 MiB (4,194,304); measured 4,284,552 bytes (Rust 1.95, lld 22),
# and docs/bench/size.md says what is left above 4 MiB and why. Raise it only with a measured reason.
budget=${CC_SIZE_BUDGET:-4300800}
target=${CARGO_TARGET_DIR:-target}
ext=so; [ "$(uname -s)" = Darwin ] && ext=dylib
passed=0 failed=0
ok() { echo "ok $1"; passed=$((passed + 1)); }
bad() { echo "FAILED $1" >&2; failed=$((failed + 1)); }

# The gate itself at its edge: a file of exactly the budget passes, one byte more fails.
within() { [ "$(stat -c %s "$1")" -le "$2" ]; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
truncate -s "$budget" "$tmp/at"
truncate -s "$((budget + 1))" "$tmp/over"
if within "$tmp/at" "$budget" && ! within "$tmp/over" "$budget"; then ok "gate: $budget bytes pass, $((budget + 1)) fail"; else bad "gate edge"; fi

# The linker flags the mobile packages use (docs/bench/size.md): identical code folded (lld
# --icf=all, also the NDK's linker) and relative relocations packed (RELR here; the AAR packs them
# the Android way, Apple's chained fixups already do). In their own target directory: RUSTFLAGS
# would otherwise rebuild the workspace's other artifacts.
mobile_target=$target/size
RUSTFLAGS="-C link-arg=-Wl,--icf=all -C link-arg=-Wl,-z,pack-relative-relocs" CARGO_TARGET_DIR=$mobile_target \
  cargo build -q -p cc-app-server-ffi --lib --profile release-mobile --no-default-features
lib=$mobile_target/release-mobile/libcc_app_server_ffi.$ext
size=$(stat -c %s "$lib")
if within "$lib" "$budget"; then
  ok "mobile library: $size bytes <= $budget ($lib, stripped, release-mobile, no default features)"
else
  bad "mobile library: $size bytes > $budget ($lib): find the growth with the commands of docs/bench/size.md"
fi
# What the library must still hold: the exports a mobile host calls (a smaller file that lost one
# of them is not a win).
# It loads (the packed relocations are applied) and answers.
if python3 -c 'import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.cc_library_version.restype = ctypes.c_char_p; assert lib.cc_library_version()' "$lib"; then
  ok "loads and answers cc_library_version"
else
  bad "the mobile library does not load"
fi
nm -D --defined-only "$lib" >"$tmp/exports"
for sym in cc_server_open cc_client_request uniffi_cc_app_server_ffi_fn_constructor_appserver_open; do
  if grep -q " $sym$" "$tmp/exports"; then ok "exports $sym"; else bad "missing export $sym"; fi
done

# The desktop natives, built by the wheel and jar steps before this one (default features: the
# OpenAI kernel and its HTTP/TLS stack, the JNI hot path).
for wheel in target/wheels/cc_app_server-*.whl; do
  [ -f "$wheel" ] && python3 - "$wheel" <<'PY'
import sys, zipfile
for i in zipfile.ZipFile(sys.argv[1]).infolist():
    if i.filename.endswith((".so", ".dylib")):
        print(f"report: the wheel's {i.filename} is {i.file_size} bytes unpacked ({i.compress_size} in the wheel)")
PY
done
native=target/jvm/natives/linux-x86-64/libcc_app_server_ffi.$ext
[ -f "$native" ] && echo "report: the jar's $native is $(stat -c %s "$native") bytes"
echo "size: $passed passed, $failed failed"
[ "$failed" = 0 ]
