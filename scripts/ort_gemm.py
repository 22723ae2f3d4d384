#!/usr/bin/env python3
"""ONNX Runtime single-thread GEMM throughput on the shapes `nrt bench --gemm` uses:
Y[M,N] = X[M,K] · W[K,N] with W a constant (f32 MatMul; then MatMulInteger u8 × i8 → i32,
keyed `int8 MxKxN`, in GOPS). Prints one JSON object per shape.

usage: ort_gemm.py [SECONDS]
"""
import json
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
shapes = [(m, k, n, False) for m, k, n in [(1, 512, 512), (64, 512, 512), (512, 512, 512),
                                             (128, 64, 128)]]
shapes += [(1, 512, 512, True), (64, 512, 512, True), (512, 512, 512, True)]
for m, k, n, int8 in shapes:
    rng = np.random.default_rng(1)
    if int8:
        w = rng.integers(-127, 128, (k, n)).astype(np.int8)
        g = helper.make_graph(
            [helper.make_node("MatMulInteger", ["X", "W"], ["Y"])], "gemm_int8",
            [helper.make_tensor_value_info("X", TensorProto.UINT8, [m, k])],
            [helper.make_tensor_value_info("Y", TensorProto.INT32, [m, n])],
            [numpy_helper.from_array(w, "W")])
    else:
        w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
        g = helper.make_graph(
            [helper.make_node("MatMul", ["X", "W"], ["Y"])], "gemm",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, [m, k])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
            [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    # From the bytes: no file to leave behind.
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = (np.random.default_rng(2).integers(0, 256, (m, k)).astype(np.uint8) if int8
         else np.random.default_rng(2).standard_normal((m, k)).astype(np.float32))
    for _ in range(20):
        sess.run(None, {"X": x})
    lat = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(lat) < 50:
        t = time.perf_counter_ns()
        sess.run(None, {"X": x})
        lat.append(time.perf_counter_ns() - t)
    med = float(np.median(lat))
    print(json.dumps({"peer": "ort-t1", "shape": f"{'int8 ' if int8 else ''}{m}x{k}x{n}",
                      "median_ns": med, "gflops": 2 * m * k * n / med}))
