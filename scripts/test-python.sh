#!/usr/bin/env bash
# The Python binding's test: installs the pinned tools into .venv (`pip install -r
# python/requirements-dev.txt`, skipped when .venv already matches it), runs `mypy --strict` over
# the generated package and the replay test, then replays every fixture under schema/fixtures/ with
# jsonschema and the generated codecs (pytest). Regenerates nothing: run
# `cargo run -q -p cc-agent-protocol -- generate` (or `generate --check`) for that. Needs Python 3.10+.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${CC_PYTHON_VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian ships venv separately.
    rm -rf "$venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    fi
    python3 -m venv "$venv"
  fi
fi

stamp="$venv/.cc-requirements-dev.sha256"
want=$( (sha256sum python/requirements-dev.txt; "$venv/bin/python" --version) | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-dev.txt
  echo "$want" >"$stamp"
fi

MYPYPATH=bindings/python "$venv/bin/python" -m mypy --strict --cache-dir "$venv/.mypy_cache" \
  bindings/python/cc_agent_protocol python/tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
