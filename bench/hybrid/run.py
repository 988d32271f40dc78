#!/usr/bin/env python3
"""A hybrid model (Gated DeltaNet + attention) through `tokenloop serve`:
the time to first token of a ~4k-token prompt cold and again (from the prefix
cache and its recurrent-state snapshot), and decode throughput with 1 and 16
concurrent streams, then the engine's own with 1 and 16 sequences
(`tokenloop bench --parallel`). Prints which machine it ran on.

Usage: bench/hybrid/run.py [-m models/random/qwen35moe-a3b-q4_k_m.gguf] [-t 2]
(the file: scripts/mkmodel.py qwen35moe-a3b, then llama-quantize Q4_K_M; see
bench/compare-llamacpp, which makes it)."""
import argparse
import concurrent.futures
import http.client
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from machine import cpu_name  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
import tlserver  # noqa: E402



def complete(port, prompt, n, stream=False):
    """(time to first token, total time, tokens, cached tokens) of one completion."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.time()
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                          "stream": True, "stream_options": {"include_usage": True},
                                                          }),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    first, usage = None, {}
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        d = json.loads(line[6:])
        if d.get("choices") and first is None:
            first = time.time() - t0
        if d.get("usage"):
            usage = d["usage"]
    c.close()
    return (first, time.time() - t0, usage.get("completion_tokens", 0),
            (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "random", "qwen35moe-a3b-q4_k_m.gguf"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--prompt-words", type=int, default=3000, help="words of the long prompt (~4k tokens)")
    a = ap.parse_args()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs, -t {a.threads}; tokenloop {commit}; {a.model}")
    words = ("the ledger lists each crate by weight and colour while the clerk checks the seals twice "
             "before noon").split()
    long_prompt = " ".join(words[i % len(words)] + (str(i % 97) if i % 5 == 0 else "") for i in range(a.prompt_words))
    srv = tlserver.Server(a.model, ["-np", "16", "-t", str(a.threads), "-c", "8192", "--spec", "off"])
    try:
        if not srv.wait_ready(timeout=600):
            sys.exit("server did not start")
        cold = complete(srv.port, long_prompt, 4)
        warm = complete(srv.port, long_prompt, 4)
        print(f"TTFT of a {a.prompt_words}-word prompt: cold {cold[0]:.2f} s, again {warm[0]:.3f} s "
              f"({warm[3]} tokens cached): {cold[0] / warm[0]:.1f}x lower")
        rates = {}
        for n in (1, 16):
            prompts = [f"Story {i}: once upon a time a traveller {i} walked" for i in range(n)]
            t0 = time.time()
            with concurrent.futures.ThreadPoolExecutor(n) as ex:
                res = list(ex.map(lambda p: complete(srv.port, p, 64), prompts))
            wall = time.time() - t0
            toks = sum(r[2] for r in res)
            rates[n] = toks / wall
            print(f"{n:2d} stream{'s' if n > 1 else ' '}: {toks} tokens in {wall:.1f} s = {rates[n]:.1f} tok/s")
        print(f"16 streams / 1: {rates[16] / rates[1]:.2f}x")
    finally:
        srv.stop()
    # The engine alone, one tl_ctx_decode per step (tokenloop bench --parallel):
    # what the server keeps of it, and the engine's own 16 / 1.
    eng = {}
    for n in (1, 16):
        p = subprocess.run([os.path.join(ROOT, "build", "tokenloop"), "bench", "-m", a.model, "-p", "0", "-n",
                            "32", "-r", "2", "-t", str(a.threads), "--parallel", str(n), "-o", "json"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"tokenloop bench --parallel {n}: {p.stderr[-300:]}")
        eng[n] = json.loads(p.stdout)[0]["avg_ts"]
        print(f"engine, {n:2d} sequence{'s' if n > 1 else ' '} (bench --parallel {n}): {eng[n]:.1f} tok/s; "
              f"the server keeps {rates[n] / eng[n]:.0%}")
    print(f"engine 16 / 1: {eng[16] / eng[1]:.2f}x")


if __name__ == "__main__":
    main()
