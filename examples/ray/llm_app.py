"""Serving a decoder LLM over the OpenAI API with Ray Serve: one replica per NeuronCore.

Each replica asks Ray for one `neuron_cores` (Ray sets `NEURON_RT_VISIBLE_CORES`, the
replica's runtime reserves that core) and runs `nrt.llm.AsyncLLMEngine` — the continuously
batched engine of `nrt llm serve` — on a model directory built by `nrt llm build`. Ray's proxy
spreads requests over the replicas; each streams its tokens as server-sent events.

HTTP (127.0.0.1:8000 by default), the routes OpenAI clients use:
  POST /v1/completions        {"prompt", "max_tokens", "temperature", "top_p", "top_k",
  POST /v1/chat/completions    "seed", "stop", "stream"} (chat: "messages")
  GET  /v1/models
Every response carries `x-nrt-replica: <pid>/<core>`: which replica answered. (`nrt llm
serve` is the complete server — errors in OpenAI's format for every bad field, metrics,
draining; this example keeps the routes' common path.)

Run it (README, "Serving with Ray"):
    pip install ./python -r examples/ray/requirements.txt
    nrt llm build SmolLM2-135M-Instruct.Q4_1.gguf -o smollm2/
    python examples/ray/llm_app.py smollm2/      # serves until Ctrl-C
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from typing import Any, Dict, Optional, Sequence

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse


def _error(status: int, message: str, param: Optional[str] = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": param,
                   "code": status}},
        status_code=status,
    )


@serve.deployment(
    num_replicas=2,
    ray_actor_options={"resources": {"neuron_cores": 1}, "num_cpus": 0},
    max_ongoing_requests=64,
    graceful_shutdown_timeout_s=5,
)
class LlmServer:
    """One replica: the engine on the core Ray gave it."""

    def __init__(self, model_dir: str, name: str, max_num_seqs: int = 4) -> None:
        import nrt.llm

        self.nrt = nrt
        self.engine = nrt.llm.AsyncLLMEngine(model_dir, max_num_seqs=max_num_seqs)
        self.name = name
        self.replica = f"{os.getpid()}/{os.environ.get('NEURON_RT_VISIBLE_CORES', '')}"

    def _params(self, body: Dict[str, Any], chat: bool):
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = 256 if chat else 16  # OpenAI's default for completions
        return self.nrt.llm.SamplingParams(
            max_tokens=int(max_tokens),
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            top_k=int(body.get("top_k") or 0),
            seed=body.get("seed") if body.get("seed") is not None else uuid.uuid4().int & (2**63 - 1),
            stop=body.get("stop"),
        )

    async def __call__(self, request: Request):
        path = request.url.path.rstrip("/")
        headers = {"x-nrt-replica": self.replica}
        if path.endswith("/v1/models"):
            return JSONResponse({"object": "list", "data": [
                {"id": self.name, "object": "model", "owned_by": "nrt-rs"}]}, headers=headers)
        chat = path.endswith("/v1/chat/completions")
        if not (chat or path.endswith("/v1/completions")):
            return _error(404, f"no route {path}")
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            if body.get("model") not in (None, self.name):
                return _error(404, f"The model `{body['model']}` does not exist.", "model")
            if chat:
                prompt = self.engine.tokenizer.apply_chat_template(body["messages"])
            else:
                prompt = body["prompt"]
            params = self._params(body, chat)
            gen = self.engine.generate(prompt, params)
            first = await gen.__anext__()  # a bad request raises here, before any byte is sent
        except (KeyError, TypeError, ValueError, self.nrt.NrtError) as e:
            return _error(400, str(e))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
        created = int(time.time())
        obj = ("chat.completion" if chat else "text_completion")

        def chunk(text: str, finish: Optional[str], usage=None) -> str:
            choice = ({"index": 0, "delta": {"content": text} if text or not finish else {},
                       "finish_reason": finish} if chat else
                      {"index": 0, "text": text, "finish_reason": finish})
            c = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created,
                 "model": self.name, "choices": [choice]}
            if usage:
                c["usage"] = usage
            return f"data: {json.dumps(c)}\n\n"

        def usage(out) -> Dict[str, int]:
            n, m = len(out.prompt_token_ids), len(out.outputs[0].token_ids)
            return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}

        if body.get("stream"):
            async def events():
                shown = 0
                out = first
                try:
                    while True:
                        text = out.outputs[0].text
                        if out.finished:
                            if len(text) > shown:
                                yield chunk(text[shown:], None)
                            yield chunk("", out.outputs[0].finish_reason, usage(out))
                            yield "data: [DONE]\n\n"
                            return
                        if len(text) > shown:
                            yield chunk(text[shown:], None)
                            shown = len(text)
                        out = await gen.__anext__()
                finally:
                    await gen.aclose()  # a client that left cancels its request

            return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
        out = first
        async for out in gen:
            pass
        c = out.outputs[0]
        choice = ({"index": 0, "message": {"role": "assistant", "content": c.text},
                   "finish_reason": c.finish_reason} if chat else
                  {"index": 0, "text": c.text, "finish_reason": c.finish_reason})
        return JSONResponse({"id": rid, "object": obj, "created": created, "model": self.name,
                             "choices": [choice], "usage": usage(out)}, headers=headers)


def app(model_dir: str, name: str = "smollm2", num_replicas: int = 2, max_num_seqs: int = 4):
    """The Serve application for a model directory."""
    return LlmServer.options(num_replicas=num_replicas).bind(model_dir, name, max_num_seqs)


def main(argv: Optional[Sequence[str]] = None) -> None:
    import ray

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model_dir", help="a directory from `nrt llm build`")
    p.add_argument("--name", default="smollm2", help="the model's name in the API")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--neuron-cores", type=int, default=2, help="cores the local Ray node offers")
    p.add_argument("--seconds", type=float, default=0, help="serve this long (0: until Ctrl-C)")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nrt-llm-serve-") as tmp:
        ray.init(
            num_cpus=2,
            resources={"neuron_cores": a.neuron_cores},
            include_dashboard=False,
            runtime_env={"env_vars": {"NRT_RUNTIME_DIR": tempfile.mkdtemp(dir=tmp)}},
        )
        serve.start(http_options={"host": "127.0.0.1", "port": a.port})
        serve.run(app(os.path.abspath(a.model_dir), a.name, min(2, a.neuron_cores)),
                  name="nrt-llm", route_prefix="/")
        print(f"serving {a.model_dir} as {a.name!r} on http://127.0.0.1:{a.port}/v1  e.g.")
        print(f"  curl -N http://127.0.0.1:{a.port}/v1/completions -H 'content-type: application/json' "
              f"-d '{{\"model\": \"{a.name}\", \"prompt\": \"The capital of France is\", "
              f"\"max_tokens\": 16, \"temperature\": 0, \"stream\": true}}'")
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
