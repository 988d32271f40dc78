#!/usr/bin/env python3
"""Checks tokenloop ($TL_BIN) on the architectures we have no real model file
for (Llama 3 RoPE factors, Qwen2 biases, Qwen3 QK-norm, Mistral's sliding
window key, Phi-3 fused tensors) against llama.cpp's logits in
tests/oracle/fixtures/archs_*.json (tests/oracle/make_fixtures_archs.py);
BF16 weights in fast mode against the exact mode and across CPU levels.
The models are regenerated with scripts/mkmodel.py into models/random/ and
must hash as recorded. Also: an unknown architecture and a missing tensor must
fail with an error naming them.
Usage: TL_BIN=build/tokenloop python3 tests/py/test_oracle_archs.py
(TL_VOCAB_DIR: the shared vocabularies; TL_ARCHS_MODELS: where models go)
"""
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FIX = os.path.join(ROOT, "tests", "oracle", "fixtures")
OUT_DIR = os.environ.get("TL_ARCHS_MODELS", os.path.join(ROOT, "models", "random"))
MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")
TL_BIN = os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop"))
TIMEOUT = 300

# Max abs logit error allowed per fixture (docs/NUMERICS.md). The fixtures hold
# llama.cpp's float32 logits exactly, and every op mirrors ggml's order, so the
# bound is zero: bitwise equal. That is the exact numerics mode; the default
# fast mode (docs/NUMERICS.md) is held to FAST_TOL (measured: max abs 0.052,
# mean abs 0.0093 at worst, llama3_q8 and phi3) and to the same top-1 where
# the reference's margin exceeds FAST_MARGIN.
TOL = 0.0
FAST_TOL = 0.1
FAST_MARGIN = 0.3
# BF16 fast vs exact: both round activations to bf16, so an order difference
# that moves a value across a rounding step becomes a 2^-9 relative change
# (measured: max abs 0.24 at logits up to 107 in magnitude; the F16 model the
# file is made from gives 0.03, and bf16 vs f16 weights move them by 0.36).
BF16_TOL = 0.5

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_oracle import check  # noqa: E402  (shared pass/fail counting)
import test_oracle as to  # noqa: E402


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def mkmodel(args, path):
    p = subprocess.run([sys.executable, MKMODEL, args[0], path] + list(args[1:]),
                       capture_output=True, text=True, timeout=TIMEOUT)
    return p.returncode == 0, p.stderr


def tl_logits(model, ids, tmp, extra=()):
    ids_path = os.path.join(tmp, "ids.json")
    out = os.path.join(tmp, "logits.bin")
    with open(ids_path, "w") as f:
        json.dump(ids, f)
    p = subprocess.run([TL_BIN, "logits", "-m", model, "--ids-file", ids_path, "-o", out] + list(extra),
                       capture_output=True, text=True, timeout=TIMEOUT, env=dict(os.environ, TL_NUMERICS=to.NUMERICS))
    if p.returncode != 0:
        return None, p.stderr.strip()[-300:]
    return np.fromfile(out, dtype=np.float32), ""


MADE = set()  # the fixtures whose model this run has made and hashed


def check_fixture(path, tmp):
    name = os.path.basename(path)[len("archs_"):-len(".json")]
    with open(path, encoding="utf-8") as f:
        fx = json.load(f)
    meta = fx["meta"]
    model = os.path.join(OUT_DIR, f"archs_{name}.gguf")
    if name in MADE:  # made and hashed by this run's first pass
        return check_logits(name, fx, meta, model, tmp)
    ok, err = mkmodel(meta["mkmodel_args"], model)
    if not check(ok, f"{name}: mkmodel.py failed: {err[-300:]}"):
        return
    if meta.get("quantize"):
        # llama-quantize made the fixture's file: ours must write the same bytes
        src = model + ".src"
        os.replace(model, src)
        p = subprocess.run([TL_BIN, "quantize", src, model, meta["quantize"]], capture_output=True, text=True,
                           timeout=TIMEOUT)
        os.remove(src)
        if not check(p.returncode == 0, f"{name}: tokenloop quantize {meta['quantize']}: {p.stderr[-300:]}"):
            return
    if not check(sha256(model) == meta["model_sha256"],
                 f"{name}: regenerated model differs" + (" from llama-quantize's" if meta.get("quantize") else "")):
        return
    MADE.add(name)
    check_logits(name, fx, meta, model, tmp)


