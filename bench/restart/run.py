#!/usr/bin/env python3
"""Time to first token of a long agent context after a server restart, with
the prefix cache on disk (serve --cache-dir), against prefilling it.

Starts `tokenloop serve --cache-dir` on a fresh directory, sends a prompt of
about N tokens (an agent's context: instructions and tool results) with
max_tokens 32 at temperature 0 and times it (cold: the whole prefill), stops
the server (SIGTERM), starts it again on the same directory, sends the same
request (warm: the prefix read back from disk) and compares the two answers
token for token. Prints one markdown table. Run by hand:
  bench/restart/run.py [-m MODEL] [-n 30000] [-t 2]
"""
import argparse
import http.client
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(a, d):
    port = free_port()
    p = subprocess.Popen([os.path.join(ROOT, "tokenloop"), "serve", "-m", a.m, "--port", str(port), "-np", "1",
                          "-t", str(a.t), "-c", str(a.c), "--cache-dir", d],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        if "disk cache" in line:
            print("  " + line.strip(), file=sys.stderr)
            return p, port
    raise SystemExit("the server did not start")


def ask(port, prompt):
    """(time to the first streamed token, the whole answer's text, usage)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t = time.time()
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": prompt, "max_tokens": 32, "temperature": 0,
                                                          "stream": True,
                                                          "stream_options": {"include_usage": True}}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, text, usage = None, "", {}
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices") or []:
            if ch.get("text") and ttft is None:
                ttft = time.time() - t
            text += ch.get("text") or ""
        usage = ev.get("usage") or usage
    return ttft, text, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("-n", type=int, default=30000, help="prompt tokens, about")
    ap.add_argument("-c", type=int, default=32768)
    ap.add_argument("-t", type=int, default=2)
    a = ap.parse_args()
    def make_prompt(k):
        parts = ["You are a coding agent. Follow the tool protocol exactly.\n"]
        for i in range(k):
            parts.append(f"<tool_result id={i}>file src/mod{i % 97}.c line {i * 13 % 997}: "
                         f"value = compute(x{i}, y{i % 31}); /* checked {i * 7 % 101} times */</tool_result>\n")
        return "".join(parts) + "\nSummarise the tool results above in one sentence:"

    d = tempfile.mkdtemp(prefix="tl-restart-")
    try:
        p, port = start(a, d)
        # as many tool results as fit a.n tokens (the server's own tokenizer)
        lo, hi = 1, 4 * a.n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            c.request("POST", "/tokenize", body=json.dumps({"content": make_prompt(mid)}),
                      headers={"Content-Type": "application/json"})
            n_tok = len(json.loads(c.getresponse().read())["tokens"])
            lo, hi = (mid, hi) if n_tok <= a.n else (lo, mid - 1)
        prompt = make_prompt(lo)
        cold, toks_cold, usage = ask(port, prompt)
        p.terminate()
        p.wait()
        p, port = start(a, d)
        warm, toks_warm, usage2 = ask(port, prompt)
        p.terminate()
        p.wait()
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    n = usage["prompt_tokens"]
    cached = (usage2.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    print(f"machine: {cpu_name()}, {a.t} threads; model {os.path.basename(a.m)}; prompt {n} tokens, "
          f"32 generated; disk cache {size / 2**20:.0f} MiB\n")
    print("| server | time to first token, s | positions from cache | answer (32 tokens) |")
    print("|---|---:|---:|---|")
    print(f"| first start (cold) | {cold:.2f} | 0 | - |")
    print(f"| after a restart (--cache-dir) | {warm:.2f} | {cached} | "
          f"{'the same 32 tokens' if toks_cold == toks_warm else 'DIFFERENT'} |")
    print(f"\nrestart vs cold: {cold / warm:.1f}x lower")
    return 0 if toks_cold == toks_warm else 1


if __name__ == "__main__":
    sys.exit(main())
