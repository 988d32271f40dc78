#!/usr/bin/env python3
"""Writes tests/oracle/fixtures/embed_mean.json: llama.cpp's mean-pooled
embeddings of SmolLM2 (through llama-cpp-python 0.3.36's AVX2 build,
Llama(embedding=True, pooling_type=1).embed(text, normalize=False)) for texts
of chosen token counts, one for each way its CPU path sums a mean
(src/forward/pool.c): tokens past the last step of 32 fall into blocks of 8,
of 4 and a fused tail (tinyBLAS, which would take multiples of 8, declines a
matmul of one column).
Read by tests/py/test_embed.py.
Run by hand: PYTHONPATH=/work/lcp-avx2/lib/python3.11/site-packages \\
    python3 tests/oracle/make_fixtures_embed_mean.py
"""
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(HERE, "fixtures", "embed_mean.json")
MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
# 8, 16: blocks of 8 alone; 64: steps of 32 alone; 13 and 45: a block of 8,
# one of 4 and 1 fused; 43: a block of 8 and 3 fused; 100: a block of 4 alone; 131: four steps of 32, 3 left
COUNTS = [8, 13, 16, 43, 45, 64, 100, 131]
WORDS = ("river stone light quiet garden morning paper window table orange music letter forest cloud "
         "bridge silver winter market").split()


def text_of(llm, n):
    """A text of exactly n tokens, grown a word at a time."""
    words, k = ["Once"], 0
    while True:
        t = " ".join(words)
        c = len(llm.tokenize(t.encode(), add_bos=True, special=True))
        if c == n:
            return t
        if c < n:
            words.append(WORDS[k % len(WORDS)])
        else:  # overshot: try the next word in the last slot
            words[-1] = WORDS[k % len(WORDS)]
        k += 1
        if k > 10000:
            raise SystemExit(f"no text of {n} tokens")


def main():
    import llama_cpp
    from llama_cpp import Llama
    llm = Llama(model_path=os.path.join(ROOT, MODEL), embedding=True, pooling_type=1, n_ctx=512, n_batch=512,
                n_ubatch=512, n_threads=2, verbose=False)
    cases = []
    for n in COUNTS:
        t = text_of(llm, n)
        v = np.array(llm.embed(t, normalize=False), dtype=np.float32)
        cases.append({"text": t, "ids": llm.tokenize(t.encode(), add_bos=True, special=True),
                      "embedding": [float(x) for x in v]})
        print(n, t[:60])
    out = {"meta": {"generator": "tests/oracle/make_fixtures_embed_mean.py",
                    "llama_cpp_python_version": llama_cpp.__version__, "model": MODEL,
                    "procedure": "Llama(embedding=True, pooling_type=1, n_ctx=n_batch=n_ubatch=512)"
                                 ".embed(text, normalize=False)"},
           "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
