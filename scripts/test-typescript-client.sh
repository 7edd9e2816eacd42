#!/usr/bin/env bash
# The Node client (`typescript/`, npm package `cc-app-server`) tested as installed, like the wheel
# and the jar:
#   1. `npm ci` of its pinned dev tools (skipped when node_modules already matches the lockfile);
#   2. the build: the generated wire module is copied from bindings/typescript/src/protocol.ts
#      (one source of wire types) and the package compiled with `tsc --strict` into dist/;
#   3. `npm pack`, and the tarball installed into a fresh temporary directory;
#   4. the `node --test` suite (typescript/test/*.test.mjs) run from there against the real
#      `cc-app-server serve` ($CARGO_TARGET_DIR/debug/cc-app-server, built if missing);
#   5. the example (typescript/examples/quickstart.ts, also docs/typescript.md's quickstart) and
#      the type tests (typescript/test/types.ts) compiled with `tsc --strict` against the
#      installed package, and the example run.
# Prints `typescript-client: N passed, N failed`; exits 1 on any failure. Needs Node >= 20 and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
pkg=$root/typescript

command -v node >/dev/null && command -v npm >/dev/null || {
  echo "test-typescript-client: node and npm (Node >= 20) are needed" >&2
  exit 1
}
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' || {
  echo "test-typescript-client: Node >= 20 is needed (found $(node --version))" >&2
  exit 1
}

target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$root/$target ;; esac
bin=$target/debug/cc-app-server
if [ ! -x "$bin" ]; then
  echo "== building $bin"
  cargo build -q -p cc-app-server-cli --bin cc-app-server
fi

passed=0
failed=0
check() { # check NAME COMMAND...: one counted check
  local name=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $name" >&2
  fi
}

work=$(mktemp -d "${TMPDIR:-/tmp}/cc-ts-client.XXXXXX")
trap 'rm -rf "$work"' EXIT

cd "$pkg"
stamp=node_modules/.cc-package-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "== npm ci (typescript/)"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
fi

echo "== build: tsc --strict (typescript/ -> dist/)"
check "the package compiles with tsc --strict" node scripts/build.mjs
check "the package's protocol module is the generated one" \
  cmp -s src/protocol.ts "$root/bindings/typescript/src/protocol.ts"

echo "== npm pack"
tarball=$(npm pack --ignore-scripts --silent --pack-destination "$work")
tarball=$work/$tarball
contents() {
  tar -tzf "$tarball" | sort | tr '\n' ' '
}
want_files="package/README.md package/dist/approvals.d.ts package/dist/approvals.js package/dist/client.d.ts package/dist/client.js package/dist/errors.d.ts package/dist/errors.js package/dist/index.d.ts package/dist/index.js package/dist/pilot.d.ts package/dist/pilot.js package/dist/protocol.d.ts package/dist/protocol.js package/package.json "
check "the tarball holds dist/ (with the generated protocol module), README.md and package.json, nothing else" \
  test "$(contents)" = "$want_files"

echo "== install the tarball into a fresh directory"
app=$work/app
mkdir -p "$app/test"
cat >"$app/package.json" <<'EOF'
{ "name": "cc-app-server-installed-test", "version": "0.0.0", "private": true, "type": "module" }
EOF
(cd "$app" && npm install --no-audit --no-fund --loglevel=error "$tarball" >/dev/null)
cp "$pkg"/test/*.mjs "$app/test/"
cp "$pkg"/examples/quickstart.ts "$pkg"/examples/tsconfig.json "$app/"
cp "$pkg"/test/types.ts "$app/types-check.ts"
# The example's compiler and Node types come from the package's dev tools.
ln -s "$pkg/node_modules/@types" "$app/node_modules/@types"
# State directories the tests and the example make go here, and go with it.
mkdir -p "$work/tmp"
export TMPDIR=$work/tmp

echo "== node --test (installed package, real server: $bin)"
tap=$work/tap.txt
set +e
(cd "$app" && CC_APP_SERVER_BIN=$bin node --test --test-concurrency=2 \
  --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=tap --test-reporter-destination="$tap" test/*.test.mjs)
suite=$?
set -e
tests_passed=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$tap" | tail -1)
tests_failed=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$tap" | tail -1)
tests_cancelled=$(sed -n 's/^# cancelled \([0-9]*\)$/\1/p' "$tap" | tail -1)
passed=$((passed + ${tests_passed:-0}))
failed=$((failed + ${tests_failed:-0} + ${tests_cancelled:-0}))
if [ "$suite" != 0 ] && [ "${tests_failed:-0}${tests_cancelled:-0}" = "00" ]; then
  echo "FAIL: node --test exited $suite" >&2
  failed=$((failed + 1))
fi

echo "== example and type tests: tsc --strict against the installed package; the example runs"
check "the example and typescript/test/types.ts compile with tsc --strict" \
  "$pkg/node_modules/.bin/tsc" --strict -p "$app/tsconfig.json"
run_example() {
  local out
  out=$(cd "$app" && CC_APP_SERVER_BIN=$bin node build/quickstart.js) || return 1
  printf '%s\n' "$out"
  [ "$out" = $'the tool was approved\ncompleted\nthe tool was approved' ]
}
check "the example runs" run_example
docs_block() { # the first ```ts block of docs/typescript.md
  awk '/^```ts$/ { on = 1; next } on && /^```$/ { exit } on { print }' "$root/docs/typescript.md"
}
check "docs/typescript.md's quickstart is the example" diff <(docs_block) "$pkg/examples/quickstart.ts"

echo "typescript-client: $passed passed, $failed failed"
[ "$failed" = 0 ]
