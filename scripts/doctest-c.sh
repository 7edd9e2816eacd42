#!/usr/bin/env bash
# Runs the C snippets of a doc (docs-as-tests, issue 25 item 14): every DIR/*.c that
# scripts/doctest.py extracted (one whole program per file; `<!-- doctest: append -->` pieces are
# already joined) is compiled with gcc -std=c11 -Wall -Wextra -Werror against the INSTALLED C
# library (`pkg-config --cflags --libs cc-app-server`; the prefix is
# ${CC_C_PREFIX:-${CARGO_TARGET_DIR:-target}/ffi-test/prefix}, the one scripts/test-ffi.sh
# installs, made with scripts/install-c.sh if missing) and run in a fresh temporary directory
# (exit status 0 within ${CC_DOCTEST_TIMEOUT:-120} s passes). Prints `doctest c: N passed,
# M failed` and exits non-zero on any failure.
#
# Usage: scripts/doctest-c.sh DIR
set -uo pipefail
dir=${1:?usage: scripts/doctest-c.sh DIR}
dir=$(cd "$dir" && pwd) || exit 2
cd "$(dirname "$0")/.."
target=$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)
prefix=${CC_C_PREFIX:-$target/ffi-test/prefix}
if [ ! -f "$prefix/lib/pkgconfig/cc-app-server.pc" ]; then
  bash scripts/install-c.sh --prefix "$prefix" >&2 || { echo "doctest c: 0 passed, 1 failed (install)"; exit 1; }
fi
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# shellcheck disable=SC2207 # pkg-config output is words by design
flags=($(pkg-config --cflags cc-app-server))
# shellcheck disable=SC2207
libs=($(pkg-config --libs cc-app-server) "-Wl,-rpath,$(pkg-config --variable=libdir cc-app-server)" -lpthread)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
shopt -s nullglob
for src in "$dir"/*.c; do
  name=$(basename "$src" .c)
  if ! gcc -std=c11 -Wall -Wextra -Werror "${flags[@]}" "$src" -o "$work/$name" "${libs[@]}" 2>"$work/$name.cc"; then
    echo "FAIL $src: does not compile"; sed 's/^/  /' "$work/$name.cc"
    failed=$((failed + 1)); continue
  fi
  mkdir -p "$work/run-$name"
  if (cd "$work/run-$name" && timeout "${CC_DOCTEST_TIMEOUT:-120}" "$work/$name") >"$work/$name.out" 2>&1; then
    passed=$((passed + 1))
  else
    echo "FAIL $src: exit $?"; tail -20 "$work/$name.out" | sed 's/^/  /'
    failed=$((failed + 1))
  fi
done
echo "doctest c: $passed passed, $failed failed"
[ "$failed" = 0 ]
