#!/usr/bin/env python3
"""Prints the benchmark tables of one scripts/bench.sh run (its output folder)."""
import json
import os
import re
import sys

out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "nrt.jsonl")) if l.strip()]
peers = {}
log = os.path.join(out, "peers.log")
if os.path.exists(log):
    for line in open(log):
        m = re.match(r"\[(\S+)\s+(\S+)\s*\] median ([\d.]+) us\s+p99 (\S+) us", line)
        if m:
            peers[(m.group(1), m.group(2))] = float(m.group(3))
gemm = {}
if os.path.exists(os.path.join(out, "ort_gemm.jsonl")):
    for l in open(os.path.join(out, "ort_gemm.jsonl")):
        j = json.loads(l)
        gemm[j["shape"]] = j


def us(ns):
    return f"{ns / 1000:.2f}" if ns < 1e7 else f"{ns / 1e6:.1f} ms"


print("\n## Runtime overhead (near-null model) and async throughput\n")
print("| row | surface | depth | cores | median µs | p99 µs | execs/s | allocs/exec | note |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    if (r["surface"] in ("gemm", "peak", "processes", "process-of-2")
            or r["model"].split("_bf16")[0] in ("tiny", "mlp", "mlp_b64", "encoder", "cnn")
            or r["model"].endswith("-sample")):
        continue
    print(f"| {r['model']} | {r['surface']} | {r['depth']} | {r['cores']} | {us(r['median_ns'])} | "
          f"{us(r['p99_ns'])} | {r['execs_per_s']:,.0f} | {r['allocs_per_exec']:.3f} | {r['note']} |")
limit = next((r for r in rows if r["surface"] == "limit"), None)
sync = next((r for r in rows if r["surface"] == "sync" and r["model"] == "near-null"), None)
e8 = next((r for r in rows if r["surface"] == "explicit" and r["depth"] == 8), None)
if limit and sync:
    print(f"\nsync near-null / spinning pingpong limit (same run): {sync['median_ns'] / limit['median_ns']:.1f}x")
if sync and e8:
    print(f"explicit async depth 8 / sync throughput: {e8['execs_per_s'] / sync['execs_per_s']:.1f}x")
for quiet, busy, depth in (("sync", "sync-cotenant", 1), ("explicit", "explicit-cotenant", 8)):
    q = next((r for r in rows if r["model"] == "near-null" and r["surface"] == quiet and r["depth"] == depth), None)
    b = next((r for r in rows if r["model"] == "near-null" and r["surface"] == busy), None)
    if q and b:
        print(f"{busy} / quiet throughput (one busy co-tenant process): {b['execs_per_s'] / q['execs_per_s']:.2f}x, "
              f"median {us(b['median_ns'])} µs")
if ("tiny", "tract-native") in peers:
    print(f"tract-native tiny (same run): {peers[('tiny', 'tract-native')]:.2f} µs")

print("\n## GEMM (GFLOP/s, single thread; int8 rows in GOPS)\n")
for r in rows:
    if r["surface"] == "peak":
        print(f"- {r['model']}: {r['note']}")
