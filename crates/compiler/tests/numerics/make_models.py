#!/usr/bin/env python3
"""Small ONNX models exercising the compiler's fusions and layout handling, for numerical
checks against ONNX Runtime:

    .venv/bin/python crates/compiler/tests/numerics/make_models.py /tmp/fusions
    .venv/bin/python scripts/ort_oracle.py /tmp/fusions/*
    ./target/release/nrt conformance /tmp/fusions

Each model is written as DIR/<name>/model.onnx (ort_oracle.py adds the inputs and ONNX
Runtime's outputs). `tests/fusion*.rs` check what these patterns lower to; this checks that
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

def quantized_attention(out):
    # The quantized-transformer pieces (issue 13) in one graph, at sizes that leave partial
    # tiles in the int8 kernel (M = 13 rows, K = 70, N = 40 columns): a dynamically
    # quantized activation times int8 weights (MatMulInteger), dequantized; TopK over it,
    # GatherElements with TopK's indices, GatherND / ScatterND of whole rows (reduction add),
    # and a per-axis QuantizeLinear / DequantizeLinear round trip.
    wq = RNG.integers(-64, 64, (70, 40)).astype(np.int8)
    inits = [
        numpy_helper.from_array(wq, "Wq"),
        numpy_helper.from_array(np.array(3, dtype=np.int8), "wzp"),
        f32("wscale", 0.02),
        i64("K", [5]),
        i64("rows_from", [[0, 7], [0, 1], [0, 7]]),
        i64("rows_to", [[0, 2], [0, 5], [0, 2]]),
        f32("qscale", RNG.uniform(0.01, 0.05, 40)),
        numpy_helper.from_array(RNG.integers(100, 156, 40).astype(np.uint8), "qzp"),
    ]
    nodes = [
        N("DynamicQuantizeLinear", ["X"], ["xq", "xs", "xzp"]),
        N("MatMulInteger", ["xq", "Wq", "xzp", "wzp"], ["acc"]),
        N("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        N("Mul", ["xs", "wscale"], ["s"]),
        N("Mul", ["accf", "s"], ["Y1"]),
        N("TopK", ["Y1", "K"], ["top", "top_i"], axis=-1),
        N("GatherElements", ["Y1", "top_i"], ["picked"], axis=2),
        N("Sub", ["picked", "top"], ["Y2"]),
        N("GatherND", ["Y1", "rows_from"], ["rows"]),
        N("ScatterND", ["Y1", "rows_to", "rows"], ["Y3"], reduction="add"),
        N("QuantizeLinear", ["Y3", "qscale", "qzp"], ["q"], axis=2),
        N("DequantizeLinear", ["q", "qscale", "qzp"], ["Y4"], axis=2),
    ]
    save(out, "quantized_attention_pieces", nodes, [("X", [1, 13, 70])],
         [("Y1", [1, 13, 40]), ("top", [1, 13, 5]), ("Y2", [1, 13, 5]), ("Y3", [1, 13, 40]),
          ("Y4", [1, 13, 40])], inits, opset=18)


def int8_dequantizing_products(out):
    # The dequantizing integer product (MatMulInteger + Cast + Mul fused into one instruction
    # with packed constant weights): u8 weights with a per-column zero point and a
    # per-column scale; i8 weights whose product feeds a graph output and another reader
    # (not fused: the i32 result is kept); K = 37 and N = 45 leave tails in the 4-byte words
    # and the 32-column tile.
    w8 = RNG.integers(0, 256, (37, 45)).astype(np.uint8)
    wi = RNG.integers(-128, 128, (37, 45)).astype(np.int8)
    inits = [
        numpy_helper.from_array(w8, "Wu"),
        numpy_helper.from_array(RNG.integers(100, 156, 45).astype(np.uint8), "wuzp"),
        f32("colscale", RNG.uniform(0.001, 0.01, 45)),
        numpy_helper.from_array(wi, "Wi"),
    ]
    nodes = [
        N("DynamicQuantizeLinear", ["X"], ["xq", "xs", "xzp"]),
        N("MatMulInteger", ["xq", "Wu", "xzp", "wuzp"], ["acc"]),
        N("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        N("Mul", ["colscale", "accf"], ["Y1"]),
        N("MatMulInteger", ["xq", "Wi", "xzp"], ["acc2"]),
        N("Cast", ["acc2"], ["acc2f"], to=TensorProto.FLOAT),
        N("Mul", ["acc2f", "xs"], ["Y2"]),
        N("Cast", ["acc2"], ["Y3"], to=TensorProto.FLOAT),
    ]
    save(out, "int8_dequantizing_products", nodes, [("X", [2, 9, 37])],
         [("Y1", [2, 9, 45]), ("Y2", [2, 9, 45]), ("Y3", [2, 9, 45])], inits, opset=18)


def recurrent(out):
    # Recurrent networks unrolled on the device (issue 13), against ONNX Runtime: a
    # streaming LSTM step block with its state in and out (Y omitted, peepholes, biases), a
    # bidirectional GRU with linear_before_reset, a reverse RNN with clip. (ONNX Runtime
    # refuses layout = 1; the node tests' *_batchwise cases check it.)
    s, b, i, h = 6, 3, 5, 7
    save(out, "lstm_streaming_state", [
        N("LSTM", ["X", "W", "R", "B", "", "H0", "C0", "P"], ["", "Yh", "Yc"], hidden_size=h)],
        [("X", [s, b, i]), ("H0", [1, b, h]), ("C0", [1, b, h])],
        [("Yh", [1, b, h]), ("Yc", [1, b, h])],
        [w("W", (1, 4 * h, i), 0.4), w("R", (1, 4 * h, h), 0.4), w("B", (1, 8 * h), 0.3),
         w("P", (1, 3 * h), 0.3)], opset=14)
    save(out, "gru_bidirectional", [
        N("GRU", ["X", "W", "R", "B", "", "H0"], ["Y", "Yh"], hidden_size=h,
          direction="bidirectional", linear_before_reset=1)],
        [("X", [s, b, i]), ("H0", [2, b, h])],
        [("Y", [s, 2, b, h]), ("Yh", [2, b, h])],
        [w("W", (2, 3 * h, i), 0.4), w("R", (2, 3 * h, h), 0.4), w("B", (2, 6 * h), 0.3)],
        opset=14)
    save(out, "rnn_reverse_clip", [
        N("RNN", ["X", "W", "R", "B"], ["Y", "Yh"], hidden_size=h, direction="reverse",
          clip=0.5)],
        [("X", [s, b, i])], [("Y", [s, 1, b, h]), ("Yh", [1, b, h])],
        [w("W", (1, h, i), 0.5), w("R", (1, h, h), 0.5), w("B", (1, 2 * h), 0.3)], opset=14)


def sequence_lens(out):
    # Recurrent networks over padded batches (issue 13): sequence_lens as a constant and as
    # an input (ONNX Runtime's oracle feeds 0..2 of 6 steps), forward, reverse and
    # bidirectional, with initial state, against ONNX Runtime: Y is zero past each entry's
    # length and Y_h / Y_c are the state at its last step (the reverse direction starts
    # there).
    s, b, i, h = 6, 3, 5, 4
    F, I32 = TensorProto.FLOAT, TensorProto.INT32
    save(out, "lstm_bidirectional_sequence_lens", [
        N("LSTM", ["X", "W", "R", "B", "L", "H0", "C0"], ["Y", "Yh", "Yc"], hidden_size=h,
          direction="bidirectional")],
        [("X", [s, b, i]), ("H0", [2, b, h]), ("C0", [2, b, h])],
        [("Y", [s, 2, b, h]), ("Yh", [2, b, h]), ("Yc", [2, b, h])],
        [w("W", (2, 4 * h, i), 0.4), w("R", (2, 4 * h, h), 0.4), w("B", (2, 8 * h), 0.3),
         numpy_helper.from_array(np.array([6, 2, 4], np.int32), "L")], opset=14)
    save_typed(out, "gru_reverse_sequence_lens_input", [
        N("GRU", ["X", "W", "R", "B", "L"], ["Y", "Yh"], hidden_size=h, direction="reverse")],
        [("X", F, [s, b, i]), ("L", I32, [b])],
        [("Y", F, [s, 1, b, h]), ("Yh", F, [1, b, h])],
        [w("W", (1, 3 * h, i), 0.4), w("R", (1, 3 * h, h), 0.4), w("B", (1, 6 * h), 0.3)],
        opset=14)
    save_typed(out, "rnn_sequence_lens_computed", [
        # The lengths computed in the graph: 1 + (index of each entry's largest first
        # feature over time) — a value only the data decides.
        N("Slice", ["X", "z", "one", "two"], ["x0"]),
        N("ArgMax", ["x0"], ["am"], axis=0, keepdims=0),
        N("Reshape", ["am", "bshape"], ["am1"]),
        N("Add", ["am1", "one64"], ["l64"]),
        N("Cast", ["l64"], ["L"], to=I32),
        N("RNN", ["X", "W", "R", "B", "L", "H0"], ["Y", "Yh"], hidden_size=h)],
        [("X", F, [s, b, i]), ("H0", F, [1, b, h])],
        [("Y", F, [s, 1, b, h]), ("Yh", F, [1, b, h])],
        [w("W", (1, h, i), 0.5), w("R", (1, h, h), 0.5), w("B", (1, 2 * h), 0.3),
         i64("z", [0]), i64("one", [1]), i64("two", [2]), i64("bshape", [b]),
         i64("one64", 1)], opset=14)


def computed_value_operands(out):
    # Operands ONNX Runtime takes at run time and that decide values, not shapes (issue 13):
    # Pad's constant_value, ReverseSequence's sequence_lens (both axis orders), STFT's window,
    # each computed in the graph from the input, against ONNX Runtime.
    F = TensorProto.FLOAT
    save(out, "pad_computed_value", [
        N("ReduceMean", ["X"], ["v"], keepdims=0),
        N("Pad", ["X", "pads", "v"], ["Y"], mode="constant")],
        [("X", [2, 3, 4])], [("Y", [2, 5, 7])], [i64("pads", [0, 1, 2, 0, 1, 1])], opset=13)
    t, b = 5, 3
    save(out, "reverse_sequence_computed_lens", [
        N("Slice", ["X", "z", "one", "two"], ["x0"]),
        N("ArgMax", ["x0"], ["am"], axis=0, keepdims=0),
        N("Reshape", ["am", "bshape"], ["am1"]),
        N("Add", ["am1", "one1"], ["L"]),
        N("ReverseSequence", ["X", "L"], ["Y"], time_axis=0, batch_axis=1),
        N("Transpose", ["X"], ["Xt"], perm=[1, 0, 2]),
        N("ReverseSequence", ["Xt", "L"], ["Yt"], time_axis=1, batch_axis=0)],
        [("X", [t, b, 2])], [("Y", [t, b, 2]), ("Yt", [b, t, 2])],
        [i64("z", [0]), i64("one", [1]), i64("two", [2]), i64("bshape", [b]),
         i64("one1", 1)], opset=13)
    save(out, "stft_computed_window", [
        N("ReduceMean", ["X"], ["m"], keepdims=0),
        N("Mul", ["w0", "m"], ["wm"]),
        N("Sigmoid", ["wm"], ["win"]),
        N("STFT", ["X", "step", "win"], ["Y"])],
        [("X", [1, 32, 1])], [("Y", [1, 3, 9, 2])],
        [i64("step", 8), w("w0", (16,), 2.0)], opset=17)


def if_gated(out):
    # An If whose condition is a shape comparison (folded at compile time, issue 13): the
    # branches read outer-scope values (X, a computed value, an initializer) and the taken
    # branch holds a nested If on a constant.
    def branch(name, nodes, outs, inits=()):
        return helper.make_graph(nodes, name, [],
                                 [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                  for o in outs], list(inits))
    inner_then = branch("inner_then", [N("Mul", ["t", "two"], ["y_in"])], ["y_in"],
                        [f32("two", 2.0)])
    inner_else = branch("inner_else", [N("Neg", ["t"], ["y_in2"])], ["y_in2"])
    then_g = branch("then", [
        N("Relu", ["X"], ["r"]),
        N("Add", ["r", "bias"], ["t"]),
        N("If", ["always"], ["y_then"], then_branch=inner_then, else_branch=inner_else),
    ], ["y_then"], [numpy_helper.from_array(np.array(True), "always")])
    else_g = branch("else", [N("Sub", ["X", "s"], ["y_else"])], ["y_else"])
    nodes = [
        N("ReduceSum", ["X"], ["s"], keepdims=1),
        N("Shape", ["X"], ["shp"]),
        N("Gather", ["shp", "one"], ["d1"]),
        N("Greater", ["d1", "four"], ["wide"]),
        N("If", ["wide"], ["Y"], then_branch=then_g, else_branch=else_g),
    ]
    inits = [i64("one", 1), i64("four", 4), w("bias", (6,), 0.5)]
    save(out, "if_shape_gated", nodes, [("X", [3, 6])], [("Y", [3, 6])], inits, opset=13)


def if_runtime(out):
    # Ifs whose conditions are computed at run time (issue 13): both branches predicated on
    # the device (Op::Guard), each output selected by a Where. `c` (sum |X| >= 0) always
    # holds but is not known at compile time; the first If takes its then branch, the second
    # (on Not c) its else branch, so each run has a branch taken and one not taken on either
    # side. The branches not taken gather rows far past X's end (argmax + 100): they must not
    # run (ONNX Runtime never runs them). The taken then-branch nests an If on a data-dependent
    # condition (max X > 0.5) and reads outer values (X, an initializer, a computed value).
    def branch(name, nodes, outs, inits=()):
        return helper.make_graph(nodes, name, [],
                                 [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                  for o in outs], list(inits))

    def oob(name, tag):
        return branch(name, [
            N("ArgMax", ["X"], [f"am{tag}"], axis=1, keepdims=0),
            N("Add", [f"am{tag}", "hundred"], [f"rows{tag}"]),
            N("Gather", ["X", f"rows{tag}"], [f"g{tag}"], axis=0),
        ], [f"g{tag}"])

    inner_then = branch("inner_then", [N("Mul", ["r", "s"], ["y2"])], ["y2"])
    inner_else = branch("inner_else", [N("Neg", ["r"], ["y3"])], ["y3"])
    taken_then = branch("taken_then", [
        N("MatMul", ["X", "W1"], ["h"]),
        N("Relu", ["h"], ["r"]),
        N("If", ["big"], ["yt"], then_branch=inner_then, else_branch=inner_else),
    ], ["yt"])
    taken_else = branch("taken_else", [
        N("MatMul", ["X", "W2"], ["h2"]),
        N("Sigmoid", ["h2"], ["ye"]),
    ], ["ye"])
    nodes = [
        N("Abs", ["X"], ["ax"]),
        N("ReduceSum", ["ax"], ["sa"], keepdims=0),
        N("GreaterOrEqual", ["sa", "zero"], ["c"]),
        N("Not", ["c"], ["nc"]),
        N("ReduceMax", ["X"], ["m"], keepdims=0),
        N("Greater", ["m", "half"], ["big"]),
        N("ReduceMean", ["X"], ["s"], keepdims=1),
        N("If", ["c"], ["Y1"], then_branch=taken_then, else_branch=oob("oob_else", "a")),
        N("If", ["nc"], ["Y2"], then_branch=oob("oob_then", "b"), else_branch=taken_else),
    ]
    inits = [w("W1", (8, 8)), w("W2", (8, 8)), f32("zero", 0.0), f32("half", 0.5),
             i64("hundred", 100)]
    save(out, "if_run_time", nodes, [("X", [4, 8])], [("Y1", [4, 8]), ("Y2", [4, 8])],
         inits, opset=13)


def blocked_qdq(out):
    # Blocked quantization (opset 21) with a ragged last block: 10 columns in blocks of 4.
    qs = RNG.uniform(0.01, 0.05, (3, 3)).astype(np.float32)
    qz = RNG.integers(100, 156, (3, 3)).astype(np.uint8)
    save(out, "blocked_quantize_dequantize", [
        N("QuantizeLinear", ["X", "qs", "qz"], ["q"], axis=1, block_size=4),
        N("DequantizeLinear", ["q", "qs", "qz"], ["Y"], axis=1, block_size=4)],
        [("X", [3, 10])], [("Y", [3, 10])],
        [numpy_helper.from_array(qs, "qs"), numpy_helper.from_array(qz, "qz")], opset=21)


def quantized_convs(out):
    # QLinearConv (u8 activations, i8 weights with per-channel scales, i32 bias, padding,
    # stride 2) and ConvInteger (u8 x u8 with zero points), on a quantized float input.
    wq = RNG.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8)
    wc = RNG.integers(0, 255, (2, 3, 2, 2)).astype(np.uint8)
    inits = [
        f32("xs", 0.05), numpy_helper.from_array(np.array(128, np.uint8), "xz"),
        numpy_helper.from_array(wq, "Wq"), f32("ws", RNG.uniform(0.005, 0.02, 4)),
        numpy_helper.from_array(np.zeros(4, np.int8), "wz"),
        f32("ys", 0.1), numpy_helper.from_array(np.array(100, np.uint8), "yz"),
        numpy_helper.from_array(RNG.integers(-500, 500, 4).astype(np.int32), "B"),
        numpy_helper.from_array(wc, "Wc"), numpy_helper.from_array(np.array(7, np.uint8), "wcz"),
    ]
    nodes = [
        N("QuantizeLinear", ["X", "xs", "xz"], ["xq"]),
        N("QLinearConv", ["xq", "xs", "xz", "Wq", "ws", "wz", "ys", "yz", "B"], ["yq"],
          pads=[1, 1, 1, 1], strides=[2, 2]),
        N("DequantizeLinear", ["yq", "ys", "yz"], ["Y"]),
        N("ConvInteger", ["xq", "Wc", "xz", "wcz"], ["ci"], pads=[0, 1, 1, 0]),
        N("Cast", ["ci"], ["Y2"], to=TensorProto.FLOAT),
    ]
    save(out, "quantized_convs", nodes, [("X", [1, 3, 9, 9])],
         [("Y", [1, 4, 5, 5]), ("Y2", [1, 2, 9, 9])], inits, opset=13)
def epilogues(out):
    """MatMul/Gemm with what follows fused into the MatMul's epilogue (bias, residual,
    activation, scale), with tails: odd sizes, batches folded into M, several row blocks,
    1-D operands, and a residual not yet computed when the MatMul runs (no fusion)."""
    save(out, "epi_mlp_bias_relu", [
        N("MatMul", ["X", "W1"], ["h1"]), N("Add", ["h1", "b1"], ["a1"]), N("Relu", ["a1"], ["r1"]),
        N("MatMul", ["r1", "W2"], ["h2"]), N("Add", ["b2", "h2"], ["a2"]), N("Relu", ["a2"], ["Y"]),
    ], [("X", [2, 33, 48])], [("Y", [2, 33, 37])],
        [w("W1", (48, 40)), w("b1", (40,)), w("W2", (40, 37)), w("b2", (37,))])
    save(out, "epi_bias_residual", [
        N("MatMul", ["X", "W"], ["h"]), N("Add", ["h", "b"], ["hb"]), N("Add", ["X", "hb"], ["Y"]),
    ], [("X", [2, 5, 16])], [("Y", [2, 5, 16])], [w("W", (16, 16)), w("b", (16,))])
    save(out, "epi_residual_sigmoid", [
        N("MatMul", ["X", "W"], ["h"]), N("Add", ["h", "R"], ["s"]), N("Sigmoid", ["s"], ["Y"]),
    ], [("X", [7, 12]), ("R", [7, 9])], [("Y", [7, 9])], [w("W", (12, 9))])
    save(out, "epi_scale_bias_tanh", [
        N("MatMul", ["X", "W"], ["h"]), N("Mul", ["h", "s"], ["hs"]), N("Add", ["hs", "b"], ["a"]),
        N("Tanh", ["a"], ["Y"]),
    ], [("X", [3, 10])], [("Y", [3, 11])], [w("W", (10, 11)), w("b", (11,)), f32("s", 0.125)])
    save(out, "epi_gemm_full_c_leaky", [
        N("Gemm", ["X", "W", "C"], ["g"], transB=1), N("LeakyRelu", ["g"], ["Y"], alpha=0.2),
    ], [("X", [6, 8]), ("C", [6, 5])], [("Y", [6, 5])], [w("W", (5, 8))])
    save(out, "epi_gemm_c_residual_clip", [
        N("Gemm", ["X", "W", "b"], ["g"], alpha=0.5, beta=2.0), N("Add", ["g", "R"], ["s"]),
        N("Clip", ["s", "lo", "hi"], ["Y"]),
    ], [("X", [9, 4]), ("R", [9, 6])], [("Y", [9, 6])],
        [w("W", (4, 6)), w("b", (6,)), f32("lo", -0.1), f32("hi", 0.2)])
    save(out, "epi_row_blocks", [
        N("MatMul", ["X", "W"], ["h"]), N("Add", ["h", "b"], ["a"]), N("Relu", ["a"], ["Y"]),
    ], [("X", [150, 9])], [("Y", [150, 2048])], [w("W", (9, 2048)), w("b", (2048,))])
    save(out, "epi_matvec_bias", [
        N("MatMul", ["X", "v"], ["h"]), N("Add", ["h", "b"], ["a"]), N("Relu", ["a"], ["Y"]),
    ], [("X", [3, 7, 16])], [("Y", [3, 7])], [w("v", (16,)), f32("b", 0.05)])
    save(out, "epi_vecmat_bias", [
        N("MatMul", ["x", "W"], ["h"]), N("Add", ["h", "b"], ["Y"]),
    ], [("x", [16])], [("Y", [8])], [w("W", (16, 8)), w("b", (8,))])
    save(out, "epi_batched_b_row_bias", [
        N("MatMul", ["X", "W"], ["h"]), N("Add", ["h", "b"], ["a"]), N("Relu", ["a"], ["Y"]),
    ], [("X", [2, 3, 8, 16])], [("Y", [2, 3, 8, 5])], [w("W", (2, 3, 16, 5)), w("b", (8, 1))])
    # R is computed after the MatMul in node order: not fusable, still right.
    save(out, "epi_residual_not_ready", [
        N("MatMul", ["X", "W"], ["h"]), N("Abs", ["Z"], ["R"]), N("Add", ["h", "R"], ["Y"]),
    ], [("X", [4, 6]), ("Z", [4, 3])], [("Y", [4, 3])], [w("W", (6, 3))])
    # The MatMul's result is also a graph output: nothing fuses.
    save(out, "epi_intermediate_output", [
        N("MatMul", ["X", "W"], ["H"]), N("Add", ["H", "b"], ["a"]), N("Relu", ["a"], ["Y"]),
    ], [("X", [4, 6])], [("H", [4, 3]), ("Y", [4, 3])], [w("W", (6, 3)), w("b", (3,))])


def save_typed(out, name, nodes, inputs, outputs, inits, opset):
    """`save` with an element type per input and output: (name, elem, shape)."""
    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs],
        [helper.make_tensor_value_info(n, e, s) for n, e, s in outputs],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    onnx.save(m, os.path.join(d, "model.onnx"))


def einsums(out):
    # Einsum (decomposed into Transpose/Reshape/MatMul/ReduceSum, compiler/src/ops/einsum.rs)
    # with the equations models use: attention scores and context, bilinear forms, outer
    # products, broadcast ellipses, diagonals and traces, three operands, implicit outputs.
    F = TensorProto.FLOAT
    cases = [
        ("attn_scores", "bhqd,bhkd->bhqk", [[2, 3, 4, 8], [2, 3, 5, 8]], [2, 3, 4, 5]),
        ("attn_context", "bhqk,bhkd->bqhd", [[2, 3, 4, 5], [2, 3, 5, 8]], [2, 4, 3, 8]),
        ("proj", "abc,cd->abd", [[2, 3, 6], [6, 4]], [2, 3, 4]),
        ("bilinear", "bn,anm,bm->ba", [[3, 4], [2, 4, 5], [3, 5]], [3, 2]),
        ("outer", "i,j->ij", [[4], [5]], [4, 5]),
        ("ellipsis_bcast", "...ij,...jk->...ik", [[2, 1, 3, 4], [2, 5, 4, 2]], [2, 5, 3, 2]),
        ("trace", "ii", [[5, 5]], []),
        ("diag_mul", "ij,jj->ij", [[3, 4], [4, 4]], [3, 4]),
        ("implicit", "ij,jk", [[3, 4], [4, 2]], [3, 2]),
        ("sum_all", "abc->", [[2, 3, 4]], []),
        ("permute_sum", "abcd->dba", [[2, 3, 4, 5]], [5, 3, 2]),
        ("dot_batch", "bi,bi->b", [[4, 6], [4, 6]], [4]),
    ]
    for name, eq, shapes, oshape in cases:
        ins = [(f"X{k}", F, s) for k, s in enumerate(shapes)]
        save_typed(out, f"einsum_{name}", [
            N("Einsum", [i[0] for i in ins], ["Y"], equation=eq),
        ], ins, [("Y", F, oshape)], [], opset=12)


def bitwise_and_math(out):
    # Bitwise operators and shifts (NCM 1.2 BinaryOps), through i64 for the narrower and
    # unsigned types (full-range inputs from ort_oracle.py), ReduceProd, the inverse
    # trigonometric and hyperbolic functions (NCM 1.2 ActFuncs), IsNaN and IsInf.
    T = TensorProto
    for op, elem, sa, sb in [
        ("BitwiseAnd", T.UINT8, [3, 4], [4]),
        ("BitwiseOr", T.INT16, [2, 3, 4], [3, 1]),
        ("BitwiseXor", T.UINT64, [3, 4], [3, 4]),
        ("BitwiseAnd", T.INT32, [5], [5]),
    ]:
        save_typed(out, f"{op.lower()}_{T.DataType.Name(elem).lower()}", [
            N(op, ["A", "B"], ["Y"]),
        ], [("A", elem, sa), ("B", elem, sb)], [("Y", elem, [max(x, y) for x, y in
            zip([1] * (len(sb) - len(sa)) + sa, [1] * (len(sa) - len(sb)) + sb)])], [],
            opset=18)
    for elem in [T.UINT32, T.INT8]:
        save_typed(out, f"bitwisenot_{T.DataType.Name(elem).lower()}", [
            N("BitwiseNot", ["A"], ["Y"]),
        ], [("A", elem, [3, 4])], [("Y", elem, [3, 4])], [], opset=18)
    for direction, elem, amounts in [
        ("LEFT", T.UINT16, [0, 1, 7, 15]),
        ("RIGHT", T.UINT64, [0, 1, 33, 63]),
        ("RIGHT", T.UINT8, [0, 3, 5, 7]),
    ]:
        dt = {T.UINT16: np.uint16, T.UINT64: np.uint64, T.UINT8: np.uint8}[elem]
        save_typed(out, f"bitshift_{direction.lower()}_{T.DataType.Name(elem).lower()}", [
            N("BitShift", ["A", "k"], ["Y"], direction=direction),
        ], [("A", elem, [3, 4])], [("Y", elem, [3, 4])],
            [numpy_helper.from_array(np.array(amounts, dtype=dt), "k")], opset=11)
    F = TensorProto.FLOAT
    save_typed(out, "reduce_prod_axes", [
        N("ReduceProd", ["X", "ax"], ["Y"], keepdims=0),
    ], [("X", F, [2, 7, 3, 5])], [("Y", F, [2, 3])], [i64("ax", [1, 3])], opset=18)
    save_typed(out, "reduce_prod_all_keep", [
        N("ReduceProd", ["X"], ["Y"], keepdims=1),
    ], [("X", F, [3, 5])], [("Y", F, [1, 1])], [], opset=18)
    save_typed(out, "reduce_prod_i64", [
        N("ReduceProd", ["X", "ax"], ["Y"], keepdims=1),
    ], [("X", T.INT64, [4, 6])], [("Y", T.INT64, [4, 1])], [i64("ax", [1])], opset=18)
    save_typed(out, "trig_inverse_hyperbolic", [
        N("Tanh", ["X"], ["t"]),
        N("Asin", ["t"], ["asin"]), N("Acos", ["t"], ["acos"]), N("Atanh", ["t"], ["atanh"]),
        N("Atan", ["X"], ["atan"]), N("Sinh", ["X"], ["sinh"]), N("Cosh", ["X"], ["cosh"]),
        N("Asinh", ["X"], ["asinh"]), N("Tan", ["X"], ["tan"]),
        N("Abs", ["X"], ["a"]), N("Add", ["a", "one"], ["a1"]), N("Acosh", ["a1"], ["acosh"]),
    ], [("X", F, [4, 6])], [(o, F, [4, 6]) for o in
        ["asin", "acos", "atanh", "atan", "sinh", "cosh", "asinh", "tan", "acosh"]],
        [f32("one", 1.0)], opset=13)
    B = TensorProto.BOOL
    save_typed(out, "isnan_isinf", [
        N("Log", ["X"], ["l"]), N("IsNaN", ["l"], ["nan"]),
        N("Div", ["X", "zero"], ["d"]), N("IsInf", ["d"], ["inf"]),
        N("IsInf", ["d"], ["pinf"], detect_negative=0),
        N("IsInf", ["d"], ["ninf"], detect_positive=0),
    ], [("X", F, [4, 6])], [(o, B, [4, 6]) for o in ["nan", "inf", "pinf", "ninf"]],
        [f32("zero", 0.0)], opset=20)


def f32v(name, arr):
    return numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name)


def resizes(out):
    # Resize modes done as one weight-matrix product per axis (compiler/src/ops/resize.rs):
    # cubic (both coefficient sets, exclude_outside), antialias (linear and cubic), and
    # tf_crop_and_resize with an extrapolation value, on image-like shapes.
    F = TensorProto.FLOAT
    cases = [
        ("cubic_up2_half_pixel", dict(mode="cubic"), [1, 3, 8, 8], [1, 1, 2, 2], None,
         [1, 3, 16, 16]),
        ("cubic_pytorch_sizes", dict(mode="cubic", coordinate_transformation_mode=
                                     "pytorch_half_pixel", cubic_coeff_a=-0.5,
                                     exclude_outside=1), [2, 2, 9, 7], None, [2, 2, 5, 12],
         [2, 2, 5, 12]),
        ("cubic_align_corners_down", dict(mode="cubic", coordinate_transformation_mode=
                                          "align_corners"), [1, 2, 10, 10], [1, 1, 0.6, 0.6],
         None, [1, 2, 6, 6]),
        ("linear_antialias_down", dict(mode="linear", antialias=1), [1, 3, 16, 12],
         [1, 1, 0.25, 0.5], None, [1, 3, 4, 6]),
        ("cubic_antialias_sizes", dict(mode="cubic", antialias=1), [1, 1, 13, 17], None,
         [1, 1, 5, 6], [1, 1, 5, 6]),
        ("tf_crop_extrapolate", dict(mode="linear", coordinate_transformation_mode=
                                     "tf_crop_and_resize", extrapolation_value=-3.0),
         [1, 2, 6, 8], None, [1, 2, 5, 7], [1, 2, 5, 7]),
    ]
    for name, attrs, shape, scales, sizes, oshape in cases:
        inits = [f32v("roi", [0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3]
                      if "tf_crop" in name else [])]
        ins = ["X", "roi"]
        if scales is not None:
            inits.append(f32v("scales", scales))
            ins.append("scales")
        else:
            inits += [f32v("scales", []), i64("sizes", sizes)]
            ins += ["scales", "sizes"]
        save_typed(out, f"resize_{name}", [N("Resize", ins, ["Y"], **attrs)],
                   [("X", F, shape)], [("Y", F, oshape)], inits, opset=18)


def maxpool_indices(out):
    # MaxPool's Indices output (compiler/src/ops/pool.rs: compare-and-select per window
    # offset): pads, strides, dilations, ceil mode, column-major storage_order, 1-D and 3-D.
    F, I = TensorProto.FLOAT, TensorProto.INT64
    cases = [
        ("2d_pads_strides", [2, 3, 9, 8], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                                strides=[2, 2]), [2, 3, 5, 4]),
        ("2d_dilated_ceil", [1, 2, 10, 9], dict(kernel_shape=[2, 3], dilations=[2, 1],
                                                strides=[3, 2], ceil_mode=1), [1, 2, 3, 4]),
        ("2d_column_major", [1, 2, 6, 7], dict(kernel_shape=[2, 2], strides=[2, 2],
                                               storage_order=1), [1, 2, 3, 3]),
        ("1d", [2, 3, 11], dict(kernel_shape=[3], strides=[2], pads=[1, 0]), [2, 3, 5]),
        ("3d", [1, 2, 5, 6, 4], dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2],
                                     pads=[0, 1, 0, 1, 1, 1]), [1, 2, 4, 4, 3]),
    ]
    for name, shape, attrs, oshape in cases:
        save_typed(out, f"maxpool_indices_{name}", [
            N("MaxPool", ["X"], ["Y", "I"], **attrs),
        ], [("X", F, shape)], [("Y", F, oshape), ("I", I, oshape)], [], opset=12)


def small_ops(out):
    # OneHot (run-time indices and values), Compress (a constant condition), CenterCropPad,
    # integer CumSum (a scan of DVE adds), MeanVarianceNormalization, EyeLike, the windows.
    F, I, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
    save_typed(out, "onehot_axis1", [
        N("Sub", ["idx", "one"], ["i"]), N("OneHot", ["i", "depth", "vals"], ["Y"], axis=1),
    ], [("idx", I, [3, 4]), ("vals", F, [2])], [("Y", F, [3, 5, 4])],
        [i64("one", 1), f32v("depth", [5.0])], opset=11)
    save_typed(out, "compress_axis0", [
        N("Compress", ["X", "cond"], ["Y"], axis=0),
    ], [("X", F, [6, 4])], [("Y", F, [3, 4])],
        [numpy_helper.from_array(np.array([1, 0, 1, 1, 0], dtype=bool), "cond")], opset=11)
    save_typed(out, "compress_flat", [
        N("Compress", ["X", "cond"], ["Y"]),
    ], [("X", F, [2, 3])], [("Y", F, [3])],
        [numpy_helper.from_array(np.array([0, 1, 1, 0, 1], dtype=bool), "cond")], opset=11)
    save_typed(out, "center_crop_pad_mixed", [
        N("CenterCropPad", ["X", "shape"], ["Y"], axes=[1, 2]),
    ], [("X", F, [2, 7, 4, 3])], [("Y", F, [2, 4, 9, 3])], [i64("shape", [4, 9])],
        opset=18)
    save_typed(out, "cumsum_i32_reverse_exclusive", [
        N("CumSum", ["X", "axis"], ["Y"], reverse=1, exclusive=1),
    ], [("X", I32, [3, 7])], [("Y", I32, [3, 7])], [i64("axis", 1)], opset=14)
    save_typed(out, "mvn_default", [N("MeanVarianceNormalization", ["X"], ["Y"])],
               [("X", F, [2, 3, 4, 5])], [("Y", F, [2, 3, 4, 5])], [], opset=13)
    save_typed(out, "eyelike_k_neg", [
        N("EyeLike", ["X"], ["e"], k=-1), N("Add", ["e", "X"], ["Y"]),
    ], [("X", F, [4, 6])], [("Y", F, [4, 6])], [], opset=13)
    save_typed(out, "windows", [
        N("HannWindow", ["n"], ["h"]), N("HammingWindow", ["n"], ["m"], periodic=0),
        N("BlackmanWindow", ["n"], ["b"]), N("Mul", ["X", "h"], ["Y1"]),
        N("Mul", ["X", "m"], ["Y2"]), N("Mul", ["X", "b"], ["Y3"]),
    ], [("X", F, [2, 10])], [("Y1", F, [2, 10]), ("Y2", F, [2, 10]), ("Y3", F, [2, 10])],
        [i64("n", 10)], opset=17)


def spectral(out):
    # DFT / STFT as MatMuls with cos/sin matrices (compiler/src/ops/spectral.rs): real and
    # complex input, an axis with dimensions after it, zero-padding and truncation by
    # dft_length, onesided, inverse; STFT with a Hann window over a complex signal.
    F = TensorProto.FLOAT
    cases = [
        ("real_pad_onesided", [2, 7, 3, 1], 1, 12, dict(onesided=1), [2, 7, 3, 2]),
        ("complex_truncate", [2, 9, 4, 2], 1, 6, {}, [2, 6, 4, 2]),
        ("complex_inverse_axis2", [2, 3, 8, 2], 2, None, dict(inverse=1), [2, 3, 8, 2]),
        ("real_axis0", [5, 3, 1], 0, None, {}, [5, 3, 2]),
    ]
    for name, shape, axis, length, attrs, oshape in cases:
        inits = [i64("axis", axis)]
        ins = ["X", "", "axis"]
        if length is not None:
            inits.append(i64("len", length))
            ins[1] = "len"
        save_typed(out, f"dft_{name}", [N("DFT", ins, ["Y"], **attrs)],
                   [("X", F, shape)], [("Y", F, oshape)], inits, opset=20)
    win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)
    save_typed(out, "stft_complex_window", [
        N("STFT", ["X", "step", "win"], ["Y"], onesided=0),
    ], [("X", F, [2, 70, 2])], [("Y", F, [2, 10, 16, 2])], [i64("step", 6), f32v("win", win)],
        opset=17)
    save_typed(out, "stft_real_length", [
        N("STFT", ["X", "step", "", "flen"], ["Y"]),
    ], [("X", F, [1, 64, 1])], [("Y", F, [1, 7, 9, 2])], [i64("step", 8), i64("flen", 16)],
        opset=17)


def batch_norm_training(out):
    # BatchNormalization with training_mode = 1 (decomposed in compiler/src/ops/norm.rs):
    # batch statistics and the running mean / variance outputs.
    F = TensorProto.FLOAT
    save_typed(out, "batchnorm_training", [
        N("BatchNormalization", ["X", "s", "b", "mean", "var"], ["Y", "rm", "rv"],
          training_mode=1, momentum=0.8, epsilon=1e-3),
    ], [("X", F, [3, 4, 5, 2])], [("Y", F, [3, 4, 5, 2]), ("rm", F, [4]), ("rv", F, [4])],
        [f32v("s", [1, 2, .5, -1]), f32v("b", [0, 1, -1, .3]), f32v("mean", [.1, .2, .3, .4]),
         f32v("var", [1, 2, 3, .5])], opset=15)


def grid_samples(out):
    # GridSample (compiler/src/ops/grid.rs) with run-time grids from ort_oracle.py (standard
    # normal: many coordinates fall outside [-1, 1], so every padding mode matters): each
    # mode and padding, both align_corners, and a volumetric case.
    F = TensorProto.FLOAT
    for mode in ["nearest", "linear", "cubic"]:
        for padding in ["zeros", "border", "reflection"]:
            for align in [0, 1]:
                save_typed(out, f"gridsample_{mode}_{padding}_a{align}", [
                    N("GridSample", ["X", "G"], ["Y"], mode=mode, padding_mode=padding,
                      align_corners=align),
                ], [("X", F, [2, 3, 5, 7]), ("G", F, [2, 4, 6, 2])], [("Y", F, [2, 3, 4, 6])],
                    [], opset=20)
    for mode in ["nearest", "linear"]:
        save_typed(out, f"gridsample_3d_{mode}_reflection", [
            N("GridSample", ["X", "G"], ["Y"], mode=mode, padding_mode="reflection"),
        ], [("X", F, [1, 2, 4, 5, 3]), ("G", F, [1, 3, 2, 4, 3])], [("Y", F, [1, 2, 3, 2, 4])],
            [], opset=20)


def image_ops(out):
    # Col2Im (strided adds per block offset), AffineGrid (constant base grid times theta^T),
    # ReverseSequence (reversed views), and AffineGrid feeding GridSample as a spatial
    # transformer does.
    F = TensorProto.FLOAT
    save_typed(out, "col2im_strided_dilated_padded", [
        N("Col2Im", ["X", "img", "blk"], ["Y"], strides=[2, 1], dilations=[1, 2],
          pads=[1, 0, 1, 2]),
    ], [("X", F, [2, 12, 15])], [("Y", F, [2, 2, 8, 5])],
        [i64("img", [8, 5]), i64("blk", [2, 3])], opset=18)
    for align in [0, 1]:
        save_typed(out, f"affine_grid_sample_a{align}", [
            N("AffineGrid", ["theta", "size"], ["grid"], align_corners=align),
            N("GridSample", ["X", "grid"], ["Y"], align_corners=align),
        ], [("theta", F, [2, 2, 3]), ("X", F, [2, 3, 6, 7])], [("Y", F, [2, 3, 5, 4])],
            [i64("size", [2, 3, 5, 4])], opset=20)
    save_typed(out, "affine_grid_3d", [
        N("AffineGrid", ["theta", "size"], ["Y"]),
    ], [("theta", F, [2, 3, 4])], [("Y", F, [2, 3, 4, 5, 3])], [i64("size", [2, 1, 3, 4, 5])],
        opset=20)
    save_typed(out, "reverse_sequence_batch0", [
        N("ReverseSequence", ["X", "lens"], ["Y"], batch_axis=0, time_axis=1),
    ], [("X", F, [4, 6, 3])], [("Y", F, [4, 6, 3])], [i64("lens", [6, 1, 3, 0])], opset=10)


def scans(out):
    # Scan unrolled over its sequence (compiler/src/graph.rs inline_scan): a state carried
    # across steps, two scan inputs (one reversed, one on axis 1), a body reading an outer
    # value, scan outputs stacked on axis 0 and (reversed) on axis 1.
    F = TensorProto.FLOAT
    body = helper.make_graph(
        [N("Add", ["s", "a"], ["s1"]), N("Mul", ["s1", "w"], ["s2"]),
         N("Tanh", ["s2"], ["s_out"]), N("Mul", ["b", "s_out"], ["y1"]),
         N("Add", ["s_out", "a"], ["y2"])],
        "body",
        [helper.make_tensor_value_info("s", F, [3]), helper.make_tensor_value_info("a", F, [3]),
         helper.make_tensor_value_info("b", F, [3])],
        [helper.make_tensor_value_info("s_out", F, [3]),
         helper.make_tensor_value_info("y1", F, [3]),
         helper.make_tensor_value_info("y2", F, [3])],
    )
    save_typed(out, "scan_state_directions_outer", [
        N("Mul", ["W0", "two"], ["w"]),
        N("Scan", ["S0", "A", "B"], ["S", "Y1", "Y2"], body=body, num_scan_inputs=2,
          scan_input_directions=[1, 0], scan_input_axes=[0, 1], scan_output_axes=[0, 1],
          scan_output_directions=[0, 1]),
    ], [("S0", F, [3]), ("A", F, [5, 3]), ("B", F, [3, 5]), ("W0", F, [3])],
        [("S", F, [3]), ("Y1", F, [5, 3]), ("Y2", F, [3, 5])], [f32("two", 2.0)], opset=16)


def loops_and_3d(out):
    # Loop unrolled at compile time (compiler/src/graph.rs inline_loop): a trip count and a
    # condition from initializers, a loop-carried state, a body reading the outer run-time
    # X and the iteration number, a scan output stacked on axis 0; a while-loop ended by
    # the condition its body computes from the iteration number.
    F, I, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [N("Cast", ["i"], ["fi"], to=F), N("Mul", ["x", "fi"], ["xi"]),
         N("Mul", ["s", "w"], ["sw"]), N("Add", ["sw", "xi"], ["t"]),
         N("Tanh", ["t"], ["s_out"]), N("Mul", ["s_out", "two"], ["y"]),
         N("Identity", ["c"], ["c_out"])],
        "body",
        [vi("i", I, []), vi("c", B, []), vi("s", F, [3])],
        [vi("c_out", B, []), vi("s_out", F, [3]), vi("y", F, [3])],
        [f32("two", 2.0)],
    )
    save_typed(out, "loop_state_scan_outer", [
        N("Loop", ["M", "cond", "S0"], ["S", "Y"], body=body),
    ], [("S0", F, [3]), ("x", F, [3]), ("w", F, [3])],
        [("S", F, [3]), ("Y", F, [4, 3])],
        [i64("M", 4), numpy_helper.from_array(np.array(True), "cond")], opset=17)
    body = helper.make_graph(
        [N("Add", ["i", "one"], ["i1"]), N("Less", ["i1", "three"], ["c_out"]),
         N("Mul", ["s", "x"], ["sx"]), N("Add", ["sx", "half"], ["s_out"])],
        "body",
        [vi("i", I, []), vi("c", B, []), vi("s", F, [2, 3])],
        [vi("c_out", B, []), vi("s_out", F, [2, 3])],
        [i64("one", 1), i64("three", 3), f32("half", 0.5)],
    )
    save_typed(out, "loop_while_condition", [
        N("Loop", ["", "cond", "S0"], ["S"], body=body),
    ], [("S0", F, [2, 3]), ("x", F, [2, 3])], [("S", F, [2, 3])],
        [numpy_helper.from_array(np.array(True), "cond")], opset=17)
    # Scan of opset 8 (its batched form): per batch entry, one scan input reversed.
    body = helper.make_graph(
        [N("Add", ["s_in", "a"], ["s_out"]), N("Mul", ["s_out", "b"], ["o1"]),
         N("Sub", ["a", "b"], ["o2"])],
        "body",
        [vi("s_in", F, [2]), vi("a", F, [2]), vi("b", F, [2])],
        [vi("s_out", F, [2]), vi("o1", F, [2]), vi("o2", F, [2])],
    )
    save_typed(out, "scan8_batched", [
        N("Scan", ["", "init", "X", "Z"], ["S", "Y1", "Y2"], num_scan_inputs=2,
          directions=[0, 1], body=body),
    ], [("init", F, [3, 2]), ("X", F, [3, 4, 2]), ("Z", F, [3, 4, 2])],
        [("S", F, [3, 2]), ("Y1", F, [3, 4, 2]), ("Y2", F, [3, 4, 2])], [], opset=8)
    # 3-D ConvTranspose (one 2-D ConvTranspose over the depth slices + a placing MatMul):
    # strides, pads, output padding, two groups, bias.
    save(out, "convtranspose_3d_strided_groups", [
        N("ConvTranspose", ["X", "W", "B"], ["Y"], strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 0],
          output_padding=[1, 0, 1], group=2),
    ], [("X", [2, 4, 3, 4, 5])], [("Y", [2, 6, 5, 5, 9])],
        [w("W", (4, 3, 3, 2, 3)), w("B", (6,), 0.5)])
    # MelWeightMatrix folded at compile time, applied to a power spectrum.
    save_typed(out, "mel_filter_bank", [
        N("MelWeightMatrix", ["bins", "dft", "rate", "lo", "hi"], ["M"]),
        N("Mul", ["X", "X"], ["P"]), N("MatMul", ["P", "M"], ["Y"]),
    ], [("X", F, [2, 5, 257])], [("Y", F, [2, 5, 20])],
        [i64("bins", 20), i64("dft", 512), i64("rate", 16000), f32("lo", 20.0),
         f32("hi", 8000.0)], opset=17)


def cache_and_unpool(out):
    # TensorScatter with run-time write indices (a KV-cache update, linear and circular),
    # MaxPool -> MaxUnpool (the indices computed on the device, with a larger output_shape),
    # and the deprecated Upsample (as Resize).
    F, I = TensorProto.FLOAT, TensorProto.INT64
    # Write indices from ort_oracle.py are 0..2: the circular cache of 4 wraps.
    for mode, length in [("linear", 6), ("circular", 4)]:
        save_typed(out, f"tensorscatter_{mode}", [
            N("TensorScatter", ["cache", "upd", "w"], ["Y"], mode=mode, axis=2),
        ], [("cache", F, [3, 2, length, 4]), ("upd", F, [3, 2, 3, 4]), ("w", I, [3])],
            [("Y", F, [3, 2, length, 4])], [], opset=24)
    # (An output_shape larger than the unpooled shape is left out: onnx's reference and
    # node test put the values in its leading corner, ONNX Runtime indexes the larger plane.)
    save_typed(out, "maxpool_maxunpool", [
        N("MaxPool", ["X"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
        N("MaxUnpool", ["p", "i", "shape"], ["Y"], kernel_shape=[2, 2], strides=[2, 2]),
    ], [("X", F, [2, 3, 6, 8])], [("Y", F, [2, 3, 6, 8])], [i64("shape", [2, 3, 6, 8])],
        opset=11)
    save_typed(out, "upsample_linear", [
        N("Upsample", ["X", "scales"], ["Y"], mode="linear"),
    ], [("X", F, [1, 2, 3, 4])], [("Y", F, [1, 2, 6, 6])], [f32v("scales", [1, 1, 2, 1.5])],
        opset=9)


def det_and_int_pool(out):
    # Det (the Leibniz sum on DVE) of batched 2x2..5x5 matrices, and MaxPool on uint8
    # (through f32, exact).
    F = TensorProto.FLOAT
    for m in [2, 3, 4, 5]:
        save_typed(out, f"det_{m}x{m}", [N("Det", ["X"], ["Y"])],
                   [("X", F, [2, 3, m, m])], [("Y", F, [2, 3])], [], opset=11)
    save_typed(out, "maxpool_uint8", [
        N("MaxPool", ["X"], ["Y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    ], [("X", TensorProto.UINT8, [1, 2, 7, 7])], [("Y", TensorProto.UINT8, [1, 2, 4, 4])], [],
        opset=12)

def packed_weights(out):
    """Constant weights the compiler stores packed in 32-column panels (5+ rows, K >= 128):
    row and column tails (the last panel zero-padded), batches folded into M, K past one K
    block of the kernel (512), Gemm's transB, a shared weight read by two MatMuls and by an
    elementwise node (stored both ways), with epilogues."""
    save(out, "packed_tails_bias_sigmoid", [
        N("MatMul", ["X", "W"], ["h"]), N("Add", ["h", "b"], ["a"]), N("Sigmoid", ["a"], ["Y"]),
    ], [("X", [2, 13, 130])], [("Y", [2, 13, 70])], [w("W", (130, 70), 0.1), w("b", (70,))])
    save(out, "packed_gemm_transb_long_k", [
        N("Gemm", ["X", "W", "b"], ["g"], transB=1, alpha=0.5), N("Relu", ["g"], ["Y"]),
    ], [("X", [9, 600])], [("Y", [9, 97])], [w("W", (97, 600), 0.05), w("b", (97,))])
    save(out, "packed_shared_weight", [
        N("MatMul", ["X", "W"], ["h1"]), N("Relu", ["h1"], ["r"]),
        N("MatMul", ["r", "W"], ["h2"]), N("Add", ["h2", "W"], ["Y"]),
    ], [("X", [160, 160])], [("Y", [160, 160])], [w("W", (160, 160), 0.08)])


def convs_3d(out):
    # 3-D Conv (compiler/src/ops/conv.rs expand_conv_3d: Pad on depth, a Gather stacking each
    # output depth's kernel-depth slices as channels, one 2-D Conv over the depth slices):
    # stride 2 with asymmetric pads and bias; dilations with two groups and per-axis strides;
    # depthwise SAME_UPPER; a Conv-Relu-Conv chain with a 1x1x1 kernel and kernel_shape.
    save(out, "conv3d_strided_pads_bias", [
        N("Conv", ["X", "W", "B"], ["Y"], strides=[2, 2, 2], pads=[1, 0, 1, 1, 1, 0]),
    ], [("X", [2, 3, 7, 8, 9])], [("Y", [2, 4, 4, 4, 4])],
        [w("W", (4, 3, 3, 3, 3)), w("B", (4,), 0.5)])
    save(out, "conv3d_dilated_groups", [
        N("Conv", ["X", "W"], ["Y"], group=2, dilations=[3, 1, 2], strides=[1, 2, 1],
          pads=[2, 1, 0, 0, 1, 1]),
    ], [("X", [1, 4, 9, 6, 7])], [("Y", [1, 6, 8, 3, 6])], [w("W", (6, 2, 2, 3, 2))])
    save(out, "conv3d_depthwise_same_upper", [
        N("Conv", ["X", "W", "B"], ["Y"], group=3, auto_pad="SAME_UPPER", strides=[2, 1, 2]),
    ], [("X", [1, 3, 5, 6, 6])], [("Y", [1, 3, 3, 6, 3])],
        [w("W", (3, 1, 3, 3, 3)), w("B", (3,), 0.5)])
    save(out, "conv3d_chain", [
        N("Conv", ["X", "W1", "B1"], ["h"], pads=[1] * 6, kernel_shape=[3, 3, 3]),
        N("Relu", ["h"], ["r"]),
        N("Conv", ["r", "W2"], ["Y"]),
    ], [("X", [1, 2, 4, 5, 5])], [("Y", [1, 2, 4, 5, 5])],
        [w("W1", (4, 2, 3, 3, 3)), w("B1", (4,), 0.5), w("W2", (2, 4, 1, 1, 1))])


def main():
    out = sys.argv[1]
    det_and_int_pool(out)
    cache_and_unpool(out)
    scans(out)
    loops_and_3d(out)
    image_ops(out)
    grid_samples(out)
    batch_norm_training(out)
    spectral(out)
    small_ops(out)
    maxpool_indices(out)
    resizes(out)
    einsums(out)
    bitwise_and_math(out)

    packed_weights(out)
    decoder_block(out)
    halves(out)
    doubles(out)

    quantized_convs(out)
    blocked_qdq(out)
    if_gated(out)
    if_runtime(out)
    recurrent(out)
    sequence_lens(out)
    quantized_attention(out)
    int8_dequantizing_products(out)
    epilogues(out)
    computed_operands(out)
    computed_value_operands(out)
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
    convs_3d(out)
    recurrent_packed(out)


def recurrent_packed(out):
    # Recurrent layers wide enough for the compiler to pack their constant weights in panels,
    # one packed matrix per direction (W[d] from K = input ≥ 128; R[d] from K = hidden ≥ 128,
    # not GRU's; under bf16 auto-cast any K): bidirectional, so direction 1's matrices come
    # from the second half of each weight.
    s, b, i = 3, 2, 128
    h = 128
    save(out, "lstm_bidirectional_packed", [
        N("LSTM", ["X", "W", "R", "B", "", "H0", "C0"], ["Y", "Yh", "Yc"], hidden_size=h,
          direction="bidirectional")],
        [("X", [s, b, i]), ("H0", [2, b, h]), ("C0", [2, b, h])],
        [("Y", [s, 2, b, h]), ("Yh", [2, b, h]), ("Yc", [2, b, h])],
        [w("W", (2, 4 * h, i), 0.1), w("R", (2, 4 * h, h), 0.1), w("B", (2, 8 * h), 0.3)],
        opset=14)
    save(out, "rnn_bidirectional_packed", [
        N("RNN", ["X", "W", "R", "B"], ["Y", "Yh"], hidden_size=h, direction="bidirectional")],
        [("X", [s, b, i])], [("Y", [s, 2, b, h]), ("Yh", [2, b, h])],
        [w("W", (2, h, i), 0.1), w("R", (2, h, h), 0.1), w("B", (2, 2 * h), 0.3)], opset=14)
    h = 48
    save(out, "gru_packed_input", [
        N("GRU", ["X", "W", "R", "B"], ["Y", "Yh"], hidden_size=h, direction="reverse")],
        [("X", [s, b, i])], [("Y", [s, 1, b, h]), ("Yh", [1, b, h])],
        [w("W", (1, 3 * h, i), 0.1), w("R", (1, 3 * h, h), 0.2), w("B", (1, 6 * h), 0.3)],
        opset=14)


if __name__ == "__main__":
    main()
