#!/usr/bin/env python3
"""Writes the Gemma 3 oracle fixtures (tests/oracle/fixtures/gemma_*.json) from
llama.cpp through llama-cpp-python (flash attention off, its default):
tokenizations with the Gemma vocabulary, top-20 logits, greedy continuations
and perplexity. Run by hand; tests/py/test_oracle_gemma.py checks tokenloop
against the committed outputs without llama_cpp. Reuses the string lists and
helpers of make_fixtures.py (the SmolLM2 fixtures) so the two stay alike.

Usage: make_fixtures_gemma.py [--only tokenizer,logits,greedy,perplexity]
"""
import argparse
import hashlib
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402

MODEL = os.path.join(mf.ROOT, "models", "gemma-3-270m-q4_k_m.gguf")

# A base model: plain prompts, no chat template. "long_swa" is longer than the
# 512-position sliding window, so the local layers' mask is exercised.
LOGIT_PROMPTS = [(n, t) for n, t in mf.LOGIT_PROMPTS if not n.startswith("chat_")] + [
    ("gemma_turns", "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
                    "<start_of_turn>model\n"),
    ("question", "Question: Why is the sky blue?\nAnswer:"),
    ("numbers", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"),
    ("long_swa", (mf.LONG_PROMPT + "\n\n") * 3),
]

GREEDY_PROMPTS = mf.GREEDY_PLAIN + [
    "The largest planet in the solar system is",
    "Water boils at a temperature of",
    "import numpy as np\n\ndef softmax(x):",
    "Dear Sir or Madam,\n\nI am writing to",
]


def load(n_ctx, logits_all=True):
    from llama_cpp import Llama
    return Llama(model_path=MODEL, n_threads=mf.N_THREADS, n_threads_batch=mf.N_THREADS,
                 n_ctx=n_ctx, n_batch=mf.N_BATCH, n_ubatch=mf.N_BATCH, seed=mf.SEED,
                 logits_all=logits_all, verbose=False)


def do_tokenizer():
    llm = load(512, logits_all=False)
    items = []
    for label, b in mf.tokenizer_strings() + mf.spm_strings():
        items.append({"label": label, "hex": b.hex(),
                      "ids_special": llm.tokenize(b, add_bos=False, special=True),
                      "ids_plain": llm.tokenize(b, add_bos=False, special=False)})
    obj = {"meta": mf.meta(MODEL, call="llm.tokenize(bytes, add_bos=False, special=True|False)"),
           "note": "strings as hex of the raw bytes; ids_special = parse_special true",
           "items": items}
    mf.write_json("gemma_tokenizer.json", obj)


def do_logits(llm, n_gen=32):
    add_bos = mf.model_add_bos(llm)
    items = []
    for name, text in LOGIT_PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
        gen, _ = mf.greedy(llm, ids, n_gen, stop_at_eog=False)
        seq = ids + gen
        rows = mf.eval_fresh(llm, seq)
        items.append({"name": name, "prompt": text, "n_prompt": len(ids), "tokens": seq,
                      "top20": mf.topk_rows(rows)})
        print(f"logits {name}: {len(seq)} tokens")
    obj = {"meta": mf.meta(MODEL, logits_all=True, add_bos=add_bos, n_gen=n_gen,
                           procedure="as make_fixtures.py do_logits: prompt + 32 greedy tokens "
                                     "evaluated in one eval from an empty cache; top20 per position"),
           "items": items}
    mf.write_json("gemma_logits.json", obj)


def do_greedy(llm, n_gen=64):
    add_bos = mf.model_add_bos(llm)
    items = []
    for text in GREEDY_PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
        gen, margins = mf.greedy(llm, ids, n_gen, stop_at_eog=True)
        decoded = llm.detokenize(gen).decode("utf-8", errors="replace")
        items.append({"prompt": text, "prompt_ids": ids, "ids": gen, "text": decoded,
                      "margins": margins})
        print(f"greedy {text[:30]!r}: {len(gen)} tokens, min margin {min(margins):.3f}")
    obj = {"meta": mf.meta(MODEL, add_bos=add_bos, n_gen=n_gen, temp=0,
                           procedure="as make_fixtures.py do_greedy (prompt in one eval, then one "
                                     "token per eval, argmax; margins = top1 - top2 logit)"),
           "items": items}
    mf.write_json("gemma_greedy.json", obj)


def do_perplexity():
    path = os.path.join(mf.FIX, "ppl_text.txt")
    with open(path, "rb") as f:
        text = f.read()
    res_all = {}
    for n_ctx in (512, 2048):
        llm = load(n_ctx)
        tokens = llm.tokenize(text, add_bos=mf.model_add_bos(llm), special=False)
        if len(tokens) // n_ctx < 2:
            print(f"perplexity -c {n_ctx}: only {len(tokens)} tokens, fewer than 2 chunks; skipped")
            del llm
            continue
        res = mf.ppl_protocol(llm, tokens, n_ctx)
        res.update({"n_tokens": len(tokens), "n_ctx": n_ctx})
        print(f"perplexity -c {n_ctx}: {res['ppl']:.4f} +/- {res['stderr']:.5f} "
              f"({res['n_chunks']} chunks)")
        res_all[str(n_ctx)] = res
        del llm
    obj = {"meta": mf.meta(MODEL, procedure="tools/perplexity/perplexity.cpp default protocol "
                                           "(make_fixtures.py ppl_protocol), one Llama per n_ctx"),
           "text_file": "ppl_text.txt", "text_sha256": hashlib.sha256(text).hexdigest(),
           "results": res_all}
    mf.write_json("gemma_perplexity.json", obj)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="tokenizer,logits,greedy,perplexity")
    parts = set(ap.parse_args().only.split(","))
    if not os.path.exists(MODEL):
        sys.exit(f"missing model {MODEL}")
    if "tokenizer" in parts:
        do_tokenizer()
    if parts & {"logits", "greedy"}:
        llm = load(2048)
        if "logits" in parts:
            do_logits(llm)
        if "greedy" in parts:
            do_greedy(llm)
        del llm
    if "perplexity" in parts:
        do_perplexity()


if __name__ == "__main__":
    main()
