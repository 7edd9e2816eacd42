#!/usr/bin/env bash
# The one built wheel (py3-none: no per-version build) on every other supported CPython
# (python/pyproject.toml: requires-python >= 3.10; 3.11 runs the full suite in
# scripts/test-python-sdk.sh). For each of CC_PYTHON_VERSIONS (default "3.10 3.12 3.13"): a fresh
# venv, the wheel and python/requirements-sdk-test.txt installed, then from outside the source
# tree the SDK suite's approval flow, typed notifications, per-turn streams and error classes
# (python/sdk_tests/test_approvals.py, test_turn_stream.py, test_errors.py), the quickstart, and
# `mypy --strict --python-version X.Y` over the installed SDK layer and the examples.
# Run after scripts/test-python-sdk.sh (it takes the wheel that built). A missing interpreter is
# a failure, not a skip (looked up on PATH, then in pyenv's versions). Prints `python-versions: N passed, N failed`.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
versions=${CC_PYTHON_VERSIONS:-3.10 3.12 3.13}
wheel=$(ls target/wheels/cc_app_server-*.whl 2>/dev/null | head -n 1)
passed=0
failed=0
fail() { echo "python-versions: FAILED: $*" >&2; failed=$((failed + 1)); }
if [ -z "$wheel" ]; then
  fail "no wheel in target/wheels (run scripts/test-python-sdk.sh or scripts/build-wheel.sh first)"
  echo "python-versions: $passed passed, $failed failed"
  exit 1
fi
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT

for v in $versions; do
  # On PATH, or installed by pyenv but not selected (its shim then refuses to run it).
  py=$(command -v "python$v" || true)
  if [ -z "$py" ] || ! "$py" -c 'import sys' 2>/dev/null; then
    py=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v" 2>/dev/null | sort -V | tail -n 1)
  fi
  if [ -z "$py" ] || ! "$py" -c 'import sys' 2>/dev/null; then
    fail "python$v: no such interpreter on PATH"
    continue
  fi
  echo "--- CPython $("$py" -c 'import platform; print(platform.python_version())') ($py)"
  venv=$repo/target/python-$v-venv
  rm -rf "$venv"
  if ! "$py" -m venv "$venv" || ! "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      "$wheel" -r python/requirements-sdk-test.txt; then
    fail "python$v: venv or install of $wheel"
    continue
  fi
  (cd "$run" && "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$repo/python/sdk_tests" \
      "$repo/python/sdk_tests/test_approvals.py" "$repo/python/sdk_tests/test_turn_stream.py" \
      "$repo/python/sdk_tests/test_errors.py") >"$run/pytest-$v.log" 2>&1
  line=$(grep -E '^sdk-pytest: [0-9]+ passed, [0-9]+ failed' "$run/pytest-$v.log" | tail -n 1 || true)
  tail -n 3 "$run/pytest-$v.log"
  if [ -n "$line" ] && echo "$line" | grep -q ' 0 failed' && ! echo "$line" | grep -q ' 0 passed'; then
    passed=$((passed + 1))
  else
    fail "python$v: pytest (${line:-no summary line})"
    cat "$run/pytest-$v.log" >&2
  fi
  if (cd "$run" && "$venv/bin/python" "$repo/examples/python/quickstart.py" "$run/quickstart-$v") >"$run/qs-$v.log" 2>&1 \
      && grep -q '^approve fs.write' "$run/qs-$v.log" && grep -q '^turn completed$' "$run/qs-$v.log"; then
    passed=$((passed + 1))
  else
    fail "python$v: quickstart"
    cat "$run/qs-$v.log" >&2
  fi
  mypy=("$venv/bin/python" -m mypy --config-file "$repo/python/mypy-sdk.ini" --python-version "$v" \
    --cache-dir "$run/.mypy-$v")
  if (cd "$run" && "${mypy[@]}" -p cc_app_server && "${mypy[@]}" "$repo/examples/python"); then
    passed=$((passed + 1))
  else
    fail "python$v: mypy --strict"
  fi
done

echo "python-versions: $passed passed, $failed failed"
[ "$failed" = 0 ]
