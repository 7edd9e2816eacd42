#!/usr/bin/env bash
# The host boundary's tests beyond `cargo test -p cc-app-server-ffi`: builds the cdylib and the
# pinned uniffi-bindgen once (debug, in ${CARGO_TARGET_DIR:-target}), checks
# ffi/include/cc_app_server.h is what cbindgen generates now, installs the RELEASE C library with
# scripts/install-c.sh into $TARGET/ffi-test/prefix (an up-to-date release build is reused),
# compiles the C tests (ffi/tests/c/*.c) and the C example against that prefix with
# `pkg-config --cflags --libs cc-app-server` and gcc -Wall -Wextra -Werror, runs each C test under
# valgrind (--leak-check=full; any error or any definite, indirect or possible leak that
# ffi/tests/c/valgrind.supp does not name fails; it names only process-lifetime statics; the
# docs suite's scripts/doctest-c.sh reuses the prefix), generates the uniffi Python module against
# the debug cdylib and runs python/tests/test_ffi_*.py. Prints `N passed, N failed` per suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
step() { printf '\n=== %s\n' "$*"; }
# Absolute: cargo's target dir (CARGO_TARGET_DIR may be relative to here, or anywhere).
target=$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)
out=$target/ffi-test
mkdir -p "$out"

step "build the cdylib and the pinned uniffi-bindgen"
cargo build -p cc-app-server-ffi --message-format=json-render-diagnostics >"$out/build.json"
lib=$target/debug/libcc_app_server_ffi.so
bindgen=$(bash scripts/bindgen.sh)
header_out=$(python3 - "$out/build.json" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and "cc-app-server-ffi" in m["package_id"]:
        print(m["out_dir"])
PY
)

step "C header is fresh"
header_status=0
if [ -z "$header_out" ] || ! diff -u ffi/include/cc_app_server.h "$header_out/cc_app_server.h"; then
  echo "ffi/include/cc_app_server.h is stale: run CC_FFI_UPDATE_HEADER=1 cargo build -p cc-app-server-ffi and commit it"
  header_status=1
fi
echo "header: $((1 - header_status)) passed, $header_status failed"

step "install the release C library under a prefix"
prefix=$out/prefix
rm -rf "$prefix"
bash scripts/install-c.sh --prefix "$prefix"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pc_cflags=$(pkg-config --cflags cc-app-server)
pc_libs=$(pkg-config --libs cc-app-server)
pc_libdir=$(pkg-config --variable=libdir cc-app-server)

step "C tests (gcc -Wall -Wextra -Werror, against the prefix) under valgrind, and the C example"
if ! command -v valgrind >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
  fi
fi
cflags=(-std=c11 -Wall -Wextra -Werror -g)
# shellcheck disable=SC2206 # pkg-config output is words by design
pc=($pc_cflags)
# shellcheck disable=SC2206
libs=($pc_libs "-Wl,-rpath,$pc_libdir" -lpthread)
c_status=0
for test_c in ffi/tests/c/*.c; do
  name=$(basename "$test_c" .c)
  gcc "${cflags[@]}" "${pc[@]}" "$test_c" -o "$out/$name" "${libs[@]}"
  # The binary must use the installed library, not a build tree's.
  # (ldd's whole output first: with pipefail, `grep -q` closing the pipe early fails ldd.)
  linked=$(ldd "$out/$name")
  if [[ "$linked" != *"$pc_libdir/libcc_app_server.so"* ]]; then
    echo "$name does not load $pc_libdir/libcc_app_server.so"; c_status=1
  fi
  valgrind --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect,possible \
    --errors-for-leak-kinds=definite,indirect,possible --num-callers=500 \
    --suppressions=ffi/tests/c/valgrind.supp --quiet "$out/$name" || c_status=1
done
echo "c-valgrind: $((1 - c_status)) passed, $c_status failed"
gcc "${cflags[@]}" "${pc[@]}" examples/c/host.c -o "$out/c_host" "${libs[@]}"
example_dir=$(mktemp -d)
example_status=0
"$out/c_host" "$example_dir/state" >"$out/c_host.log" || example_status=1
rm -rf "$example_dir"
grep -q '"method":"turn/completed"' "$out/c_host.log" || example_status=1
grep -q '^rollout verified: ok' "$out/c_host.log" || example_status=1
echo "c-example: $((1 - example_status)) passed, $example_status failed"

step "uniffi Python module and the Python tests of the raw surface"
py_dir=$target/ffi-python
rm -rf "$py_dir" && mkdir -p "$py_dir"
"$bindgen" generate --library "$lib" --language python --out-dir "$py_dir" >/dev/null
cp "$lib" "$py_dir/"
venv=${CC_PYTHON_VENV:-.venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pytest' 2>/dev/null; then
  python3 -m venv "$venv" 2>/dev/null || {
    rm -rf "$venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    fi
    python3 -m venv "$venv"
  }
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-dev.txt
fi
py_status=0
CC_FFI_PYTHON_DIR="$py_dir" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  python/tests/test_ffi_surface.py python/tests/test_ffi_listeners.py || py_status=1

status=$((header_status | c_status | example_status | py_status))
echo
if [ "$status" = 0 ]; then echo "ffi: all suites passed"; else echo "ffi: FAILED"; fi
exit "$status"
