#!/usr/bin/env bash
# Conformance against the platform's PUBLISHED clients: chainlesschain-agent-sdk 0.2.4 and 0.2.9
# from PyPI (a test dependency, installed into their own venvs; nothing of the package is in this
# repository). Drives our release binary through the whole flow (docs/wire.md, "How it is tested"):
#   - 0.2.9: the package's own AppServerClient, unchanged (scripts/published/flow_029.py);
#   - 0.2.4: a minimal client of ours (scripts/published/flow_024.py), since 0.2.4 has none;
#   - both: the package's AgentSession against `cc-app-server agent`.
# Every message in both directions is checked by that version's validate_protocol_message, every
# published object by validate_protocol_definition.
#
# Env: CC_APP_SERVER_BIN (default ${CARGO_TARGET_DIR:-target}/release/cc-app-server, built if
# absent), CC_PUBLISHED_PYTHON (interpreter for the venvs, default python3), CC_PUBLISHED_VENVS
# (default ${CARGO_TARGET_DIR:-target}/published-venvs), CC_PUBLISHED_ONLY (run only the checks
# whose name contains it), CC_PUBLISHED_TRACE=1 (print every checked message, both directions, on
# stderr). Prints `N passed, N failed` last; exits 1 if any check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$repo/$target ;; esac
python=${CC_PUBLISHED_PYTHON:-python3}
venvs=${CC_PUBLISHED_VENVS:-$target/published-venvs}
versions=(0.2.4 0.2.9)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

bin=${CC_APP_SERVER_BIN:-$target/release/cc-app-server}
# Always through cargo when no binary is named: a no-op when fresh, never a stale binary.
if [ -z "${CC_APP_SERVER_BIN:-}" ]; then
  echo "--- building $bin"
  if ! cargo build --release -p cc-app-server-cli >&2; then
    echo "FAIL build: cargo build --release -p cc-app-server-cli failed"
    failed=$((failed + 1)); finish
  fi
fi
if [ ! -x "$bin" ]; then
  echo "FAIL setup: no executable server binary at $bin"
  failed=$((failed + 1)); finish
fi
case $bin in /*) ;; *) bin=$repo/$bin ;; esac

# One venv per version, reused while it holds exactly that version.
venv_for() {
  local version=$1 venv=$venvs/sdk-$1
  if [ -x "$venv/bin/python" ] && [ "$("$venv/bin/python" -c \
      'import importlib.metadata as m; print(m.version("chainlesschain-agent-sdk"))' 2>/dev/null)" = "$version" ]; then
    echo "$venv"; return 0
  fi
  rm -rf "$venv"
  mkdir -p "$venvs"
  "$python" -m venv "$venv" >&2 || return 1
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "chainlesschain-agent-sdk==$version" >&2 || return 1
  echo "$venv"
}

for version in "${versions[@]}"; do
  echo "--- chainlesschain-agent-sdk $version"
  if ! venv=$(venv_for "$version"); then
    echo "FAIL $version setup: could not install chainlesschain-agent-sdk==$version into a venv"
    failed=$((failed + 1)); continue
  fi
  script=$repo/scripts/published/flow_${version//./}.py
  # Each check is bounded at ~30 s inside; this bounds the whole run of one version.
  log=$work/$version.log
  mkdir -p "$work/$version"
  (cd "$work/$version" && PYTHONDONTWRITEBYTECODE=1 timeout -k 10 900 "$venv/bin/python" "$script" "$bin") 2>&1 | tee "$log"
  summary=$(grep -E "^published-$version: [0-9]+ passed, [0-9]+ failed$" "$log" | tail -n 1)
  if [ -n "$summary" ]; then
    passed=$((passed + $(echo "$summary" | sed -E 's/.* ([0-9]+) passed.*/\1/')))
    failed=$((failed + $(echo "$summary" | sed -E 's/.* ([0-9]+) failed.*/\1/')))
  else
    echo "FAIL $version run: $script ended without its summary line (crashed or timed out)"
    passed=$((passed + $(grep -c '^ok ' "$log")))
    failed=$((failed + $(grep -c '^FAIL ' "$log") + 1))
  fi
done
finish
