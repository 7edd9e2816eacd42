#!/usr/bin/env bash
# Installs the C ABI under a prefix: builds the RELEASE cdylib of cc-app-server-ffi (in
# ${CARGO_TARGET_DIR:-target}; an up-to-date release build is reused as cargo reuses it) and
# installs
#   PREFIX/lib/libcc_app_server.so          (the cdylib, debug info stripped; symbol names kept for backtraces and valgrind)
#   PREFIX/include/cc_app_server.h          (ffi/include/cc_app_server.h)
#   PREFIX/lib/pkgconfig/cc-app-server.pc   (pkg-config --cflags --libs cc-app-server)
# A C host then builds with
#   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cc host.c $(pkg-config --cflags --libs cc-app-server)
# and finds the library at run time through the system's search path, LD_LIBRARY_PATH, or an
# rpath (-Wl,-rpath,$(pkg-config --variable=libdir cc-app-server)). docs/ffi.md, "Install".
#
# Usage: scripts/install-c.sh --prefix DIR [--no-build]
#   --no-build  install what ${CARGO_TARGET_DIR:-target}/release already holds (fails if absent).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=""
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "install-c.sh: unknown argument $1 (usage: --prefix DIR [--no-build])" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "install-c.sh: --prefix DIR is required" >&2; exit 2; }
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
target=${CARGO_TARGET_DIR:-target}
lib="$target/release/libcc_app_server_ffi.so"

if [ "$build" = 1 ]; then
  CARGO_TERM_COLOR=never cargo build --release -p cc-app-server-ffi --lib
fi
[ -f "$lib" ] || { echo "install-c.sh: no release library at $lib (run without --no-build)" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
# Copied to a temporary name and renamed, so a host running from this prefix never maps a
# half-written library.
install -m 0755 "$lib" "$prefix/lib/.libcc_app_server.so.tmp"
if command -v strip >/dev/null; then strip --strip-debug "$prefix/lib/.libcc_app_server.so.tmp"; fi
mv -f "$prefix/lib/.libcc_app_server.so.tmp" "$prefix/lib/libcc_app_server.so"
install -m 0644 ffi/include/cc_app_server.h "$prefix/include/cc_app_server.h"
cat >"$prefix/lib/pkgconfig/cc-app-server.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: cc-app-server
Description: CC App Server C ABI (an embeddable agent app server)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -lcc_app_server
Libs.private: -lpthread -ldl -lm
EOF
size=$(du -k "$prefix/lib/libcc_app_server.so" | cut -f1)
echo "installed cc-app-server $version under $prefix (lib/libcc_app_server.so ${size} KiB, include/cc_app_server.h, lib/pkgconfig/cc-app-server.pc)"
