#!/usr/bin/env bash
# The TypeScript binding's test: installs the pinned tools (`npm ci` from the committed lockfile,
# skipped when node_modules already matches it), type-checks the generated module and the replay
# harness with `tsc --strict --noEmit`, then replays every fixture under schema/fixtures/ with ajv
# and the generated codecs. Regenerates nothing: run `cargo run -q -p cc-agent-protocol -- generate`
# (or `generate --check`) for that. Needs Node 20 and npm.
set -euo pipefail
cd "$(dirname "$0")/../bindings/typescript"

command -v node >/dev/null && command -v npm >/dev/null || {
  echo "test-typescript: node and npm (Node 20) are needed" >&2
  exit 1
}

stamp=node_modules/.cc-package-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
fi

npx --no-install tsc --strict --noEmit -p tsconfig.json
rm -rf build
npx --no-install tsc -p tsconfig.json --outDir build
node build/test/replay.js
