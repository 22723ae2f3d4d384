#!/usr/bin/env python3
"""Small ONNX models exercising the compiler's fusions and layout handling, for numerical
checks against ONNX Runtime:

    .venv/bin/python crates/compiler/tests/numerics/make_models.py /tmp/fusions
    .venv/bin/python scripts/ort_oracle.py /tmp/fusions/*
    ./target/release/nrt conformance /tmp/fusions

Each model is written as DIR/<name>/model.onnx (ort_oracle.py adds the inputs and ONNX
Runtime's outputs). `tests/fusion.rs` checks what these patterns lower to; this checks that
the numbers are right.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(11)


def f32(name, arr):
    return numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name)


def i64(name, arr):
    return numpy_helper.from_array(np.asarray(arr, dtype=np.int64), name)


def w(name, shape, scale=0.2):
    return f32(name, scale * RNG.standard_normal(shape))


def save(out, name, nodes, inputs, outputs, inits, opset=17, elem=TensorProto.FLOAT):
    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, elem, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, elem, s) for n, s in outputs],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    onnx.save(m, os.path.join(d, "model.onnx"))


def N(op, ins, outs, **kw):
    return helper.make_node(op, ins, outs, **kw)


def gelu_models(out):
    k = np.sqrt(2 / np.pi)
    consts = [f32("three", 3.0), f32("c", 0.044715), f32("k", k), f32("one", 1.0),
              f32("half", 0.5), f32("two", 2.0), w("W", (8, 16)), w("b", (16,), 0.5)]
    head = [N("MatMul", ["X", "W"], ["mm"]), N("Add", ["b", "mm"], ["f"])]
    variants = {
        "gelu_tanh_a": [
            N("Pow", ["f", "three"], ["x3"]), N("Mul", ["x3", "c"], ["cx3"]),
            N("Add", ["f", "cx3"], ["in"]), N("Mul", ["in", "k"], ["sc"]),
            N("Tanh", ["sc"], ["t"]), N("Add", ["t", "one"], ["p"]),
            N("Mul", ["f", "half"], ["hx"]), N("Mul", ["hx", "p"], ["Y"]),
        ],
        "gelu_tanh_b": [
            N("Mul", ["f", "f"], ["x2"]), N("Mul", ["x2", "f"], ["x3"]),
            N("Mul", ["c", "x3"], ["cx3"]), N("Add", ["cx3", "f"], ["in"]),
            N("Mul", ["k", "in"], ["sc"]), N("Tanh", ["sc"], ["t"]),
            N("Sum", ["one", "t"], ["p"]), N("Mul", ["p", "f"], ["xp"]),
            N("Mul", ["half", "xp"], ["Y"]),
        ],
        "gelu_erf": [
            N("Sqrt", ["two"], ["s2"]), N("Div", ["f", "s2"], ["d"]), N("Erf", ["d"], ["e"]),
            N("Add", ["e", "one"], ["p"]), N("Mul", ["f", "p"], ["xp"]),
            N("Div", ["xp", "two"], ["Y"]),
        ],
        # x/1.5 inside erf: not a GELU, computed as written.
        "erf_near_miss": [
            N("Div", ["f", "three"], ["d"]), N("Erf", ["d"], ["e"]),
            N("Add", ["e", "one"], ["p"]), N("Mul", ["f", "p"], ["xp"]),
            N("Mul", ["xp", "half"], ["Y"]),
        ],
    }
    for name, body in variants.items():
        save(out, name, head + body, [("X", [4, 8])], [("Y", [4, 16])], consts)


def attention(out, scale_op):
    s, h, heads = 8, 16, 2
    dh = h // heads
    nodes, inits = [], [i64("sh", [1, s, heads, dh]), i64("mg", [1, s, h])]
    for p in "qkv":
        inits += [w(f"W{p}", (h, h)), w(f"b{p}", (h,))]
        nodes += [
            N("MatMul", ["X", f"W{p}"], [f"{p}m"]), N("Add", [f"{p}m", f"b{p}"], [f"{p}l"]),
            N("Reshape", [f"{p}l", "sh"], [f"{p}r"]),
            N("Transpose", [f"{p}r"], [f"{p}h"], perm=[0, 2, 1, 3]),
        ]
    sc = 1 / np.sqrt(dh) if scale_op == "Mul" else np.sqrt(dh)
    inits += [f32("sc", sc), w("Wo", (h, h))]
    nodes += [
        N("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
        N("MatMul", ["qh", "kt"], ["qk"]), N(scale_op, ["qk", "sc"], ["scores"]),
        N("Softmax", ["scores"], ["pr"], axis=-1), N("MatMul", ["pr", "vh"], ["ctx"]),
        N("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
        N("Reshape", ["ct", "mg"], ["cm"]), N("MatMul", ["cm", "Wo"], ["o"]),
        N("Add", ["X", "o"], ["Y"]),
    ]
    save(out, f"attention_{scale_op.lower()}", nodes, [("X", [1, s, h])], [("Y", [1, s, h])],
         inits)


def layouts(out):
    # A producer writing the transposed layout, then a reshape into the output.
    save(out, "transposed_producer", [
        N("MatMul", ["X", "W"], ["mm"]), N("Transpose", ["mm"], ["t"], perm=[1, 0]),
        N("Reshape", ["t", "s"], ["Y"]),
    ], [("X", [3, 4])], [("Y", [18])], [w("W", (4, 6)), i64("s", [18])])
    # A transposed view reshaped across the transposed dims: a dense copy is needed.
    save(out, "strided_reshape", [
        N("Relu", ["X"], ["r"]), N("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        N("Reshape", ["t", "s"], ["u"]), N("Sigmoid", ["u"], ["Y"]),
    ], [("X", [2, 3, 4])], [("Y", [2, 12])], [i64("s", [2, 12])])
    # A value read by a Transpose and an elementwise op: never overwritten in place.
    save(out, "no_in_place_under_a_view", [
        N("Relu", ["X"], ["r"]), N("Transpose", ["r"], ["t"], perm=[1, 0]),
        N("Transpose", ["t"], ["tt"], perm=[1, 0]), N("Add", ["r", "tt"], ["a"]),
        N("Sum", ["a", "r", "a"], ["Y"]),
    ], [("X", [4, 4])], [("Y", [4, 4])], [])


def gemm_and_pow(out):
    save(out, "gemm_beta_relu", [
        N("Gemm", ["X", "W", "b"], ["g"], transB=1, beta=0.5), N("Relu", ["g"], ["r"]),
        N("Gemm", ["r", "W2", "b2"], ["Y"]),
    ], [("X", [5, 4])], [("Y", [5, 3])], [w("W", (6, 4)), w("b", (6,)), w("W2", (6, 3)),
                                          w("b2", (3,))])
    for e in [3.0, 4.0, -1.0, -0.5]:
        name = f"pow_{str(e).replace('-', 'm').replace('.', '_')}"
        save(out, name, [
            N("Abs", ["X"], ["a"]), N("Add", ["a", "one"], ["p"]),
            N("Pow", ["p", "e"], ["Y"]),
        ], [("X", [3, 5])], [("Y", [3, 5])], [f32("one", 1.0), f32("e", e)])


def convs(out):
    for name, (c, o, k, s, g, p) in {
        "conv_s2": (4, 6, 3, 2, 1, 1),
        "conv_groups": (4, 6, 3, 1, 2, 0),
        "conv_depthwise": (4, 4, 3, 1, 4, 1),
        "conv_pointwise": (4, 6, 1, 1, 1, 0),
    }.items():
        hw = 9
        oh = (hw + 2 * p - k) // s + 1
        save(out, name, [
            N("Conv", ["X", "W", "b"], ["c"], kernel_shape=[k, k], strides=[s, s],
              pads=[p] * 4, group=g),
            N("Relu", ["c"], ["Y"]),
        ], [("X", [1, c, hw, hw])], [("Y", [1, o, oh, oh])],
            [w("W", (o, c // g, k, k)), w("b", (o,))])


def batch_norms(out):
    def bn(p, ch):
        return [w(f"{p}s", (ch,), 1.0), w(f"{p}b", (ch,)), w(f"{p}m", (ch,)),
                f32(f"{p}v", 0.5 + RNG.random(ch))]
    # Folded into the convolution (with and without a conv bias), then BN + Relu alone.
    save(out, "conv_bn_relu", [
        N("Conv", ["X", "W", "cb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        N("BatchNormalization", ["c", "as", "ab", "am", "av"], ["n"]),
        N("Relu", ["n"], ["r"]),
        N("Conv", ["r", "W2"], ["c2"], kernel_shape=[1, 1]),
        N("BatchNormalization", ["c2", "bs", "bb", "bm", "bv"], ["n2"]),
        N("BatchNormalization", ["n2", "cs", "cb2", "cm", "cv"], ["n3"]),
        N("Relu", ["n3"], ["Y"]),
    ], [("X", [1, 3, 6, 6])], [("Y", [1, 5, 6, 6])],
        [w("W", (4, 3, 3, 3)), w("cb", (4,)), w("W2", (5, 4, 1, 1))]
        + bn("a", 4) + bn("b", 5) + [w("cs", (5,), 1.0), w("cb2", (5,)), w("cm", (5,)),
                                     f32("cv", 0.5 + RNG.random(5))], opset=13)


def pools(out):
    for op in ["MaxPool", "AveragePool"]:
        kw = dict(kernel_shape=[2, 3, 3], strides=[2, 1, 2], pads=[1, 1, 0, 0, 1, 1],
                  ceil_mode=1)
        if op == "AveragePool":
            kw["count_include_pad"] = 1
        save(out, f"{op.lower()}_3d", [N(op, ["X"], ["Y"], **kw)],
             [("X", [1, 2, 5, 6, 7])], [("Y", [1, 2, 3, 6, 4])], [], opset=19)
    # Ceil-mode overhang without padding, padding counted: the overhang is not counted.
    save(out, "avgpool_2d_ceil_count_pad", [
        N("AveragePool", ["X"], ["Y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1,
          count_include_pad=1),
    ], [("X", [1, 2, 6, 6])], [("Y", [1, 2, 3, 3])], [], opset=19)
    for pw in [1, 3]:
        save(out, f"lppool_p{pw}", [
            N("LpPool", ["X"], ["Y"], kernel_shape=[2, 3], strides=[2, 2], pads=[1, 0, 1, 1],
              p=pw),
        ], [("X", [1, 2, 5, 6])], [("Y", [1, 2, 3, 3])], [], opset=18)
    save(out, "lrn", [N("LRN", ["X"], ["Y"], size=5, alpha=0.01, beta=0.6, bias=1.5)],
         [("X", [1, 6, 5, 5])], [("Y", [1, 6, 5, 5])], [], opset=13)


def concats(out):
    # Branches written straight into their part of a Concat (dense parts at batch 1,
    # strided at batch 2), one Concat input also read elsewhere, one a graph input.
    for batch in [1, 2]:
        save(out, f"concat_branches_b{batch}", [
            N("Conv", ["X", "W1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            N("Relu", ["c1"], ["r1"]),
            N("Conv", ["X", "W2"], ["c2"], kernel_shape=[1, 1]),
            N("MaxPool", ["X"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            N("Sigmoid", ["c2"], ["s2"]),
            N("Concat", ["r1", "c2", "p", "X"], ["cat"], axis=1),
            N("Add", ["cat", "cat"], ["d"]),
            N("Concat", ["d", "s2"], ["Y"], axis=1),
        ], [("X", [batch, 3, 5, 5])], [("Y", [batch, 20, 5, 5])],
            [w("W1", (4, 3, 3, 3)), w("W2", (5, 3, 1, 1))], opset=13)


def norms(out):
    # LayerNormalization over an axis of size 1 (the output is the bias), instance and group
    # norms (per-channel parameters).
    save(out, "layernorm_axis_of_one", [
        N("LayerNormalization", ["X", "g", "b"], ["Y"], axis=-1),
    ], [("X", [3, 4, 1])], [("Y", [3, 4, 1])], [w("g", (1,)), w("b", (1,))], opset=17)
    save(out, "instance_norm", [
        N("InstanceNormalization", ["X", "s", "b"], ["Y"], epsilon=1e-3),
    ], [("X", [2, 3, 4, 5])], [("Y", [2, 3, 4, 5])], [w("s", (3,), 1.0), w("b", (3,))])
    save(out, "group_norm", [
        N("GroupNormalization", ["X", "s", "b"], ["Y"], num_groups=2),
    ], [("X", [2, 4, 3, 3])], [("Y", [2, 4, 3, 3])], [w("s", (4,), 1.0), w("b", (4,))],
        opset=21)


def nested_concat(out):
    save(out, "concat_nested", [
        N("Relu", ["X"], ["a"]), N("Sigmoid", ["X"], ["b"]), N("Tanh", ["X"], ["c"]),
        N("Concat", ["a", "b"], ["ab"], axis=1), N("Concat", ["c", "ab"], ["Y"], axis=1),
    ], [("X", [1, 2, 3])], [("Y", [1, 6, 3])], [], opset=13)


def cumsums(out):
    for axis in [0, 1, 2]:
        for exclusive in [0, 1]:
            for reverse in [0, 1]:
                save(out, f"cumsum_a{axis}_e{exclusive}_r{reverse}", [
                    N("CumSum", ["X", "axis"], ["Y"], exclusive=exclusive, reverse=reverse),
                ], [("X", [3, 5, 4])], [("Y", [3, 5, 4])], [i64("axis", axis)], opset=14)


def computed_operands(out):
    # Clip whose bounds other nodes compute (issue 13): read on the device at execution time,
    # not folded. Both bounds from the input, only one, and one constant with one computed.
    lo = [N("ReduceMean", ["X"], ["lo"], keepdims=0),
          N("Add", ["lo", "half"], ["hi"])]
    save(out, "clip_computed_bounds", lo + [N("Clip", ["X", "lo", "hi"], ["Y"])],
         [("X", [3, 5])], [("Y", [3, 5])], [f32("half", 0.5)], opset=13)
    save(out, "clip_computed_min_only", lo + [N("Clip", ["X", "lo"], ["Y"])],
         [("X", [3, 5])], [("Y", [3, 5])], [f32("half", 0.5)], opset=13)
    save(out, "clip_computed_max_constant_min", lo + [N("Clip", ["X", "neg", "hi"], ["Y"])],
         [("X", [2, 3, 4])], [("Y", [2, 3, 4])], [f32("half", 0.5), f32("neg", -0.25)],
         opset=13)


def f16(name, shape, scale=0.2):
    return numpy_helper.from_array((scale * RNG.standard_normal(shape)).astype(np.float16), name)


def halves(out):
    # float16 models (issue 13): f32-only operators (MatMul, Gemm, Conv, pooling, norms,
    # Softmax, reductions) run on f16 tensors through f32 (compiler/src/widen.rs); the
    # elementwise ones widen themselves. ONNX Runtime computes them on its CPU backend.
    H = TensorProto.FLOAT16
    save(out, "f16_mlp", [
        N("MatMul", ["X", "W1"], ["h"]), N("Add", ["h", "b1"], ["a"]), N("Relu", ["a"], ["r"]),
        N("Gemm", ["r", "W2", "b2"], ["Y"], transB=1),
    ], [("X", [4, 16])], [("Y", [4, 8])],
        [f16("W1", (16, 32)), f16("b1", (32,), 0.5), f16("W2", (8, 32)), f16("b2", (8,), 0.5)],
        elem=H)
    save(out, "f16_conv_pool", [
        N("Conv", ["X", "K", "kb"], ["c"], pads=[1, 1, 1, 1]),
        N("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        N("GlobalAveragePool", ["p"], ["Y"]),
    ], [("X", [1, 3, 8, 8])], [("Y", [1, 4, 1, 1])], [f16("K", (4, 3, 3, 3)), f16("kb", (4,))],
        elem=H)
    save(out, "f16_layernorm_softmax", [
        N("LayerNormalization", ["X", "g", "b"], ["n"], axis=-1),
        N("Softmax", ["n"], ["s"], axis=-1),
        N("ReduceSum", ["s", "ax"], ["Y"], keepdims=1),
    ], [("X", [2, 3, 8])], [("Y", [2, 1, 8])],
        [f16("g", (8,), 1.0), f16("b", (8,)), i64("ax", [1])], elem=H)


def doubles(out):
    # double models (issue 13): storage only, computed in f32 (compiler/src/widen.rs); ONNX
    # Runtime computes them in double.
    D = TensorProto.DOUBLE
    d = lambda name, shape, scale=0.2: numpy_helper.from_array(
        (scale * RNG.standard_normal(shape)).astype(np.float64), name)
    save(out, "f64_mlp_logsumexp", [
        N("MatMul", ["X", "W"], ["h"]), N("Add", ["h", "b"], ["a"]), N("Tanh", ["a"], ["t"]),
        N("ReduceLogSumExp", ["t", "ax"], ["Y"], keepdims=1),
    ], [("X", [3, 8])], [("Y", [3, 1])], [d("W", (8, 6)), d("b", (6,)), i64("ax", [1])],
        opset=18, elem=D)


def decoder_block(out):
    # A decoder block with a KV cache passed in and out (issue 13): LayerNorm, Q/K/V
    # projections, Attention (opset 23: 3-D inputs, grouped-query heads 4/2, causal, past
    # and present key/value), output projection and the residual.
    hid, hq, hkv, d, past = 16, 4, 2, 4, 3
    nodes = [
        N("LayerNormalization", ["X", "g", "b"], ["n"], axis=-1),
        N("MatMul", ["n", "Wq"], ["q"]), N("MatMul", ["n", "Wk"], ["k"]),
        N("MatMul", ["n", "Wv"], ["v"]),
        N("Attention", ["q", "k", "v", "", "past_key", "past_value"],
          ["a", "present_key", "present_value"], is_causal=1, q_num_heads=hq,
          kv_num_heads=hkv),
        N("MatMul", ["a", "Wo"], ["o"]), N("Add", ["X", "o"], ["Y"]),
    ]
    g = helper.make_graph(
        nodes, "decoder_block",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 5, hid]),
         helper.make_tensor_value_info("past_key", TensorProto.FLOAT, [1, hkv, past, d]),
         helper.make_tensor_value_info("past_value", TensorProto.FLOAT, [1, hkv, past, d])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 5, hid]),
         helper.make_tensor_value_info("present_key", TensorProto.FLOAT, [1, hkv, past + 5, d]),
         helper.make_tensor_value_info("present_value", TensorProto.FLOAT,
                                       [1, hkv, past + 5, d])],
        [w("g", (hid,), 1.0), w("b", (hid,)), w("Wq", (hid, hq * d)), w("Wk", (hid, hkv * d)),
         w("Wv", (hid, hkv * d)), w("Wo", (hq * d, hid))],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    dd = os.path.join(out, "decoder_block_kv_cache")
    os.makedirs(dd, exist_ok=True)
    onnx.save(m, os.path.join(dd, "model.onnx"))


def main():
    out = sys.argv[1]
    decoder_block(out)
    halves(out)
    doubles(out)
    computed_operands(out)
    gelu_models(out)
    attention(out, "Mul")
    attention(out, "Div")
    layouts(out)
    gemm_and_pow(out)
    convs(out)
    batch_norms(out)
    pools(out)
    cumsums(out)
    norms(out)
    concats(out)
    nested_concat(out)


if __name__ == "__main__":
    main()
