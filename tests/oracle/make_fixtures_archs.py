#!/usr/bin/env python3
"""Writes tests/oracle/fixtures/archs_*.json: llama.cpp's logits (through
llama-cpp-python, flash attention off) on small random-weight models made by
scripts/mkmodel.py, one file per model. Each stores the generator arguments
and the model's sha256 (the test regenerates the identical file), the token
id sequences, and the top-20 (id, logit) per position, logits kept exact.
Run by hand: python3 tests/oracle/make_fixtures_archs.py [NAME...]
with the llama-cpp-python whose kernels the exact mode mirrors: built with
GGML_NATIVE=OFF for AVX2 (docs/NUMERICS.md; here PYTHONPATH=
/work/lcp-avx2/lib/python3.11/site-packages). A native build on an AVX-512
machine takes other float orders, and its logits differ from the fixtures.
"""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(HERE, "fixtures")
OUT_DIR = os.path.join(ROOT, "models", "random")
MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")

N_THREADS = 2
N_CTX = 512
CTX = {"phi3_longrope_c100": 100}  # fixtures run at another context
TOPK = 20
LENGTHS = [5, 17, 40, 60]  # mistral's window is 16: the longer ones pass it

# fixture name -> mkmodel.py arguments (after ARCH OUT)
MODELS = {
    "llama3": ["llama3", "--seed", "1", "--type", "f32"],
    "llama3_q8": ["llama3", "--seed", "2", "--type", "q8_0"],
    "qwen2": ["qwen2", "--seed", "3", "--type", "f16"],
    "qwen3": ["qwen3", "--seed", "4", "--type", "f32"],
    "mistral": ["mistral", "--seed", "5", "--type", "f32"],
    "phi3": ["phi3", "--seed", "6", "--type", "q8_0"],
    # mixtures of experts
    "qwen3moe": ["qwen3moe", "--seed", "21", "--type", "f32"],
    "qwen3moe_q8": ["qwen3moe", "--seed", "22", "--type", "q8_0"],
    "mixtral": ["mixtral", "--seed", "23", "--type", "f16"],
    "qwen2moe": ["qwen2moe", "--seed", "24", "--type", "q8_0"],
    # gpt-oss: sinks, biases, YaRN, windowed even layers, softmax over the chosen
    "gptoss": ["gpt-oss", "--seed", "25", "--type", "f16"],
    "gptoss_q8": ["gpt-oss", "--seed", "26", "--type", "q8_0"],
    # RoPE scaling with an original context of 32: the longer sequences run
    # past it. YaRN on NeoX pairs (the corr dims' ramp at one dimension), on
    # adjacent pairs (three ramp dimensions) with rope.scaling.attn_factor;
    # linear on top of Llama 3's frequency factors.
    "qwen2_yarn": ["qwen2", "--seed", "7", "--type", "f16", "--rope-scaling", "yarn", "--rope-factor", "4",
                   "--rope-orig-ctx", "32"],
    "mistral_yarn": ["mistral", "--seed", "9", "--type", "f32", "--rope-scaling", "yarn", "--rope-factor", "8",
                     "--rope-orig-ctx", "32", "--rope-attn-factor", "1.25"],
    "llama3_linear": ["llama3", "--seed", "8", "--type", "f32", "--rope-scaling", "linear"],
    # Phi-3's LongRoPE: the long factors (the context, 512, exceeds an original
    # 32) with rope.scaling.attn_factor as Phi-3 128k's converter writes it;
    # the short ones (the original context 4096 is not exceeded)
    "phi3_longrope": ["phi3", "--seed", "10", "--type", "f32", "--longrope", "--rope-orig-ctx", "32",
                      "--rope-attn-factor", "1.1902"],
    "phi3_longrope_short": ["phi3", "--seed", "11", "--type", "q8_0", "--longrope"],
    # a context of 100 over an original 200: llama.cpp rounds its context up
    # to 256 before it chooses, so the long factors
    "phi3_longrope_c100": ["phi3", "--seed", "12", "--type", "f32", "--longrope", "--rope-orig-ctx", "200"],
    # quantized KV caches (KV_TYPES below), run with flash attention as
    # llama.cpp requires for a quantized V: grouped-query heads, QK-norm, a
    # window with sinks (an f16 V accumulated in f16), a window (f16 K)
    "llama3_kvq8": ["llama3", "--seed", "12", "--type", "f32"],
    "qwen3_kvq4": ["qwen3", "--seed", "13", "--type", "q8_0"],
    "gptoss_kvq8k": ["gpt-oss", "--seed", "27", "--type", "f16"],
    # F32 weights put sinks near a row's maximum: the sink's step after the
    # keys rounds S*ms and then adds (the keys' steps are fused)
    "gptoss_f32_kvq8": ["gpt-oss", "--seed", "12", "--type", "f32"],
    "mistral_kvq8v": ["mistral", "--seed", "14", "--type", "f32"],
    # heads of 64 and 128: llama.cpp rotates q/k (v) of a quantized cache by a
    # Walsh-Hadamard matrix there (64 and 128 for K, 64 for V)
    "llama3_kvq8_hd64": ["llama3", "--seed", "16", "--type", "f32", "--n-head", "2"],
    "qwen3_kvq4_hd128": ["qwen3", "--seed", "17", "--type", "q8_0", "--n-head", "1"],
    # Qwen3.5/3.6 hybrids: Gated DeltaNet layers (llama.cpp's fused CPU op,
    # token by token) between gated full-attention layers; experts with a
    # shared one
    "qwen35": ["qwen35", "--seed", "31", "--type", "f32"],
    "qwen35_q8": ["qwen35", "--seed", "33", "--type", "q8_0"],
    "qwen35_f16": ["qwen35", "--seed", "35", "--type", "f16"],
    "qwen35moe": ["qwen35moe", "--seed", "32", "--type", "q8_0"],
    "qwen35moe_f16": ["qwen35moe", "--seed", "34", "--type", "f16"],
    # Gemma 4: sliding-window and global layers of their own head sizes and
    # KV heads, proportional RoPE, v = k's projection, per-layer inputs,
    # shared KV layers; experts beside the dense FFN (gate and up fused)
    "gemma4": ["gemma4", "--seed", "41", "--type", "f32"],
    "gemma4_q8": ["gemma4", "--seed", "42", "--type", "q8_0"],
    "gemma4moe": ["gemma4moe", "--seed", "43", "--type", "f16"],
    "gemma4moe_q8": ["gemma4moe", "--seed", "44", "--type", "q8_0"],
    # and a quantized cache whose layers have two head sizes (32 and 64:
    # llama.cpp's two caches, each rotated by its own head size)
    "gemma4_kvq8": ["gemma4", "--seed", "45", "--type", "f32"],
}
# fixture -> (K type, V type): llama.cpp's -ctk/-ctv, with flash attention on
KV_TYPES = {"llama3_kvq8": ("q8_0", "q8_0"), "qwen3_kvq4": ("q4_0", "q4_0"),
            "gptoss_kvq8k": ("q8_0", "f16"), "gptoss_f32_kvq8": ("q8_0", "q8_0"), "mistral_kvq8v": ("f16", "q8_0"),
            "llama3_kvq8_hd64": ("q8_0", "q8_0"), "qwen3_kvq4_hd128": ("q4_0", "q4_0"),
            "gemma4_kvq8": ("q8_0", "q8_0")}
