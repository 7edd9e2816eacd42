#!/usr/bin/env bash
# Docs as tests, the JVM runner: compiles every .kt block in DIR with kotlinc -Werror and every
# .java block with javac -Xlint:all -Werror against the built jar and its runtime deps on a plain
# class path (no -Djna.library.path), and runs each block that has a main. Blocks are extracted to
# DIR by scripts/doctest.py (`<4-digit fence line>.kt`, or the name a `doctest: file` directive
# gives, e.g. Main.java). Builds the jar (tests skipped) if target/jvm has none, and installs
# kotlinc under .tools/ (CC_TOOLS_DIR) if missing, as scripts/test-jvm.sh does.
# Usage: bash scripts/doctest-jvm.sh DIR   → `doctest jvm: N passed, M failed`
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: doctest-jvm.sh DIR}
dir=$(cd "$dir" && pwd)
out=target/jvm
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
jar=$out/maven/cc-app-server-$version.jar
if [ ! -f "$jar" ] || [ ! -d "$out/deps" ]; then
  CC_JVM_SKIP_TESTS=1 bash scripts/build-jar.sh
fi
cp="$PWD/$jar:$(find "$PWD/$out/deps" -name '*.jar' | sort | tr '\n' ':' | sed 's/:$//')"
kotlin_home="${CC_TOOLS_DIR:-$PWD/.tools}/kotlin-2.2.0"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
verdict() {  # name status
  if [ "$2" = 0 ]; then passed=$((passed + 1)); echo "ok $1"; else failed=$((failed + 1)); echo "FAILED $1"; fi
}

shopt -s nullglob
kts=("$dir"/*.kt)
if [ ${#kts[@]} -gt 0 ] && [ ! -x "$kotlin_home/bin/kotlinc" ]; then
  # The same kotlinc scripts/test-jvm.sh and test-kotlin.sh install (npm package kotlin-compiler).
  echo "installing kotlinc 2.2.0 into $kotlin_home (npm registry)"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "kotlin-compiler@2.2.0" >/dev/null)
  mkdir -p "$tmp/x" && tar xzf "$tmp"/kotlin-compiler-*.tgz -C "$tmp/x"
  chmod +x "$tmp/x/package/bin/"*
  mkdir -p "$(dirname "$kotlin_home")" && rm -rf "$kotlin_home" && mv "$tmp/x/package" "$kotlin_home"
  rm -rf "$tmp"
fi
for f in "${kts[@]}"; do
  name=$(basename "$f" .kt)
  # A file name kotlinc can make a facade class of: Doc<name>.kt → Doc<name>Kt.
  stem="Doc${name//[^A-Za-z0-9]/_}"
  mkdir -p "$work/$stem"
  cp "$f" "$work/$stem/$stem.kt"
  status=0
  JAVA_OPTS="${JAVA_OPTS:--Xmx1g}" "$kotlin_home/bin/kotlinc" -Werror -jvm-target 17 -cp "$cp" \
    -d "$work/$stem/classes" "$work/$stem/$stem.kt" >"$work/$stem/log" 2>&1 || status=$?
  if [ "$status" = 0 ] && grep -qE '^\s*(suspend\s+)?fun main\(' "$f"; then
    pkg=$(sed -n 's/^package \([A-Za-z0-9_.]*\).*/\1./p' "$f" | head -1)
    (cd "$work/$stem" && timeout 120 java -cp "$cp:classes" "${pkg}${stem}Kt") >>"$work/$stem/log" 2>&1 || status=$?
  fi
  [ "$status" = 0 ] || cat "$work/$stem/log"
  verdict "$(basename "$dir")/$name.kt" "$status"
done

for f in "$dir"/*.java; do
  name=$(basename "$f" .java)
  mkdir -p "$work/java-$name"
  status=0
  javac -Xlint:all -Werror -cp "$cp" -d "$work/java-$name/classes" "$f" >"$work/java-$name/log" 2>&1 || status=$?
  if [ "$status" = 0 ] && grep -q 'static void main(' "$f"; then
    pkg=$(sed -n 's/^package \([A-Za-z0-9_.]*\);.*/\1./p' "$f" | head -1)
    (cd "$work/java-$name" && timeout 120 java -cp "$cp:classes" "${pkg}${name}") >>"$work/java-$name/log" 2>&1 || status=$?
  fi
  [ "$status" = 0 ] || cat "$work/java-$name/log"
  verdict "$(basename "$dir")/$name.java" "$status"
done

echo "doctest jvm: $passed passed, $failed failed"
[ "$failed" = 0 ]
