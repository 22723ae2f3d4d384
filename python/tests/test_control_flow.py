"""Control flow decided by the data: an `If` whose condition is computed at run time runs both
branches predicated on the device (the branch not taken moves no data and cannot fault) and
selects each output. One compiled model, executed on inputs that take either branch (and
either branch of an If nested in one), checked against ONNX Runtime each time."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import nrt
from conftest import ort_run, save


def branch(name, nodes, outs, inits=()):
    return helper.make_graph(
        nodes,
        name,
        [],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        list(inits),
    )


def gated_model(path):
    """Y = If(sum(X) > 0) { r = Relu(X @ W); If(max(X) > 1) { 2r } else { -r } }
    else { Gather(X, argmax(X, axis 1) + K, axis 0) }. The calls that take the then branch
    pass K = 100: the else branch's rows are then far past X's end, and it must not run (ONNX
    Runtime never runs it); the calls that take it pass K = 0."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 6)).astype(np.float32)
    inner_then = branch("inner_then", [helper.make_node("Mul", ["r", "two"], ["y2"])], ["y2"],
                        [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    inner_else = branch("inner_else", [helper.make_node("Neg", ["r"], ["y3"])], ["y3"])
    then_g = branch("then", [
        helper.make_node("MatMul", ["X", "W"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("If", ["big"], ["yt"], then_branch=inner_then, else_branch=inner_else),
    ], ["yt"])
    else_g = branch("else", [
        helper.make_node("ArgMax", ["X"], ["am"], axis=1, keepdims=0),
        helper.make_node("Add", ["am", "K"], ["rows"]),
        helper.make_node("Gather", ["X", "rows"], ["ye"], axis=0),
    ], ["ye"])
    nodes = [
        helper.make_node("ReduceSum", ["X"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("ReduceMax", ["X"], ["m"], keepdims=0),
        helper.make_node("Greater", ["m", "one"], ["big"]),
        helper.make_node("If", ["c"], ["Y"], then_branch=then_g, else_branch=else_g),
    ]
    g = helper.make_graph(
        nodes,
        "gated",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [6, 6]),
         helper.make_tensor_value_info("K", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [6, 6])],
        [numpy_helper.from_array(w, "W"),
         numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
         numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return save(m, path)


def test_run_time_if_takes_each_branch_and_matches_onnx_runtime(tmp_path):
    path = gated_model(tmp_path / "gated.onnx")
    m = nrt.Model.load(path)
    rng = np.random.default_rng(5)
    seen = set()
    for i in range(12):
        x = rng.standard_normal((6, 6)).astype(np.float32) * (0.2 if i % 3 == 0 else 1.0)
        if i % 2:
            x = -np.abs(x)  # sum <= 0: the else branch, with rows in range
            k = np.array(0, np.int64)
        else:
            x = np.abs(x)  # sum > 0: the then branch; the else branch's rows are out of range
            k = np.array(100, np.int64)
        (ref,) = ort_run(path, {"X": x, "K": k})
        out = m({"X": x, "K": k})["Y"]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=f"call {i}")
        seen.add((bool(x.sum() > 0), bool(x.max() > 1)))
    # Both branches, and both branches of the nested If, were taken.
    assert seen >= {(True, True), (True, False), (False, False)}, seen


def test_branches_of_different_shapes_are_refused_naming_the_if(tmp_path):
    then_g = branch("then", [helper.make_node("Relu", ["X"], ["a"])], ["a"])
    else_g = branch("else", [helper.make_node("ReduceSum", ["X"], ["b"], keepdims=1)], ["b"])
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["X"], ["s"], keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["Y"], name="gate", then_branch=then_g, else_branch=else_g)],
        "mismatch",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = save(m, tmp_path / "mismatch.onnx")
    with pytest.raises(nrt.NrtError) as e:
        nrt.compile(path)
    msg = str(e.value)
    assert "gate" in msg and "then_branch" in msg and "[2, 3]" in msg and "[1, 1]" in msg, msg
