#!/usr/bin/env bash
# Paired A/B of the quiet near-null rows between a base commit and the working tree: builds
# `nrt` (release) at BASE in a temporary worktree and here, then alternates the two binaries
# ROUNDS times per row with ../shared/tools/ab.sh (median per-pair ratio B/A; B = this tree).
# Run it on an idle machine (no build, fuzzer or helper running).
#
#   scripts/ab_hotpath.sh [BASE=0e8cac4] [ROUNDS=16] [SECONDS=0.2]
#
# Rows: sync median latency, explicit depth 8 throughput, implicit depth 8 throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-0e8cac4} rounds=${2:-16} secs=${3:-0.2}
ab=../shared/tools/ab.sh
[ -x "$ab" ] || ab="bash $ab"
work=target/ab-base
if [ ! -x "$work/bin/nrt" ] || [ "$(cat "$work/commit" 2>/dev/null)" != "$base" ]; then
  rm -rf "$work" && mkdir -p "$work"
  git worktree add --detach -f "$work/src" "$base" > /dev/null
  (cd "$work/src" && cargo build --quiet --release -p nrt-cli --target-dir ../target)
  mkdir -p "$work/bin" && cp "$work/target/release/nrt" "$work/bin/nrt"
  git worktree remove --force "$work/src"
  echo "$base" > "$work/commit"
fi
cargo build --quiet --release -p nrt-cli
a="$work/bin/nrt" b=target/release/nrt
echo "A = $base, B = working tree; $rounds pairs of ${secs}s runs per row"
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