print("\n| M×K×N | weights | nrt through the device | share of its peak | the MatMul alone (median) | its best 30 ms batch (the limit's statistic) | ONNX Runtime t1 (f32; int8: MatMulInteger) | ratio |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    if r["surface"] != "gemm":
        continue
    parts = r["model"].split()
    shape, wt = parts[1], (" ".join(parts[2:]) or "f32")
    m, k, n = map(int, shape.split("x"))
    g = 2 * m * k * n / r["median_ns"]
    share = next((p.split(" of ")[0] for p in r["note"].split(", ") if "% of" in p), "-")
    o = gemm.get(f"int8 {shape}" if wt == "int8" else shape)
    og = f"{o['gflops']:.1f}" if o else "-"
    ratio = f"{g / o['gflops']:.2f}" if o else "-"
    alone = re.search(r"the instruction alone ([0-9.]+), ([0-9]+%)", r["note"])
    if alone is None:
        alone = re.search(r"the instruction alone ([0-9.]+)()", r["note"])
    alone = f"{alone.group(1)} ({alone.group(2)})" if alone else "-"
    best = re.search(r"best 30 ms batch ([0-9.]+)(?:, ([0-9]+%))?", r["note"])
    best = f"{best.group(1)} ({best.group(2) or '-'})" if best else "-"
    print(f"| {shape} | {wt} | {g:.1f} | {share} | {alone} | {best} | {og} | {ratio} |")

# The bf16 auto-cast's error against ONNX Runtime in f32 on the same inputs (bench.sh runs
# `nrt conformance --auto-cast matmult` on each model with ONNX Runtime's outputs as the
# reference): max |nrt − ORT| / max |ORT| over each model's outputs.
bf16_err = {}
err_path = os.path.join(out, "bf16_err.txt")
if os.path.exists(err_path):
    for line in open(err_path):
        m = re.match(r"PASS (\S+) \(.*max error / max \|reference\| ([0-9.e+-]+)", line)
        if m:
            bf16_err[m.group(1) + "_bf16"] = m.group(2)

print("\n## Compute models (median µs, synchronous single inference)\n")
print("bf16 rows: `--auto-cast matmult` (bf16 weights, f32 accumulation), beside the peers in f32; "
      "their error column is max |nrt − ORT f32| / max |ORT f32| over the model's outputs on "
      "the same seeded inputs.\n")
names = ["ort-t1", "ort-t2", "tract-native", "tract", "iree-sync", "iree-sync-native", "iree-task"]
present = [p for p in names if any(k[1] == p for k in peers)]
print("| model | nrt | " + " | ".join(present) + " | nrt / ort-t1 | bf16 error vs ORT f32 |")
print("|---|---:|" + "---:|" * len(present) + "---:|---:|")
for r in rows:
    base = r["model"].split("_bf16")[0]
    if (base not in ("tiny", "mlp", "mlp_b64", "encoder", "cnn", "int8_gemm", "lstm_step")
            or r["surface"] != "sync"
            or r.get("cores", 1) != 1):
        continue
    cells = [f"{peers[(base, p)]:.2f}" if (base, p) in peers else "-" for p in present]
    o = peers.get((base, "ort-t1"))
    ratio = f"{r['median_ns'] / 1000 / o:.2f}" if o else "-"
    err = bf16_err.get(r["model"], "-" if r["model"].endswith("_bf16") else "")
    print(f"| {r['model']} | {r['median_ns'] / 1000:.2f} | " + " | ".join(cells) + f" | {ratio} | {err} |")

# The int8 GEMM (one dynamically quantized 64x512x512 layer) in GOPS, and the LSTM step.
q = next((r for r in rows if r["model"] == "int8_gemm" and r["surface"] == "sync"), None)
if q:
    ops = 2 * 64 * 512 * 512
    o = peers.get(("int8_gemm", "ort-t1"))
    ort = f"{ops / (o * 1000):.0f} GOPS" if o else "-"
    print(f"\nint8 GEMM 64x512x512 (DynamicQuantizeLinear + MatMulInteger + rescale, whole "
          f"execution): nrt {ops / q['median_ns']:.0f} GOPS, ONNX Runtime 1 thread {ort}")
l = next((r for r in rows if r["model"] == "lstm_step" and r["surface"] == "sync"), None)
if l:
    o = peers.get(("lstm_step", "ort-t1"))
    ort = f"{o:.2f} µs" if o else "-"
    print(f"LSTM step (input 128, hidden 256, state in and out): nrt {l['median_ns'] / 1000:.2f} µs, "
          f"ONNX Runtime 1 thread {ort}")

print("\n## Both vCPUs: two cores, two processes, the waiting caller's CPU\n")
print("| model | nrt 1 core µs | nrt 2 cores µs | 2c / 1c | ort-t1 µs | ort-t2 µs | nrt 2c / ort-t2 | caller CPU 1c / 2c (share of a vCPU) |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for name in ("mlp_b64", "encoder", "mlp_b64-sample", "encoder-sample"):
    one = next((r for r in rows if r["model"] == name and r["surface"] == "sync" and r["cores"] == 1), None)
    two = next((r for r in rows if r["model"] == name and r["surface"] == "sync" and r["cores"] == 2), None)
    if not one or not two:
        continue
    o1, o2 = peers.get((name, "ort-t1")), peers.get((name, "ort-t2"))
    c1, c2 = one.get("caller_cpu_share"), two.get("caller_cpu_share")
    cpu = f"{c1 * 100:.1f}% / {c2 * 100:.1f}%" if c1 is not None and c2 is not None else "-"
    t1, t2 = one["median_ns"] / 1000, two["median_ns"] / 1000
    ort1 = f"{o1:.1f}" if o1 else "-"
    ort2 = f"{o2:.1f}" if o2 else "-"
    vs2 = f"{t2 / o2:.2f}" if o2 else "-"
    print(f"| {name} | {t1:.1f} | {t2:.1f} | {t2 / t1:.2f} | {ort1} | {ort2} | {vs2} | {cpu} |")
busy = {r["cores"]: r for r in rows if r["model"] == "encoder-sample" and r["surface"] == "sync-cotenant"}
if 1 in busy and 2 in busy:
    one, two = busy[1], busy[2]
    print(f"\nencoder-sample beside one busy co-tenant process: 1 core {one['execs_per_s']:,.0f} execs/s "
          f"(p99 {us(one['p99_ns'])} µs), 2 cores {two['execs_per_s']:,.0f} (p99 {us(two['p99_ns'])} µs): "
          f"{two['execs_per_s'] / one['execs_per_s']:.2f}x")
for name in ("mlp_b64", "mlp_b64-sample"):
    one = next((r for r in rows if r["model"] == name and r["surface"] == "sync" and r["cores"] == 1), None)
    procs = [r for r in rows if r["model"] == name and r["surface"] == "process-of-2"]
    agg = sum(r["execs_per_s"] for r in procs) if len(procs) == 2 else None
    p = next((r for r in rows if r["model"] == name and r["surface"] == "processes"), None)
    if p:
        agg = p["execs_per_s"]
    if one and agg:
        print(f"\n{name}: two processes × one core, aggregate {agg:,.0f} execs/s = "
              f"{agg / one['execs_per_s']:.2f}x one process ({one['execs_per_s']:,.0f})")