def check_logits(name, fx, meta, model, tmp):
    nv = meta["n_vocab"]
    fast = to.NUMERICS == "fast"
    tol = FAST_TOL if fast else TOL
    # a type llama.cpp multiplies another way for a batch of batch_dependent_from
    # rows or more: exact mode bitwise on shorter sequences only, the fidelity
    # rules (the fixture's relative tolerance, decisive top-1) elsewhere
    batch_from = meta.get("batch_dependent_from")
    if fast and meta.get("tol"):
        tol = meta["tol"]
    # a quantized cache: the default mode within the cache's own effect on
    # llama.cpp (make_fixtures_archs.py), decisive top-1 beyond it
    margin = meta.get("margin", FAST_MARGIN)
    worst, total, n_pos, n_exact, top1_bad = 0.0, 0.0, 0, 0, 0
    # llama.cpp's context size: Phi-3's LongRoPE factors are chosen by it
    ctx = ["-c", str(meta["settings"]["n_ctx"])]
    # its cache types (llama.cpp's -ctk/-ctv, flash attention on)
    if "type_k" in meta["settings"]:
        ctx += ["-ctk", meta["settings"]["type_k"], "--kv-type-v", meta["settings"]["type_v"]]
    for ci, case in enumerate(fx["cases"]):
        flat, err = tl_logits(model, case["ids"], tmp, ctx)
        if not check(flat is not None, f"{name} case {ci}: tokenloop failed: {err}"):
            continue
        if not check(flat.size == nv * len(case["ids"]),
                     f"{name} case {ci}: {flat.size} logits, expected {nv} x {len(case['ids'])}"):
            continue
        rows = flat.reshape(len(case["ids"]), nv)
        if ci == len(fx["cases"]) - 1:
            # chunked and on another thread count: the same bits (batch invariance)
            again, err = tl_logits(model, case["ids"], tmp, ctx + ["-t", "3", "-b", "7"])
            check(again is not None and np.array_equal(again, flat),
                  f"{name} case {ci}: -t 3 -b 7 differs from one batch {err}")
        loose = not fast and batch_from and len(case["ids"]) >= batch_from
        for pos, top in enumerate(case["top"]):
            idx = np.array([t[0] for t in top])
            ref = np.array([t[1] for t in top], dtype=np.float32)
            d = np.abs(rows[pos, idx] - ref)
            if loose:
                check(float(d.max()) <= meta["tol"], f"{name} case {ci} pos {pos}: {float(d.max()):.3g} > {meta['tol']}")
                top1_bad += int(int(np.argmax(rows[pos])) != top[0][0] and top[0][1] - top[1][1] > FAST_MARGIN)
                continue
            worst = max(worst, float(d.max()))
            total += float(d.mean())
            n_pos += 1
            n_exact += int(d.max() == 0)
            top1_bad += int(int(np.argmax(rows[pos])) != top[0][0] and
                            top[0][1] - top[1][1] > (margin if fast else 1e-3))
    if n_pos == 0:
        return
    print(f"{name} [{to.NUMERICS}]: {n_pos} positions, bitwise at {n_exact}, max abs {worst:.3g}, "
          f"mean abs {total / n_pos:.3g}")
    check(worst <= tol, f"{name}: max abs logit error {worst:.3g} > {tol:.3g}")
    check(top1_bad == 0, f"{name}: top-1 differs at {top1_bad} positions")


def check_bf16(tmp):
    """BF16 weights (the qwen2 fixture's model converted by `tokenloop quantize`):
    the fast mode's vdpbf16ps order against the exact mode by the fidelity
    rules, and the same bits on every CPU level (the instruction where the CPU
    has it, its emulation elsewhere) and under other threads and chunking."""
    src = os.path.join(OUT_DIR, "archs_qwen2.gguf")
    model = os.path.join(tmp, "qwen2_bf16.gguf")
    p = subprocess.run([TL_BIN, "quantize", src, model, "BF16"], capture_output=True, text=True, timeout=TIMEOUT)
    if not check(p.returncode == 0, f"bf16: quantize failed: {p.stderr.strip()[-300:]}"):
        return
    with open(os.path.join(FIX, "archs_qwen2.json"), encoding="utf-8") as f:
        ids = json.load(f)["cases"][-1]["ids"]
    saved = to.NUMERICS
    got = {}
    for mode, cpu, extra in (("exact", None, ()), ("fast", None, ()), ("fast", None, ("-t", "3", "-b", "7")),
                             ("fast", "avx2", ()), ("fast", "scalar", ())):
        to.NUMERICS = mode
        env_cpu = os.environ.pop("TL_CPU", None)
        if cpu:
            os.environ["TL_CPU"] = cpu
        flat, err = tl_logits(model, ids, tmp, extra)
        os.environ.pop("TL_CPU", None)
        if env_cpu is not None:
            os.environ["TL_CPU"] = env_cpu
        key = f"{mode} {cpu or 'detected'} {' '.join(extra)}".strip()
        if check(flat is not None, f"bf16 {key}: tokenloop failed: {err}"):
            got[key] = flat.reshape(len(ids), -1)
    to.NUMERICS = saved
    if "exact detected" not in got or "fast detected" not in got:
        return
    ex, fa = got["exact detected"], got["fast detected"]
    d = np.abs(ex - fa)
    srt = np.sort(ex, axis=1)
    margin = srt[:, -1] - srt[:, -2]
    top1_bad = int(np.sum((np.argmax(ex, axis=1) != np.argmax(fa, axis=1)) & (margin > FAST_MARGIN)))
    print(f"bf16 [fast vs exact]: {len(ids)} positions, max abs {d.max():.3g}, mean abs {d.mean():.3g}")
    check(d.max() <= BF16_TOL, f"bf16: fast vs exact max abs {d.max():.3g} > {BF16_TOL}")
    check(top1_bad == 0, f"bf16: fast and exact top-1 differ at {top1_bad} decisive positions")
    for key, rows in got.items():
        if key.startswith("fast") and key != "fast detected":
            check(np.array_equal(rows, fa), f"bf16: fast '{key}' differs from the detected level's bits")


