"""The `nrt` package: outputs against ONNX Runtime, the API surface, the data paths."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading

import numpy as np
import pytest

import nrt
from conftest import ort_run, run_py, tiny_model

SAMPLES = ["mlp", "mlp_b64", "cnn", "encoder", "transformer"]


def feeds_for(m: nrt.Model, seed=0):
    rng = np.random.default_rng(seed)
    return {i.name: (rng.random(i.shape) * 2 - 1).astype(i.dtype) for i in m.inputs}


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_models_match_onnx_runtime(samples_dir, name):
    path = samples_dir / name / "model.onnx"
    m = nrt.Model.load(path)
    feeds = feeds_for(m)
    out = m(feeds)
    ref = ort_run(path, feeds)
    assert list(out) == [o.name for o in m.outputs]
    for o, r in zip(m.outputs, ref):
        assert out[o.name].shape == r.shape and out[o.name].dtype == r.dtype
        np.testing.assert_allclose(out[o.name], r, rtol=1e-4, atol=1e-5)


def test_tensor_info(models):
    m = nrt.Model.load(models["two"])
    assert [(i.name, i.shape, i.dtype, i.size) for i in m.inputs] == [
        ("A", (2, 3), np.dtype(np.int32), 24),
        ("B", (2, 3), np.dtype(np.int32), 24),
        ("F", (3,), np.dtype(np.float32), 12),
    ]
    assert [(o.name, o.shape, o.dtype) for o in m.outputs] == [
        ("S", (2, 3), np.dtype(np.int32)),
        ("P", (3,), np.dtype(np.float32)),
    ]
    assert isinstance(m.inputs[0].dtype, np.dtype)
    assert "TensorInfo(name=\"A\", shape=(2, 3)" in repr(m.inputs[0])
    assert m.name and m.core == 0 and m.cores == 1 and m.loaded


def test_run_and_call_agree_several_dtypes(models):
    m = nrt.Model.load(models["two"])
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.full((2, 3), 7, np.int32)
    f = np.array([1.5, -2.0, 3.0], np.float32)
    out = m({"A": a, "B": b, "F": f})
    np.testing.assert_array_equal(out["S"], a + b)
    np.testing.assert_array_equal(out["P"], f * f)
    out2 = m.run({"A": a, "B": b, "F": f})
    np.testing.assert_array_equal(out2["S"], out["S"])


def test_non_contiguous_inputs_are_copied_once_and_correct(models):
    m = nrt.Model.load(models["tiny"])
    base = np.random.default_rng(1).random((4, 8)).astype(np.float32)
    strided = base[::2, ::2]  # [2, 4] view, not contiguous
    fortran = np.asfortranarray(base[:2, :4])
    assert not strided.flags.c_contiguous and not fortran.flags.c_contiguous
    for x in (strided, fortran, base[:2, :4].tolist()):
        out = m({"X": x})["Y"]
        ref = ort_run(models["tiny"], {"X": np.ascontiguousarray(x, dtype=np.float32)})[0]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    # The caller's array is only read.
    before = base.copy()
    m({"X": base[:2, :4].copy()})
    np.testing.assert_array_equal(base, before)


def test_outputs_are_fresh_arrays(models):
    m = nrt.Model.load(models["tiny"])
    x = np.ones((2, 4), np.float32)
    y1 = m({"X": x})["Y"]
    y2 = m({"X": 2 * x})["Y"]
    assert not np.shares_memory(y1, y2)
    assert y1.flags.c_contiguous and y1.flags.writeable and y1.flags.owndata


def test_eight_threads_at_once(models):
    m = nrt.Model.load(models["tiny"])
    ref_inputs = [np.full((2, 4), k / 8, np.float32) for k in range(8)]
    refs = [ort_run(models["tiny"], {"X": x})[0] for x in ref_inputs]
    errors = []
    barrier = threading.Barrier(8)

    def worker(k):
        try:
            barrier.wait(timeout=30)
            for _ in range(300):
                y = m({"X": ref_inputs[k]})["Y"]
                np.testing.assert_allclose(y, refs[k], rtol=1e-5, atol=1e-6)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]


def test_threads_on_two_cores(models):
    m0 = nrt.Model.load(models["tiny"], core=0)
    m1 = nrt.Model.load(models["tiny"], core=1)
    assert (m0.core, m1.core) == (0, 1)
    x = np.ones((2, 4), np.float32)
    ref = ort_run(models["tiny"], {"X": x})[0]
    results = []

    def worker(m):
        for _ in range(200):
            results.append(np.allclose(m({"X": x})["Y"], ref, rtol=1e-5, atol=1e-6))

    ts = [threading.Thread(target=worker, args=(m,)) for m in (m0, m1, m0, m1)]
    [t.start() for t in ts]
    [t.join(timeout=60) for t in ts]
    assert len(results) == 800 and all(results)


def test_submit_future(models):
    m = nrt.Model.load(models["tiny"])
    x = np.ones((2, 4), np.float32)
    fut = m.submit({"X": x})
    assert isinstance(fut, nrt.Future)
    out = fut.result(timeout=10)
    np.testing.assert_allclose(out["Y"], ort_run(models["tiny"], {"X": x})[0], rtol=1e-5, atol=1e-6)
    bad = m.submit({"X": np.ones((3, 4), np.float32)})
    with pytest.raises(nrt.NrtError) as e:
        bad.result(timeout=10)
    assert e.value.status == 2 and "'X'" in str(e.value)


def test_asyncio(models):
    m = nrt.Model.load(models["tiny"])
    xs = [np.full((2, 4), k, np.float32) for k in range(16)]

    async def main():
        return await asyncio.wait_for(asyncio.gather(*(m.submit({"X": x}) for x in xs)), 30)

    outs = asyncio.run(main())
    for x, o in zip(xs, outs):
        np.testing.assert_allclose(o["Y"], ort_run(models["tiny"], {"X": x})[0], rtol=1e-5, atol=1e-6)


def test_device_tensor_path(models):
    m = nrt.Model.load(models["tiny"])
    x = np.random.default_rng(2).random((2, 4)).astype(np.float32)
    t = nrt.Tensor.from_numpy(x, core=0, name="x_dev")
    assert (t.shape, t.dtype, t.core, t.size, t.name) == ((2, 4), np.dtype(np.float32), 0, 32, "x_dev")
    np.testing.assert_array_equal(t.numpy(), x)
    ref = ort_run(models["tiny"], {"X": x})[0]
    np.testing.assert_allclose(m({"X": t})["Y"], ref, rtol=1e-5, atol=1e-6)
    # Updating the device tensor in place changes what the model sees.
    t.write(2 * x)
    np.testing.assert_allclose(m({"X": t})["Y"], ort_run(models["tiny"], {"X": 2 * x})[0], rtol=1e-5, atol=1e-6)
    # Host and device inputs mix; the host path still works after a device call.
    np.testing.assert_allclose(m({"X": x})["Y"], ref, rtol=1e-5, atol=1e-6)
    # A tensor on another core, or of the wrong size, is refused naming the input.
    with pytest.raises(nrt.NrtError, match="core 1"):
        m({"X": nrt.Tensor.from_numpy(x, core=1)})
    with pytest.raises(nrt.NrtError, match="'X'"):
        m({"X": nrt.Tensor.from_numpy(np.ones((3, 4), np.float32))})


def test_benchmark_smoke(models):
    m = nrt.Model.load(models["tiny"])
    for mode in ("host", "device"):
        r = m.benchmark(warmup=5, iterations=50, mode=mode)
        assert {"mean", "min", "max", "p50", "p99", "std", "per_iteration"} <= set(r)
        assert len(r["per_iteration"]) == 50 and r["unit"] == "us"
        assert 0 < r["min"] <= r["p50"] <= r["p99"] <= r["max"]
    with pytest.raises(nrt.NrtError, match="mode"):
        m.benchmark(1, 1, mode="gpu")


def test_profile_writes_chrome_trace(models, tmp_path):
    m = nrt.Model.load(models["tiny"])
    x = np.ones((2, 4), np.float32)
    p = tmp_path / "trace.json"
    with nrt.profile(p):
        for _ in range(3):
            m({"X": x})
    events = json.loads(p.read_text())["traceEvents"]
    names = {e["name"] for e in events}
    assert {"validate", "bind", "stage", "doorbell", "harvest"} <= names, names
    assert sum(e["name"] == "harvest" for e in events) >= 3


def test_compile_and_load_ncm(models, tmp_path):
    blob = nrt.compile(models["tiny_dyn"], input_shapes={"X": [3, 4]}, cores=1)
    assert isinstance(blob, bytes) and len(blob) > 0
    m = nrt.Model.load(blob)
    assert m.inputs[0].shape == (3, 4)
    p = tmp_path / "tiny3.ncm"
    p.write_bytes(blob)
    m2 = nrt.Model.load(str(p))
    x = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(m({"X": x})["Y"], m2({"X": x})["Y"])
    # Compiling from bytes too.
    assert nrt.compile(models["tiny"].read_bytes()) == nrt.compile(models["tiny"])


def test_inference_session_static(samples_dir):
    path = samples_dir / "cnn" / "model.onnx"
    s = nrt.InferenceSession(path)
    i = s.get_inputs()[0]
    assert (i.name, i.shape, i.type) == ("X", [1, 3, 32, 32], "tensor(float)")
    x = np.random.default_rng(3).random((1, 3, 32, 32)).astype(np.float32)
    out = s.run(None, {"X": x})
    ref = ort_run(path, {"X": x})
    assert isinstance(out, list) and len(out) == len(ref)
    for a, b in zip(out, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    names = [o.name for o in s.get_outputs()]
    assert len(s.run(names[:1], {"X": x})) == 1


def test_inference_session_symbolic_dims_compile_per_shape(models):
    s = nrt.InferenceSession(models["tiny_dyn"])
    assert s.get_inputs()[0].shape == ["N", 4]
    assert s.get_outputs()[0].type == "tensor(float)"
    assert s.compiled_shapes == []
    for n in (1, 5, 1, 5, 2):
        x = np.random.default_rng(n).random((n, 4)).astype(np.float32)
        np.testing.assert_allclose(
            s.run(None, {"X": x})[0], ort_run(models["tiny_dyn"], {"X": x})[0], rtol=1e-5, atol=1e-6
        )
    assert sorted(s.compiled_shapes) == [((1, 4),), ((2, 4),), ((5, 4),)]


def test_status_table():
    assert nrt.STATUS["NRT_SUCCESS"] == 0
    assert nrt.STATUS["NRT_TIMEOUT"] == 5
    assert nrt.STATUS["NRT_EXEC_UNIT_UNRECOVERABLE"] == 101


def test_visible_cores_default_is_whole_device():
    assert nrt.visible_cores() == [[0], [1]]


def bf16_model(path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [
            helper.make_node("Cast", ["X"], ["Y"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["Y"], ["Z"], to=TensorProto.BFLOAT16),
        ],
        "bf",
        [helper.make_tensor_value_info("X", TensorProto.BFLOAT16, [4])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("Z", TensorProto.BFLOAT16, [4]),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_bfloat16_with_ml_dtypes(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert nrt.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    m = nrt.Model.load(bf16_model(tmp_path / "bf.onnx"))
    assert m.inputs[0].dtype == nrt.bfloat16 and m.outputs[1].dtype == nrt.bfloat16
    x = np.array([1.5, -2, 3.25, 0.1], ml_dtypes.bfloat16)
    for feed in (x, x.view(np.uint16)):  # raw bits are accepted too
        out = m({"X": feed})
        np.testing.assert_array_equal(out["Y"], x.astype(np.float32))
        assert out["Z"].dtype == nrt.bfloat16
        np.testing.assert_array_equal(out["Z"].view(np.uint16), x.view(np.uint16))


def test_bfloat16_without_ml_dtypes_is_uint16(tmp_path):
    path = bf16_model(tmp_path / "bf.onnx")
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import numpy as np, nrt\n"
        "assert nrt.bfloat16 == np.dtype(np.uint16)\n"
        f"m = nrt.Model.load({str(path)!r})\n"
        "assert m.inputs[0].dtype == np.uint16\n"
        "bits = np.array([0x3FC0, 0xC000], np.uint16).repeat(2)  # 1.5, -2.0\n"
        "out = m({'X': bits})\n"
        "print(out['Y'].tolist(), out['Z'].dtype, out['Z'].tolist())\n"
    )
    r = run_py(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[1.5, 1.5, -2.0, -2.0] uint16 [16320, 16320, 49152, 49152]"


def test_every_public_name_has_a_docstring():
    for name in nrt.__all__:
        obj = getattr(nrt, name)
        if isinstance(obj, (dict, np.dtype)):
            continue
        assert obj.__doc__, name
    for cls in (nrt.Model, nrt.Tensor, nrt.TensorInfo, nrt.InferenceSession):
        for k, v in vars(cls).items():
            if not k.startswith("_") and (callable(v) or inspect.isdatadescriptor(v)):
                assert getattr(v, "__doc__", None), f"{cls.__name__}.{k}"


def test_minus_one_batch_model_matches_onnx_runtime(tmp_path):
    """A model exported with -1 as its batch dimension (a common exporter habit; ONNX Runtime
    takes it as unknown): the session specializes it per batch size given, one compiled model
    each, every call checked against ONNX Runtime."""
    path = tiny_model(tmp_path / "minus_one.onnx", batch=-1)
    s = nrt.InferenceSession(path)
    assert s.compiled_shapes == []
    for n in (3, 1, 3, 7):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_allclose(
            s.run(None, {"X": x})[0], ort_run(path, {"X": x})[0], rtol=1e-5, atol=1e-6
        )
    assert sorted(s.compiled_shapes) == [((1, 4),), ((3, 4),), ((7, 4),)]
