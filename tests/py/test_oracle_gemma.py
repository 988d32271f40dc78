#!/usr/bin/env python3
"""Checks tokenloop's CLI ($TL_BIN) on Gemma 3 270M against the llama.cpp
fixtures tests/oracle/fixtures/gemma_*.json (written by
tests/oracle/make_fixtures_gemma.py): token ids, logits (top-20 per
position), greedy continuations and perplexity at -c 512 (and 2048).
Shares the helpers of test_oracle.py. A missing model or binary is a failure.
Usage: TL_BIN=build/tokenloop python3 tests/py/test_oracle_gemma.py [tokenizer logits greedy perplexity]
"""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_oracle as to  # noqa: E402

MODEL = os.path.join(to.ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
to.MODEL = MODEL  # run_logits and the tokenizer helper read the module's MODEL

# Tolerances, measured on these fixtures: max abs 2.16, mean abs per prompt
# 0.11-0.30 (overall 0.22), decisive top-1 always equal. The whole gap comes
# from two batch-dependent kernel paths of llama.cpp that we do not follow, to
# stay batch-invariant (docs/NUMERICS.md): Q4_K weights (attn_output, half the
# ffn_down) are repacked and a batch's groups of 4 rows go through a gemm that
# accumulates per 64 elements instead of per 256 (we mirror its one-row gemv),
# and Q6_K batches of 8+ rows take the "tiled" path. With both emulated
# (a scratch build, GGML_CPU_TILED_MM=0) the logits were bitwise equal on 14-,
# 46-, 71-, 867- and 1500-token prompts (the last through the wrapped
# sliding-window ring), so everything else is exact; a last-bit difference in
# those matmuls is amplified by the 8-bit activation quantization of the next.
LOGIT_MAX_ABS = 3.0
LOGIT_MEAN_ABS = 0.35
# The fast numerics mode (docs/NUMERICS.md) adds its own order on top: measured
# max abs 2.4, mean abs per prompt 0.15-0.39 (overall 0.22). It is held to the
# issue's rule over all prompts: top-1 agreement >= 99% where the reference's
# margin exceeds 0.3 (measured 99.68%, 1560/1565; the exact mode: 99.87%).
FAST_MEAN_ABS = 0.5
FAST_MARGIN = 0.3
FAST_TOP1_AGREE = 0.99
TOP1_AGREE = 1.0     # measured: every position with a decisive margin agrees
MARGIN = 0.6          # the near-tie rule for greedy and top-1 checks
PPL_REL = 0.005


def test_logits():
    fx = to.load("gemma_logits.json")
    all_abs = []
    fast = to.NUMERICS == "fast"
    n_dec = n_ok = 0
    with tempfile.TemporaryDirectory() as tmp:
        # under the sanitizers: the prompt through the wrapped sliding-window
        # ring, and two short ones
        for it in to.asan_pick(fx["items"], ("long_swa", "code_c", "single_token"), f"logits [{to.NUMERICS}]"):
            name, ids = it["name"], it["tokens"]
            got, err = to.run_logits(ids, tmp)
            if not to.check(got is not None, f"logits {name}: {err}"):
                continue
            ref_ids = np.array([[p[0] for p in row] for row in it["top20"]])
            ref_val = np.array([[p[1] for p in row] for row in it["top20"]])
            diff = np.abs(np.take_along_axis(got, ref_ids, axis=1) - ref_val)
            all_abs.append(diff.ravel())
            decisive = ref_val[:, 0] - ref_val[:, 1] > MARGIN
            top1_ok = got.argmax(axis=1) == ref_ids[:, 0]
            agree = (decisive & top1_ok).sum() / max(1, decisive.sum())
            print(f"logits [{to.NUMERICS}] {name}: n={len(ids)} max_abs={diff.max():.4f} mean_abs={diff.mean():.5f} "
                  f"p99={np.percentile(diff, 99):.4f} top1 {int(top1_ok.sum())}/{len(ids)} "
                  f"decisive agree {agree:.3f}")
            to.check(diff.max() <= LOGIT_MAX_ABS, f"logits {name}: max abs {diff.max():.4f} > {LOGIT_MAX_ABS}")
            mean_tol = FAST_MEAN_ABS if to.NUMERICS == "fast" else LOGIT_MEAN_ABS
            to.check(diff.mean() <= mean_tol, f"logits {name}: mean abs {diff.mean():.5f} > {mean_tol}")
            fd = ref_val[:, 0] - ref_val[:, 1] > FAST_MARGIN
            n_dec += int(fd.sum())
            n_ok += int((fd & top1_ok).sum())
            if not fast:
                to.check(agree >= TOP1_AGREE, f"logits {name}: decisive top-1 agreement {agree:.3f} < {TOP1_AGREE}")
    if fast:
        agree = n_ok / max(1, n_dec)
        print(f"logits [fast]: top-1 agreement where the margin exceeds {FAST_MARGIN}: {n_ok}/{n_dec} = {agree:.4f}")
        to.check(n_dec > 0 and agree >= FAST_TOP1_AGREE,
                 f"logits fast: top-1 agreement {agree:.4f} < {FAST_TOP1_AGREE} (margin > {FAST_MARGIN})")
    if all_abs:
        d = np.concatenate(all_abs)
        print(f"logits overall: max_abs={d.max():.4f} mean_abs={d.mean():.5f} p99={np.percentile(d, 99):.4f}")


def test_greedy():
    fx = to.load("gemma_greedy.json")
    n = fx["meta"]["settings"]["n_gen"]
    to.MARGIN = MARGIN
    for it in to.asan_pick(fx["items"], 3, "greedy"):
        rc, out, err = to.tl(["run", "-m", MODEL, "-p", it["prompt"], "-n", str(n), "--temp", "0", "--ids"])
        got = to.parse_ids(out) if rc == 0 else None
        if got is None:
            print(f"  rc={rc} {err.strip()[-300:]}")
        # <eos> and <end_of_turn> end a generation
        to.compare_greedy(repr(it["prompt"][:30]), it["ids"], got, it["margins"], {1, 106})


def test_perplexity():
    fx = to.load("gemma_perplexity.json")
    text = os.path.join(to.FIX, fx["text_file"])
    to.check(bool(fx["results"]), "gemma_perplexity.json has no results")
    results = sorted(fx["results"].items(), key=lambda kv: int(kv[0]))
    if to.ASAN and len(results) > 1:
        # -c 2048's code paths (the wrapped sliding-window ring) are exercised
        # under the sanitizers by the long_swa logits above and test_forward
        print(f"perplexity: sanitizer run, checking -c {results[0][0]} only "
              f"(the normal run checks {', '.join(k for k, _ in results)})")
        results = results[:1]
    for n_ctx, ref in results:
        r = to.run_perplexity(MODEL, text, n_ctx, ref["ppl"], ref.get("running_ppl"), PPL_REL)
        if r is None:
            continue
        ppl, se, ref_ppl, bound = r
        rel = abs(ppl - ref_ppl) / ref_ppl
        print(f"perplexity [{to.NUMERICS}] -c {n_ctx}: ours {ppl:.4f} +/- {se:.5f}, reference "
              f"{ref_ppl:.4f} ({ref['n_chunks']} chunks in all), rel diff {rel:.5f}")
        to.check(rel <= bound, f"perplexity -c {n_ctx}: {ppl:.4f} vs {ref_ppl:.4f} (rel {rel:.5f} > {bound})")


def main():
    parts = sys.argv[1:] or ["tokenizer", "logits", "greedy", "perplexity"]
    ok = to.check(os.path.exists(MODEL), f"model {MODEL} missing")
    ok = to.check(os.access(to.TL_BIN, os.X_OK), f"TL_BIN {to.TL_BIN} is not an executable") and ok
    if ok:
        if "tokenizer" in parts:
            to.test_tokenizer_file("gemma_tokenizer.json", MODEL)
        # both numerics modes, held to the same fidelity bounds (see above);
        # the sanitizer run looks for memory errors, not numbers: it runs the
        # long greedy and perplexity checks in the default mode only (the exact
        # kernels stay under it through the logits here and test_forward's
        # --numerics exact run)
        for to.NUMERICS in ("exact", "fast"):
            long_ok = not to.ASAN or to.NUMERICS == "fast"
            if "logits" in parts:
                test_logits()
            if "greedy" in parts and long_ok:
                test_greedy()
            if "perplexity" in parts and long_ok:
                test_perplexity()
    print(f"{to.passed} passed, {to.failed} failed")
    return 1 if to.failed else 0


if __name__ == "__main__":
    sys.exit(main())
