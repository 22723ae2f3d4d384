#!/usr/bin/env python3
"""`nrt llm serve` tested as its users use it (issue 49): the official `openai` client, many
streaming clients with random disconnects, bad input, a flood past the queue, a device fault
mid-generation, and a drain on SIGTERM. Every wait is bounded; servers bind 127.0.0.1 only
and are stopped at the end.

    scripts/llm_serve_test.py NRT_BINARY MODEL_DIR

MODEL_DIR is a built SmolLM2 directory (scripts/test.sh builds one with context buckets
32,64, batch buckets 1,4 and max model length 128).
"""

import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import openai

NRT, DIR = sys.argv[1], sys.argv[2]
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
]


def start(*extra, env=None):
    """Starts a server on a free port; returns (process, port)."""
    p = subprocess.Popen(
        [NRT, "llm", "serve", DIR, "--port", "0", *extra],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            # Keep reading stderr so the server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, int(m.group(1))
    p.kill()
    sys.exit(f"FAIL: the server did not start: {line!r}")


def stop(p):
    """SIGTERM: the server drains and exits 0 within its grace period."""
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        sys.exit("FAIL: the server did not stop within 60 s of SIGTERM")
    assert rc == 0, f"exit status {rc} after SIGTERM"


def raw(port, method, path, body=None, headers=None, timeout=60):
    """One request with http.client: (status, headers, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def metrics(port):
    _, _, text = raw(port, "GET", "/metrics")
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def metric(m, name, **labels):
    for k, v in m.items():
        if k.split("{")[0] == name and all(f'{a}="{b}"' in k for a, b in labels.items()):
            return v
    raise KeyError(name)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")
    print(f"ok: {what}")


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def openai_client_checks(port, name):
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                      timeout=120)
    models = c.models.list()
    check([m.id for m in models.data] == [name], f"/v1/models lists {name!r}")

    r = c.completions.create(model=name, prompt=PROMPTS[0], max_tokens=8, temperature=0)
    text = r.choices[0].text
    check("Paris" in text, f"completion answers Paris: {text!r}")
    check(r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 0, f"usage {r.usage}")
    check(r.choices[0].finish_reason == "length", "finish_reason length")

    # Longer than the largest context bucket (64): prefilled in chunks.
    long_prompt = ("Berlin is the capital of Germany. Madrid is the capital of Spain. "
                   "Rome is the capital of Italy. Lisbon is the capital of Portugal. "
                   "Vienna is the capital of Austria. Athens is the capital of Greece. "
                   "Warsaw is the capital of Poland. Dublin is the capital of Ireland. "
                   "Oslo is the capital of Norway. The capital of France is")
    r = c.completions.create(model=name, prompt=long_prompt, max_tokens=4, temperature=0)
    check(64 < r.usage.prompt_tokens < 120 and "Paris" in r.choices[0].text,
          f"a {r.usage.prompt_tokens}-token prompt past the largest bucket (chunked prefill): "
          f"{r.choices[0].text!r}")

    pieces = []
    last = None
    for chunk in c.completions.create(model=name, prompt=PROMPTS[0], max_tokens=8,
                                      temperature=0, stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            last = chunk
    check("".join(pieces) == text, "streamed text equals the whole response")
    check(last.choices[0].finish_reason == "length", "the last chunk has the finish_reason")

    chat = c.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16, temperature=0)
    answer = chat.choices[0].message.content
    check("Paris" in answer, f"chat answers Paris: {answer!r}")
    streamed = "".join(
        ch.choices[0].delta.content or ""
        for ch in c.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True})
        if ch.choices)
    check(streamed == answer, "streamed chat equals the whole chat answer")

    stop_at = text.split()[1] if len(text.split()) > 1 else "."
    s = c.completions.create(model=name, prompt=PROMPTS[0], max_tokens=8, temperature=0,
                             stop=[stop_at])
    check(s.choices[0].finish_reason == "stop" and stop_at not in s.choices[0].text,
          f"stop string {stop_at!r} ends the text: {s.choices[0].text!r}")

    a = c.completions.create(model=name, prompt=PROMPTS[1], max_tokens=12, temperature=0.9,
                             top_p=0.95, seed=1234)
    b = c.completions.create(model=name, prompt=PROMPTS[1], max_tokens=12, temperature=0.9,
                             top_p=0.95, seed=1234)
    check(a.choices[0].text == b.choices[0].text, "a seed reproduces the sampled text")

    lp = c.completions.create(model=name, prompt=PROMPTS[0], max_tokens=4, temperature=0,
                              logprobs=0)
    l = lp.choices[0].logprobs
    check(len(l.token_logprobs) == 4 and all(x <= 0 for x in l.token_logprobs),
          f"completion logprobs: {l.token_logprobs}")
    chat_lp = c.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
        temperature=0, logprobs=True)
    content = chat_lp.choices[0].logprobs.content
    check(len(content) == chat_lp.usage.completion_tokens and all(t.logprob <= 0 for t in content),
          "chat logprobs, one per token")

    try:
        c.completions.create(model="gpt-4", prompt="x", max_tokens=1)
        check(False, "an unknown model is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "unknown model: 404 NotFoundError")
    try:
        c.completions.create(model=name, prompt="x", max_tokens=100000)
        check(False, "max_tokens past the context is refused")
    except openai.BadRequestError as e:
        check("maximum context length" in str(e), "max_tokens past the context: 400, says why")


def alone(port, name, prompt, max_tokens):
    s, _, b = raw(port, "POST", "/v1/completions", json.dumps(
        {"model": name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}))
    assert s == 200, (s, b)
    return json.loads(b)["choices"][0]["text"]


def stream_client(port, name, prompt, max_tokens, leave_after, out, i):
    """A raw SSE client; leaves (closes the socket) after `leave_after` chunks if set."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps(
            {"model": name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
             "stream": True}))
        r = c.getresponse()
        if r.status != 200:
            out[i] = ("status", r.status)
            return
        text, chunks, finish, done = "", 0, None, 0
        while True:
            line = r.fp.readline()
            if not line:
                break
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done += 1
                break
            ev = json.loads(data)
            if "error" in ev:
                out[i] = ("error", ev["error"]["message"])
                return
            ch = ev["choices"][0]
            text += ch["text"]
            finish = ch["finish_reason"] or finish
            chunks += 1
            if leave_after is not None and chunks >= leave_after:
                c.sock.shutdown(socket.SHUT_RDWR)
                c.close()
                out[i] = ("left", text)
                return
        out[i] = ("done", text, finish, done)
    except Exception as e:  # noqa: BLE001 — reported as the client's outcome
        out[i] = ("exception", repr(e))


