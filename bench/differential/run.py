#!/usr/bin/env python3
"""tokenloop's logits beside llama.cpp's on random-weight files of shapes our
fixtures do not hold: the differential sweep that found stop 44's bugs
(MTP blocks refused, expert_weights_scale, the repacked Q4_0/IQ4_NL/MXFP4
order). Not part of the suite: it needs llama.cpp.

Each case is a scripts/mkmodel.py file (optionally requantized by
llama-quantize); for each, the same random token ids go through
`tokenloop logits` (exact and fast) and llama.cpp (the llama-cpp-python on
PYTHONPATH, one eval, flash attention off unless a quantized cache is asked).
The exact mode should be bitwise where llama.cpp's path is batch-invariant
(docs/NUMERICS.md names the exceptions: repacked Q4_K in batches of 4+ rows,
Q6_K's tiled path for 8+); the fast mode is held to the fidelity rules.

For the exact mode's claim use llama.cpp built for AVX2 (GGML_NATIVE=OFF,
GGML_AVX2=ON): a native AVX-512 build takes other orders. Point
LLAMA_CPP_LIB_PATH at its libllama.so's directory.

Usage: bench/differential/run.py [--cases NAME,...] [--tl build/tokenloop]
       [--quantize PATH/llama-quantize] [--keep DIR]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")

# name: (mkmodel arguments, llama-quantize type or None, cache types or None)
CASES = {
    "qwen3moe_e12u5": (["qwen3moe", "--experts", "12,5", "--type", "f16"], None, None),
    "qwen3moe_e64u40": (["qwen3moe", "--experts", "64,40", "--type", "f16"], None, None),
    "mixtral_e6u3": (["mixtral", "--experts", "6,3", "--type", "f16"], None, None),
    "qwen2moe_q8": (["qwen2moe", "--type", "q8_0"], None, None),
    "gptoss_mxfp4": (["gpt-oss", "--type", "f16"], "MXFP4_MOE", None),
    "qwen3moe_wscale": (["qwen3moe", "--expert-weights-scale", "2.5"], None, None),
    "qwen35_mtp": (["qwen35", "--mtp", "1"], None, None),
    "qwen35moe_mtp": (["qwen35moe", "--mtp", "1", "--type", "f16"], None, None),
    "llama3_q4_0": (["llama3", "--type", "f16"], "Q4_0", None),
    "qwen3_iq4nl": (["qwen3", "--type", "f16"], "IQ4_NL", None),
    "qwen3moe_q4_k_m": (["qwen3moe", "--type", "f16"], "Q4_K_M", None),
    "llama3_yarn_kvq8": (["llama3", "--rope-scaling", "yarn", "--rope-orig-ctx", "64", "--n-head", "2"], None,
                         ("q8_0", "q8_0")),
    "phi3_longrope": (["phi3", "--longrope", "--rope-orig-ctx", "64"], None, None),
    "gemma4": (["gemma4"], None, None),
}
GGML_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}


def make(name, tmp, quantize, seed):
    args, qtype, _ = CASES[name]
    path = os.path.join(tmp, f"{name}.gguf")
    subprocess.run([sys.executable, MKMODEL, args[0], path, "--seed", str(seed)] + args[1:], check=True,
                   capture_output=True)
    if qtype:
        src = path + ".src"
        os.replace(path, src)
        subprocess.run([quantize, "--allow-requantize", src, path, qtype, "2"], check=True, capture_output=True)
        os.remove(src)
    return path


def llama_logits(path, ids, kv):
    from llama_cpp import Llama
    extra = {"flash_attn": True, "type_k": GGML_TYPES[kv[0]], "type_v": GGML_TYPES[kv[1]]} if kv else {}
    llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_ubatch=512, logits_all=True, verbose=False,
                n_threads=2, n_threads_batch=2, seed=1, **extra)
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def tl_logits(tl, path, ids, numerics, kv, tmp):
    out = os.path.join(tmp, "tl.bin")
    cmd = [tl, "logits", "-m", path, "--ids", ",".join(map(str, ids)), "-o", out, "--numerics", numerics, "-c", "512"]
    if kv:
        cmd += ["--kv-type-k", kv[0], "--kv-type-v", kv[1]]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"rc {p.returncode}"
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--tl", default=os.path.join(ROOT, "build", "tokenloop"))
    ap.add_argument("--quantize", default=os.path.join(ROOT, "bench", ".cache", "llama-cpp-python-0.3.36", "build",
                                                       "bin", "llama-quantize"))
    ap.add_argument("--len", type=int, default=60, help="tokens per sequence")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--keep", help="keep the files in this directory")
    a = ap.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="tl-diff-")
    os.makedirs(tmp, exist_ok=True)
    print("| case | llama.cpp | exact: bitwise rows, max abs | fast: max abs, top-1 |")
    print("|---|---|---|---|")
    for name in a.cases.split(","):
        try:
            path = make(name, tmp, a.quantize, a.seed)
        except subprocess.CalledProcessError as e:
            print(f"| {name} | could not make the file: {(e.stderr or b'').decode()[-200:]} | | |")
            continue
        rng = np.random.default_rng(a.seed)
        ids = [1] + [int(x) for x in rng.integers(3, 32000, a.len - 1)]
        kv = CASES[name][2]
        try:
            ref = llama_logits(path, ids, kv)
        except Exception as e:  # noqa: BLE001 - llama.cpp refusing a file is a result
            ref, why = None, f"{type(e).__name__}: {e}"
        cells = []
        for numerics in ("exact", "fast"):
            got, err = tl_logits(a.tl, path, ids, numerics, kv, tmp)
            if got is None:
                cells.append(f"refused: {err}")
            elif ref is None:
                cells.append("(no reference)")
            else:
                d = np.abs(got - ref).max(axis=1)
                top = int((got.argmax(1) == ref.argmax(1)).sum())
                cells.append(f"{int((d == 0).sum())}/{len(ids)}, {d.max():.3g}" if numerics == "exact"
                             else f"{d.max():.3g}, {top}/{len(ids)}")
        print(f"| {name} | {'ran' if ref is not None else why[:80]} | {cells[0]} | {cells[1]} |")
        if not a.keep:
            os.remove(path)


if __name__ == "__main__":
    main()
