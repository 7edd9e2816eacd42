#!/usr/bin/env bash
# The JVM host, tested as a user gets it: builds the jar (scripts/build-jar.sh: release cdylib
# inside, uniffi glue generated, kotlinc allWarningsAsErrors, JUnit 5 against the real library),
# then — from the built jar on a plain `java -cp jar:deps` classpath, with no -Djna.library.path —
# runs the Kotlin example (examples/kotlin), the JetBrains example (examples/jetbrains), both
# compiled with kotlinc -Werror, the Java-facade test, the error-class test and the public-API
# check (javap), and checks the KDoc jar (scripts/check-javadoc-jar.sh). Prints `jvm: N passed, N failed`
# (the JUnit tests plus the three plain-classpath runs).
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/jvm
reports=$out/maven/surefire-reports
rm -rf "$reports" "$reports-jna"

build_status=0
bash scripts/build-jar.sh || build_status=$?

junit_counts() {
  python3 - "$reports" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
tests = failed = 0
for path in glob.glob(sys.argv[1] + "/TEST-*.xml") + glob.glob(sys.argv[1] + "-jna/TEST-*.xml"):
    suite = ET.parse(path).getroot()
    t, f, e, s = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    tests += t - s
    failed += f + e
print(tests - failed, failed)
PY
}
read -r junit_passed junit_failed < <(junit_counts)
echo "junit (JNI hot path, then JNA): $junit_passed passed, $junit_failed failed"
if [ "$build_status" != 0 ] || [ "$junit_passed" = 0 ]; then
  echo "jvm: $junit_passed passed, $((junit_failed > 0 ? junit_failed : 1)) failed"
  exit 1
fi

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
jar=$out/maven/cc-app-server-$version.jar
unzip -l "$jar" >"$out/jar-listing.txt"
grep -q " linux-x86-64/libcc_app_server_ffi.so$" "$out/jar-listing.txt" || { echo "no native library in $jar" >&2; exit 1; }
# Spelled out: kotlinc does not expand `dir/*` class path entries the way java does.
cp="$jar:$(find "$out/deps" -name '*.jar' | sort | tr '\n' ':' | sed 's/:$//')"

KOTLIN_VERSION="2.2.0"  # the same kotlinc scripts/test-kotlin.sh installs (npm package kotlin-compiler)
kotlin_home="${CC_TOOLS_DIR:-$PWD/.tools}/kotlin-$KOTLIN_VERSION"
if [ ! -x "$kotlin_home/bin/kotlinc" ]; then
  echo "installing kotlinc $KOTLIN_VERSION into $kotlin_home (npm registry)"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "kotlin-compiler@$KOTLIN_VERSION" >/dev/null)
  mkdir -p "$tmp/x" && tar xzf "$tmp"/kotlin-compiler-*.tgz -C "$tmp/x"
  chmod +x "$tmp/x/package/bin/"*
  mkdir -p "$(dirname "$kotlin_home")" && rm -rf "$kotlin_home" && mv "$tmp/x/package" "$kotlin_home"
  rm -rf "$tmp"
fi

plain_passed=0
plain_failed=0
echo "example: kotlinc -Werror examples/kotlin, run from the jar"
example_jar=$out/example.jar
JAVA_OPTS="${JAVA_OPTS:--Xmx1g}" "$kotlin_home/bin/kotlinc" -Werror -jvm-target 17 -cp "$cp" \
  -d "$example_jar" examples/kotlin/Main.kt
example_state=$(mktemp -d)
example_status=0
java -cp "$cp:$example_jar" MainKt "$example_state/state" >"$out/example.log" 2>&1 || example_status=$?
rm -rf "$example_state"
cat "$out/example.log"
if [ "$example_status" = 0 ] && grep -q '^approval approved' "$out/example.log" \
  && grep -q '^rollout verified: ok' "$out/example.log"; then
  plain_passed=$((plain_passed + 1))
else
  plain_failed=$((plain_failed + 1))
fi

echo "jetbrains: kotlinc -Werror examples/jetbrains, run the simulated IDE lifecycle from the jar"
jetbrains_jar=$out/jetbrains-example.jar
JAVA_OPTS="${JAVA_OPTS:--Xmx1g}" "$kotlin_home/bin/kotlinc" -Werror -jvm-target 17 -cp "$cp" \
  -d "$jetbrains_jar" examples/jetbrains/AgentProjectService.kt examples/jetbrains/Main.kt
if java -cp "$cp:$jetbrains_jar" com.example.ccplugin.MainKt >"$out/jetbrains.log" 2>&1 \
  && grep -q '^alpha turn completed' "$out/jetbrains.log" && grep -q '^disposed: true' "$out/jetbrains.log"; then
  plain_passed=$((plain_passed + 1))
else
  plain_failed=$((plain_failed + 1))
fi
cat "$out/jetbrains.log"

echo "java facade: JavaFacadeTest.main from the jar (no JUnit, no jna.library.path)"
if java -cp "$cp:$out/maven/test-classes" com.chainlesschain.appserver.JavaFacadeTest; then
  plain_passed=$((plain_passed + 1))
else
  plain_failed=$((plain_failed + 1))
fi

echo "error classes: ErrorClassesTest.main from the jar (each class made to happen, caught from Java)"
if java -cp "$cp:$out/maven/test-classes" com.chainlesschain.appserver.ErrorClassesTest; then
  plain_passed=$((plain_passed + 1))
else
  plain_failed=$((plain_failed + 1))
fi

echo "public API: javap -public over the jar's SDK classes (no glue type), protocol names vs default imports"
m2="${CC_MAVEN_REPO:-$HOME/.m2/repository}"
reflect="$m2/org/jetbrains/kotlin/kotlin-reflect/$KOTLIN_VERSION/kotlin-reflect-$KOTLIN_VERSION.jar"
if java -Dcc.api.classes="$jar" -cp "$cp:$reflect:$out/maven/test-classes" com.chainlesschain.appserver.PublicApiTestKt; then
  plain_passed=$((plain_passed + 1))
else
  plain_failed=$((plain_failed + 1))
fi

echo "KDoc jar: scripts/check-javadoc-jar.sh (Dokka HTML beside the jar, no glue page)"
if bash scripts/check-javadoc-jar.sh "$out/maven/cc-app-server-$version-javadoc.jar"; then
  plain_passed=$((plain_passed + 1))
else
  plain_failed=$((plain_failed + 1))
fi

echo "jvm: $((junit_passed + plain_passed)) passed, $((junit_failed + plain_failed)) failed"
[ "$plain_failed" = 0 ]