def load_checks(port, name, pid):
    want = {p: alone(port, name, p, 8) for p in PROMPTS}
    before = metrics(port)
    rss0 = rss_mb(pid)
    rng = random.Random(7)
    n = 64
    plan = [(PROMPTS[i % 4], rng.choice([None, None, None, 1, 3])) for i in range(n)]
    out = [None] * n
    threads = [threading.Thread(target=stream_client, args=(port, name, p, 8, leave, out, i))
               for i, (p, leave) in enumerate(plan)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    check(all(not t.is_alive() for t in threads), f"64 streaming clients ended in {time.time() - t0:.1f} s")
    finished = [(i, o) for i, o in enumerate(out) if o and o[0] == "done"]
    left = [o for o in out if o and o[0] == "left"]
    bad = [o for o in out if not o or o[0] not in ("done", "left")]
    check(not bad, f"every client finished or left on purpose: {bad[:3]}")
    for i, o in finished:
        if o[1] != want[plan[i][0]] or o[3] != 1:
            sys.exit(f"FAIL: client {i}: {o!r} != alone {want[plan[i][0]]!r}")
    check(True, f"{len(finished)} finished streams equal their request alone, {len(left)} left early")
    # The engine hears a departure at its next step: wait for it to settle.
    deadline = time.time() + 30
    while time.time() < deadline:
        m = metrics(port)
        if metric(m, "vllm:num_requests_running") == 0 and metric(m, "vllm:num_requests_waiting") == 0:
            break
        time.sleep(0.1)
    ended = sum(metric(m, "vllm:request_success_total", finished_reason=r) -
                metric(before, "vllm:request_success_total", finished_reason=r)
                for r in ("stop", "length", "abort"))
    check(ended == n, f"no request lost or duplicated: {ended:.0f} ended of {n}")
    check(metric(m, "vllm:kv_cache_usage_perc") == 0, "every cache slot was freed")
    rss1 = rss_mb(pid)
    check(rss1 - rss0 < 64, f"memory flat: RSS {rss0:.0f} → {rss1:.0f} MB")


def bad_input_checks(port, name):
    def post(body, path="/v1/completions", headers=None):
        return raw(port, "POST", path, body, headers)

    cases = [
        (b"{bad json", 400, "not valid JSON"),
        (b"\xff\xfe\x00garbage", 400, "not valid JSON"),
        (b"[1,2]", 400, "JSON object"),
        (json.dumps({"prompt": 5}), 400, "one prompt"),
        (json.dumps({"prompt": "x", "max_tokens": "ten"}), 400, "integer"),
        (json.dumps({"prompt": "x", "max_tokens": -3}), 400, "at least 1"),
        (json.dumps({"prompt": "x", "max_tokens": 10**12}), 400, "maximum context length"),
        (json.dumps({"prompt": "x", "temperature": -1}), 400, "temperature"),
        (json.dumps({"prompt": "x", "top_p": 0}), 400, "top_p"),
        (json.dumps({"prompt": "x", "n": 3}), 400, "n = 1"),
        (json.dumps({"prompt": [1, 2, 99999999]}), 400, "vocabulary"),
        (json.dumps({"prompt": "x", "stop": [""]}), 400, "stop"),
        (json.dumps({"prompt": "word " * 400}), 400, "context"),
        (json.dumps({"prompt": "x", "model": "other"}), 404, "does not exist"),
        (json.dumps({"messages": "hi"}), 400, "messages"),
    ]
    for body, status, says in cases:
        path = "/v1/chat/completions" if b"messages" in (body if isinstance(body, bytes) else body.encode()) else "/v1/completions"
        s, _, b = post(body, path)
        err = json.loads(b).get("error", {}) if b.startswith(b"{") else {}
        if s != status or says not in err.get("message", ""):
            sys.exit(f"FAIL: {body[:60]!r}: {s} {b[:200]!r}, want {status} saying {says!r}")
    check(True, f"{len(cases)} bad requests: OpenAI errors with the right status")
    s, _, b = post(b"{" + b" " * (2 << 20) + b"}")
    check(s == 413, f"a 2 MB body: 413 ({s})")
    s, _, _ = raw(port, "GET", "/nope")
    check(s == 404, "an unknown route: 404")
    # A slow-loris client holds a connection open; others are served meanwhile.
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    check(alone(port, name, PROMPTS[0], 2) != "", "served beside a slow-loris client")
    slow.close()


def flood_checks(port, name):
    """Far more requests than the queue holds: 200 or 429 with Retry-After, nothing else."""
    statuses, retry = [], []
    lock = threading.Lock()

    def one():
        try:
            s, h, _ = raw(port, "POST", "/v1/completions", json.dumps(
                {"model": name, "prompt": "Hi", "max_tokens": 1, "temperature": 0}), timeout=300)
        except Exception as e:  # noqa: BLE001
            s, h = repr(e), {}
        with lock:
            statuses.append(s)
            if s == 429:
                retry.append(h.get("Retry-After") or h.get("retry-after"))

    threads = [threading.Thread(target=one) for _ in range(300)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    kinds = {s: statuses.count(s) for s in set(statuses)}
    check(set(kinds) <= {200, 429} and kinds.get(429, 0) > 0 and all(retry),
          f"a flood of 300: {kinds}, every 429 with Retry-After")
    check(alone(port, name, PROMPTS[0], 2) != "", "served after the flood")


def fault_checks():
    # The sixth execution (a decode step of the first request) wedges the core.
    p, port = start("--max-num-seqs", "4", env={"NRT_SIM_FAULTS": "fatal@exec=6"})
    try:
        out = [None]
        stream_client(port, DIR.rstrip("/"), PROMPTS[1], 12, None, out, 0)
        check(out[0][0] == "error" and "UNRECOVERABLE" in out[0][1].upper(),
              f"a fault mid-generation ends the stream with an error event: {out[0]}")
        check(alone(port, DIR.rstrip("/"), PROMPTS[0], 4) != "", "the core was reset: the next request runs")
        m = metrics(port)
        check(metric(m, "nrt_llm_requests_failed_total") == 1, "the failure is counted")
    finally:
        stop(p)


def drain_checks():
    p, port = start("--max-num-seqs", "4", "--drain-timeout", "20")
    name = DIR.rstrip("/")
    out = [None] * 3
    threads = [threading.Thread(target=stream_client, args=(port, name, PROMPTS[i], 24, None, out, i))
               for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    s, _, _ = raw(port, "GET", "/health")
    s2, _, b = raw(port, "POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1}))
    for t in threads:
        t.join(timeout=120)
    rc = p.wait(timeout=60)
    check(s == 503 and s2 == 503, f"draining: /health {s}, a new request {s2}")
    check(all(o and o[0] == "done" and o[3] == 1 for o in out),
          f"what ran when SIGTERM came finished: {[o[0] if o else o for o in out]}")
    check(rc == 0, "the server exits 0 after draining")


def main():
    p, port = start("--max-num-seqs", "4", "--max-queue", "64")
    name = DIR.rstrip("/")
    try:
        s, _, _ = raw(port, "GET", "/health")
        check(s == 200, "/health 200")
        openai_client_checks(port, name)
        load_checks(port, name, p.pid)
        bad_input_checks(port, name)
        flood_checks(port, name)
    finally:
        stop(p)
    fault_checks()
    drain_checks()
    print("llm serve: all checks passed")


if __name__ == "__main__":
    main()
