#!/usr/bin/env bash
# The full test command (README line 2). On a fresh Debian machine with Rust, Node 20, Python 3.11,
# JDK 17 + Maven and gcc, it installs everything else it needs itself (npm/PyPI/Maven tools, apt
# packages), builds Rust once and reuses the artifacts, and runs every suite. Exit 0 only if all pass.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

# Each step's wall time, printed as a table at the end (and on failure, up to the failing step).
timings=()
current="" started=$SECONDS t0=$SECONDS
close_step() {
  [ -n "$current" ] && timings+=("$(printf '%5d s  %s%s' $((SECONDS - started)) "$current" "${1:-}")")
  current=""
}
step() {
  close_step
  current="$*" started=$SECONDS
  printf '\n=== %s\n' "$*"
}
report() {
  local rc=$?
  [ $rc = 0 ] && close_step || close_step "  (failed, exit $rc)"
  printf '\n=== time per suite\n'
  printf '%s\n' "${timings[@]}"
  printf '%5d s  total\n' $((SECONDS - t0))
}
trap report EXIT

# A suite that needs no CPU of its own (a measurement that sleeps) or little (a few small venvs)
# runs in the background beside the next ones: `bg NAME CMD...` starts it with its output in
# target/bg-NAME.log, `join NAME TITLE` waits for it, prints that output and fails like a step.
declare -A bg_pid bg_started
bg() {
  local name=$1; shift
  "$@" >"target/bg-$name.log" 2>&1 &
  bg_pid[$name]=$! bg_started[$name]=$SECONDS
}
join() {
  local name=$1 title=$2 rc=0 waited=$SECONDS failed=""
  close_step
  printf '\n=== %s (ran in the background)\n' "$title"
  wait "${bg_pid[$name]}" || rc=$?
  cat "target/bg-$name.log"
  [ $rc = 0 ] || failed="  (failed, exit $rc)"
  timings+=("$(printf '%5d s  %s (in the background; %d s of it waited for)%s' \
    $((SECONDS - bg_started[$name])) "$title" $((SECONDS - waited)) "$failed")")
  return $rc
}

# The Swift toolchain root (minutes on a fresh machine, then cached) is set up in the background
# while Rust builds; scripts/test-swift.sh waits for it (a flock). Host apt runs here, in front,
# so it never races the other scripts' apt-get.
if [ "$(id -u)" = 0 ] && ! command -v debootstrap >/dev/null && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
mkdir -p target
bash scripts/swift-toolchain.sh >target/swift-toolchain.log 2>&1 &

step "rust: format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

step "rust: build once, then every test"
cargo test --workspace --no-run
cargo test --workspace

# The idle measurement sleeps for 30 s: it runs beside the schema, tamper and TypeScript suites
# (their load cannot wake its idle threads: a thread that is not running is never preempted).
step "idle: build the measurement"
idle_bin=$(bash scripts/test-idle.sh --build-only)
[ -x "$idle_bin" ] || { echo "the idle measurement was not built"; exit 1; }
bg idle "$idle_bin"

step "schema: generated code is fresh, v1 has no breaking change"
cargo run -q -p cc-agent-protocol -- generate --check
cargo run -q -p cc-agent-protocol -- compat --baseline schema/baselines/v1.json | tail -n 1

step "rollout: tamper matrix (sampled), unkeyed and keyed, both stores"
bash scripts/test-tamper.sh

step "typescript: tsc --strict, fixture replay"
bash scripts/test-typescript.sh
step "typescript client: the npm package packed, installed into a fresh directory, node --test against the real binary, tsc --strict"
bash scripts/test-typescript-client.sh
join idle "idle: zero wake-ups in-process (every host listener attached), at most 1/s in the stdio child, over 30 s"
step "python: mypy --strict, fixture replay"
bash scripts/test-python.sh
step "kotlin: kotlinc -Werror, fixture replay on the JVM"
bash scripts/test-kotlin.sh
step "host boundary: C ABI under valgrind, uniffi from Python, header freshness"
bash scripts/test-ffi.sh
step "swift: the package built (Swift 6, no warnings) and XCTested on Linux, the quickstart run"
bash scripts/test-swift.sh
step "python sdk: the wheel built, installed into a fresh venv, pytest + quickstart + mypy --strict against it"
bash scripts/test-python-sdk.sh
# The other Pythons (small venvs of the built wheel) run beside the published-client suite.
bg pyversions bash scripts/test-python-versions.sh
step "published clients: chainlesschain-agent-sdk 0.2.4 and 0.2.9 from PyPI against our release binary, both directions validated"
bash scripts/test-published.sh
join pyversions "python versions: the same wheel on CPython 3.10, 3.12 and 3.13 (fresh venvs): approvals, typed notifications, errors, quickstart, mypy --strict"
step "jvm: the jar (natives inside), JUnit 5 on the real library, examples and the Java facade from the jar"
bash scripts/test-jvm.sh
step "memory: an open compact server with 1,000 threads on disk and 10 loaded within 8 MiB of its host (release, median of 3)"
bash scripts/test-memory.sh
step "size: the stripped mobile library (release-mobile, no default features) within its budget; the wheel's and jar's natives"
bash scripts/test-size.sh
step "release manifest: the record of this checkout (versions, digest, commit, generator, consumers, artifact SHA-256s) checked field by field"
bash scripts/test-release-manifest.sh
step "docs: every code block of README.md and docs/{python,kotlin,swift,ffi}.md extracted and run or compiled"
bash scripts/test-docs.sh
step "fuzz: every libFuzzer target for 8 s (nightly, AddressSanitizer)"
bash scripts/test-fuzz.sh
step "soak: 60 s at 10x queue capacity, in-process and over stdio"
bash scripts/test-soak.sh

close_step
echo
echo "all suites passed"
