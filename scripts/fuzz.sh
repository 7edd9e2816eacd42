#!/usr/bin/env bash
# Fuzzes every target (or the ones named) for SECONDS each, one after the other, with libFuzzer
# on the nightly toolchain; see docs/fuzzing.md. Exit 0 only if no target found a crash, a hang
# or a broken invariant. Corpora live in fuzz/corpus/<target> (seeded from schema/fixtures and
# from real state dirs on first use); findings go to fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh SECONDS [TARGET...]
#   env: CC_FUZZ_JOBS (libFuzzer -jobs, default 1), CC_FUZZ_STRICT=1 (also trip on the findings
#        already filed in issue 10), CC_FUZZ_NICE (default 15), CC_FUZZ_MAX_RUNS (-runs per target),
#        CC_FUZZ_CORPUS (corpora root, default fuzz/corpus).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_EACH=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
ALL_TARGETS=(framing validate dispatch store_open capi graph_compile sse)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL_TARGETS[@]}")
NICE=${CC_FUZZ_NICE:-15}
JOBS=${CC_FUZZ_JOBS:-1}
TRIPLE=x86_64-unknown-linux-gnu
OUT=fuzz/target/$TRIPLE/release

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz: the nightly toolchain is missing; install it with 'rustup toolchain install nightly' (libFuzzer needs -Zsanitizer and sancov)" >&2
  exit 2
fi

# The flags cargo-fuzz 0.13 passes (`cargo fuzz build`, its default release + debug assertions
# + AddressSanitizer), so `cargo fuzz run TARGET` works on the same crate; driving cargo directly
# saves installing cargo-fuzz (about 25 s) on a fresh machine.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cllvm-args=-simplifycfg-branch-fold-threshold=0 \
-Zsanitizer=address -Cllvm-args=-sanitizer-coverage-stack-depth -Cdebug-assertions -Coverflow-checks"
export ASAN_OPTIONS="detect_odr_violation=0:detect_leaks=0:allocator_may_return_null=1"
export CARGO_TERM_COLOR=never
build_start=$(date +%s)
(cd fuzz && nice -n "$NICE" cargo +nightly build --release --target "$TRIPLE" \
  --config 'profile.release.debug="line-tables-only"' $(printf -- '--bin %s ' "${TARGETS[@]}"))
echo "fuzz: build took $(( $(date +%s) - build_start )) s"
unset RUSTFLAGS

CORPUS=${CC_FUZZ_CORPUS:-fuzz/corpus}
seed() {
  local t=$1 dir=$CORPUS/$1
  mkdir -p "$dir"
  [ -n "$(ls -A "$dir" 2>/dev/null)" ] && return 0
  case $t in
    validate | dispatch | capi | framing)
      find schema/fixtures -name '*.json' -print0 | while IFS= read -r -d '' f; do
        cp "$f" "$dir/$(basename "$f" .json)-$(basename "$(dirname "$f")")"
      done
      ;;
    store_open) python3 fuzz/seed_store.py "$dir" ;;
    graph_compile)
      find schema/fixtures -path '*/definitions/graph-definition-*.json' -print0 | while IFS= read -r -d '' f; do
        cp "$f" "$dir/$(basename "$f" .json)-$(basename "$(dirname "$f")")"
      done
      ;;
    sse)
      # Header: chunk-count byte, a 2-byte line bound (little-endian), the chunk lengths; then a
      # stream (fuzz/fuzz_targets/sse.rs): a chat-completions answer, a tool call, keep-alives.
      printf '\003\000\002\005\001\007data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n' >"$dir/answer"
      printf '\002\000\001\003\011: keep-alive\n\n: keep-alive\r\n\r\nevent: x\ndata: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"run_command","arguments":"{\\"argv\\":[]}"}}]}}]}\n\n' >"$dir/tool-call"
      printf '\001\040\000\001data: %s\n\n' "$(head -c 200 /dev/zero | tr '\0' x)" >"$dir/long-line"
      ;;
  esac
}

declare -A ARGS=(
  [framing]="-max_len=4096"
  [validate]="-max_len=65536 -dict=fuzz/dict/wire.dict"
  [dispatch]="-max_len=4096 -dict=fuzz/dict/wire.dict"
  [store_open]="-max_len=65536"
  [capi]="-max_len=4096 -dict=fuzz/dict/wire.dict"
  [graph_compile]="-max_len=65536 -dict=fuzz/dict/graph.dict"
  [sse]="-max_len=4096 -dict=fuzz/dict/sse.dict"
)
status=0
summary=()
for t in "${TARGETS[@]}"; do
  seed "$t"
  mkdir -p "fuzz/artifacts/$t"
  log=fuzz/artifacts/$t/last-run.log
  echo "=== fuzz $t for ${SECONDS_EACH}s"
  extra=()
  [ -n "${CC_FUZZ_MAX_RUNS:-}" ] && extra+=(-runs="$CC_FUZZ_MAX_RUNS")
  [ "$JOBS" -gt 1 ] && extra+=(-jobs="$JOBS" -workers="$JOBS")
  set +e
  # shellcheck disable=SC2086
  nice -n "$NICE" "$OUT/$t" "$CORPUS/$t" ${ARGS[$t]} -max_total_time="$SECONDS_EACH" \
    -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$t/" "${extra[@]}" >"$log" 2>&1
  rc=$?
  set -e
  # With -jobs>1 libFuzzer writes fuzz-N.log per worker; fold them in.
  if [ "$JOBS" -gt 1 ]; then cat fuzz-*.log >>"$log" 2>/dev/null || true; rm -f fuzz-*.log; fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{s+=$2} END {print s+0}' || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | awk '{print $2}' || true)
  crashes=$(ls "fuzz/artifacts/$t" | grep -cE '^(crash|timeout|oom|leak|slow-unit)-' || true)
  if [ $rc -ne 0 ]; then
    status=1
    echo "fuzz $t: FAILED (exit $rc); the input is in fuzz/artifacts/$t/, the log in $log:"
    # The panic with its message (an assertion's left/right), the sanitizer's verdict and the
    # input as base64, so a failure on a CI machine can be replayed here from its log alone.
    awk '/panicked at/ {p=1} /^stack backtrace:/ {p=0} p' "$log" | head -n 12 || true
    grep -E 'ERROR: libFuzzer|ERROR: AddressSanitizer|SUMMARY|^Base64: ' "$log" | cut -c1-2000 | head -n 6 || true
  fi
  summary+=("$(printf '%-11s execs %-10s cov %-6s exit %-3s artifacts %s' "$t" "$execs" "${cov:-?}" "$rc" "$crashes")")
done
echo
echo "=== fuzz summary (${SECONDS_EACH}s per target, jobs $JOBS)"
printf '%s\n' "${summary[@]}"
exit $status
