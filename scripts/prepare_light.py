#!/usr/bin/env python3
"""Lays out the ONNX package's `light` models (AlexNet, ResNet-50, SqueezeNet, …) as
node-test folders: DIR/<name>/model.onnx, test_data_set_0/input_0.pb with the input the
ONNX backend test runner uses for them (arange(n)/n, float32) and output_0.pb as shipped.

usage: prepare_light.py OUT_DIR
"""
import glob
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import numpy_helper

out = sys.argv[1]
light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
for model in sorted(glob.glob(os.path.join(light, "light_*.onnx"))):
    name = os.path.basename(model)[len("light_"):-len(".onnx")]
    d = os.path.join(out, name)
    ds = os.path.join(d, "test_data_set_0")
    os.makedirs(ds, exist_ok=True)
    shutil.copy(model, os.path.join(d, "model.onnx"))
    m = onnx.load(model)
    inits = {t.name for t in m.graph.initializer}
    k = 0
    for i in m.graph.input:
        if i.name in inits:
            continue
        shape = [dim.dim_value for dim in i.type.tensor_type.shape.dim]
        n = int(np.prod(shape))
        x = (np.arange(n).reshape(shape) / n).astype(np.float32)
        with open(os.path.join(ds, f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x, i.name).SerializeToString())
        k += 1
    shutil.copy(model[:-len(".onnx")] + "_output_0.pb", os.path.join(ds, "output_0.pb"))
    print(d)
