#!/usr/bin/env python3
"""ONNX Runtime (1 and 2 intra-op threads) on one ONNX model that the shared peers script
does not know (the project's own samples, e.g. `cnn`), timed the way
`bench-peers/bench_peers.py` times its models: 0.3 s warm-up, then single synchronous calls
for SECONDS, median and p99 of the per-call latency. Prints lines in bench_peers.py's log
format, which scripts/bench_table.py reads:

    [cnn      ort-t1           ] median 30.12 us  p99 41.0 us  n=33000

usage: ort_model.py MODEL.onnx NAME [SECONDS] [THREADS]   (THREADS: 1, 2 or both, the default)
"""
import gc
import sys
import time

import numpy as np
import onnxruntime as ort

path, name = sys.argv[1], sys.argv[2]
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
thread_counts = (int(sys.argv[4]),) if len(sys.argv) > 4 else (1, 2)


def dims(arg):
    # Symbolic dimensions (none in the samples) are taken as 1.
    return [d if isinstance(d, int) and d > 0 else 1 for d in arg.shape]


DTYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}

for threads in thread_counts:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    feed = {}
    for i in sess.get_inputs():
        dt = DTYPES.get(i.type)
        if dt is None:
            sys.exit(f"ort_model.py: input '{i.name}' of {path} has type {i.type}, not handled")
        feed[i.name] = rng.standard_normal(dims(i)).astype(dt)
    t_end = time.perf_counter() + 0.3
    k = 0
    while time.perf_counter() < t_end or k < 20:
        sess.run(None, feed)
        k += 1
    lat = []
    gc.disable()
    pc = time.perf_counter_ns
    deadline = pc() + int(seconds * 1e9)
    while (len(lat) < 200 or pc() < deadline) and len(lat) < 200_000:
        t0 = pc()
        sess.run(None, feed)
        lat.append(pc() - t0)
    gc.enable()
    us = np.asarray(lat, dtype=np.int64) / 1e3
    peer = f"ort-t{threads}"
    print(f"[{name:<8} {peer:<17}] median {np.median(us):.2f} us  "
          f"p99 {np.percentile(us, 99):.1f} us  n={us.size}")
