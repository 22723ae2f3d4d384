"""The Ray Serve example end to end: a local Ray with two `neuron_cores`, two replicas on
different cores, outputs against ONNX Runtime, a replica hit by a fatal device fault replaced
by Serve, and a two-node simulated cluster spreading the replicas. Run by scripts/test.sh
(`pytest examples/ray`); every wait is bounded and Ray is shut down at the end."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_app  # noqa: E402

# A whole test may take this long before it is failed (Ray start + deploy on 2 vCPUs take
# ~15-30 s each).
TEST_BUDGET_S = 150




@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return serve_app.demo_model(str(tmp_path_factory.mktemp("ray") / "serve_mlp.onnx"))


@pytest.fixture(scope="module")
def oracle(model):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return lambda x: s.run(None, {"X": x[None, :]})[0][0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 20.0):
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"error": text.decode(errors="replace")}


def infer_many(url: str, oracle, n: int, workers: int = 16, seed: int = 0):
    """n concurrent requests; checks every answer against ONNX Runtime; returns them."""
    rng = np.random.default_rng(seed)
    xs = (rng.random((n, 16)) * 2 - 1).astype(np.float32)
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        answers = list(ex.map(lambda x: post(url, {"x": x.tolist()}), xs))
    for x, (code, body) in zip(xs, answers):
        assert code == 200, body
        np.testing.assert_allclose(np.array(body["y"], np.float32), oracle(x), rtol=1e-4, atol=1e-5)
    return [b for _, b in answers]


def start_local_ray(neuron_cores: int, runtime_dir: str) -> None:
    ray.init(
        num_cpus=2,
        resources={"neuron_cores": neuron_cores},
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
        runtime_env={"env_vars": {"NRT_RUNTIME_DIR": runtime_dir}},
    )


def test_two_replicas_batching_faults(model, oracle, runtime_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    start_local_ray(2, runtime_dir("ray-"))
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(serve_app.app(model), name="nrt", route_prefix="/")

        # A few hundred requests, checked against ONNX Runtime; batched onto the batch dim.
        answers = infer_many(url, oracle, 300)
        cores = {a["core"] for a in answers}
        pids = {a["pid"] for a in answers}
        assert cores == {"0", "1"}, cores  # NEURON_RT_VISIBLE_CORES, one core per replica
        assert len(pids) == 2
        assert {tuple(map(tuple, a["cores"])) for a in answers} == {((0,),), ((1,),)}
        assert max(a["batch"] for a in answers) > 1, "requests were never batched"

        # Arm a fatal fault in the replica that answers (that process only).
        code, armed = post(url + "fault", {"spec": "fatal"})
        assert code == 200, armed
        victim = armed["pid"]
        saw_fatal = False
        replaced = False
        streak = 0
        deadline = time.monotonic() + 90
        rng = np.random.default_rng(1)
        while time.monotonic() < deadline:
            x = (rng.random(16) * 2 - 1).astype(np.float32)
            code, body = post(url, {"x": x.tolist()})
            if code == 200:
                np.testing.assert_allclose(np.array(body["y"], np.float32), oracle(x), rtol=1e-4, atol=1e-5)
                if body["pid"] not in pids:
                    replaced = True
                streak = streak + 1 if replaced else 0
                if saw_fatal and replaced and streak >= 50:
                    break
            else:
                assert code in (500, 503), (code, body)
                if body.get("pid") == victim and "NRT_EXEC_UNIT_UNRECOVERABLE" in body.get("error", ""):
                    saw_fatal = True
                streak = 0
                time.sleep(0.05)
        assert saw_fatal, "the armed replica never reported the fatal fault"
        assert replaced, "Serve did not replace the failed replica in time"
        assert streak >= 50
        # The replacement took the freed core; both cores serve again.
        answers = infer_many(url, oracle, 100, seed=2)
        assert {a["core"] for a in answers} == {"0", "1"}
        assert victim not in {a["pid"] for a in answers}
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_node_cluster_spreads_replicas(model, oracle, runtime_dir):
    from ray.cluster_utils import Cluster

    dirs = [runtime_dir(f"node{i}-") for i in range(3)]
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    # Each simulated node has its own NRT_RUNTIME_DIR (ownership of cores is per directory;
    # both nodes' core 0 would collide otherwise) and one neuron core.
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "env_vars": {"NRT_RUNTIME_DIR": dirs[0]},
        },
    )
    try:
        for d in dirs[1:]:
            cluster.add_node(num_cpus=1, resources={"neuron_cores": 1}, env_vars={"NRT_RUNTIME_DIR": d})
        cluster.wait_for_nodes(timeout=60)
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(serve_app.app(model), name="nrt", route_prefix="/")
        answers = infer_many(url, oracle, 100, workers=8)
        nodes = {a["node"] for a in answers}
        assert len(nodes) == 2, nodes  # one replica per node: each node has one core
        assert {a["runtime_dir"] for a in answers} == set(dirs[1:])
        assert {a["core"] for a in answers} == {"0"}  # each node's own core 0
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
