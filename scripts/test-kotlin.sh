#!/usr/bin/env bash
# Kotlin protocol replay: installs kotlinc and org.json under .tools/ (once; a no-op afterwards),
# compiles the generated bindings plus the hand-written harness with -Werror, and replays every
# shared fixture on the JVM. Exit status is the verdict.
set -euo pipefail
cd "$(dirname "$0")/.."

KOTLIN_VERSION="2.2.0"   # npm package `kotlin-compiler` ships the full JetBrains distribution
ORG_JSON_VERSION="20250517"
TOOLS="${CC_TOOLS_DIR:-$PWD/.tools}"
KOTLIN_HOME="$TOOLS/kotlin-$KOTLIN_VERSION"
ORG_JSON_JAR="$TOOLS/lib/json-$ORG_JSON_VERSION.jar"
OUT="${CC_KOTLIN_OUT:-$PWD/target/kotlin-protocol-test}"

install_kotlinc() {
  [ -x "$KOTLIN_HOME/bin/kotlinc" ] && return 0
  echo "installing kotlinc $KOTLIN_VERSION into $KOTLIN_HOME (npm registry)"
  local tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "kotlin-compiler@$KOTLIN_VERSION" >/dev/null)
  mkdir -p "$tmp/x"
  tar xzf "$tmp"/kotlin-compiler-*.tgz -C "$tmp/x"
  chmod +x "$tmp/x/package/bin/"*
  mkdir -p "$TOOLS"
  rm -rf "$KOTLIN_HOME"
  mv "$tmp/x/package" "$KOTLIN_HOME"
  rm -rf "$tmp"
}

install_org_json() {
  [ -f "$ORG_JSON_JAR" ] && return 0
  echo "fetching org.json:json:$ORG_JSON_VERSION into $TOOLS/lib (Maven Central)"
  mkdir -p "$TOOLS/lib"
  mvn -q -B dependency:copy "-Dartifact=org.json:json:$ORG_JSON_VERSION" "-DoutputDirectory=$TOOLS/lib" >/dev/null
}

install_kotlinc
install_org_json

SOURCES=(bindings/kotlin/src/main/kotlin/com/chainlesschain/appserver/protocol/*.kt kotlin/protocol-test/src/*.kt)
mkdir -p "$OUT"
JAR="$OUT/protocol-test.jar"
# Recompile only when a source changed: kotlinc is the slow part on a shared machine.
if [ ! -f "$JAR" ] || [ -n "$(find "${SOURCES[@]}" -newer "$JAR" 2>/dev/null | head -1)" ]; then
  echo "kotlinc -Werror (${#SOURCES[@]} files)"
  JAVA_OPTS="${JAVA_OPTS:--Xmx1g}" "$KOTLIN_HOME/bin/kotlinc" -Werror -jvm-target 17 \
    -cp "$ORG_JSON_JAR" -d "$JAR" "${SOURCES[@]}"
fi

java -cp "$JAR:$ORG_JSON_JAR:$KOTLIN_HOME/lib/kotlin-stdlib.jar" \
  com.chainlesschain.appserver.protocol.test.ReplayKt schema/fixtures