GGML_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}
# fixture -> llama-quantize type applied to the mkmodel.py file: the test makes
# the same file with `tokenloop quantize` and must find llama-quantize's bytes
# (LLAMA_QUANTIZE: llama.cpp's llama-quantize from the same source, e.g. the one
# bench/compare-llamacpp builds)
QUANTIZED = {"gptoss_mxfp4": ("gpt-oss", ["--seed", "25", "--type", "f16"], "MXFP4_MOE"),
             "qwen3_iq4nl": ("qwen3", ["--seed", "9", "--type", "f16"], "IQ4_NL"),
             "qwen3_iq4xs": ("qwen3", ["--seed", "9", "--type", "f16"], "IQ4_XS"),
             # Q4_0 is repacked too (q4_0_8x8): dense and experts in that order
             "llama3_q4_0": ("llama3", ["--seed", "41", "--type", "f16"], "Q4_0"),
             "qwen3moe_q4_0": ("qwen3moe", ["--seed", "42", "--type", "f16"], "Q4_0"),
             # IQ4_NL matrices of 4 rows (the DeltaNet's alpha and beta): not
             # repacked, so llama.cpp's prompt takes tinyBLAS's one chain
             "qwen35_iq4nl": ("qwen35", ["--seed", "40", "--type", "f16"], "IQ4_NL")}