def check_levels(tmp):
    """The hybrids' recurrence (Gated DeltaNet) gives the same bits on every
    CPU level in both modes (the AVX2 steps are elementwise fma and one dot
    order, as the scalar ones)."""
    for name in ("qwen35moe", "qwen35"):
        model = os.path.join(OUT_DIR, f"archs_{name}.gguf")
        with open(os.path.join(FIX, f"archs_{name}.json"), encoding="utf-8") as f:
            ids = json.load(f)["cases"][-1]["ids"]
        saved, env_cpu = to.NUMERICS, os.environ.pop("TL_CPU", None)
        for to.NUMERICS in ("fast", "exact"):
            got = []
            for cpu in (None, "avx2", "scalar"):
                if cpu:
                    os.environ["TL_CPU"] = cpu
                flat, err = tl_logits(model, ids, tmp, ["-c", "512"])
                os.environ.pop("TL_CPU", None)
                if check(flat is not None, f"{name} {to.NUMERICS} {cpu}: tokenloop failed: {err}"):
                    got.append(flat)
            check(len(got) == 3 and all(np.array_equal(g, got[0]) for g in got),
                  f"{name} [{to.NUMERICS}]: the detected level, avx2 and scalar give the same bits")
        to.NUMERICS = saved
        if env_cpu is not None:
            os.environ["TL_CPU"] = env_cpu


def check_errors(tmp):
    """Files to refuse: unknown architecture, a tensor left out, a RoPE scaling
    not implemented (rope.scaling.type longrope; LongRoPE factors outside
    phi3, or one of the pair alone)."""
    cases = [
        (["llama3", "--arch-name", "nosucharch"], "nosucharch"),
        (["llama3", "--drop", "blk.1.ffn_down.weight"], "blk.1.ffn_down.weight"),
        (["qwen3", "--drop", "blk.0.attn_k_norm.weight"], "blk.0.attn_k_norm.weight"),
        (["phi3", "--drop", "blk.1.attn_qkv.weight"], "attn_qkv"),
        (["qwen2", "--rope-scaling", "longrope"], "qwen2.rope.scaling.type"),
        (["qwen3", "--longrope"], "rope_factors_long"),
        (["phi3", "--longrope", "--drop", "rope_factors_short.weight"], "rope_factors_short.weight"),
        (["gemma4", "--drop", "per_layer_proj_norm.weight"], "per_layer_proj_norm.weight"),
        (["gemma4moe", "--drop", "blk.1.ffn_down_exps.scale"], None),  # optional: runs unscaled
    ]
    for args, needle in cases:
        model = os.path.join(tmp, "bad.gguf")
        ok, err = mkmodel(args, model)
        if not check(ok, f"mkmodel {args}: {err[-200:]}"):
            continue
        flat, msg = tl_logits(model, [1, 2, 3], tmp)
        if needle is None:
            check(flat is not None, f"{args}: expected to run, got {msg!r}")
            continue
        check(flat is None and needle in msg,
              f"{args}: expected an error naming {needle!r}, got {'success' if flat is not None else msg!r}")


def main():
    if not check(os.access(TL_BIN, os.X_OK), f"no tokenloop binary at {TL_BIN}"):
        print(f"{to.passed} passed, {to.failed} failed")
        return 1
    os.makedirs(OUT_DIR, exist_ok=True)
    fixtures = sorted(glob.glob(os.path.join(FIX, "archs_*.json")))
    check(len(fixtures) >= 5, f"expected the archs_*.json fixtures, found {len(fixtures)}")
    with tempfile.TemporaryDirectory() as tmp:
        # the sanitizer run (make asan) takes the exact mode alone: each
        # architecture's own code runs in both modes, and the fast kernels
        # stay under the sanitizers in test_batch, test_forward and
        # test_kernels_bench
        modes = ("exact",) if to.ASAN else ("exact", "fast")
        if to.ASAN:
            print("sanitizer run: the exact mode only (the plain run checks both)")
        for to.NUMERICS in modes:
            for path in fixtures:
                check_fixture(path, tmp)
        check_bf16(tmp)
        check_levels(tmp)
        check_errors(tmp)
    print(f"{to.passed} passed, {to.failed} failed")
    return 1 if to.failed else 0


if __name__ == "__main__":
    sys.exit(main())
