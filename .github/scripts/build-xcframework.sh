#!/usr/bin/env bash
# Builds swift/CcAppServerFFI.xcframework on macOS (Xcode command line tools, rustup): the static
# library of crate cc-app-server-ffi for iOS device (arm64), the iOS simulator (arm64 + x86_64) and
# macOS (arm64 + x86_64), each slice with the uniffi header and a module map. Package.swift's
# binaryTarget points at the result. Not runnable on the project's Linux machine (no Xcode):
# .github/workflows/swift-protocol.yml runs it. docs/swift.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(uname -s)" = Darwin ] || { echo "build-xcframework.sh: needs macOS with Xcode" >&2; exit 1; }

profile=${CC_XCFRAMEWORK_PROFILE:-release-mobile}
# No `openai` (TLS stack: +2.6 MB) and no `jni` on Apple platforms; the uniffi surface is the same.
features=(--no-default-features)
targets=(aarch64-apple-ios aarch64-apple-ios-sim x86_64-apple-ios aarch64-apple-darwin x86_64-apple-darwin)
rustup target add "${targets[@]}"
for t in "${targets[@]}"; do
    cargo build -p cc-app-server-ffi --lib --profile "$profile" --target "$t" "${features[@]}"
done
lib() { echo "target/$1/$profile/libcc_app_server_ffi.a"; }

out=target/xcframework
rm -rf "$out" swift/CcAppServerFFI.xcframework
mkdir -p "$out/headers" "$out/ios-sim" "$out/macos"
cp swift/Sources/CcAppServerFFI/CcAppServerFFI.h "$out/headers/"
# The Linux module map links the cdylib by name; inside an XCFramework the static library is the link.
cat >"$out/headers/module.modulemap" <<'MAP'
module CcAppServerFFI {
    header "CcAppServerFFI.h"
    export *
}
MAP
lipo -create "$(lib aarch64-apple-ios-sim)" "$(lib x86_64-apple-ios)" -output "$out/ios-sim/libcc_app_server_ffi.a"
lipo -create "$(lib aarch64-apple-darwin)" "$(lib x86_64-apple-darwin)" -output "$out/macos/libcc_app_server_ffi.a"
xcodebuild -create-xcframework \
    -library "$(lib aarch64-apple-ios)" -headers "$out/headers" \
    -library "$out/ios-sim/libcc_app_server_ffi.a" -headers "$out/headers" \
    -library "$out/macos/libcc_app_server_ffi.a" -headers "$out/headers" \
    -output swift/CcAppServerFFI.xcframework
(cd swift && zip -qry ../target/CcAppServerFFI.xcframework.zip CcAppServerFFI.xcframework)
swift package compute-checksum target/CcAppServerFFI.xcframework.zip
