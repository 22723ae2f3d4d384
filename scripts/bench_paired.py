#!/usr/bin/env python3
"""The ratio targets of #14 and #15 as paired rounds, for a machine with fast and slow phases.

`scripts/bench.sh` measures every row once, one after the other: a ratio whose two sides ran
a minute apart reads whatever phase each side fell into (the 2-core/1-core `encoder` ratio
read 0.59 and 0.90 in two runs of the same code). Here each ratio's two sides run back to
back, ROUNDS times, the order alternating (A B, B A, ...), each side a fresh process, and the
table gives the median of the per-round ratios, their range, and how many rounds met the
target — the project's rule for deciding anything on this machine (`../shared/tools/ab.sh`).

The near-null targets come from whole runs of `nrt bench`'s standard rows (each run holds
both sides of its ratios), ROUNDS of them.

usage: bench_paired.py [--rounds 5] [--seconds 1] [--nrt target/release/nrt]
                       [--models DIR] [--samples DIR] [--only SUBSTRING]
Run it with the peers' venv python (numpy, onnx, onnxruntime), on an idle machine, after
`scripts/bench.sh` has built the peers (PEERS_WORKDIR, default target/peers).
"""
import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.environ.get("PEERS_WORKDIR", os.path.join(ROOT, "target", "peers"))

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--seconds", type=float, default=1.0)
ap.add_argument("--nrt", default=os.path.join(ROOT, "target", "release", "nrt"))
ap.add_argument("--models", default=os.path.join(WORK, "models"))
ap.add_argument("--samples", default=None, help="`nrt samples --out` folder (made if absent)")
ap.add_argument("--only", default=None, help="run only the targets whose label has this")
args = ap.parse_args()
tmp = tempfile.mkdtemp(prefix="bench_paired.")
atexit.register(shutil.rmtree, tmp, ignore_errors=True)
samples = args.samples or os.path.join(tmp, "samples")
if not os.path.isdir(os.path.join(samples, "cnn")):
    subprocess.run([args.nrt, "samples", "--out", samples], check=True, capture_output=True)


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        sys.exit(f"bench_paired: {' '.join(cmd)} failed: {r.stderr.strip()[-800:]}")
    return r.stdout


def nrt(model, cores=1, cast=None):
    """One `nrt bench MODEL` row: its median latency in µs."""
    cmd = [args.nrt, "bench", model, "--json", "--seconds", str(args.seconds),
           "--cores", str(cores)]
    if cast:
        cmd += ["--auto-cast", cast]
    row = json.loads(run(cmd).strip().splitlines()[-1])
    return row["median_ns"] / 1e3


def ort(model, threads):
    """ONNX Runtime with `threads` intra-op threads (scripts/ort_model.py): median µs."""
    out = run([sys.executable, os.path.join(ROOT, "scripts", "ort_model.py"), model, "m",
               str(args.seconds), str(threads)])
    return float(out.split("median ")[1].split()[0])


def tract(model):
    """tract (native, the peers' tract_native build) on standard-normal inputs: median µs."""
    exe = os.path.join(WORK, "tract_native-target", "release", "tract_native")
    m = onnx.load(model, load_external_data=False)
    shape = [d.dim_value or 1 for d in m.graph.input[0].type.tensor_type.shape.dim]
    fin, fout = os.path.join(tmp, "in.f32"), os.path.join(tmp, "out.f32")
    np.random.default_rng(3).standard_normal(shape).astype("<f4").tofile(fin)
    out = run([exe, model, fin, fout, ",".join(map(str, shape)), str(args.seconds)])
    return json.loads(out.strip().splitlines()[-1])["median_us"]


def model(name):
    return os.path.join(args.models, name + ".onnx")


