"""Outputs whose extent depends on the data (NonZero, Unique, NonMaxSuppression): the device
holds a static upper bound and writes the actual shape into `<name>:shape`; the package
returns each such output trimmed to its actual shape, checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import nrt
from conftest import ort_run, save


def nonzero_model(path):
    g = helper.make_graph(
        [helper.make_node("NonZero", ["X"], ["Y"])],
        "nonzero",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.INT64, [2, None])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return save(m, path)


def unique_model(path):
    g = helper.make_graph(
        [helper.make_node("Unique", ["X"], ["Y", "I", "V", "C"], sorted=0)],
        "unique",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None]),
            helper.make_tensor_value_info("I", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("V", TensorProto.INT64, [8]),
            helper.make_tensor_value_info("C", TensorProto.INT64, [None]),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return save(m, path)


@pytest.mark.parametrize(
    "x",
    [
        np.array([[1, 0, 2, 0], [0, 0, 0, 3], [4, 5, 0, 0]], np.float32),
        np.zeros((3, 4), np.float32),  # nothing selected: shape (2, 0)
        np.ones((3, 4), np.float32),  # everything: the whole bound
    ],
)
def test_inference_session_trims_nonzero_to_its_actual_shape(tmp_path, x):
    path = nonzero_model(tmp_path / "nonzero.onnx")
    s = nrt.InferenceSession(path)
    assert [o.name for o in s.get_outputs()] == ["Y"]
    out = s.run(None, {"X": x})
    (ref,) = ort_run(path, {"X": x})
    assert len(out) == 1
    assert out[0].shape == ref.shape and out[0].dtype == np.int64
    np.testing.assert_array_equal(out[0], ref)
    # The Neuron-style call: the same, and the companion is not a result of its own.
    m = nrt.Model.load(path)
    d = m({"X": x})
    assert list(d) == ["Y"]
    np.testing.assert_array_equal(d["Y"], ref)
    # The companion is listed among the model's outputs (the C view), at the bound.
    infos = {o.name: o.shape for o in m.outputs}
    assert infos == {"Y": (2, 12), "Y:shape": (2,)}


def test_inference_session_trims_every_unique_output(tmp_path):
    path = unique_model(tmp_path / "unique.onnx")
    s = nrt.InferenceSession(path)
    for x in (
        np.array([2, 1, 1, 3, 4, 3, 1, 2], np.float32),
        np.full(8, 7.0, np.float32),  # all equal: one distinct value
    ):
        out = s.run(None, {"X": x})
        ref = ort_run(path, {"X": x})
        assert len(out) == 4
        for a, b in zip(out, ref):
            assert a.shape == b.shape, (a, b)
            np.testing.assert_array_equal(a, b)
