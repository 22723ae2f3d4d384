#!/usr/bin/env bash
# Paired A/B of two `nrt` binaries on the rows this wave's wait-policy and two-core changes
# touch (../shared/tools/ab.sh: alternating runs, median per-pair ratio B/A). Run it on an
# idle machine (no build, fuzzer or helper running). Build the binaries first, e.g. at two
# commits: `git stash; cargo build --release -p nrt-cli; cp target/release/nrt /tmp/a; ...`.
#
#   scripts/ab_binaries.sh A_BINARY B_BINARY [ROUNDS=12] [SECONDS=0.3] [ROWS=all]
#
# ROWS (comma-separated): sync, explicit (near-null depth 8), cotenant (the co-tenant rows of
# the standard bench), mlp_b64, mlp_b64_2c, encoder, encoder_2c (the peers' models in
# $PEERS_WORKDIR/models, default target/peers/models), and cotenant_2c (mlp_b64 and encoder
# on 2 cores beside one busy process: executions per second and p99 — how a lockstep
# group's serving mode holds up when the threads outnumber the vCPUs), threads (`mlp` from 2
# and 4 threads at once on one core, `--threads`: executions per second, p99 and the
# process's CPU per execution; both binaries need `--threads`; THREADS_MODELS="A.onnx B.onnx"
# and THREADS="2 3 4" choose others), and implicit_2c (`encoder` on 2 cores,
# implicit depth 4: executions per second and the client's CPU per execution).
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1 b=$2 rounds=${3:-12} secs=${4:-0.3} rows=${5:-all}
ab=../shared/tools/ab.sh
[ -x "$ab" ] || ab="bash $ab"
models=${PEERS_WORKDIR:-target/peers}/models
want() { [ "$rows" = all ] || [[ ",$rows," == *",$1,"* ]]; }
echo "A = $a, B = $b; $rounds pairs of ${secs}s runs per row"
if want sync; then
  echo "-- sync near-null, median_ns (lower is better)"
  $ab "$rounds" '"median_ns":([0-9.]+)' \
    "$a bench --surface sync --seconds $secs --json" "$b bench --surface sync --seconds $secs --json"
fi
if want explicit; then
  echo "-- explicit depth 8, execs_per_s (higher is better)"
  $ab "$rounds" '"execs_per_s":([0-9.]+)' \
    "$a bench --surface explicit --depth 8 --seconds $secs --json" \
    "$b bench --surface explicit --depth 8 --seconds $secs --json"
fi
if want cotenant; then
  # As the standard bench's co-tenant rows: one busy-looping process beside.
  co=../shared/tools/cotenant.sh
  echo "-- sync near-null beside one busy process, execs_per_s (higher is better)"
  $ab "$rounds" '"execs_per_s":([0-9.]+)' \
    "bash $co -- $a bench --surface sync --seconds $secs --json" \
    "bash $co -- $b bench --surface sync --seconds $secs --json"
  echo "-- explicit depth 8 beside one busy process, execs_per_s (higher is better)"
  $ab "$rounds" '"execs_per_s":([0-9.]+)' \
    "bash $co -- $a bench --surface explicit --depth 8 --seconds $secs --json" \
    "bash $co -- $b bench --surface explicit --depth 8 --seconds $secs --json"
fi
for m in mlp_b64 encoder; do
  for c in 1 2; do
    row=$m; [ "$c" = 2 ] && row=${m}_2c
    want "$row" || continue
    echo "-- $m on $c core(s), median_ns (lower is better)"
    $ab "$rounds" '"median_ns":([0-9.]+)' \
      "$a bench $models/$m.onnx --cores $c --seconds $secs --json" \
      "$b bench $models/$m.onnx --cores $c --seconds $secs --json"
  done
done
if want cotenant_2c; then
  co=../shared/tools/cotenant.sh
  for m in mlp_b64 encoder; do
    for f in execs_per_s p99_ns; do
      echo "-- $m on 2 cores beside one busy process, $f"
      $ab "$rounds" "\"$f\":([0-9.]+)" \
        "bash $co -- $a bench $models/$m.onnx --cores 2 --seconds $secs --json" \
        "bash $co -- $b bench $models/$m.onnx --cores 2 --seconds $secs --json"
    done
  done
fi
if want threads; then
  for m in ${THREADS_MODELS:-$models/mlp.onnx}; do
    for t in ${THREADS:-2 4}; do
      run() { echo "$1 bench $m --threads $t --seconds $secs --json"; }
      echo "-- $(basename "$m") from $t threads on one core, execs_per_s (higher is better)"
      $ab "$rounds" '"execs_per_s":([0-9.]+)' "$(run "$a")" "$(run "$b")"
      echo "-- $(basename "$m") from $t threads on one core, p99_ns (lower is better)"
      $ab "$rounds" '"p99_ns":([0-9.]+)' "$(run "$a")" "$(run "$b")"
      echo "-- $(basename "$m") from $t threads on one core, the process's µs of CPU per execution (lower is better)"
      $ab "$rounds" '([0-9.]+) µs of CPU per execution' "$(run "$a")" "$(run "$b")"
    done
  done
fi
if want implicit_2c; then
  for f in execs_per_s caller_cpu_ns; do
    echo "-- encoder on 2 cores, implicit depth 4, $f"
    $ab "$rounds" "\"$f\":([0-9.]+)" \
      "$a bench $models/encoder.onnx --cores 2 --surface implicit --depth 4 --seconds $secs --json" \
      "$b bench $models/encoder.onnx --cores 2 --surface implicit --depth 4 --seconds $secs --json"
  done
fi
