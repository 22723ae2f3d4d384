#!/usr/bin/env bash
# Instructions per execution of one surface's hot path (callgrind; deterministic, so it
# decides small changes where timing on this VM's fast and slow phases cannot):
#
#   scripts/callgrind_hotpath.sh [NRT_BINARY=target/release/nrt] [SURFACE=sync] [SECONDS=2]
#
# Under valgrind the threads run one at a time, so a synchronous caller's choice to run its
# execution on its own thread (decided on measured times) can go either way from run to run;
# NRT_SIM_SYNC_ON_CALLER=always (or never) pins it for a comparison.
#
# Counts only inside the synchronous execution (sync: `Runtime::execute`) or the explicit
# schedule call (any other
# surface: `execute_schedule`; its polls are left out, since how many a completion takes
# depends on how valgrind interleaves the threads), on the caller's thread and on the device's
# threads, and divides by the executions made.
set -euo pipefail
bin=${1:-target/release/nrt} surface=${2:-sync} secs=${3:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
  "$bin" bench --surface "$surface" --depth 1 --seconds "$secs" --json >"$out/row" 2>"$out/log"
callgrind_annotate --inclusive=yes "$out/cg" >"$out/inc" 2>/dev/null
total=$(grep -m1 'PROGRAM TOTALS' "$out/inc" | awk '{gsub(",","",$1); print $1}')
case $surface in
  # The public call (execute_sync may be inlined into it, and is not always its own symbol).
  sync) fn='<impl nrt_runtime::Runtime>::execute \[' ;;
  *) fn='<impl nrt_runtime::Runtime>::execute_schedule \[' ;;
esac
incl=$(grep -m1 -E "$fn" "$out/inc" | awk '{gsub(",","",$1); print $1}')
# The row's count (its warm-up adds a few executions more: well under 1%).
calls=$(grep -o '"n":[0-9]*' "$out/row" | head -1 | cut -d: -f2)
dev=$(grep -m1 -E 'nrt_sim::device_thread \[' "$out/inc" | awk '{gsub(",","",$1); print $1}' || true)
echo "executions: $calls"
echo "instructions per execution, inside the call: $((incl / calls))"
echo "device threads' instructions per execution: $(( ${dev:-0} / calls ))"
echo "whole process per execution: $((total / calls))"
