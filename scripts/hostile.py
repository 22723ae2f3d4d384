#!/usr/bin/env python3
"""The hostile-input suite (issue 11): hostile files through the real command line.

    .venv/bin/python scripts/hostile.py target/release/nrt WORKDIR

1. Hostile ONNX models (written with the `onnx` package): huge dims, overflowing attributes,
   huge constants, cycles, negative dims, bad pads, ... Each must make `nrt compile` fail
   cleanly: a nonzero exit, an error message naming the culprit, no signal, no panic.
2. Mutated NCM files: valid models (a tiny Relu and the compiled `mlp` and `cnn` samples),
   with bit flips, truncations, and huge values written over header, plan, I/O and
   instruction fields (access-pattern shapes and strides included), the CRC fixed up so the
   mutation reaches the checks behind it. Each goes through `nrt inspect` and `nrt run`,
   which must exit cleanly (0 for a mutation that happens to be harmless; otherwise nonzero
   with an error message), never with a signal, a panic or a hang.

3. Legal models whose constants take gigabytes, compiled (and, where they compile, run) under a
   2 GiB address-space limit: each compiles, or fails with a "too large" error; an allocation
   the compiler does not make fallibly would abort the process there. Then compiled in a 1 GiB
   memory cgroup (where one can be made), where a reservation past the container's limit
   would be OOM-killed; and under NRT_HOST_MEMORY_MAX=1G (the user's cap).

Deterministic (fixed seed), and fast: about 65 ONNX cases, 15 huge ones and 240 NCM mutations. Prints
`hostile: N passed, M failed` and exits 1 if M > 0.
"""
import os
import random
import resource
import struct
import subprocess
import sys
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
T20, T31, T40 = 2**20, 2**31, 2**40
TIMEOUT_S = 20
# A case that is legal (e.g. a slice with step i64::MAX takes one element): it must compile
# or fail cleanly, and a compiled one must run cleanly.
MAY_COMPILE = "<may compile>"
FAILURES = []
PASSED = 0


def run(cmd, env_extra=None, address_space=None, timeout=TIMEOUT_S, cgroup=None):
    env = dict(os.environ)
    env.setdefault("NEURON_RT_EXEC_TIMEOUT", "0.5")
    env["RUST_BACKTRACE"] = "0"
    if env_extra:
        env.update(env_extra)
    limit = None
    if address_space or cgroup:
        def limit():
            if address_space:
                resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
            if cgroup:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout, env=env, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout} s"
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def verdict(case, rc, out, err, must_fail, expect=None):
    """Records whether one command ended cleanly."""
    global PASSED
    text = out + err
    why = None
    if rc is None:
        why = err
    elif rc < 0 or rc >= 128:
        why = f"killed by a signal (rc {rc})"
    elif "panicked" in text or "RUST_BACKTRACE" in text:
        why = "panicked"
    elif must_fail and rc == 0:
        why = "succeeded; expected a clean error"
    elif rc != 0 and not err.strip():
        why = f"exit {rc} without an error message"
    elif rc != 0 and "internal compiler error" in text:
        why = "internal compiler error"
    elif rc != 0 and expect and expect not in text:
        why = f"the error does not name '{expect}'"
    if why:
        last = (err.strip().splitlines() or [""])[-1][:300]
        FAILURES.append(f"FAIL {case}: {why} -- {last}")
    else:
        PASSED += 1


# ---------------------------------------------------------------------------------------------
# Hostile ONNX models
# ---------------------------------------------------------------------------------------------


def i64(name, v):
    return numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)


def f32(name, v):
    return numpy_helper.from_array(np.asarray(v, dtype=np.float32), name)


def raw_tensor(name, dims):
    """An initializer whose dims claim more than its (empty) data holds."""
    t = onnx.TensorProto()
    t.name, t.data_type = name, TensorProto.FLOAT
    t.dims.extend(dims)
    return t


def vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def N(op, ins, outs, **kw):
    return helper.make_node(op, ins, outs, name=f"{op}_{outs[0]}", **kw)


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "hostile", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()  # never checked: most of these are invalid on purpose


