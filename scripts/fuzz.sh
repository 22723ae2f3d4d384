#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS each (default 60) with overflow checks on
# (--debug-assertions) and prints, per target, the executions and the findings.
#
#   scripts/fuzz.sh [SECONDS]
#
# Corpora: fuzz/corpus/<target> (grows, gitignored) seeded from the committed fuzz/seeds/
# (scripts/fuzz-seeds.sh writes them). Findings land in fuzz/artifacts/<target>/; reproduce
# one with `cd fuzz && cargo +nightly fuzz run <target> --debug-assertions <file>`.
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly toolchain; without nightly,
# RUSTC_BOOTSTRAP=1 lets stable rustc take the -Z flags.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  fuzz=(cargo +nightly fuzz)
else
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi
# model_exec loads and runs thousands of hostile models: their load errors and timeouts are
# the expected outcome, not news.
export NEURON_RT_LOG_LEVEL=${NEURON_RT_LOG_LEVEL:-OFF}
# A 1 GiB cap on host memory (nrt_hal::host_memory): every allocation the compiler and the
# runtime make fallibly refuses past it before allocating, so an allocation that libFuzzer's
# 2 GiB malloc limit reports (an "oom-" finding) is one made infallibly: a bug.
export NRT_HOST_MEMORY_MAX=${NRT_HOST_MEMORY_MAX:-1G}
"${fuzz[@]}" build --debug-assertions || exit 1
mkdir -p logs
summary=()
found=0
for t in $("${fuzz[@]}" list); do
  case $t in
    isa_decode) seeds=seeds/isa ;;
    compile_onnx) seeds=seeds/onnx ;;
    *) seeds=seeds/ncm ;;
  esac
  mkdir -p "corpus/$t" "artifacts/$t"
  before=$(ls "artifacts/$t" | wc -l)
  echo "== $t: ${secs}s"
  # -rss_limit_mb: the model_exec device is 256 MiB; anything near 2 GiB is a finding.
  # -timeout: one input running 10 s (the execution timeout is 100 ms) is a hang.
  "${fuzz[@]}" run "$t" --debug-assertions "corpus/$t" "$seeds" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    > "logs/$t.log" 2>&1
  rc=$?
  runs=$(grep -oE 'Done [0-9]+ runs' "logs/$t.log" | grep -oE '[0-9]+' | tail -1)
  [ -n "$runs" ] || runs=$(grep -oE '^#[0-9]+' "logs/$t.log" | tail -1 | tr -d '#')
  new=$(( $(ls "artifacts/$t" | wc -l) - before ))
  if [ "$rc" -ne 0 ] || [ "$new" -gt 0 ]; then
    found=1
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "logs/$t.log" | head -5
  fi
  summary+=("$t: ${runs:-0} execs in ${secs}s, exit $rc, $new new finding(s) (corpus $(ls "corpus/$t" | wc -l))")
done
echo "== fuzz summary (overflow checks on)"
printf '%s\n' "${summary[@]}"
exit $found
