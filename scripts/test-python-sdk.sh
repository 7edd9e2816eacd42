#!/usr/bin/env bash
# The Python SDK against the installed wheel: builds the wheel (scripts/build-wheel.sh), installs it
# into a FRESH venv (never the repo's .venv, never editable), then from a directory outside the
# source tree, so `import cc_app_server` can only be the installed package:
#   1. pytest python/sdk_tests (real engine, real files, real threads, a real SIGINT);
#   2. examples/python/quickstart.py;
#   3. mypy --strict over the installed SDK layer, examples/python and the SDK tests
#      (python/mypy-sdk.ini; the generated uniffi glue is excluded).
# Prints `python-sdk: N passed, N failed`. CC_SDK_PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export CARGO_TERM_COLOR=never
python=${CC_SDK_PYTHON:-python3}

wheel=$(bash scripts/build-wheel.sh | tail -n 1)
echo "wheel: $wheel ($(du -h "$wheel" | cut -f1))"

venv=$repo/target/python-sdk-venv
rm -rf "$venv"
if ! "$python" -m venv "$venv" 2>/dev/null; then
  rm -rf "$venv"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
  fi
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" -r python/requirements-sdk-test.txt

run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
cd "$run"
status=0
passed=0
failed=0

"$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$repo/python/sdk_tests" "$repo/python/sdk_tests" \
  | tee "$run/pytest.log" || status=1
line=$(grep -E '^sdk-pytest: [0-9]+ passed, [0-9]+ failed' "$run/pytest.log" | tail -n 1 || true)
if [ -n "$line" ]; then
  passed=$(echo "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/')
  failed=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
else
  failed=$((failed + 1))
fi

echo "--- examples/python/quickstart.py"
if "$venv/bin/python" "$repo/examples/python/quickstart.py" "$run/quickstart-state" | tee "$run/quickstart.log" \
    && grep -q '^approve fs.write' "$run/quickstart.log" && grep -q '^turn completed$' "$run/quickstart.log"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); status=1
fi

echo "--- mypy --strict (installed SDK, examples, SDK tests)"
mypy=("$venv/bin/python" -m mypy --config-file "$repo/python/mypy-sdk.ini" --cache-dir "$run/.mypy_cache")
if "${mypy[@]}" -p cc_app_server && "${mypy[@]}" "$repo/examples/python" "$repo/python/sdk_tests"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); status=1
fi

echo
echo "python-sdk: $passed passed, $failed failed"
exit "$status"
