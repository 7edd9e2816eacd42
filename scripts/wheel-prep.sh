#!/usr/bin/env bash
# What every build of the Python package needs first (scripts/build-wheel.sh, scripts/test-sdist.sh):
# `scripts/wheel-prep.sh TOOLS` makes (or reuses while python/requirements-build.txt is unchanged)
# the venv TOOLS with the pinned maturin, and copies the generated protocol types from
# bindings/python/cc_agent_protocol into python/src/cc_app_server/protocol/ (git-ignored):
# bindings/ stays the one checked-in copy, and the package carries exactly it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=${1:?usage: scripts/wheel-prep.sh TOOLS_VENV}
if [ ! -x "$tools/bin/maturin" ] || ! cmp -s python/requirements-build.txt "$tools/.requirements-build.txt"; then
  rm -rf "$tools"
  if ! python3 -m venv "$tools" 2>/dev/null; then
    rm -rf "$tools"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    fi
    python3 -m venv "$tools"
  fi
  "$tools/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-build.txt
  cp python/requirements-build.txt "$tools/.requirements-build.txt"
fi
protocol=python/src/cc_app_server/protocol
rm -rf "$protocol"
mkdir -p "$protocol"
cp bindings/python/cc_agent_protocol/__init__.py bindings/python/cc_agent_protocol/py.typed "$protocol/"
