#!/usr/bin/env python3
"""#14's quiet near-null floors — sync ≤ 3.5× the spinning pingpong, explicit depth 8 ≥ 3 M/s —
for two `nrt` binaries in the same run: the issue's baseline (the commit it measured them on)
and the one under test.

The floors were written from one machine's figures (at `0e8cac4`: sync 2.9× the pingpong,
explicit depth 8 3.8 M/s). Whether a machine can meet them at all is a property of the
machine — its cross-core round trip and its per-core speed — so this measures the baseline
beside the new binary: ROUNDS rounds, each one whole `nrt bench` standard run of each binary
(the order alternating: A B, B A, ...), each run holding its own pingpong, sync and explicit
rows. It prints every run's figures, then per binary the medians, and the per-round B/A ratios
(the project's rule for deciding anything on a machine with fast and slow phases).

usage: floors_vs_baseline.py BASELINE_NRT NEW_NRT [--rounds 4] [--seconds 0.3]

Build the baseline in a worktree, e.g.:
  git worktree add /tmp/w0e 0e8cac4 &&
  (cd /tmp/w0e && cargo build --release -p nrt-cli --target-dir /tmp/w0e-target)
then: scripts/floors_vs_baseline.py /tmp/w0e-target/release/nrt target/release/nrt
Run it on an idle machine (no build, fuzzer or helper running).
"""
import argparse
import json
import statistics
import subprocess
import sys

SYNC_FLOOR = 3.5  # × the pingpong, at most
EXPLICIT_FLOOR = 3.0e6  # executions per second at depth 8, at least

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
ap.add_argument("baseline")
ap.add_argument("new")
ap.add_argument("--rounds", type=int, default=4)
ap.add_argument("--seconds", type=float, default=0.3)
args = ap.parse_args()


def run(binary):
    """One standard run: (pingpong ns, sync ns, explicit depth 8 executions/s)."""
    cmd = [binary, "bench", "--seconds", str(args.seconds), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"floors_vs_baseline: {' '.join(cmd)} failed: {r.stderr.strip()[-800:]}")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]

    def find(model, surface, depth):
        for row in rows:
            if (row["model"], row["surface"], row["depth"]) == (model, surface, depth):
                return row
        sys.exit(f"floors_vs_baseline: {binary} printed no {model} {surface} depth {depth} row")

    return (
        find("spin-pingpong", "limit", 1)["median_ns"],
        find("near-null", "sync", 1)["median_ns"],
        find("near-null", "explicit", 8)["execs_per_s"],
    )


names = {"A": args.baseline, "B": args.new}
runs = {"A": [], "B": []}
print(f"A = {args.baseline}\nB = {args.new}\n{args.rounds} rounds of one standard run each")
print(f"{'round':>5} {'bin':>3} {'pingpong':>9} {'sync':>8} {'sync/pp':>8} {'explicit d8':>12}")
for i in range(args.rounds):
    for side in ("AB" if i % 2 == 0 else "BA"):
        pp, sync, exp = run(names[side])
        runs[side].append((pp, sync, exp))
        print(f"{i + 1:>5} {side:>3} {pp:>7.0f}ns {sync:>6.0f}ns {sync / pp:>7.2f}x "
              f"{exp / 1e6:>9.2f}M/s")


def med(xs):
    return statistics.median(xs)


print(f"\nfloors: sync / pingpong <= {SYNC_FLOOR}, explicit depth 8 >= {EXPLICIT_FLOOR / 1e6:.0f} M/s")
for side in "AB":
    r = runs[side]
    ratios = [s / p for p, s, _ in r]
    exps = [e for _, _, e in r]
    print(f"{side}: sync/pingpong median {med(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}, "
          f"{sum(x <= SYNC_FLOOR for x in ratios)}/{len(r)} met); explicit d8 median "
          f"{med(exps) / 1e6:.2f} M/s ({min(exps) / 1e6:.2f}-{max(exps) / 1e6:.2f}, "
          f"{sum(x >= EXPLICIT_FLOOR for x in exps)}/{len(r)} met)")
sync_ratio = [b[1] / a[1] for a, b in zip(runs["A"], runs["B"])]
exp_ratio = [b[2] / a[2] for a, b in zip(runs["A"], runs["B"])]
print(f"B/A per round: sync latency median {med(sync_ratio):.3f} "
      f"({sum(x < 1 for x in sync_ratio)}/{len(sync_ratio)} lower); explicit d8 throughput "
      f"median {med(exp_ratio):.3f} ({sum(x > 1 for x in exp_ratio)}/{len(exp_ratio)} higher)")
