#!/usr/bin/env bash
# Builds the JVM jar target/jvm/maven/cc-app-server-<version>.jar: the release cdylib (the release
# profile the Python wheel uses too, plus the `jni` feature, which recompiles only the ffi crate),
# stripped and placed at JNA's resource path (linux-x86-64/), the uniffi Kotlin glue generated
# into target/jvm/uniffi-kotlin (never checked in) by the pinned uniffi-bindgen, then
# `mvn verify` (kotlinc with allWarningsAsErrors, javac -Werror, JUnit 5 against the real library).
# `mvn` also writes the KDoc jar (Dokka HTML, classifier javadoc; scripts/check-javadoc-jar.sh).
# Also copies the runtime dependencies to target/jvm/deps for a plain `java -cp` run.
# Set CC_JVM_SKIP_TESTS=1 to package without running the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
out=target/jvm  # the JVM build's own files (kotlin/pom.xml reads them here)
cargo_out=${CARGO_TARGET_DIR:-target}  # cargo's artifacts, wherever the caller keeps them
mkdir -p "$out"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
pom_version=$(sed -n 's:^  <version>\(.*\)</version>:\1:p' kotlin/pom.xml | head -1)
if [ "$version" != "$pom_version" ]; then
  echo "kotlin/pom.xml version $pom_version differs from the cargo workspace version $version; make them equal" >&2
  exit 1
fi

if ! command -v mvn >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq maven >/dev/null
  fi
fi

echo "cargo: release cdylib (with the JNI hot path) and the pinned uniffi-bindgen"
# `--features jni`: the direct JNI entry points the SDK uses for requests and notifications
# (ffi/src/jni.rs, docs/bench/jvm.md). Only the ffi crate differs from the default release build.
cargo build -q -p cc-app-server-ffi --release --features jni
# The pinned bindgen (ffi/bindgen, its own small package: building it never rebuilds the library).
bindgen=$(bash scripts/bindgen.sh)
lib=$cargo_out/release/libcc_app_server_ffi.so

echo "uniffi-bindgen: Kotlin glue into $out/uniffi-kotlin"
rm -rf "$out/uniffi-kotlin"
"$bindgen" generate --no-format --library "$lib" --language kotlin \
  --out-dir "$out/uniffi-kotlin" >/dev/null
glue="$out/uniffi-kotlin/com/chainlesschain/appserver/ffi/cc_app_server.kt"
[ -f "$glue" ] || { echo "uniffi-bindgen wrote no $glue" >&2; exit 1; }

echo "natives: stripped $lib at JNA's resource path"
rm -rf "$out/natives"
mkdir -p "$out/natives/linux-x86-64"
strip --strip-unneeded -o "$out/natives/linux-x86-64/libcc_app_server_ffi.so" "$lib"

mvn_args=(-B -q -Dstyle.color=never -f kotlin/pom.xml)
[ -n "${CC_MAVEN_REPO:-}" ] && mvn_args+=("-Dmaven.repo.local=$CC_MAVEN_REPO")
goal=verify
[ "${CC_JVM_SKIP_TESTS:-0}" = 1 ] && mvn_args+=(-DskipTests)
echo "mvn $goal (kotlinc allWarningsAsErrors, JUnit 5)"
mvn "${mvn_args[@]}" "$goal"
mvn "${mvn_args[@]}" dependency:copy-dependencies -DincludeScope=runtime \
  -DoutputDirectory="$PWD/$out/deps" >/dev/null
# The sources jar an IDE attaches (SDK, generated protocol types, generated glue): built with the
# JDK's `jar` from the same three source roots kotlinc compiled.
sources_jar="$out/maven/cc-app-server-$version-sources.jar"
rm -f "$sources_jar"
jar cf "$sources_jar" -C kotlin/src/main/kotlin . -C bindings/kotlin/src/main/kotlin . -C "$out/uniffi-kotlin" .
echo "built $out/maven/cc-app-server-$version.jar, $sources_jar and the KDoc jar $out/maven/cc-app-server-$version-javadoc.jar"
