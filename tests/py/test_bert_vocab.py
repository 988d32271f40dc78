#!/usr/bin/env python3
"""Checks tokenloop's WordPiece tokenizer (tokenizer.ggml.model = "bert",
llama.cpp's WPM: lower-casing and accent stripping by llama.cpp's Unicode
tables, splits at whitespace, punctuation, ASCII symbols and CJK, greedy
longest match with word-initial pieces stored after U+2581 and "##" pieces
bare, [CLS] ... [SEP] with add_special) against llama.cpp's ids in
tests/oracle/fixtures/bert_vocab.json (tests/oracle/make_fixtures_bert_vocab.py:
a cut of llama.cpp's ggml-vocab-bert-bge.gguf, and a variant without
lower-casing).

For every string: `tokenloop tokenize --bos --ids` with and without
--no-special, and without --bos, give llama.cpp's ids; the pieces of the
special-parsed ids join to llama.cpp's detokenization. Standard library
only; a missing binary or fixture is a failure.
Usage: TL_BIN=build/tokenloop python3 tests/py/test_bert_vocab.py
"""
import hashlib
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tlcheck import ROOT, check, finish  # noqa: E402
import test_gemma4_vocab as tg  # noqa: E402  (its GGUF writer and tokenloop runners)
from test_gemma4_vocab import T_ARRAY, T_BOOL, T_FLOAT32, T_INT32, T_STRING, T_UINT32, gguf_bytes  # noqa: E402,F401

FIXTURE = os.path.join(ROOT, "tests", "oracle", "fixtures", "bert_vocab.json")


def vocab_kvs(v):
    """The vocabulary's key/values in the order the generator's GGUFWriter writes them."""
    tokens = [bytes.fromhex(h) for h in v["tokens_hex"]]
    kvs = [
        ("general.architecture", T_STRING, v["architecture"]),
        ("general.name", T_STRING, v["name"]),
        ("tokenizer.ggml.model", T_STRING, v["model"]),
        ("tokenizer.ggml.pre", T_STRING, v["pre"]),
        ("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, tokens)),
        ("tokenizer.ggml.scores", T_ARRAY, (T_FLOAT32, [0.0] * len(tokens))),
        ("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, v["token_types"])),
    ]
    for key in ("unknown_token_id", "seperator_token_id", "padding_token_id", "cls_token_id", "mask_token_id"):
        kvs.append((f"tokenizer.ggml.{key}", T_UINT32, v[key]))
    if "lowercase" in v:
        kvs.append(("tokenizer.ggml.normalizer.lowercase", T_BOOL, v["lowercase"]))
    return kvs


def ids_of(model, data, bos, special):
    args = ["tokenize", "-m", model, "--stdin", "--ids"] + (["--bos"] if bos else []) + \
           ([] if special else ["--no-special"])
    rc, out, err = tg.tl(args, data)
    if rc != 0:
        return None, f"rc={rc} {err.decode(errors='replace').strip()[-200:]}"
    try:
        return json.loads(out.decode().strip().splitlines()[-1]), None
    except (ValueError, IndexError, UnicodeDecodeError):
        return None, f"unparsable output {out[-200:]!r}"


def check_file(model, name, items):
    workers = max(2, os.cpu_count() or 2)
    for mode, key, bos, special in (("special", "ids_special", 1, 1), ("plain", "ids_plain", 1, 0),
                                    ("no bos", "ids_nobos", 0, 0)):
        with ThreadPoolExecutor(max_workers=workers) as ex:
            res = list(ex.map(lambda it: ids_of(model, bytes.fromhex(it["hex"]), bos, special), items))
        bad = [(it, ids, err) for it, (ids, err) in zip(items, res) if ids != it[key]]
        print(f"{name} ids [{mode}]: {len(items) - len(bad)}/{len(items)} identical to llama.cpp's")
        for it, ids, err in bad[:6]:
            ref, got = it[key], ids or []
            k = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
            print(f"  {it['label']} {bytes.fromhex(it['hex'])[:50]!r}: first difference at {k}: "
                  f"ref {ref[k:k + 8]} got {got[k:k + 8]} {err or ''}")
        check(not bad, f"{name} ids [{mode}]: {len(bad)} of {len(items)} strings tokenize differently")
    with ThreadPoolExecutor(max_workers=workers) as ex:
        res = list(ex.map(lambda it: tg.tokenize_pieces(model, bytes.fromhex(it["hex"]), it["ids_special"]), items))
    bad = [(it, p, e) for it, (p, e) in zip(items, res)
           if p is None or b"".join(p) != bytes.fromhex(it["detok_hex"]).replace(b"\0", b"")]
    print(f"{name} detokenized: {len(items) - len(bad)}/{len(items)} identical to llama.cpp's")
    for it, p, e in bad[:4]:
        print(f"  ref {bytes.fromhex(it['detok_hex'])[:60]!r} got {b''.join(p)[:60] if p else p!r} {e or ''}")
    check(not bad, f"{name} detokenization: {len(bad)} of {len(items)} strings differ")


def main():
    if not check(os.path.isfile(FIXTURE), f"fixture {FIXTURE} missing"):
        return
    if not check(os.path.isfile(tg.TL_BIN) and os.access(tg.TL_BIN, os.X_OK),
                 f"TL_BIN {tg.TL_BIN} is not an executable"):
        return
    with open(FIXTURE, encoding="utf-8") as f:
        fx = json.load(f)
    check(len(fx["items"]) >= 200, f"the fixture holds {len(fx['items'])} strings, expected at least 200")
    # the cut must still make [UNK]s, multi-piece words and [CLS]/[SEP], or the test proves little
    flat = [t for it in fx["items"] for t in it["ids_plain"]]
    check(flat.count(100) >= 5 and flat.count(101) == len(fx["items"]), "the fixture lacks [UNK]s or [CLS]s")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (v, items) in enumerate(((fx["vocab"], fx["items"]),
                                        ({**fx["vocab"], **fx["variant"]}, fx["variant_items"]))):
            name = "bert" + ("" if i == 0 else " (lowercase=false)")
            blob = gguf_bytes(vocab_kvs(v))
            sha = hashlib.sha256(blob).hexdigest()
            if not check(sha == v["gguf_sha256"], f"{name}: the rebuilt GGUF differs from the one llama.cpp read"):
                continue
            model = os.path.join(tmp, f"vocab{i}.gguf")
            with open(model, "wb") as f:
                f.write(blob)
            check_file(model, name, items)


if __name__ == "__main__":
    main()
    finish()
