#!/usr/bin/env python3
"""Writes tests/oracle/fixtures/longctx_yarn.json: llama.cpp's logits deep in
a 32,768-position context, past a YaRN model's original 4,096, for
tests/py/test_longctx.py. The model is scripts/mkmodel.py's small qwen2
(2 layers, 4 heads of 32, GQA) with YaRN factor 8 over 4,096 positions and a
training context of 32,768; the sequence is 32,768 random token ids after
BOS. llama.cpp (llama-cpp-python, flash attention off, one context of 32,768)
evaluates the first 4,090 ids at once, then one id at a time to 4,097; then
the ids up to 32,759 at once and one at a time to 32,766, keeping each
single step's logits row: positions 4,089-4,096 (across the original
context) and 32,759-32,766 (the last a request can prompt with one position
left for the reply). Per row the top 20 (id, logit) and the row's
log-sum-exp, so the test can compare log-probabilities.
Run by hand: PYTHONPATH=<llama-cpp-python> python3 tests/oracle/make_fixtures_longctx.py
"""
import hashlib
import json
import math
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(ROOT, "models", "random", "longctx_yarn.gguf")
MK_ARGS = ["qwen2", "--seed", "15", "--type", "f32", "--rope-scaling", "yarn", "--rope-factor", "8",
           "--rope-orig-ctx", "4096", "--ctx", "32768"]
N_CTX = 32768
SEGMENTS = [(4089, 4096), (32759, 32766)]  # positions whose rows are kept (inclusive)
TOPK = 20


def main():
    from llama_cpp import Llama
    import llama_cpp
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), MK_ARGS[0], OUT] + MK_ARGS[1:],
                   check=True)
    with open(OUT, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    llm = Llama(model_path=OUT, n_ctx=N_CTX, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2,
                logits_all=False, verbose=False)
    rng = np.random.default_rng(2026)
    ids = [1] + [int(x) for x in rng.integers(3, llm.n_vocab(), N_CTX - 1)]
    rows = []
    done = 0
    for lo, hi in SEGMENTS:
        llm.eval(ids[done:lo + 1])  # through position lo: its row is the last
        done = lo + 1
        for pos in range(lo, hi + 1):
            if pos > lo:
                llm.eval([ids[pos]])
                done = pos + 1
            # the last evaluated token's logits (llama-cpp-python keeps no
            # scores without logits_all)
            r = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float32).copy()
            mx = float(r.max())
            lse = mx + math.log(float(np.exp(r.astype(np.float64) - mx).sum()))
            idx = np.argsort(-r, kind="stable")[:TOPK]
            rows.append({"pos": pos, "lse": lse, "top": [[int(i), float(r[i])] for i in idx]})
            print(f"pos {pos}: top {rows[-1]['top'][0]}", flush=True)
    obj = {"meta": {"generator": "tests/oracle/make_fixtures_longctx.py",
                    "llama_cpp_python_version": llama_cpp.__version__, "mkmodel_args": MK_ARGS,
                    "model_sha256": sha, "n_vocab": llm.n_vocab(), "n_ctx": N_CTX,
                    "ids_rng": "numpy default_rng(2026).integers(3, n_vocab, 32767) after BOS (1)",
                    "procedure": "eval of the ids through the first kept position in one call (n_batch 512), "
                                 "then one id per call; each call's last row kept"},
           "ids": ids, "rows": rows}
    with open(os.path.join(HERE, "fixtures", "longctx_yarn.json"), "w", encoding="utf-8") as f:
        json.dump(obj, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
