#!/usr/bin/env bash
# Runs the Python blocks of the docs, as extracted by scripts/doctest.py: scripts/doctest-python.sh DIR.
# Each DIR/*.py is first checked with `mypy --strict` (python/mypy-sdk.ini) against the installed
# wheel, then run with the venv's python in its own empty temporary directory (so a block that
# opens "state" gets a fresh one) with a timeout (CC_DOCTEST_TIMEOUT seconds, default 120).
# The venv is the one scripts/test-python-sdk.sh installs the wheel into (target/python-sdk-venv);
# when it is missing this builds the wheel (scripts/build-wheel.sh) and makes it.
# Prints `doctest python: N passed, M failed`; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
dir=${1:?usage: scripts/doctest-python.sh DIR}
dir=$(cd "$dir" && pwd)
limit=${CC_DOCTEST_TIMEOUT:-120}
venv=$repo/target/python-sdk-venv

if ! "$venv/bin/python" -c 'import cc_app_server, mypy' 2>/dev/null; then
  wheel=$(bash scripts/build-wheel.sh | tail -n 1)
  rm -rf "$venv"
  "${CC_SDK_PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" -r python/requirements-sdk-test.txt
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
shopt -s nullglob
for block in "$dir"/*.py; do
  name=${block#"$dir"/}
  if ! (cd "$work" && "$venv/bin/python" -m mypy --config-file "$repo/python/mypy-sdk.ini" \
        --cache-dir "$work/.mypy_cache" "$block") >"$work/mypy.log" 2>&1; then
    echo "FAIL $name: mypy --strict"
    sed 's/^/    /' "$work/mypy.log"
    failed=$((failed + 1))
    continue
  fi
  run=$(mktemp -d "$work/run.XXXXXX")
  if (cd "$run" && timeout "$limit" "$venv/bin/python" "$block") >"$work/run.log" 2>&1; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    code=$?
    if [ "$code" = 124 ]; then why="timed out after ${limit} s"; else why="exit $code"; fi
    echo "FAIL $name: $why"
    tail -n 30 "$work/run.log" | sed 's/^/    /'
    failed=$((failed + 1))
  fi
  rm -rf "$run"
done

echo "doctest python: $passed passed, $failed failed"
[ "$failed" = 0 ]
