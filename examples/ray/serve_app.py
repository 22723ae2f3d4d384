"""Serving a model on the software NeuronCore with Ray Serve.

Two replicas, each asking Ray for one `neuron_cores`; Ray sets `NEURON_RT_VISIBLE_CORES` for
each, and each replica's `nrt` runtime reserves exactly that core. Requests are batched with
`@serve.batch` onto the model's batch dimension: the model (an ONNX file whose first input
dimension is the batch, symbolic or not) is compiled once per batch size in `BATCH_SIZES`,
and each batch runs on the smallest compiled size that holds it, padded with zeros.

HTTP (127.0.0.1:8000 by default):
  POST /       {"x": [...one example...]}  -> {"y": [...], "core": "0", "pid": ..., "node": ...}
  GET  /info                                -> which replica / core / node answered
  POST /fault  {"spec": "fatal"}            -> arms a fault plan in the replica that answers
                                               (nrt.inject_faults: that process only)

A replica whose core hits a fatal device error (NRT_EXEC_UNIT_UNRECOVERABLE) answers 503 and
fails its health check, so Serve replaces it with a fresh replica (a fresh runtime).

Run it (README, "Serving with Ray"):
    pip install ./python -r examples/ray/requirements.txt
    python examples/ray/serve_app.py            # serves until Ctrl-C; try the curl it prints
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

BATCH_SIZES = (1, 4, 16)
MAX_BATCH = max(BATCH_SIZES)


@serve.deployment(
    num_replicas=2,
    ray_actor_options={"resources": {"neuron_cores": 1}, "num_cpus": 0},
    health_check_period_s=1,
    health_check_timeout_s=10,
    graceful_shutdown_timeout_s=2,
    max_ongoing_requests=64,
)
class NrtModel:
    """One replica: one runtime on the core Ray gave it, one compiled model per batch size."""

    def __init__(self, model_path: str, batch_sizes: Sequence[int] = BATCH_SIZES) -> None:
        import ray

        import nrt

        self.nrt = nrt
        # The runtime reads NEURON_RT_VISIBLE_CORES (set by Ray) when it starts, here.
        self.visible = os.environ.get("NEURON_RT_VISIBLE_CORES", "")
        self.node = ray.get_runtime_context().get_node_id()
        self.runtime_dir = os.environ.get("NRT_RUNTIME_DIR", "")
        sig_in, _ = nrt._nrt._onnx_signature(model_path)
        self.input_name = sig_in[0][0]
        self.example_shape = [int(d) for d in sig_in[0][1][1:]]
        self.models = {
            b: nrt.Model.load(
                model_path, core=0, input_shapes={self.input_name: [b, *self.example_shape]}
            )
            for b in sorted(batch_sizes)
        }
        self.output_name = self.models[min(self.models)].outputs[0].name
        self.fatal: Optional[str] = None

    def _where(self) -> Dict[str, Any]:
        return {
            "core": self.visible,
            "cores": self.nrt.visible_cores(),
            "pid": os.getpid(),
            "node": self.node,
            "runtime_dir": self.runtime_dir,
        }

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=0.005)
    async def predict(self, xs: List[np.ndarray]) -> List[Any]:
        n = len(xs)
        size = min(b for b in self.models if b >= n)
        batch = np.zeros([size, *self.example_shape], np.float32)
        batch[:n] = np.stack(xs)
        try:
            out = await self.models[size].submit({self.input_name: batch})
        except self.nrt.NrtError as e:
            if e.status == self.nrt.STATUS["NRT_EXEC_UNIT_UNRECOVERABLE"]:
                self.fatal = str(e)  # check_health fails: Serve replaces this replica
            return [e] * n
        y = out[self.output_name]
        return [(y[i], size) for i in range(n)]

    async def __call__(self, request: Request) -> JSONResponse:
        path = request.url.path.rstrip("/")
        if path.endswith("/info"):
            return JSONResponse(self._where())
        if path.endswith("/fault"):
            spec = (await request.json()).get("spec", "fatal")
            self.nrt.inject_faults(spec)
            return JSONResponse({"armed": spec, **self._where()})
        if self.fatal is not None:
            return JSONResponse({"error": self.fatal, **self._where()}, status_code=503)
        body = await request.json()
        x = np.asarray(body["x"], np.float32)
        if list(x.shape) != self.example_shape:
            return JSONResponse(
                {"error": f"x has shape {list(x.shape)}; expected {self.example_shape}"},
                status_code=400,
            )
        r = await self.predict(x)
        if isinstance(r, Exception):
            code = 503 if self.fatal is not None else 500
            return JSONResponse({"error": str(r), **self._where()}, status_code=code)
        y, size = r
        return JSONResponse({"y": y.tolist(), "batch": size, **self._where()})

    def check_health(self) -> None:
        if self.fatal is not None:
            raise RuntimeError(f"NeuronCore {self.visible} is in a fatal state: {self.fatal}")


def app(model_path: str, batch_sizes: Sequence[int] = BATCH_SIZES, num_replicas: int = 2):
    """The Serve application for `model_path`."""
    return NrtModel.options(num_replicas=num_replicas).bind(model_path, tuple(batch_sizes))


def demo_model(path: str, features: int = 16, hidden: int = 32) -> str:
    """Writes a small MLP with a symbolic batch dimension: Y = Relu(X W1 + b1) W2 + b2."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W1"], ["h0"]),
            helper.make_node("Add", ["h0", "B1"], ["h1"]),
            helper.make_node("Relu", ["h1"], ["h2"]),
            helper.make_node("MatMul", ["h2", "W2"], ["h3"]),
            helper.make_node("Add", ["h3", "B2"], ["Y"]),
        ],
        "serve_mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])],
        [w("W1", features, hidden), w("B1", hidden), w("W2", hidden, 4), w("B2", 4)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def main(argv: Optional[Sequence[str]] = None) -> None:
    import ray

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="ONNX model (first input dim = batch); default: a demo MLP")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--neuron-cores", type=int, default=2, help="cores the local Ray node offers")
    p.add_argument("--seconds", type=float, default=0, help="serve this long (0: until Ctrl-C)")
    a = p.parse_args(argv)
    # The demo model and this node's NRT_RUNTIME_DIR (ownership of cores is per directory)
    # live in a directory removed on the way out.
    with tempfile.TemporaryDirectory(prefix="nrt-serve-") as tmp:
        model = a.model or demo_model(os.path.join(tmp, "serve_mlp.onnx"))
        ray.init(
            num_cpus=2,
            resources={"neuron_cores": a.neuron_cores},
            include_dashboard=False,
            runtime_env={"env_vars": {"NRT_RUNTIME_DIR": tempfile.mkdtemp(dir=tmp)}},
        )
        serve.start(http_options={"host": "127.0.0.1", "port": a.port})
        serve.run(app(model, num_replicas=min(2, a.neuron_cores)), name="nrt", route_prefix="/")
        print(f"serving {model} on http://127.0.0.1:{a.port}/  e.g.")
        print(
            f"  curl -s -X POST http://127.0.0.1:{a.port}/ -H 'content-type: application/json' "
            f"-d '{{\"x\": {[0.5] * 16}}}'"
        )
        try:
            deadline = time.monotonic() + a.seconds if a.seconds else None
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            serve.shutdown()
            ray.shutdown()


if __name__ == "__main__":
    main()
