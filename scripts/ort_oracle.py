#!/usr/bin/env python3
"""Turns folders holding a model.onnx into ONNX node-test folders whose expected outputs come
from ONNX Runtime (the oracle): for each DIR/model.onnx, seeded random inputs are written as
DIR/test_data_set_0/input_<i>.pb and ONNX Runtime's outputs as output_<i>.pb. `nrt
conformance DIR` then checks nrt-rs against them.

ONNX Runtime's u8 x s8 integer products (MatMulInteger, QLinearMatMul, ConvInteger,
QLinearConv with int8 weights) saturate on x86 CPUs without AVX-512 VNNI / AVX-VNNI: MLAS then
uses `vpmaddubsw`, whose pairs of products are summed into a saturating int16 (on a Zen 3 the
`int8_gemm` sample's MatMulInteger was off by up to 1e5 in 29,672 of 32,768 outputs). The oracle
therefore runs an exactly equivalent model: int8 weights shifted to uint8 (b + 128) with their
zero points shifted alike (b_zp + 128; 128 where there was none), so (b - b_zp) is unchanged and
ONNX Runtime takes its exact u8 x u8 kernel. The model nrt-rs compiles is the original.

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


# op type -> (index of the weight input, index of its zero point)
INTEGER_WEIGHTS = {
    "MatMulInteger": (1, 3),
    "ConvInteger": (1, 3),
    "QLinearMatMul": (3, 5),
    "QLinearConv": (3, 5),
}


def exact_integer_products(model):
    """The model with every int8 weight initializer of an integer product shifted to uint8
    (see the module comment); None when it has none."""
    inits = {t.name: t for t in model.graph.initializer}
    changed = False
    for n, node in enumerate(model.graph.node):
        where = INTEGER_WEIGHTS.get(node.op_type)
        if where is None or node.domain not in ("", "ai.onnx"):
            continue
        wi, zi = where
        w = inits.get(node.input[wi]) if len(node.input) > wi else None
        if w is None or w.data_type != onnx.TensorProto.INT8:
            continue
        zp_name = node.input[zi] if len(node.input) > zi else ""
        zp = inits.get(zp_name) if zp_name else None
        if zp_name and (zp is None or zp.data_type != onnx.TensorProto.INT8):
            continue  # a zero point computed at run time: left as it is
        wu = (numpy_helper.to_array(w).astype(np.int16) + 128).astype(np.uint8)
        zpu = (numpy_helper.to_array(zp).astype(np.int16) + 128).astype(np.uint8) if zp else np.uint8(128)
        wname, zname = f"{node.input[wi]}__u8_{n}", f"{zp_name or 'b_zero_point'}__u8_{n}"
        model.graph.initializer.extend([numpy_helper.from_array(wu, wname),
                                        numpy_helper.from_array(np.asarray(zpu), zname)])
        inputs = list(node.input)
        while len(inputs) <= zi:
            inputs.append("")
        inputs[wi], inputs[zi] = wname, zname
        del node.input[:]
        node.input.extend(inputs)
        changed = True
    return model if changed else None


def session(path, opts):
    model = exact_integer_products(onnx.load(path))
    if model is None:
        return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def main(dirs):
    for d in dirs:
        path = os.path.join(d, "model.onnx")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # errors only: unused-initializer warnings are noise here
        sess = session(path, opts)
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
