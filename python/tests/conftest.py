"""Shared fixtures: small ONNX models built with the onnx helper, the project's sample
models (written by `nrt samples`), and ONNX Runtime as the oracle."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]

# Ownership of cores is per NRT_RUNTIME_DIR: give this test process its own (decisions,
# "Host view and ownership"), before the runtime starts, and every subprocess another
# (`run_py`). All of them live under one directory, removed when the session ends.
RUNTIME_DIRS = tempfile.mkdtemp(prefix="nrt-pytest-")
atexit.register(shutil.rmtree, RUNTIME_DIRS, ignore_errors=True)
os.environ.setdefault("NRT_RUNTIME_DIR", tempfile.mkdtemp(prefix="rt-", dir=RUNTIME_DIRS))


def nrt_cli() -> str:
    """The `nrt` CLI binary (scripts/test.sh builds it and sets NRT_CLI)."""
    for c in [os.environ.get("NRT_CLI"), ROOT / "target/release/nrt", ROOT / "target/debug/nrt"]:
        if c and Path(c).is_file():
            return str(c)
    raise RuntimeError("the nrt CLI is not built: cargo build --release -p nrt-cli")


@pytest.fixture(scope="session")
def samples_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("samples")
    subprocess.run([nrt_cli(), "samples", "--out", str(d)], check=True, capture_output=True)
    return d


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def tiny_model(path: Path, batch="N", n=4) -> Path:
    """Y = Relu(X @ W + B): X [batch, n] float32 (batch symbolic by default)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n,)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["M"]),
            helper.make_node("Add", ["M", "B"], ["A"]),
            helper.make_node("Relu", ["A"], ["Y"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, n])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, n])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return save(m, path)


def two_input_model(path: Path) -> Path:
    """S = A + B (int32 [2, 3]); P = Mul(F, F) (float32 [3]) — two inputs of two dtypes."""
    g = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["S"]), helper.make_node("Mul", ["F", "F"], ["P"])],
        "two",
        [
            helper.make_tensor_value_info("A", TensorProto.INT32, [2, 3]),
            helper.make_tensor_value_info("B", TensorProto.INT32, [2, 3]),
            helper.make_tensor_value_info("F", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("S", TensorProto.INT32, [2, 3]),
            helper.make_tensor_value_info("P", TensorProto.FLOAT, [3]),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return save(m, path)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {
        "tiny_dyn": tiny_model(d / "tiny_dyn.onnx"),
        "tiny": tiny_model(d / "tiny.onnx", batch=2),
        "two": two_input_model(d / "two.onnx"),
    }


def ort_run(path, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def run_py(code: str, env=None, timeout=120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (a fresh process-global runtime)."""
    e = dict(os.environ)
    e["NRT_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="sub-", dir=RUNTIME_DIRS)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=timeout
    )
