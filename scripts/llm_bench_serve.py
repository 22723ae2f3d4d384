#!/usr/bin/env python3
"""A serving benchmark of `nrt llm serve` (issue 49), with the fields of vLLM's
`benchmark_serving.py`: TTFT, TPOT, ITL and end-to-end latency (mean, p50, p99), request/s,
output tokens/s and goodput under a TTFT/TPOT target.

    scripts/llm_bench_serve.py --nrt target/release/nrt --dir smollm2/ \
        [--concurrency 1,4,8,16] [--requests 32] [--prompt-len 16:48] [--output-len 32] \
        [--rate inf] [--ttft-ms 2000] [--tpot-ms 250] [--json]

Starts the server itself (127.0.0.1, a free port, `--max-num-seqs` the largest batch bucket)
or, with `--url`, measures a running one. For each concurrency: `--requests` requests, each
prompt a fixed-seed draw of `--prompt-len` tokens' worth of public-domain text, each output
exactly `--output-len` tokens (`ignore_eos`, greedy), sent all at once (`--rate inf`) or at a
Poisson rate, at most `concurrency` in flight. The first row (concurrency 1) is batch-1
generation through the same server: the table's last column is each row's output tokens/s
against it.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
    "season of Light, it was the season of Darkness, it was the spring of hope, it was the winter "
    "of despair, we had everything before us, we had nothing before us, we were all going direct "
    "to Heaven, we were all going direct the other way"
).split()


def prompt_of(rng, lo, hi):
    n = rng.randint(lo, hi)
    start = rng.randrange(len(TEXT))
    words = [TEXT[(start + i) % len(TEXT)] for i in range(n)]
    # About one token per word of this text.
    return " ".join(words)


def one(host, port, model, prompt, out_len):
    """Streams one completion; returns (ttft, [itl...], e2e, tokens)."""
    c = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps({
        "model": model, "prompt": prompt, "max_tokens": out_len, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}))
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
    ttft, last, itl, tokens = None, None, [], 0
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        if ev.get("choices") and ev["choices"][0].get("text"):
            now = time.perf_counter()
            if ttft is None:
                ttft = now - t0
            else:
                itl.append(now - last)
            last = now
    e2e = time.perf_counter() - t0
    c.close()
    return ttft or e2e, itl, e2e, tokens


def run(host, port, model, concurrency, prompts, out_len, rate, rng):
    results, lock = [], threading.Lock()
    slots = threading.Semaphore(concurrency)

    def worker(p):
        try:
            res = one(host, port, model, p, out_len)
            with lock:
                results.append(res)
        finally:
            slots.release()

    threads = []
    t0 = time.perf_counter()
    for p in prompts:
        slots.acquire()
        t = threading.Thread(target=worker, args=(p,))
        t.start()
        threads.append(t)
        if rate != float("inf"):
            time.sleep(rng.expovariate(rate))
    for t in threads:
        t.join(timeout=900)
    return results, time.perf_counter() - t0


def pct(v, q):
    if not v:
        return 0.0
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def summarize(concurrency, results, wall, ttft_ms, tpot_ms):
    ttft = [r[0] * 1e3 for r in results]
    tpot = [(r[2] - r[0]) * 1e3 / (r[3] - 1) for r in results if r[3] > 1]
    itl = [x * 1e3 for r in results for x in r[1]]
    e2e = [r[2] * 1e3 for r in results]
    out_tokens = sum(r[3] for r in results)
    good = sum(1 for r in results
               if r[0] * 1e3 <= ttft_ms and (r[3] <= 1 or (r[2] - r[0]) * 1e3 / (r[3] - 1) <= tpot_ms))
    row = {"concurrency": concurrency, "requests": len(results), "duration_s": wall,
           "request_throughput": len(results) / wall, "output_throughput": out_tokens / wall,
           "goodput": good / wall}
    for name, v in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2e_ms", e2e)):
        row[f"mean_{name}"] = statistics.fmean(v) if v else 0.0
        row[f"p50_{name}"] = pct(v, 50)
        row[f"p99_{name}"] = pct(v, 99)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nrt", default="target/release/nrt")
    ap.add_argument("--dir")
    ap.add_argument("--url", help="a running server, http://HOST:PORT (else one is started)")
    ap.add_argument("--model", help="the served model name (default: asked from /v1/models)")
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-len", default="16:48")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--rate", type=float, default=float("inf"), help="requests/s (Poisson)")
    ap.add_argument("--ttft-ms", type=float, default=2000.0)
    ap.add_argument("--tpot-ms", type=float, default=250.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.prompt_len.split(":"))
    server = None
    if a.url:
        m = re.match(r"http://([^:/]+):(\d+)", a.url)
        host, port = m.group(1), int(m.group(2))
    else:
        if not a.dir:
            sys.exit("give --dir (a model directory) or --url")
        server = subprocess.Popen([a.nrt, "llm", "serve", a.dir, "--port", "0"],
                                  stderr=subprocess.PIPE, text=True)
        host, port = "127.0.0.1", None
        deadline = time.time() + 120
        while time.time() < deadline and port is None:
            line = server.stderr.readline()
            if not line:
                break
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
        if port is None:
            server.kill()
            sys.exit("the server did not start")
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    try:
        c = http.client.HTTPConnection(host, port, timeout=30)
        c.request("GET", "/v1/models")
        model = a.model or json.loads(c.getresponse().read())["data"][0]["id"]
        rng = random.Random(a.seed)
        prompts = [prompt_of(rng, lo, hi) for _ in range(a.requests)]
        one(host, port, model, prompts[0], 2)  # warm-up: every program touched once
        rows = []
        for conc in [int(x) for x in a.concurrency.split(",")]:
            res, wall = run(host, port, model, conc, prompts, a.output_len, a.rate,
                            random.Random(a.seed))
            rows.append(summarize(conc, res, wall, a.ttft_ms, a.tpot_ms))
        base = rows[0]["output_throughput"] if rows else 1.0
        for r in rows:
            r["vs_first_row"] = r["output_throughput"] / base if base else 0.0
        if a.json:
            for r in rows:
                print(json.dumps(r))
        else:
            print(f"{a.requests} requests per row, prompts {a.prompt_len} words, {a.output_len} "
                  f"output tokens, rate {a.rate}, goodput: TTFT ≤ {a.ttft_ms} ms and TPOT ≤ "
                  f"{a.tpot_ms} ms")
            hdr = ("conc", "req/s", "out tok/s", "goodput", "TTFT mean/p50/p99 ms",
                   "TPOT mean/p50/p99 ms", "ITL p50/p99 ms", "E2E mean/p99 ms", "vs conc 1")
            print(" | ".join(hdr))
            for r in rows:
                print(" | ".join([
                    f"{r['concurrency']}", f"{r['request_throughput']:.2f}",
                    f"{r['output_throughput']:.1f}", f"{r['goodput']:.2f}",
                    f"{r['mean_ttft_ms']:.0f}/{r['p50_ttft_ms']:.0f}/{r['p99_ttft_ms']:.0f}",
                    f"{r['mean_tpot_ms']:.1f}/{r['p50_tpot_ms']:.1f}/{r['p99_tpot_ms']:.1f}",
                    f"{r['p50_itl_ms']:.1f}/{r['p99_itl_ms']:.1f}",
                    f"{r['mean_e2e_ms']:.0f}/{r['p99_e2e_ms']:.0f}",
                    f"{r['vs_first_row']:.2f}x"]))
    finally:
        if server:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    main()
