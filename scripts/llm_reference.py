#!/usr/bin/env python3
"""Compares a decoder LLM on the software NeuronCore with ONNX Runtime on the same graph.

`nrt llm reference DIR --prompt ... --steps N -o OUT` runs each prompt greedily with the
logits head on the device and writes OUT/reference.json (prompts, tokens, the reference
ONNX graphs: the same programs, weights read from DIR/weights.bin) and the logits of the
prefill and of every decode step. This script runs those graphs with ONNX Runtime, with the
KV cache carried from step to step (present.* fed back as past_key_values.*), on the
device's own tokens, and checks per step:

- the logits: max |ours - ref| / max(1, |ref|) over the vocabulary <= --tol (1e-3);
- greedy: ONNX Runtime's arg-max is the token the device chose.

Usage: llm_reference.py OUT [--tol 1e-3]. Exit status 1 on any failure.
"""

import argparse
import json
import os
import sys

import numpy as np
import onnxruntime as ort


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args()
    with open(os.path.join(a.out, "reference.json")) as f:
        doc = json.load(f)
    vocab = doc["vocab_size"]
    layers = doc["layers"]
    cache_shape = doc["cache_shape"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sessions = {}

    def session(path):
        if path not in sessions:
            sessions[path] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        return sessions[path]

    failed = False
    worst_all = 0.0
    for i, p in enumerate(doc["prompts"]):
        ids = p["prompt_token_ids"]
        n, bucket = len(ids), p["bucket"]
        tokens = p["tokens"]
        ours = np.fromfile(os.path.join(a.out, p["logits"]), dtype="<f4").reshape(-1, vocab)
        past = {}
        for l in range(layers):
            for kv in ("key", "value"):
                past[f"past_key_values.{l}.{kv}"] = np.zeros(cache_shape, dtype=np.float32)

        def run(path, input_ids, positions, last):
            feeds = dict(past)
            feeds.update(
                input_ids=np.array(input_ids, dtype=np.int64),
                positions=np.array(positions, dtype=np.int64),
                slots=np.array([0], dtype=np.int64),
                last=np.array([last], dtype=np.int64),
            )
            s = session(path)
            names = [o.name for o in s.get_outputs()]
            out = dict(zip(names, s.run(names, feeds)))
            for l in range(layers):
                for kv in ("key", "value"):
                    past[f"past_key_values.{l}.{kv}"] = out[f"present.{l}.{kv}"]
            return out["logits"][0]

        padded = ids + [0] * (bucket - n)
        ref = [run(p["prefill_onnx"], [padded], [list(range(bucket))], n - 1)]
        for k in range(len(tokens) - 1):
            ref.append(run(p["decode_onnx"], [[tokens[k]]], [[n + k]], 0))
        ref = np.stack(ref)
        err = np.abs(ours - ref) / np.maximum(1.0, np.abs(ref))
        per_step = err.max(axis=1)
        worst = float(per_step.max())
        worst_all = max(worst_all, worst)
        agree = [int(np.argmax(ref[k])) == tokens[k] for k in range(len(tokens))]
        ok = worst <= a.tol and all(agree)
        failed |= not ok
        first_bad = next((k for k, g in enumerate(agree) if not g), None)
        print(
            f"prompt {i}: {n} tokens (bucket {bucket}), {len(tokens) - 1} decode steps: "
            f"max rel logit error {worst:.2e} (prefill {per_step[0]:.2e}), "
            f"greedy identical {sum(agree)}/{len(agree)}"
            + ("" if first_bad is None else f" (first differs at step {first_bad})")
            + ("" if ok else "  FAIL")
        )
    print(f"worst relative logit error over all steps: {worst_all:.2e} (tolerance {a.tol:g})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
