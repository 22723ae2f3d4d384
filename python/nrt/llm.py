"""Decoder LLMs on the software NeuronCore, with the names vLLM users know.

    import nrt.llm
    llm = nrt.llm.LLM("smollm2/")             # a model directory (`nrt llm build`) ...
    llm = nrt.llm.LLM("SmolLM2.Q4_1.gguf")    # ... or a GGUF, built on the fly into a cache
    out = llm.generate(["The capital of France is"], nrt.llm.SamplingParams(max_tokens=16))
    print(out[0].outputs[0].text)
    for piece in llm.stream("Once upon a time", nrt.llm.SamplingParams(temperature=0.8, seed=1)):
        print(piece, end="", flush=True)

A GGUF is built into ``$NRT_LLM_CACHE`` (default ``~/.cache/nrt-rs/llm``), keyed by the file's
bytes and the build options; the next ``LLM`` of the same file loads it from there. The
model's programs run on logical NeuronCore ``core`` (0) of the process's runtime
(``nrt.configure``); the next token is sampled on the device.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator, List, Optional, Sequence, Union

from . import _nrt

__all__ = ["LLM", "AsyncLLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput",
           "Tokenizer"]


@dataclass
class SamplingParams:
    """How to generate (vLLM's names). ``temperature`` 0 is greedy; ``top_k`` 0 or -1 and
    ``top_p`` 1 mean no restriction; ``seed`` fixes the draws (with the token's position);
    ``stop`` strings end the text (not included); ``logprobs``: return each generated token's
    log-probability."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    stop: Optional[Union[str, Sequence[str]]] = None
    logprobs: Optional[int] = None

    def _stops(self) -> List[str]:
        if self.stop is None:
            return []
        if isinstance(self.stop, str):
            return [self.stop]
        return list(self.stop)


@dataclass
class CompletionOutput:
    """One generated sequence."""

    index: int
    text: str
    token_ids: List[int]
    finish_reason: str
    logprobs: Optional[List[float]] = None


@dataclass
class RequestOutput:
    """What one prompt produced."""

    prompt: str
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput] = field(default_factory=list)
    finished: bool = True


class Tokenizer:
    """The model's tokenizer (byte-level BPE from the GGUF)."""

    def __init__(self, engine: "_nrt._LlmEngine"):
        self._e = engine

    def encode(self, text: str) -> List[int]:
        return list(self._e.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self._e.decode(list(ids))

    def apply_chat_template(self, messages: Sequence[dict]) -> str:
        """The chat template applied to ``[{"role": ..., "content": ...}]``, the assistant's
        turn opened."""
        return self._e.apply_chat_template([(m["role"], m["content"]) for m in messages])


def _cache_dir() -> str:
    d = os.environ.get("NRT_LLM_CACHE")
    if d:
        return d
    return os.path.join(os.path.expanduser("~"), ".cache", "nrt-rs", "llm")


class LLM:
    """A decoder LLM loaded on the device. ``path``: a model directory or a ``.gguf``;
    ``build_options`` (for a GGUF): ``context_buckets``, ``batch_buckets``,
    ``max_model_len``, ``weights``, ``tp``; ``core``: the logical NeuronCore."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], core: int = 0, **build_options):
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        known = {"context_buckets", "batch_buckets", "max_model_len", "weights", "tp"}
        unknown = set(build_options) - known
        if unknown:
            raise TypeError(f"unknown build options {sorted(unknown)}; known: {sorted(known)}")
        self._engine = _nrt._LlmEngine(path, _cache_dir(), core=core, **build_options)
        self.path = self._engine.path
        self.tokenizer = Tokenizer(self._engine)

    @staticmethod
    def _args(p: SamplingParams):
        if p.max_tokens < 1:
            raise ValueError(f"max_tokens={p.max_tokens}: at least 1")
        top_k = 0 if p.top_k is None or p.top_k < 0 else int(p.top_k)
        seed = 0 if p.seed is None else int(p.seed) & (2**64 - 1)
        return (p.max_tokens, float(p.temperature), float(p.top_p), top_k, seed, p._stops())

    def _run(self, prompt: str, p: SamplingParams, on_text=None):
        args = self._args(p)
        ids = self.tokenizer.encode(prompt)
        toks, text, finish, lps = self._engine.generate(ids, *args, on_text)
        return ids, toks, text, finish, lps

    def generate(
        self,
        prompts: Union[str, Sequence[str]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
    ) -> List[RequestOutput]:
        """Generates for every prompt, batched on the device (continuous batching over the
        decode buckets); ``sampling_params`` is one for all or one per prompt. Each output is
        what its prompt gives alone."""
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        requests = []
        ids_of = []
        for prompt, p in zip(prompts, params):
            ids = self.tokenizer.encode(prompt)
            ids_of.append(ids)
            requests.append((ids,) + self._args(p))
        results = self._engine.generate_batch(requests)
        outs = []
        for prompt, ids, p, (toks, text, finish, lps) in zip(prompts, ids_of, params, results):
            c = CompletionOutput(0, text, list(toks), finish, list(lps) if p.logprobs else None)
            outs.append(RequestOutput(prompt, list(ids), [c]))
        return outs

    def chat(self, messages: Sequence[dict], sampling_params: Optional[SamplingParams] = None) -> List[RequestOutput]:
        """One chat turn: the template applied to ``messages``, then ``generate``."""
        return self.generate(self.tokenizer.apply_chat_template(messages), sampling_params)

    def stream(self, prompt: str, sampling_params: Optional[SamplingParams] = None) -> Iterator[str]:
        """Yields the text as it is generated (whole UTF-8 characters)."""
        p = sampling_params or SamplingParams()
        q: "queue.Queue" = queue.Queue()
        done = object()
        failure: List[BaseException] = []

        def work():
            try:
                self._run(prompt, p, q.put)
            except BaseException as e:  # re-raised in the consumer
                failure.append(e)
            finally:
                q.put(done)

        t = threading.Thread(target=work, daemon=True)
        t.start()
        while True:
            item = q.get()
            if item is done:
                break
            yield item
        t.join()
        if failure:
            raise failure[0]


# How long AsyncLLMEngine.generate waits between polls of a request with no news: doubling
# from the first to the second (a decode step takes tens of ms on this host).
_POLL_MIN_S = 0.0005
_POLL_MAX_S = 0.008


class AsyncLLMEngine:
    """Serving from Python (vLLM's ``AsyncLLMEngine`` shape): the same continuously batched
    engine as ``nrt llm serve``, on its own thread. ``path``: a model directory or a ``.gguf``
    (built with default options into the cache); ``max_num_seqs``: sequences decoded at once;
    ``max_queue``: requests that may wait (past it ``submit`` raises).

        engine = nrt.llm.AsyncLLMEngine("smollm2/")
        async for out in engine.generate("Once upon a time", SamplingParams(max_tokens=32)):
            print(out.outputs[0].text)          # the text so far; out.finished at the end

    A generator closed early (the consumer stopped iterating) cancels its request."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], core: int = 0,
                 max_num_seqs: Optional[int] = None, max_queue: int = 256):
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        self._s = _nrt._LlmServing(path, _cache_dir(), core=core, max_num_seqs=max_num_seqs,
                                   max_queue=max_queue)
        self.path = self._s.path
        self.tokenizer = Tokenizer(self._s)
        self._requests = {}

    async def generate(self, prompt: Union[str, Sequence[int]],
                       sampling_params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None) -> AsyncIterator[RequestOutput]:
        """Yields a ``RequestOutput`` per new piece of text (cumulative, ``finished`` False),
        then the last one (``finished`` True, with ``finish_reason``). ``prompt``: text or
        token ids."""
        p = sampling_params or SamplingParams()
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
            text_prompt = prompt
        else:
            ids = [int(t) for t in prompt]
            text_prompt = None
        req = self._s.submit(ids, *LLM._args(p))
        if request_id is not None:
            self._requests[request_id] = req.id
        text, toks, lps = "", [], []
        finished = False
        # Polled from the event loop without blocking it: no executor thread per request (a
        # few threads would serialize many streams); the pause between empty polls grows to
        # a few ms, well below a decode step.
        pause = _POLL_MIN_S
        try:
            while True:
                ev = req.next(0.0)
                if ev is None:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, _POLL_MAX_S)
                    continue
                pause = _POLL_MIN_S
                kind, piece, new_ids, new_lps, reason = ev
                if kind == "delta":
                    text += piece
                    toks += new_ids
                    lps += new_lps
                    c = CompletionOutput(0, text, list(toks), None, list(lps) if p.logprobs else None)
                    yield RequestOutput(text_prompt, list(ids), [c], finished=False)
                elif kind == "finished":
                    finished = True
                    c = CompletionOutput(0, piece, list(new_ids), reason,
                                         list(new_lps) if p.logprobs else None)
                    yield RequestOutput(text_prompt, list(ids), [c], finished=True)
                    return
                elif kind == "failed":
                    finished = True
                    raise RuntimeError(f"request failed: {piece}")
                else:
                    finished = True
                    raise RuntimeError("the engine stopped")
        finally:
            if request_id is not None:
                self._requests.pop(request_id, None)
            if not finished:
                self._s.abort(req.id)

    def abort(self, request_id: str) -> None:
        """Cancels the request ``generate`` was given ``request_id`` for."""
        rid = self._requests.get(request_id)
        if rid is not None:
            self._s.abort(rid)

    def num_unfinished_requests(self) -> int:
        return int(self._s.in_flight())

    def shutdown(self, grace_s: float = 0.0) -> int:
        """Stops the engine: what runs may finish within ``grace_s``; returns how many were
        cancelled."""
        return int(self._s.shutdown(grace_s))