# The IQ4 files: their logits reach ~80, so the default mode's tolerance is
# wider. (The exact mode is bitwise at every length: llama.cpp repacks IQ4_NL
# matrices of rows a multiple of 8 on AVX2, iq4_nl_8x8, one order for every
# batch, which the exact mode follows; kernels.h vec_dot_x8.)
BATCH_DEPENDENT = {n: {"tol": 1.0} for n in ("qwen3_iq4nl", "qwen3_iq4xs")}
# Hybrids with experts: the default mode's chunked DeltaNet rounds otherwise
# than llama.cpp's token loop (max abs 0.06 elsewhere), and at a router's
# near tie that picks another expert at one position (measured 0.34 at one
# position of 122; top-1 still held where decisive).
BATCH_DEPENDENT.update({n: {"tol": 0.5} for n in ("qwen35moe", "qwen35moe_f16")})
# Gemma 4 in Q8_0: six layers of q8 activations each with attention, FFN
# and per-layer input matmuls (the fast mode's max abs 0.18, mean 0.02; its
# F32 twin 0.003)
BATCH_DEPENDENT.update({"gemma4_q8": {"tol": 0.25}})
for _n, (_a, _args, _q) in QUANTIZED.items():
    MODELS[_n] = [_a] + _args


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def make(name):
    args = MODELS[name]
    path = os.path.join(OUT_DIR, f"archs_{name}.gguf")
    subprocess.run([sys.executable, MKMODEL, args[0], path] + args[1:], check=True)
    if name in QUANTIZED:
        quant = os.environ.get("LLAMA_QUANTIZE", os.path.join(
            ROOT, "bench", ".cache", "llama-cpp-python-0.3.36", "build", "bin", "llama-quantize"))
        src = path + ".src"
        os.replace(path, src)
        subprocess.run([quant, src, path, QUANTIZED[name][2]], check=True, capture_output=True)
        os.remove(src)
    return path, args


def sequences(seed, n_vocab):
    rng = np.random.default_rng(seed)
    return [[1] + [int(x) for x in rng.integers(3, n_vocab, n - 1)] for n in LENGTHS]


def main():
    import llama_cpp
    from llama_cpp import Llama

    names = sys.argv[1:] or list(MODELS)
    for name in names:
        path, args = make(name)
        kv = KV_TYPES.get(name)
        extra = {"flash_attn": True, "type_k": GGML_TYPES[kv[0]], "type_v": GGML_TYPES[kv[1]]} if kv else {}
        n_ctx = CTX.get(name, N_CTX)
        llm = Llama(model_path=path, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                    n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                    seed=1, verbose=False, **extra)
        cases = []
        for ids in sequences(sum(map(ord, name)), llm.n_vocab()):
            llm.reset()
            llm.eval(ids)
            rows = np.array(llm.scores[: len(ids)], dtype=np.float32)
            top = []
            for r in rows:
                idx = np.argsort(-r, kind="stable")[:TOPK]
                top.append([[int(i), float(r[i])] for i in idx])
            cases.append({"ids": ids, "top": top})
        kv_meta = {}
        if kv:
            # The default mode reads the cache without quantizing q (llama.cpp
            # rounds q to K's vec_dot_type): it is held to the size of the
            # quantized cache's own effect, llama.cpp's quantized logits
            # against its f16 ones at the same ids, as tolerance and as the
            # top-1 margin.
            del llm
            llm = Llama(model_path=path, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                        n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, logits_all=True, seed=1, verbose=False)
            effect = 0.0
            for c in cases:
                llm.reset()
                llm.eval(c["ids"])
                rows = np.array(llm.scores[: len(c["ids"])], dtype=np.float32)
                for r, top in zip(rows, c["top"]):
                    effect = max(effect, float(np.abs(r[[t[0] for t in top]] - np.array([t[1] for t in top],
                                                                                         dtype=np.float32)).max()))
            kv_meta = {"kv_effect_max_abs": effect, "tol": max(0.1, effect), "margin": max(0.3, effect)}
        obj = {
            "meta": {
                "generator": "tests/oracle/make_fixtures_archs.py",
                "llama_cpp_python_version": llama_cpp.__version__,
                "mkmodel_args": args,
                **({"quantize": QUANTIZED[name][2], "quantized_by": "llama-quantize (same llama.cpp source)"}
                   if name in QUANTIZED else {}),
                **(BATCH_DEPENDENT.get(name, {})),
                **kv_meta,
                "model_sha256": sha256(path),
                "n_vocab": llm.n_vocab(),
                "settings": {"n_threads": N_THREADS, "n_ctx": n_ctx, "n_batch": n_ctx,
                             "logits_all": True,
                             **({"flash_attn": "on", "type_k": kv[0], "type_v": kv[1]} if kv
                                else {"flash_attn": "off (default)"})},
                "procedure": "each sequence evaluated in one eval from an empty cache; "
                             "top-20 per position by logit, exact float32 values",
            },
            "cases": cases,
        }
        del llm
        out = os.path.join(FIX, f"archs_{name}.json")
        with open(out, "w", encoding="utf-8") as f:
            json.dump(obj, f, separators=(",", ":"))
        print(f"{out}: {len(cases)} sequences, lengths {[len(c['ids']) for c in cases]}")


if __name__ == "__main__":
    main()
