#!/usr/bin/env bash
# Runs the Swift blocks of a doc, as extracted by scripts/doctest.py: scripts/doctest-swift.sh DIR.
# DIR may hold a `Package.swift` block (the manifest a user writes) and `.swift` programs. The
# manifest is built as written, with one substitution: its `.package(url: "<our repository>", …)`
# becomes `.package(path:)` of this checkout (there is no network here), reached through a link
# named like the repository so the package identity (`cc-app-server`) is the one users get. Every
# other block goes into the manifest's one executable target (a `main.swift` block is its entry
# point); the package is built inside the Swift toolchain root and that target is run. Without a
# manifest block, each program is built as the executable target of a minimal manifest.
# Prints `doctest swift: N passed, M failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
dir=$(cd "${1:?usage: scripts/doctest-swift.sh DIR}" && pwd -P)
target=${CARGO_TARGET_DIR:-target}
mkdir -p "$target"
target=$(cd "$target" && pwd -P)
work=$target/swift-doctest
bash scripts/swift-toolchain.sh >/dev/null
cargo build -q -p cc-app-server-ffi
lib="$target/debug"
link=(-Xlinker -L"$lib" -Xlinker -rpath -Xlinker "$lib")

passed=0 failed=0
run_package() {  # run_package NAME MANIFEST_TEXT PROGRAM...
    local name=$1 manifest=$2
    shift 2
    local app=$work/$name
    rm -rf "$app"
    mkdir -p "$app"
    ln -sfn "$repo" "$work/cc-app-server"
    printf '%s\n' "$manifest" | sed -E \
        "s#\\.package\\(url: \"https://github.com/chainlesschain/cc-app-server\"[^)]*\\)#.package(path: \"$work/cc-app-server\")#" \
        >"$app/Package.swift"
    local exe
    exe=$(tr '\n' ' ' <"$app/Package.swift" | grep -oE '\.executableTarget\( *name: "[^"]+"' | sed -E 's/.*"([^"]+)"/\1/' || true)
    if [ "$(wc -l <<<"$exe")" != 1 ] || [ -z "$exe" ]; then
        echo "FAIL $name: the manifest needs exactly one executableTarget"
        failed=$((failed + 1))
        return
    fi
    mkdir -p "$app/Sources/$exe"
    cp "$@" "$app/Sources/$exe/"
    local log=$app.log
    if (cd "$app" && "$repo/scripts/swift.sh" build --scratch-path "$work/scratch-$name" "${link[@]}") >"$log" 2>&1 \
        && (cd "$app" && "$repo/scripts/swift.sh" run --skip-build --scratch-path "$work/scratch-$name" "$exe") >>"$log" 2>&1; then
        passed=$((passed + 1))
    else
        echo "FAIL $name (log $log):"
        tail -n 25 "$log"
        failed=$((failed + 1))
    fi
}

programs=()
for f in "$dir"/*.swift; do
    [ -f "$f" ] && [ "$(basename "$f")" != Package.swift ] && programs+=("$f")
done
if [ -f "$dir/Package.swift" ]; then
    run_package "$(basename "$dir")" "$(cat "$dir/Package.swift")" "${programs[@]}"
else
    for f in "${programs[@]}"; do
        n=$(basename "$f" .swift)
        m='// swift-tools-version:6.0
import PackageDescription
let package = Package(name: "Doc'"$n"'", platforms: [.macOS(.v12)],
    dependencies: [.package(url: "https://github.com/chainlesschain/cc-app-server", from: "0.1.0")],
    targets: [.executableTarget(name: "Doc'"$n"'", dependencies: [.product(name: "CcAppServer", package: "cc-app-server")])])'
        cp "$f" "$work/main.swift.tmp" 2>/dev/null || { mkdir -p "$work"; cp "$f" "$work/main.swift.tmp"; }
        mv "$work/main.swift.tmp" "$work/main.swift"
        run_package "doc$n" "$m" "$work/main.swift"
    done
fi
echo "doctest swift: $passed passed, $failed failed"
[ $failed = 0 ]
