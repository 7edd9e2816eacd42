#!/usr/bin/env bash
# The Swift package on Linux, inside the toolchain root of scripts/swift-toolchain.sh (created on
# first use): the uniffi glue is fresh, everything builds under Swift 6 strict concurrency with no
# warning in our code (the SDK, the generated protocol types, tests, example, bench), the XCTest
# suites run against the real cdylib (CcAppServerTests: the SDK; ProtocolReplayTests: every shared
# fixture in both decode modes), and the quickstart of docs/swift.md runs. Prints `N passed, N failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
step() { printf '\n=== %s\n' "$*"; }
out=target/swift-test
mkdir -p "$out"

step "toolchain (Debian trixie root with swiftlang)"
bash scripts/swift-toolchain.sh >/dev/null

step "swift.sh: concurrent runs, no mount left on the host, a clear refusal without root"
root=$(bash scripts/swift-toolchain.sh)
before=$(grep -c " $root" /proc/self/mounts || true)
scripts/swift.sh --version >"$out/v1.log" 2>&1 & p1=$!
scripts/swift.sh --version >"$out/v2.log" 2>&1 & p2=$!
wrapper_status=0
wait $p1 || wrapper_status=1
wait $p2 || wrapper_status=1
grep -q "Swift version" "$out/v1.log" && grep -q "Swift version" "$out/v2.log" || wrapper_status=1
after=$(grep -c " $root" /proc/self/mounts || true)
[ "$before" = "$after" ] || { echo "mounts left on the host under $root"; wrapper_status=1; }
if command -v setpriv >/dev/null; then
    refusal=$(setpriv --reuid=65534 --regid=65534 --clear-groups bash scripts/swift.sh --version 2>&1) && wrapper_status=1
    grep -q "needs root" <<<"$refusal" || { echo "without root: $refusal"; wrapper_status=1; }
fi
echo "swift wrapper: $((1 - wrapper_status)) passed, $wrapper_status failed"
[ $wrapper_status = 0 ] || exit 1

step "cdylib and pinned uniffi-bindgen; the checked-in glue is fresh"
cargo build -q -p cc-app-server-ffi
glue_status=0
bash scripts/swift-glue.sh --check || glue_status=1
echo "swift glue: $((1 - glue_status)) passed, $glue_status failed"

lib="$(cd "${CARGO_TARGET_DIR:-target}" && pwd -P)/debug"
link=(-Xlinker -L"$lib" -Xlinker -rpath -Xlinker "$lib")
scratch="$repo/target/swift"

step "swift build (Swift 6 language mode, complete concurrency checking)"
build_status=0
scripts/swift.sh build --build-tests --scratch-path "$scratch" "${link[@]}" 2>&1 | tee "$out/build.log" \
    | grep -E "error|warning:" || true
[ "${PIPESTATUS[0]}" = 0 ] || build_status=1
# The uniffi glue (CcAppServerNative) is compiled in Swift 5 mode and is not ours to fix.
ours=$(grep -E "warning:|error:" "$out/build.log" | grep -v "/CcAppServerNative/" | sort -u || true)
if [ -n "$ours" ]; then
    echo "warnings or errors in our Swift:"
    echo "$ours"
    build_status=1
fi
echo "swift build: $((1 - build_status)) passed, $build_status failed"
[ $build_status = 0 ] || exit 1

step "XCTest: CcAppServerTests and ProtocolReplayTests"
test_status=0
scripts/swift.sh test --skip-build --scratch-path "$scratch" >"$out/test.log" 2>&1 || test_status=1
grep -E "error:|failed \(|passed, .* failed" "$out/test.log" || true
summary=$(grep -E "^\s*Executed [0-9]+ tests?, with [0-9]+ failures?" "$out/test.log" | tail -n 1 || true)
total=$(sed -E 's/.*Executed ([0-9]+) tests?.*/\1/' <<<"$summary")
failed=$(sed -E 's/.*with ([0-9]+) failures?.*/\1/' <<<"$summary")
if [ -z "$summary" ]; then
    tail -n 30 "$out/test.log"
    echo "xctest: 0 passed, 1 failed (no summary line)"
    exit 1
fi
echo "xctest: $((total - failed)) passed, $failed failed"
[ $test_status = 0 ] && [ "$failed" = 0 ] || exit 1

step "examples/swift: the quickstart of docs/swift.md"
doc_block=$(awk '/^## Quickstart/ {q=1} q && /^```swift$/ {f=1; next} f && /^```$/ {exit} f' docs/swift.md)
if [ "$doc_block" = "$(cat examples/swift/Quickstart/main.swift)" ]; then
    echo "quickstart doc block: 1 passed, 0 failed"
else
    diff <(printf '%s\n' "$doc_block") examples/swift/Quickstart/main.swift || true
    echo "quickstart doc block: 0 passed, 1 failed (docs/swift.md and examples/swift/Quickstart/main.swift differ)"
    exit 1
fi
# (Its state directory is under /tmp inside the toolchain's private namespace: gone afterwards.)
quick=$(scripts/swift.sh run --skip-build --scratch-path "$scratch" Quickstart 2>&1) || { echo "$quick"; exit 1; }
echo "$quick"
if grep -q "approve write_file" <<<"$quick" && grep -q "I wrote hello.txt." <<<"$quick" \
    && grep -q "turn completed" <<<"$quick" && grep -qx "hello.txt holds: hi" <<<"$quick"; then
    echo "quickstart: 1 passed, 0 failed"
else
    echo "quickstart: 0 passed, 1 failed"
    exit 1
fi