def onnx_cases():
    """(name, bytes, expected culprit in the message)."""
    X = [vi("X", [2, 3])]
    Y = [vi("Y", None)]
    X4 = [vi("X", [1, 2, 8, 8])]
    c = []
    # Huge dims, negative dims, sizes that overflow.
    c.append(("input_dims_overflow", model([N("Relu", ["X"], ["Y"])], [vi("X", [T31, T31, T31])], Y), "input 'X'"))
    c.append(("input_dims_over_budget", model([N("Relu", ["X"], ["Y"])], [vi("X", [T31, T31])], Y), "input 'X'"))
    c.append(("input_dim_negative", model([N("Relu", ["X"], ["Y"])], [vi("X", [2, -1])], Y), "input 'X'"))
    c.append(("input_dim_i64_min", model([N("Relu", ["X"], ["Y"])], [vi("X", [I64_MIN])], Y), "input 'X'"))
    # Huge constants (D5).
    c.append(("constant_of_shape_2_40", model([N("ConstantOfShape", ["S"], ["C"]), N("Add", ["X", "C"], ["Y"])],
                                              [vi("X", [1])], Y, [i64("S", [T40])]), "ConstantOfShape_C"))
    c.append(("constant_of_shape_2_20_sq", model([N("ConstantOfShape", ["S"], ["C"]), N("Add", ["X", "C"], ["Y"])],
                                                 [vi("X", [1])], Y, [i64("S", [T20, T20])]), "ConstantOfShape_C"))
    c.append(("constant_of_shape_negative", model([N("ConstantOfShape", ["S"], ["C"]), N("Add", ["X", "C"], ["Y"])],
                                                  [vi("X", [1])], Y, [i64("S", [-4])]), "ConstantOfShape_C"))
    c.append(("expand_const_2_40", model([N("Expand", ["K", "S"], ["C"]), N("Add", ["X", "C"], ["Y"])],
                                         [vi("X", [1])], Y, [f32("K", [1.0]), i64("S", [T20, T20])]), "Expand_C"))
    c.append(("expand_input_2_40", model([N("Expand", ["X", "S"], ["Y"])], [vi("X", [1])], Y, [i64("S", [T20, T20])]), "Expand_Y"))
    c.append(("expand_negative", model([N("Expand", ["X", "S"], ["Y"])], [vi("X", [1])], Y, [i64("S", [-3])]), "Expand_Y"))
    c.append(("shape_mul_constant_of_shape", model(
        [N("Shape", ["X"], ["S"]), N("Mul", ["S", "F"], ["S2"]), N("ConstantOfShape", ["S2"], ["C"]), N("Add", ["X", "C"], ["Y"])],
        [vi("X", [T20])], Y, [i64("F", [T20])]), "ConstantOfShape_C"))
    c.append(("tile_2_40", model([N("Tile", ["X", "R"], ["Y"])], X, Y, [i64("R", [T20, T20])]), "Tile_Y"))
    c.append(("tile_overflow", model([N("Tile", ["X", "R"], ["Y"])], X, Y, [i64("R", [I64_MAX, I64_MAX])]), "Tile_Y"))
    c.append(("range_2_40", model([N("Range", ["A", "B", "D"], ["R"]), N("Add", ["X", "R"], ["Y"])], [vi("X", [1])], Y,
                                  [f32("A", 0.0), f32("B", 1e15), f32("D", 1.0)]), "Range_R"))
    c.append(("range_inf", model([N("Range", ["A", "B", "D"], ["R"]), N("Add", ["X", "R"], ["Y"])], [vi("X", [1])], Y,
                                 [f32("A", 0.0), f32("B", np.inf), f32("D", 1.0)]), "Range_R"))
    c.append(("initializer_2_40_no_data", model([N("Add", ["X", "W"], ["Y"])], [vi("X", [1])], Y,
                                                [raw_tensor("W", [T40])]), "W"))
    c.append(("initializer_negative_dim", model([N("Add", ["X", "W"], ["Y"])], [vi("X", [1])], Y,
                                                [raw_tensor("W", [-1])]), "W"))
    # Overflowing attributes (D11 and its kin).
    for i, pads in enumerate([[0, I64_MIN, 0, I64_MAX], [0, I64_MAX, 0, I64_MIN], [0, I64_MAX, 0, I64_MAX], [0, -5, 0, 1]]):
        c.append((f"pad_{i}", model([N("Pad", ["X", "P"], ["Y"])], X, Y, [i64("P", pads)]), "Pad_Y"))
    c.append(("slice_step_i64_max", model([N("Slice", ["X", "S", "E", "A", "T"], ["Y"])], X, Y,
                                          [i64("S", [I64_MIN]), i64("E", [I64_MAX]), i64("A", [1]), i64("T", [I64_MAX])]), MAY_COMPILE))
    c.append(("slice_step_i64_min", model([N("Slice", ["X", "S", "E", "A", "T"], ["Y"])], X, Y,
                                          [i64("S", [I64_MAX]), i64("E", [I64_MIN]), i64("A", [1]), i64("T", [I64_MIN])]), MAY_COMPILE))
    W = [f32("W", np.ones((2, 2, 3, 3)))]
    c.append(("conv_strides_huge", model([N("Conv", ["X", "W"], ["Y"], strides=[I64_MAX, I64_MAX])], X4, Y, W), "Conv_Y"))
    c.append(("conv_dilations_huge", model([N("Conv", ["X", "W"], ["Y"], dilations=[I64_MAX, 1])], X4, Y, W), "Conv_Y"))
    c.append(("conv_pads_huge", model([N("Conv", ["X", "W"], ["Y"], pads=[I64_MAX, 0, I64_MAX, 0])], X4, Y, W), "Conv_Y"))
    c.append(("conv_pads_negative", model([N("Conv", ["X", "W"], ["Y"], pads=[-1, 0, 0, 0])], X4, Y, W), "Conv_Y"))
    c.append(("maxpool_kernel_huge", model([N("MaxPool", ["X"], ["Y"], kernel_shape=[I64_MAX, 2])], X4, Y), "MaxPool_Y"))
    c.append(("avgpool_strides_zero", model([N("AveragePool", ["X"], ["Y"], kernel_shape=[2, 2], strides=[0, 1])], X4, Y), "AveragePool_Y"))
    c.append(("convtranspose_strides_huge", model([N("ConvTranspose", ["X", "W"], ["Y"], strides=[I64_MAX, 1])], X4, Y, W), "ConvTranspose_Y"))
    c.append(("convtranspose_output_padding_huge", model([N("ConvTranspose", ["X", "W"], ["Y"], output_padding=[I64_MAX, 0])], X4, Y, W), "ConvTranspose_Y"))
    c.append(("convtranspose_output_shape_huge", model([N("ConvTranspose", ["X", "W"], ["Y"], output_shape=[T40, T40])], X4, Y, W), "ConvTranspose_Y"))
    c.append(("reshape_2_40_sq", model([N("Reshape", ["X", "S"], ["Y"])], X, Y, [i64("S", [T40, T40])]), "Reshape_Y"))
    c.append(("reshape_i64_max", model([N("Reshape", ["X", "S"], ["Y"])], X, Y, [i64("S", [I64_MAX, -1])]), "Reshape_Y"))
    c.append(("reshape_two_minus_one", model([N("Reshape", ["X", "S"], ["Y"])], X, Y, [i64("S", [-1, -1])]), "Reshape_Y"))
    c.append(("depth_to_space_huge", model([N("DepthToSpace", ["X"], ["Y"], blocksize=T40)], X4, Y), "DepthToSpace_Y"))
    c.append(("space_to_depth_huge", model([N("SpaceToDepth", ["X"], ["Y"], blocksize=I64_MAX)], X4, Y), "SpaceToDepth_Y"))
    c.append(("softmax_axis_i64_min", model([N("Softmax", ["X"], ["Y"], axis=I64_MIN)], X, Y), "Softmax_Y"))
    c.append(("concat_axis_i64_max", model([N("Concat", ["X", "X"], ["Y"], axis=I64_MAX)], X, Y), "Concat_Y"))
    c.append(("flatten_axis_i64_max", model([N("Flatten", ["X"], ["Y"], axis=I64_MAX)], X, Y), "Flatten_Y"))
    c.append(("transpose_perm_bad", model([N("Transpose", ["X"], ["Y"], perm=[I64_MAX, 0])], X, Y), "Transpose_Y"))
    c.append(("unsqueeze_axes_huge", model([N("Unsqueeze", ["X", "A"], ["Y"])], X, Y, [i64("A", [I64_MIN])]), "Unsqueeze_Y"))
    c.append(("split_sizes_huge", model([N("Split", ["X", "S"], ["Y", "Z"], axis=1)], X, [vi("Y", None), vi("Z", None)],
                                        [i64("S", [I64_MAX, I64_MIN + 4])]), "Split_Y"))
    c.append(("gather_index_out_of_range", model([N("Gather", ["X", "I"], ["Y"])], X, Y, [i64("I", [I64_MIN])]), "Gather_Y"))
    c.append(("lrn_size_huge", model([N("LRN", ["X"], ["Y"], size=I64_MAX)], X4, Y), "LRN_Y"))
    c.append(("resize_scales_huge", model([N("Resize", ["X", "", "S"], ["Y"])], X4, Y, [f32("S", [1, 1, 1e30, 1e30])]), "Resize_Y"))
    c.append(("resize_sizes_huge", model([N("Resize", ["X", "", "", "Z"], ["Y"])], X4, Y, [i64("Z", [1, 2, T40, T40])]), "Resize_Y"))
    c.append(("cast_to_bad_type", model([N("Cast", ["X"], ["Y"], to=9999)], X, Y), "Cast_Y"))
    # Non-finite float attributes (issue 54, S13): a bad attribute naming the node, not an
    # internal compiler error (NaN reached an instruction's immediate) or a NaN model.
    QKV = [vi("Q", [1, 2, 3, 4]), vi("K", [1, 2, 3, 4]), vi("V", [1, 2, 3, 4])]
    for tag, v in [("nan", float("nan")), ("inf", float("inf"))]:
        c.append((f"attention_scale_{tag}", model([N("Attention", ["Q", "K", "V"], ["Y"], scale=v)], QKV, Y, opset=23), "Attention_Y"))
        c.append((f"attention_softcap_{tag}", model([N("Attention", ["Q", "K", "V"], ["Y"], softcap=v)], QKV, Y, opset=23), "Attention_Y"))
        c.append((f"layernorm_epsilon_{tag}", model([N("LayerNormalization", ["X", "S"], ["Y"], epsilon=v)], X, Y,
                                                    [f32("S", [1.0, 1.0, 1.0])]), "LayerNormalization_Y"))
        c.append((f"rmsnorm_epsilon_{tag}", model([N("RMSNormalization", ["X", "S"], ["Y"], epsilon=v)], X, Y,
                                                  [f32("S", [1.0, 1.0, 1.0])], opset=23), "RMSNormalization_Y"))
        c.append((f"groupnorm_epsilon_{tag}", model([N("GroupNormalization", ["X", "S", "B"], ["Y"], epsilon=v, num_groups=2)], X4, Y,
                                                    [f32("S", [1.0, 1.0]), f32("B", [0.0, 0.0])], opset=21), "GroupNormalization_Y"))
        c.append((f"leakyrelu_alpha_{tag}", model([N("LeakyRelu", ["X"], ["Y"], alpha=v)], X, Y), "LeakyRelu_Y"))
    c.append(("attention_scale_negative", model([N("Attention", ["Q", "K", "V"], ["Y"], scale=-1.0)], QKV, Y, opset=23), "Attention_Y"))
    # Graph structure.
    c.append(("cycle", model([N("Relu", ["B"], ["A"]), N("Relu", ["A"], ["B"]), N("Add", ["X", "A"], ["Y"])], X, Y), None))
    c.append(("dangling_input", model([N("Add", ["X", "nobody"], ["Y"])], X, Y), "nobody"))
    c.append(("opset_huge", model([N("Relu", ["X"], ["Y"])], X, Y, opset=I64_MAX), None))
    good = model([N("Relu", ["X"], ["Y"])], X, Y)
    c.append(("truncated", good[: len(good) // 2], None))
    c.append(("random_bytes", bytes(random.Random(5).randrange(256) for _ in range(512)), None))
    return c


# Legal models whose constants (folded, generated by a lowering, or written out) take gigabytes,
# compiled (and, where they compile, run) under three memory limits (`run_huge_all`). Each must
# compile or fail with a "too large" error, never with a signal.
HUGE_LIMIT = 2 << 30
# Some of these compute a gigabyte of values before the limit stops them (3-9 s in the debug
# build on this machine); a slow phase of a shared host can double that.
HUGE_TIMEOUT_S = 60
# Folds of a small constant that no limit below lets the host hold: they must compile, to a
# small NCM that computes the fold on the device, whose 1.6-2.4 GB arena is then refused at load.
ON_DEVICE = {"expand_fold", "expand_matmul", "tile_fold", "concat_fold"}


def huge_cases():
    """(name, ONNX bytes)."""
    Y = [vi("Y", None)]
    B = [20_000, 20_000]  # 1.6 GB of f32
    c = []
    c.append(("resize_cubic_weights", model([N("Resize", ["X", "", "", "Z"], ["Y"], mode="cubic")], [vi("X", [1, 1, 13, 17])], Y,
                                            [i64("Z", [1, 1, 40_000_000, 17])])))
    c.append(("affine_grid", model([N("AffineGrid", ["T", "S"], ["Y"])], [vi("T", [2, 3, 4])], Y, [i64("S", [2, 1, 2000, 2000, 100])], opset=20)))
    c.append(("mel_weight_matrix", model([N("MelWeightMatrix", ["B", "D", "R", "L", "U"], ["M"]), N("MatMul", ["X", "M"], ["Y"])], [vi("X", [2, 257])], Y,
                                         [i64("B", 200_000), i64("D", 20_000), i64("R", 16000), f32("L", 0.0), f32("U", 8000.0)])))
    c.append(("dft_length", model([N("DFT", ["X", "L", "A"], ["Y"], onesided=1)], [vi("X", [2, 7, 3, 1])], Y, [i64("L", 40_000_000), i64("A", 1)], opset=20)))
    c.append(("hann_window", model([N("HannWindow", ["Nn"], ["W"]), N("Mul", ["X", "W"], ["Y"])], [vi("X", [1])], Y, [i64("Nn", 400_000_000)])))
    c.append(("expand_fold", model([N("Expand", ["K", "S"], ["C"]), N("Add", ["C", "C"], ["D"]), N("Add", ["X", "D"], ["Y"])], [vi("X", [1])], Y,
                                   [f32("K", [1.0]), i64("S", B)])))
    c.append(("expand_matmul", model([N("Expand", ["K", "S"], ["C"]), N("MatMul", ["X", "C"], ["Y"])], [vi("X", [1, 20000])], Y,
                                     [f32("K", [1.0]), i64("S", B)])))
    c.append(("range_fold", model([N("Range", ["A", "B", "D"], ["R"]), N("Mul", ["R", "R"], ["Q"]), N("Add", ["X", "Q"], ["Y"])], [vi("X", [1])], Y,
                                  [f32("A", 0.0), f32("B", 4e8), f32("D", 1.0)])))
    c.append(("constant_of_shape_matmul", model([N("ConstantOfShape", ["S"], ["C"]), N("MatMul", ["X", "C"], ["Y"])], [vi("X", [1, 20000])], Y, [i64("S", B)])))
    c.append(("constant_of_shape_gemm", model([N("ConstantOfShape", ["S"], ["C"]), N("Gemm", ["X", "C"], ["Y"], transB=1)], [vi("X", [1, 20000])], Y, [i64("S", B)])))
    c.append(("tile_fold", model([N("Tile", ["K", "R"], ["C"]), N("Add", ["X", "C"], ["Y"])], [vi("X", [1])], Y, [f32("K", [[1.0]]), i64("R", B)])))
    c.append(("concat_fold", model([N("Expand", ["K", "S"], ["E"]), N("Concat", ["E", "E"], ["C"], axis=0), N("Add", ["X", "C"], ["Y"])], [vi("X", [1])], Y,
                                   [f32("K", [1.0]), i64("S", [10_000, 20_000])])))
    c.append(("where_fold", model([N("ConstantOfShape", ["S"], ["C"]), N("Cast", ["C"], ["Bo"], to=TensorProto.BOOL), N("Where", ["Bo", "C", "C"], ["W"]),
                                   N("Add", ["X", "W"], ["Y"])], [vi("X", [1])], Y, [i64("S", B)])))
    c.append(("conv_weight", model([N("ConstantOfShape", ["S"], ["W"]), N("Conv", ["X", "W"], ["Y"])], [vi("X", [1, 2000, 4, 4])], Y, [i64("S", [20000, 2000, 3, 3])])))
    c.append(("reduce_fold", model([N("ConstantOfShape", ["S"], ["C"]), N("ReduceSum", ["C"], ["R"], keepdims=0), N("Add", ["X", "R"], ["Y"])], [vi("X", [1])], Y,
                                   [i64("S", B)])))
    return c


def run_huge(nrt, d, label, limits, run_limits=None):
    """Each huge model compiled under `limits` (run()'s keyword arguments): it compiles or
    fails "too large"; an ON_DEVICE one compiles to an NCM under 1 MiB. What compiles is run
    under `run_limits` (default: the same) and must be refused cleanly: its arena does not fit."""
    os.makedirs(d, exist_ok=True)
    for name, data in huge_cases():
        path, ncm = os.path.join(d, f"{name}.onnx"), os.path.join(d, f"{name}.ncm")
        with open(path, "wb") as f:
            f.write(data)
        rc, out, err = run([nrt, "compile", path, "-o", ncm], timeout=HUGE_TIMEOUT_S, **limits)
        case = f"huge/{name} (nrt compile, {label})"
        if name in ON_DEVICE and (rc != 0 or os.path.getsize(ncm) > 1 << 20):
            last = (err.strip().splitlines() or [""])[-1][:300]
            FAILURES.append(f"FAIL {case}: the fold did not stay on the device (rc {rc}) -- {last}")
        else:
            verdict(case, rc, out, err, must_fail=False, expect="too large")
        if rc == 0:
            rc, out, err = run([nrt, "run", ncm, "--output-dir", os.path.join(d, "out")],
                               timeout=HUGE_TIMEOUT_S, **(run_limits or limits))
            verdict(f"huge/{name} (nrt run, {label})", rc, out, err, must_fail=True,
                    expect="NRT_RESOURCE")
        if os.path.exists(ncm):
            os.remove(ncm)


def memory_cgroup(limit):
    """A new memory cgroup below this process's own, limited to `limit` bytes (v2, else v1),
    or None where none can be made (not root, no writable hierarchy)."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return None
    tag = f"nrt-hostile-{os.getpid()}"
    for line in lines:
        hid, ctrls, path = line.split(":", 2)
        if hid == "0" and ctrls == "":
            roots, files = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"], ("memory.max",)
            roots = [r for r in roots if os.path.exists(os.path.join(r, "cgroup.controllers"))]
        elif "memory" in ctrls.split(","):
            roots, files = ["/sys/fs/cgroup/memory"], ("memory.limit_in_bytes",)
        else:
            continue
        for r in roots:
            d = os.path.join(r + path.rstrip("/"), tag)
            try:
                os.mkdir(d)
                with open(os.path.join(d, files[0]), "w") as f:
                    f.write(str(limit))
                # A process must be able to join it (v2 refuses one where the parent's
                # subtree_control lacks memory, for example).
                def join():
                    with open(os.path.join(d, "cgroup.procs"), "w") as f:
                        f.write(str(os.getpid()))
                subprocess.run(["true"], preexec_fn=join, check=True, timeout=TIMEOUT_S)
                return d
            except (OSError, subprocess.SubprocessError):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
    return None


def run_huge_all(nrt, work):
    """The huge models under three limits:
    1. a 2 GiB address space (RLIMIT_AS), where any allocation the compiler does not make
       fallibly aborts the process; the run gets a 1 GiB device (the default 16 GiB cannot be
       reserved there), so it reaches the load;
    2. a 1 GiB memory cgroup made below this process's own, as in a container: there the
       host's MemAvailable is the machine's, and without the cgroup's headroom the compiler
       would reserve past the limit and be OOM-killed (signal 9) when it wrote the values, and
       the run would be killed when the execution wrote device memory (host memory); skipped,
       with a line saying so, where no memory cgroup can be made;
    3. NRT_HOST_MEMORY_MAX=1G (the user's cap: no root needed); a cap that is not a size must
       fail both commands, naming the variable."""
    run_huge(nrt, os.path.join(work, "huge"), f"{HUGE_LIMIT >> 30} GiB address space",
             {"address_space": HUGE_LIMIT},
             {"address_space": HUGE_LIMIT, "env_extra": {"NRT_SIM_DEVICE_MEMORY": "1G"}})
    cg = memory_cgroup(1 << 30)
    if cg is None:
        print("hostile: the memory-cgroup cases are skipped: no memory cgroup can be made here")
    else:
        try:
            run_huge(nrt, os.path.join(work, "huge_cgroup"), "1 GiB memory cgroup", {"cgroup": cg})
        finally:
            try:
                os.rmdir(cg)
            except OSError as e:
                print(f"hostile: could not remove the memory cgroup {cg}: {e}")
    d = os.path.join(work, "huge_cap")
    run_huge(nrt, d, "NRT_HOST_MEMORY_MAX=1G", {"env_extra": {"NRT_HOST_MEMORY_MAX": "1G"}})
    bad = {"NRT_HOST_MEMORY_MAX": "lots"}
    path, ncm = os.path.join(d, "relu.onnx"), os.path.join(d, "relu.ncm")
    with open(path, "wb") as f:
        f.write(model([N("Relu", ["X"], ["Y"])], [vi("X", [2, 3])], [vi("Y", None)]))
    rc, out, err = run([nrt, "compile", path, "-o", ncm], env_extra=bad)
    verdict("env/NRT_HOST_MEMORY_MAX=lots (nrt compile)", rc, out, err, must_fail=True, expect="NRT_HOST_MEMORY_MAX")
    run([nrt, "compile", path, "-o", ncm])
    rc, out, err = run([nrt, "run", ncm, "--output-dir", os.path.join(d, "out")], env_extra=bad)
    verdict("env/NRT_HOST_MEMORY_MAX=lots (nrt run)", rc, out, err, must_fail=True, expect="NRT_HOST_MEMORY_MAX")


def run_onnx(nrt, work):
    d = os.path.join(work, "onnx")
    os.makedirs(d, exist_ok=True)
    for name, data, expect in onnx_cases():
        path = os.path.join(d, f"{name}.onnx")
        with open(path, "wb") as f:
            f.write(data)
        ncm = os.path.join(d, f"{name}.ncm")
        rc, out, err = run([nrt, "compile", path, "-o", ncm])
        may = expect == MAY_COMPILE
        verdict(f"onnx/{name} (nrt compile)", rc, out, err, must_fail=not may,
                expect=None if may else expect)
        if may and rc == 0:
            rc, out, err = run([nrt, "run", ncm, "--output-dir", os.path.join(d, "out")])
            verdict(f"onnx/{name} (nrt run)", rc, out, err, must_fail=False)


# ---------------------------------------------------------------------------------------------
# Mutated NCM files
# ---------------------------------------------------------------------------------------------


def fix_crc(b):
    b[32:36] = b"\0\0\0\0"
    b[32:36] = struct.pack("<I", zlib.crc32(bytes(b)) & 0xFFFFFFFF)


def sections(b):
    count = struct.unpack_from("<I", b, 24)[0]
    out = {}
    for i in range(min(count, 16)):
        kind, _, off, size = struct.unpack_from("<IIQQ", b, 64 + 24 * i)
        out[kind] = (off, size)
    return out


def field_offsets(b):
    """Offsets worth overwriting: every u32 of the header, plan, I/O table and instruction
    operands (access-pattern shapes and strides), and every u64 of the plan."""
    s = sections(b)
    u32s, u64s, aps = list(range(0, 64, 4)), list(range(16, 64, 8)), []
    if 3 in s:  # PLAN: 32-byte records after an 8-byte count
        off, size = s[3]
        u32s += range(off, off + min(size, 8 + 32 * 16), 4)
        u64s += range(off + 8, off + min(size, 8 + 32 * 16), 8)
    if 2 in s:  # IO
        off, size = s[2]
        u32s += range(off, off + min(size, 256), 4)
    if 4 in s:  # BLOCKS: per block a 16-byte header, code, relocations
        off, size = s[4]
        n = struct.unpack_from("<I", b, off)[0]
        p = off + 8
        for _ in range(min(n, 64)):
            if p + 16 > off + size:
                break
            _, _, _, code, relocs, _ = struct.unpack_from("<BBHIII", b, p)
            p += 16
            u32s += range(p, p + code, 4)
            # Walk the instructions (u16 length at +2): operands are 48-byte access patterns
            # from +16, shape (4 × u32) at +16 and strides (4 × i32) at +32 of each.
            q = p
            while q + 4 <= p + code:
                ln = struct.unpack_from("<H", b, q + 2)[0]
                if ln < 16:
                    break
                ops = list(range(q + 16, q + ln - 47, 48))
                if ops:
                    aps.append(ops)
                q += ln
            u64s += range(p + code + 8, p + code + 16 * relocs, 16)  # relocation offsets
            p += code + 16 * relocs
    return ([o for o in u32s if o + 4 <= len(b)], [o for o in u64s if o + 8 <= len(b)],
            [ops for ops in aps if ops[-1] + 48 <= len(b)])


HUGE32 = [0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x40000000, 0x10000, 0]
HUGE64 = [2**64 - 1, 2**63, 2**63 - 1, 2**40, 2**40 + 1, 2**32]


def mutations(seed, rng, n):
    u32s, u64s, aps = field_offsets(seed)
    for k in range(n):
        b = bytearray(seed)
        kind = k % 6
        if kind == 0:  # bit flips
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
            what = "bitflip"
        elif kind == 1:  # truncation (file_size patched to match, so it reaches the sections)
            b = b[: rng.randrange(16, len(b))]
            if len(b) >= 24:
                b[16:24] = struct.pack("<Q", len(b))
            what = "truncate"
        elif kind in (2, 3):  # a u32 field overwritten with a huge value
            o = rng.choice(u32s)
            b[o:o + 4] = struct.pack("<I", rng.choice(HUGE32))
            what = f"u32@{o}"
        elif kind == 4:  # a u64 field
            o = rng.choice(u64s)
            b[o:o + 8] = struct.pack("<Q", rng.choice(HUGE64))
            what = f"u64@{o}"
        elif aps:  # D1's attack: one dimension of every operand of an instruction set to
            # 2^31 (so the shapes still agree) at stride i32::MAX / MIN
            ops, dim = rng.choice(aps), rng.randrange(4)
            size = rng.choice([2**31, 2**32 - 1, 2**20])
            for a in ops:
                b[a + 16 + 4 * dim:a + 20 + 4 * dim] = struct.pack("<I", size)
                b[a + 32 + 4 * dim:a + 36 + 4 * dim] = struct.pack("<i", rng.choice([2**31 - 1, -(2**31), 2**30, 0]))
            what = f"ap@{ops[0]}.dim{dim}"
        else:
            continue
        if len(b) >= 36 and (k % 7) != 6:  # most with a valid CRC, a few without
            fix_crc(b)
        yield f"{k:03d}-{what}", bytes(b)


def run_ncm(nrt, work):
    d = os.path.join(work, "ncm")
    os.makedirs(d, exist_ok=True)
    seeds = {}
    relu = model([N("Relu", ["X"], ["Y"])], [vi("X", [2, 3])], [vi("Y", [2, 3])])
    with open(os.path.join(d, "relu.onnx"), "wb") as f:
        f.write(relu)
    sources = [("relu", os.path.join(d, "relu.onnx"))]
    samples = os.path.join(work, "samples")
    rc, out, err = run([nrt, "samples", "--out", samples])
    if rc == 0:
        sources += [(s, os.path.join(samples, s, "model.onnx")) for s in ("mlp", "cnn")]
    for name, src in sources:
        dst = os.path.join(d, f"{name}.ncm")
        rc, out, err = run([nrt, "compile", src, "-o", dst])
        verdict(f"seed/{name} (nrt compile)", rc if rc != 0 else 0, out, err, must_fail=False)
        if rc == 0:
            with open(dst, "rb") as f:
                seeds[name] = f.read()
    rng = random.Random(11)
    per_seed = 80
    for name, seed in seeds.items():
        for mname, data in mutations(seed, rng, per_seed):
            path = os.path.join(d, f"{name}-{mname}.ncm")
            with open(path, "wb") as f:
                f.write(data)
            for cmd in ("inspect", "run"):
                rc, out, err = run([nrt, cmd, path] + (["--output-dir", d + "/out"] if cmd == "run" else []))
                verdict(f"ncm/{name}-{mname} (nrt {cmd})", rc, out, err, must_fail=False)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: hostile.py NRT WORKDIR")
    nrt, work = os.path.abspath(sys.argv[1]), sys.argv[2]
    os.makedirs(work, exist_ok=True)
    run_onnx(nrt, work)
    run_huge_all(nrt, work)
    run_ncm(nrt, work)
    # The second pass (issue 54): the runtime directory, records, the Prometheus endpoint,
    # monitor configs, the environment and .npy inputs.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hostile_host

    hostile_host.run_all(nrt, work, run, verdict)
    for f in FAILURES:
        print(f)
    print(f"hostile: {PASSED} passed, {len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
