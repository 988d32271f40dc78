#!/usr/bin/env python3
"""Long-context speed with a quantized KV cache: tokenloop beside llama.cpp
and ik_llama.cpp at a 16k context.

Two tests per engine, each peer with -ctk/-ctv of the cache type and flash
attention on (llama.cpp needs it for a quantized V; ik's best also repacks
the weights, -rtr 1):
  prefill: pp16384, a 16,384-token prompt from an empty cache;
  decode:  tg64 at depth 16,384 (llama-bench's and tokenloop's -d 16384,
           ik's -gp 16384,64: the prompt's time left out).
tokenloop also runs with an f16 cache, the baseline the quantized one is
held to. Uses the llama-bench builds of bench/compare-llamacpp
(bench/.cache/...; LLAMA_BENCH / IK_BENCH override). Run by hand:
  bench/kv-long/run.py [-m MODEL] [--kv q8_0] [-t 2] [-d 16384]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from machine import cpu_name  # noqa: E402
CACHE = os.path.join(ROOT, "bench", ".cache")
LLAMA = os.environ.get("LLAMA_BENCH", os.path.join(CACHE, "llama-cpp-python-0.3.36", "build", "bin", "llama-bench"))
IK = os.environ.get("IK_BENCH", os.path.join(CACHE, "ik-llama-cpp-python-0.1.5", "build", "bin", "llama-bench"))



def run_json(cmd):
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        return None, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    try:
        return json.loads(p.stdout), None
    except json.JSONDecodeError:
        return None, "output is not JSON"


def ts(recs, kind):
    for r in recs or []:
        if kind == "pp" and r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0:
            return r["avg_ts"]
        if kind == "tg" and r.get("n_gen", 0) > 0:  # -p 0 runs, or ik's -gp (its prompt untimed)
            return r["avg_ts"]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--kv", default="q8_0")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-d", type=int, default=16384)
    ap.add_argument("-r", type=int, default=1)
    a = ap.parse_args()
    d, r, t = str(a.d), str(a.r), str(a.t)
    tl = os.path.join(ROOT, "tokenloop")
    rows = []
    # (name, prefill command, decode command)
    for kv in ("f16", a.kv):
        rows.append((f"tokenloop --kv-type {kv}",
                     [tl, "bench", "-m", a.m, "-p", d, "-n", "0", "-r", r, "-t", t, "--kv-type", kv, "-o", "json"],
                     [tl, "bench", "-m", a.m, "-p", "0", "-n", "64", "-d", d, "-r", r, "-t", t, "--kv-type", kv,
                      "-o", "json"]))
    kvp = ["-ctk", a.kv, "-ctv", a.kv]
    if os.path.exists(LLAMA):
        rows.append((f"llama.cpp -fa on -ctk/-ctv {a.kv}",
                     [LLAMA, "-m", a.m, "-p", d, "-n", "0", "-r", r, "-t", t, "-fa", "on", *kvp, "-o", "json"],
                     [LLAMA, "-m", a.m, "-p", "0", "-n", "64", "-d", d, "-r", r, "-t", t, "-fa", "on", *kvp,
                      "-o", "json"]))
    if os.path.exists(IK):
        rows.append((f"ik_llama.cpp -fa 1 -rtr 1 -ctk/-ctv {a.kv}",
                     [IK, "-m", a.m, "-p", d, "-n", "0", "-r", r, "-t", t, "-fa", "1", "-rtr", "1", *kvp, "-o", "json"],
                     [IK, "-m", a.m, "-p", "0", "-n", "0", "-gp", f"{d},64", "-r", r, "-t", t, "-fa", "1", "-rtr", "1",
                      *kvp, "-o", "json"]))
    res = []
    for name, pcmd, dcmd in rows:
        pr, pe = run_json(pcmd)
        dr, de = run_json(dcmd)
        res.append((name, ts(pr, "pp"), ts(dr, "tg"), pe or de))
        print(f"  {name}: pp {res[-1][1]}, tg {res[-1][2]} {res[-1][3] or ''}", file=sys.stderr, flush=True)
    print(f"machine: {cpu_name()}, {a.t} threads; model {os.path.basename(a.m)}; KV {a.kv}; depth {a.d}\n")
    best_pp = max((x[1] for x in res[2:] if x[1]), default=None)
    best_tg = max((x[2] for x in res[2:] if x[2]), default=None)
    print(f"| engine | pp{a.d} t/s | tg64 @ d{a.d} t/s | note |")
    print("|---|---:|---:|---|")
    for name, pp, tg, err in res:
        f = lambda v: f"{v:.2f}" if v else "-"
        print(f"| {name} | {f(pp)} | {f(tg)} | {err or ''} |")
    q = res[1]
    if best_pp and best_tg and q[1] and q[2]:
        print(f"\ntokenloop {a.kv} vs the best peer: prefill {q[1] / best_pp:.2f}x, decode {q[2] / best_tg:.2f}x; "
              f"vs tokenloop f16: prefill {q[1] / res[0][1]:.2f}x, decode {q[2] / res[0][2]:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
