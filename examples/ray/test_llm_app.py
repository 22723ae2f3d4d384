"""The Ray Serve LLM example end to end: a local Ray with two `neuron_cores`, two replicas of
`llm_app.LlmServer` (SmolLM2 on its own core each), and the official `openai` client
streaming from both. Run by scripts/test.sh (`pytest examples/ray`) when the SmolLM2 GGUF
is installed; every wait is bounded and Ray is shut down at the end."""

from __future__ import annotations

import concurrent.futures
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")
from ray import serve  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llm_app  # noqa: E402

TEST_BUDGET_S = 240




@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    gguf = os.environ.get("NRT_SMOLLM2_GGUF")
    cli = os.environ.get("NRT_CLI")
    if not gguf or not os.path.isfile(gguf) or not cli:
        pytest.skip("NRT_SMOLLM2_GGUF and NRT_CLI are set by scripts/test.sh")
    out = tmp_path_factory.mktemp("llm") / "smollm2"
    subprocess.run([cli, "llm", "build", gguf, "-o", str(out), "--context-buckets", "32,64",
                    "--batch-buckets", "1,4", "--max-model-len", "128"],
                   check=True, capture_output=True, timeout=120)
    return str(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_replicas_stream_openai_completions(model_dir, runtime_dir):
    port = free_port()
    ray.init(num_cpus=2, resources={"neuron_cores": 2}, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False,
             # The replicas import llm_app from this directory.
             runtime_env={"env_vars": {"NRT_RUNTIME_DIR": runtime_dir("ray-llm-"),
                                       "PYTHONPATH": str(Path(__file__).resolve().parent)}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(llm_app.app(model_dir, "smollm2"), name="nrt-llm", route_prefix="/")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["smollm2"]

        def stream(i):
            raw = client.completions.with_raw_response.create(
                model="smollm2", prompt="The capital of France is", max_tokens=6,
                temperature=0, stream=True)
            text = "".join(c.choices[0].text for c in raw.parse() if c.choices)
            return raw.headers["x-nrt-replica"], text

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            answers = list(ex.map(stream, range(16)))
        replicas = {r for r, _ in answers}
        texts = {t for _, t in answers}
        assert len(replicas) == 2, replicas  # both replicas streamed
        assert {r.split("/")[1] for r in replicas} == {"0", "1"}  # one core each
        assert len(texts) == 1 and "Paris" in texts.pop(), answers  # greedy: the same everywhere

        chat = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=12, temperature=0)
        assert "Paris" in chat.choices[0].message.content
        assert chat.usage.completion_tokens >= 1
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="smollm2", prompt="x", max_tokens=0)
    finally:
        serve.shutdown()
        ray.shutdown()
