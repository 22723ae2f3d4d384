#!/usr/bin/env bash
# Paired A/B of the quiet near-null rows between a base commit and the working tree: builds
# `nrt` (release) at BASE in a temporary worktree and here, then alternates the two binaries
# ROUNDS times per row with ../shared/tools/ab.sh (median per-pair ratio B/A; B = this tree).
# Run it on an idle machine (no build, fuzzer or helper running).
#
#   scripts/ab_hotpath.sh [BASE=0e8cac4] [ROUNDS=16] [SECONDS=0.2]
#   ALIGN=64 scripts/ab_hotpath.sh ...   # both builds with functions and loops aligned
#   COTENANT=1 scripts/ab_hotpath.sh ... # also the three rows beside a busy co-tenant process
#
# Rows: sync median latency, explicit depth 8 throughput, implicit depth 8 throughput.
#
# Code layout moves these rows by several percent on its own: the same source built with
# 64-byte function and loop alignment ran near-null sync 4.5% slower than its default build
# (0e8cac4, 20 pairs), because where a hot loop falls against 32/64-byte boundaries changes
# with any edit anywhere. ALIGN=N (a power of two) builds both sides with
# `-C llvm-args=-align-all-functions=log2(N) -C llvm-args=-align-loops=N`, so the comparison is
# of the code and not of where the linker happened to put it; run it with and without.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-0e8cac4} rounds=${2:-16} secs=${3:-0.2}
ab=../shared/tools/ab.sh
[ -x "$ab" ] || ab="bash $ab"
align=${ALIGN:-}
flags=()
suffix=""
if [ -n "$align" ]; then
  log2=$(python3 -c "import math,sys; n=int(sys.argv[1]); assert n & (n - 1) == 0; print(int(math.log2(n)))" "$align")
  export RUSTFLAGS="-C target-cpu=x86-64-v3 -C llvm-args=-align-all-functions=$log2 -C llvm-args=-align-loops=$align"
  suffix="-align$align"
fi
work=target/ab-base$suffix
if [ ! -x "$work/bin/nrt" ] || [ "$(cat "$work/commit" 2>/dev/null)" != "$base" ]; then
  rm -rf "$work" && mkdir -p "$work"
  git worktree add --detach -f "$work/src" "$base" > /dev/null
  (cd "$work/src" && cargo build --quiet --release -p nrt-cli --target-dir ../target)
  mkdir -p "$work/bin" && cp "$work/target/release/nrt" "$work/bin/nrt"
  git worktree remove --force "$work/src"
  echo "$base" > "$work/commit"
fi
if [ -n "$align" ]; then
  flags=(--target-dir "target/ab-head$suffix")
  cargo build --quiet --release -p nrt-cli "${flags[@]}"
  b="target/ab-head$suffix/release/nrt"
else
  cargo build --quiet --release -p nrt-cli
  b=target/release/nrt
fi
a="$work/bin/nrt"
echo "A = $base, B = working tree${align:+ (both aligned to $align)}; $rounds pairs of ${secs}s runs per row"
echo "-- sync near-null, median_ns (lower is better)"
$ab "$rounds" '"median_ns":([0-9.]+)' \
  "$a bench --surface sync --seconds $secs --json" "$b bench --surface sync --seconds $secs --json"
echo "-- explicit depth 8, execs_per_s (higher is better)"
$ab "$rounds" '"execs_per_s":([0-9.]+)' \
  "$a bench --surface explicit --depth 8 --seconds $secs --json" \
  "$b bench --surface explicit --depth 8 --seconds $secs --json"
echo "-- implicit depth 8, execs_per_s (higher is better)"
$ab "$rounds" '"execs_per_s":([0-9.]+)' \
  "$a bench --surface implicit --depth 8 --seconds $secs --json" \
  "$b bench --surface implicit --depth 8 --seconds $secs --json"
if [ -n "${COTENANT:-}" ]; then
  # The same rows beside one busy-looping process (../shared/tools/cotenant.sh): what a
  # change to a spin or yield policy does when the threads outnumber the vCPUs.
  ct=../shared/tools/cotenant.sh
  [ -x "$ct" ] || ct="bash $ct"
  for row in "sync" "explicit --depth 8" "implicit --depth 8"; do
    echo "-- co-tenant $row, execs_per_s (higher is better)"
    $ab "$rounds" '"execs_per_s":([0-9.]+)' \
      "$ct -- $a bench --surface $row --seconds $secs --json" \
      "$ct -- $b bench --surface $row --seconds $secs --json"
  done
fi