cnn = os.path.join(samples, "cnn", "model.onnx")
# (label, target ratio (ours / theirs must be at most this), ours, theirs)
PAIRS = [
    ("#14 mlp_b64 2 cores / 1 core", 0.6,
     lambda: nrt(model("mlp_b64"), 2), lambda: nrt(model("mlp_b64"), 1)),
    ("#14 encoder 2 cores / 1 core", 0.6,
     lambda: nrt(model("encoder"), 2), lambda: nrt(model("encoder"), 1)),
    ("#14 mlp_b64 2 cores / ORT 2 threads", 1.0,
     lambda: nrt(model("mlp_b64"), 2), lambda: ort(model("mlp_b64"), 2)),
    ("#14 encoder 2 cores / ORT 2 threads", 1.0,
     lambda: nrt(model("encoder"), 2), lambda: ort(model("encoder"), 2)),
    ("#15 mlp_b64 / ORT 1 thread", 1.0,
     lambda: nrt(model("mlp_b64")), lambda: ort(model("mlp_b64"), 1)),
    ("#15 encoder / ORT 1 thread", 0.9,
     lambda: nrt(model("encoder")), lambda: ort(model("encoder"), 1)),
    ("#15 mlp / tract", 1.0, lambda: nrt(model("mlp")), lambda: tract(model("mlp"))),
    ("#15 cnn / ORT 1 thread", 1.0, lambda: nrt(cnn), lambda: ort(cnn, 1)),
    ("#15 mlp bf16 / tract f32", 0.6,
     lambda: nrt(model("mlp"), cast="matmult"), lambda: tract(model("mlp"))),
    ("#15 mlp_b64 bf16 / ORT 1 thread f32", 0.6,
     lambda: nrt(model("mlp_b64"), cast="matmult"), lambda: ort(model("mlp_b64"), 1)),
]


def standard_rows():
    """One run of the standard rows: the near-null targets, each from this one run."""
    rows = [json.loads(line) for line in run(
        [args.nrt, "bench", "--json", "--seconds", str(min(args.seconds, 0.5))]).splitlines()]

    def row(model, surface, depth=1, cores=1):
        return next(r for r in rows if r["model"] == model and r["surface"] == surface
                    and r["depth"] == depth and r["cores"] == cores)
    ping = row("spin-pingpong", "limit", cores=0)
    sync = row("near-null", "sync")
    ex8 = row("near-null", "explicit", 8)
    im8 = row("near-null", "implicit", 8)
    procs = [r for r in rows if r["surface"] == "processes"][0]
    one = row("mlp_b64-sample", "sync")
    return {
        "#14 sync / pingpong (≤ 3.5)": sync["median_ns"] / ping["median_ns"],
        "#14 explicit d8, M exec/s (≥ 3)": ex8["execs_per_s"] / 1e6,
        "#14 implicit d8 / explicit d8 (≥ 0.4)": im8["execs_per_s"] / ex8["execs_per_s"],
        "#14 implicit d8 p99, µs (≤ 50)": im8["p99_ns"] / 1e3,
        "#14 co-tenant sync / quiet (≥ 0.4)":
            row("near-null", "sync-cotenant")["execs_per_s"] / sync["execs_per_s"],
        "#14 co-tenant explicit d8 / quiet (≥ 0.4)":
            row("near-null", "explicit-cotenant", 8)["execs_per_s"] / ex8["execs_per_s"],
        "#14 2 processes / 1 (≥ 1.7)": procs["execs_per_s"] / one["execs_per_s"],
        "#14 caller share on encoder, 1 core (≤ 0.05)":
            row("encoder-sample", "sync")["caller_cpu_share"],
    }


def met(label, v):
    bound = float(label.split("(")[-1].split()[1].rstrip(")"))
    return v >= bound if "≥" in label else v <= bound


def summary(vals):
    return (statistics.median(vals), min(vals), max(vals))


print(f"{args.rounds} rounds, {args.seconds} s a side; each ratio ours / theirs, its sides "
      "back to back in alternating order\n")
print("| target | median of the rounds | range | rounds meeting it | ours µs / theirs µs (medians) |")
print("|---|---|---|---|---|")
for label, bound, ours, theirs in PAIRS:
    if args.only and args.only not in label:
        continue
    a, b = [], []
    for i in range(args.rounds):
        if i % 2 == 0:
            a.append(ours())
            b.append(theirs())
        else:
            b.append(theirs())
            a.append(ours())
    ratios = [x / y for x, y in zip(a, b)]
    med, lo, hi = summary(ratios)
    ok = sum(r <= bound for r in ratios)
    print(f"| {label} (≤ {bound}) | {med:.2f} | {lo:.2f}–{hi:.2f} | {ok}/{args.rounds} | "
          f"{statistics.median(a):.1f} / {statistics.median(b):.1f} |", flush=True)
if not args.only or "near-null" in args.only or "#14" in args.only:
    runs = [standard_rows() for _ in range(args.rounds)]
    for label in runs[0]:
        vals = [r[label] for r in runs]
        med, lo, hi = summary(vals)
        ok = sum(met(label, v) for v in vals)
        print(f"| {label} | {med:.3g} | {lo:.3g}–{hi:.3g} | {ok}/{args.rounds} | (one `nrt bench` run each) |")
