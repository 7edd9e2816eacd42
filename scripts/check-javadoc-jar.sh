#!/usr/bin/env bash
# Checks the KDoc jar `mvn package` wrote beside the JVM jar (kotlin/pom.xml: Dokka HTML,
# classifier javadoc), the file an IDE or a Maven repository shows as the API docs:
#  - it is a jar with an index page and a page per public SDK type and per protocol type;
#  - the KDoc text is rendered (a sentence from AppServer.kt's comment is on AppServer's page,
#    and `turn` is documented as a suspend function, not as a Java method);
#  - the uniffi glue (internal, docs/kotlin.md) has no page at all.
# Usage: scripts/check-javadoc-jar.sh [JAR] (default: target/jvm/maven/cc-app-server-<version>-javadoc.jar).
# Prints `javadoc jar: N passed, N failed`; exits 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
jar=${1:-target/jvm/maven/cc-app-server-$version-javadoc.jar}
passed=0
failed=0
check() {  # check NAME COMMAND...
  local name=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "javadoc jar: FAILED: $name" >&2
  fi
}
if [ ! -s "$jar" ]; then
  echo "javadoc jar: no $jar (kotlin/pom.xml's kdoc-jar execution did not run)" >&2
  echo "javadoc jar: 0 passed, 1 failed"
  exit 1
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
unzip -q "$jar" -d "$dir"
sdk="$dir/cc-app-server/com.chainlesschain.appserver"
proto="$dir/cc-app-server/com.chainlesschain.appserver.protocol"

check "index.html at the jar's root" test -s "$dir/index.html"
# One page per public SDK type a user meets first (Dokka's file names: kebab case, '-' prefix).
for type in app-server client server-options client-options turn-handle approval-handler \
  app-server-exception java-app-server java-client rollout-store; do
  check "SDK page for $type" test -s "$sdk/-$type/index.html"
done
for type in thread-start-params thread-start-result item-delta-event thread-list-params; do
  check "protocol page for $type" test -s "$proto/-$type/index.html"
done
# The comment is rendered, not just the signature: AppServer's KDoc opens with this sentence.
check "AppServer's KDoc text" grep -q "An in-process CC App Server over one state directory" "$sdk/-app-server/index.html"
# Kotlin signatures: Client.turn is a suspend function on its page (Dokka's Javadoc format would
# show it as a Java method taking a Continuation).
check "Client.turn shown as suspend" grep -q "suspend" "$sdk/-client/turn.html"
check "no Continuation parameter in Client.turn" bash -c '! grep -q "Continuation" "$1"' _ "$sdk/-client/turn.html"
# The glue is internal: no page, and no package list entry.
check "no page for the uniffi glue package" bash -c '! find "$1" -path "*com.chainlesschain.appserver.ffi*" | grep -q .' _ "$dir"
count=$(find "$dir" -name '*.html' | wc -l)
check "more than 500 pages (got $count)" test "$count" -gt 500

echo "javadoc jar: $passed passed, $failed failed"
[ "$failed" = 0 ]
