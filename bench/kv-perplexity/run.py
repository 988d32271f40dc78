#!/usr/bin/env python3
"""Perplexity with quantized KV caches, tokenloop beside llama.cpp.

For each cache type (f16, q8_0, q4_0 for K and V) on a GGUF model, runs
llama-perplexity's default protocol (non-overlapping chunks of -c tokens from
an empty cache, the second half of each scored) through llama.cpp (the
llama-cpp-python on PYTHONPATH: type_k/type_v, flash attention on for a
quantized cache, as llama.cpp needs) and `tokenloop perplexity --kv-type` in
the fast and exact numerics, and prints one markdown table with each row's
change from its own f16 figure.

Usage: bench/kv-perplexity/run.py [-m MODEL] [-f TEXT] [-c 512] [-t 2]
"""
import argparse
import math
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from machine import cpu_name  # noqa: E402
TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}



def llama_ppl(model, text, n_ctx, threads, kv):
    import llama_cpp
    from llama_cpp import Llama
    extra = {} if kv == "f16" else {"flash_attn": True, "type_k": TYPES[kv], "type_v": TYPES[kv]}
    llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads,
                n_threads_batch=threads, logits_all=True, verbose=False, **extra)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))
    toks = llm.tokenize(text.encode(), add_bos=add_bos, special=False)
    bos = llm.token_bos()
    nll, count = 0.0, 0
    for i in range(len(toks) // n_ctx):
        chunk = list(toks[i * n_ctx:(i + 1) * n_ctx])
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        rows = np.array(llm.scores[:n_ctx], dtype=np.float64)
        for j in range(n_ctx // 2, n_ctx - 1):
            r = rows[j]
            mx = r.max()
            nll += mx + math.log(np.exp(r - mx).sum()) - r[toks[i * n_ctx + j + 1]]
            count += 1
    return math.exp(nll / count)


def tl_ppl(model, text_path, n_ctx, threads, kv, numerics):
    out = subprocess.run([os.path.join(ROOT, "tokenloop"), "perplexity", "-m", model, "-f", text_path, "-c",
                          str(n_ctx), "-t", str(threads), "--kv-type", kv, "--numerics", numerics],
                         capture_output=True, text=True, check=True).stdout
    return float(re.search(r"PPL = ([0-9.]+)", out).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-f", default=os.path.join(ROOT, "tests", "oracle", "fixtures", "ppl_text.txt"))
    ap.add_argument("-c", type=int, default=512)
    ap.add_argument("-t", type=int, default=2)
    a = ap.parse_args()
    with open(a.f, encoding="utf-8") as f:
        text = f.read()
    print(f"machine: {cpu_name()}, {a.t} threads; model {os.path.basename(a.m)}; text {os.path.basename(a.f)}, "
          f"chunks of {a.c}\n")
    rows = {}
    for kv in TYPES:
        rows[kv] = (llama_ppl(a.m, text, a.c, a.t, kv), tl_ppl(a.m, a.f, a.c, a.t, kv, "fast"),
                    tl_ppl(a.m, a.f, a.c, a.t, kv, "exact"))
    print("| KV cache | llama.cpp | vs its f16 | tokenloop fast | vs its f16 | tokenloop exact | vs its f16 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kv, r in rows.items():
        cells = []
        for i in range(3):
            cells += [f"{r[i]:.4f}", f"{100 * (r[i] / rows['f16'][i] - 1):+.2f}%"]
        print(f"| {kv} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
