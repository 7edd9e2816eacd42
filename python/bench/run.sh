#!/usr/bin/env bash
# The Python SDK benchmark, one run on one release build: the Rust client's figures
# (ffi/examples/roundtrip.rs, ffi/examples/notification_rate.rs) next to the SDK's through the
# installed wheel (python/bench/bench_sdk.py). Usage: bash python/bench/run.sh [REQUESTS] [NOTIFICATIONS] [REPEAT]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-20000}
# 30,000 one-character deltas stay inside the per-turn output bound (8 MiB at 256 bytes per event).
notes=${2:-30000}
repeat=${3:-5}
wheel=$(bash scripts/build-wheel.sh | tail -n 1)
cargo build -q --release -p cc-app-server-ffi --example roundtrip --example notification_rate
venv=target/python-bench-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
"$venv/bin/python" -c 'import platform; print(f"# CPython {platform.python_version()}")'
echo "# start: $(uptime)"
target/release/examples/roundtrip "$n"
target/release/examples/notification_rate "$notes" "$repeat"
cd /tmp && "$OLDPWD/$venv/bin/python" "$OLDPWD/python/bench/bench_sdk.py" "$n" "$notes" "$repeat"
echo "# end: $(uptime)"
