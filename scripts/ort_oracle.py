#!/usr/bin/env python3
"""Turns folders holding a model.onnx into ONNX node-test folders whose expected outputs come
from ONNX Runtime (the oracle): for each DIR/model.onnx, seeded random inputs are written as
DIR/test_data_set_0/input_<i>.pb and ONNX Runtime's outputs as output_<i>.pb. `nrt
conformance DIR` then checks nrt-rs against them.

usage: ort_oracle.py DIR...
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    # Bit patterns for the bitwise operators: full-range values (no model takes indices in
    # these types).
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
}
FULL_RANGE = (np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64)


def main(dirs):
    for d in dirs:
        path = os.path.join(d, "model.onnx")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # errors only: unused-initializer warnings are noise here
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(7)
        feeds = {}
        for i in sess.get_inputs():
            shape = [s if isinstance(s, int) else 1 for s in i.shape]
            dtype = TYPES[i.type]
            if dtype in (np.float32, np.float16, np.float64):
                feeds[i.name] = rng.standard_normal(shape).astype(dtype)
            elif dtype in FULL_RANGE:
                info = np.iinfo(dtype)
                feeds[i.name] = rng.integers(info.min, info.max, shape, dtype=dtype,
                                             endpoint=True)
            else:
                feeds[i.name] = rng.integers(0, 3, shape).astype(dtype)
        outs = sess.run(None, feeds)
        ds = os.path.join(d, "test_data_set_0")
        os.makedirs(ds, exist_ok=True)
        for k, i in enumerate(sess.get_inputs()):
            with open(os.path.join(ds, f"input_{k}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(feeds[i.name], i.name).SerializeToString())
        for k, (o, v) in enumerate(zip(sess.get_outputs(), outs)):
            with open(os.path.join(ds, f"output_{k}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(np.asarray(v), o.name).SerializeToString())
        print(f"{d}: {len(feeds)} input(s), {len(outs)} output(s) from onnxruntime {ort.__version__}")


if __name__ == "__main__":
    main(sys.argv[1:])
