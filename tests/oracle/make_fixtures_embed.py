#!/usr/bin/env python3
"""Writes tests/oracle/fixtures/embed.json: llama.cpp's pooled embeddings
(through llama-cpp-python 0.3.36, the AVX2 build docs/MODELS.md names, its
Llama(embedding=True, pooling_type=...).embed(text, normalize=False)) of a few
texts, with the token ids it ran, for tests/py/test_embed.py. Models: SmolLM2
(mean pooling, as llama-embedding defaults for a generative model) and random
qwen3 and gemma4 files from scripts/mkmodel.py (last and mean pooling; the
test regenerates them and checks their sha256).
Also random bert (CLS pooling) and nomic-bert (mean) encoders, F32 and Q8_0.
Run by hand: PYTHONPATH=/work/lcp-avx2/lib/python3.11/site-packages \\
    python3 tests/oracle/make_fixtures_embed.py [NAME ...]
(names given: only those models are recorded again, the others kept.)
"""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(HERE, "fixtures", "embed.json")
TEXTS = ["Hello world",
         "The cat sat on the mat and looked at the birds outside the window for a long time.",
         "Embeddings turn text into vectors; similar texts land near each other, which is what retrieval "
         "needs. This one is longer than a batch of seven tokens, several times over.",
         "a"]
# name -> (model path relative to ROOT, mkmodel arguments or None, pooling)
MODELS = {
    "smollm2_mean": ("models/SmolLM2-135M-Instruct.Q4_1.gguf", None, "mean"),
    "qwen3_last": ("models/random/embed_qwen3.gguf", ["qwen3", "--seed", "51", "--type", "f32"], "last"),
    "gemma4_mean": ("models/random/embed_gemma4.gguf", ["gemma4", "--seed", "52", "--type", "q8_0"], "mean"),
    # encoders: attention over the whole text, post-norm layers (bge's and nomic-embed's layouts)
    "bert_cls": ("models/random/embed_bert.gguf", ["bert", "--seed", "53", "--type", "f32"], "cls"),
    "bert_q8_cls": ("models/random/embed_bert_q8.gguf", ["bert", "--seed", "54", "--type", "q8_0"], "cls"),
    "nomic_mean": ("models/random/embed_nomic.gguf", ["nomic-bert", "--seed", "55", "--type", "f32"], "mean"),
    "nomic_q8_mean": ("models/random/embed_nomic_q8.gguf", ["nomic-bert", "--seed", "56", "--type", "q8_0"], "mean"),
}
POOL = {"mean": 1, "cls": 2, "last": 3}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    import llama_cpp
    from llama_cpp import Llama
    out = {"meta": {"generator": "tests/oracle/make_fixtures_embed.py", "llama_cpp_python_version": llama_cpp.__version__,
                    "procedure": "Llama(embedding=True, pooling_type=P, n_ctx=n_batch=n_ubatch=512).embed(text, "
                                 "normalize=False); ids: llm.tokenize(text, add_bos=True, special=True)"},
           "texts": TEXTS, "models": {}}
    only = sys.argv[1:]
    if only:
        with open(OUT, encoding="utf-8") as f:
            out["models"] = json.load(f)["models"]
    for name, (rel, args, pool) in MODELS.items():
        if only and name not in only:
            continue
        path = os.path.join(ROOT, rel)
        if args:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), args[0], path] + args[1:],
                           check=True)
        llm = Llama(model_path=path, embedding=True, pooling_type=POOL[pool], n_ctx=512, n_batch=512, n_ubatch=512,
                    n_threads=2, verbose=False)
        cases = []
        for t in TEXTS:
            v = np.array(llm.embed(t, normalize=False), dtype=np.float32)
            cases.append({"ids": llm.tokenize(t.encode(), add_bos=True, special=True),
                          "embedding": [float(x) for x in v]})
        del llm
        out["models"][name] = {"path": rel, "mkmodel_args": args, "pooling": pool,
                               "model_sha256": sha256(path) if args else None, "cases": cases}
        print(name, [len(c["ids"]) for c in cases])
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
