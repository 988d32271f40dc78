#!/usr/bin/env python3
"""Writes tests/oracle/fixtures/bert_vocab.json: a WordPiece vocabulary
(tokenizer.ggml.model = "bert") cut from llama.cpp's own test vocabulary
models/ggml-vocab-bert-bge.gguf, and llama.cpp's tokenizations of many
strings with it, through llama-cpp-python 0.3.36. Run by hand:

  PYTHONPATH=/work/lcp-avx2/lib/python3.11/site-packages python3 \\
      tests/oracle/make_fixtures_bert_vocab.py [--bge PATH/ggml-vocab-bert-bge.gguf]

The cut keeps bge's first 104 tokens ([PAD], [unused0..98], [UNK], [CLS],
[SEP], [MASK], at their ids), every token llama.cpp uses for the strings
with the whole vocabulary, every one-character token (word-initial and
"##" forms), and a fixed sample of the rest; greedy longest match picks the
same pieces from the cut whenever they are in it, so the cut keeps the
whole vocabulary's answers while staying small. A variant sets
tokenizer.ggml.normalizer.lowercase = false (no lower-casing, no accent
stripping). tests/py/test_bert_vocab.py rebuilds the GGUF with its own
writer (sha256 checked) and compares tokenloop with the ids recorded here.
"""
import argparse
import hashlib
import json
import os
import random
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(HERE, "fixtures", "bert_vocab.json")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

import gguf  # noqa: E402
import llama_cpp  # noqa: E402
from llama_cpp import Llama  # noqa: E402

import make_fixtures as mf  # noqa: E402  (its tokenizer_strings())
import test_bert_vocab as tb  # noqa: E402  (the test's GGUF writer)

SAMPLE = 2500


def extra_strings():
    s = [
        "Café résumé naïve façade déjà vu", "ÄPFEL Äpfel äpfel", "Straße STRASSE", "señor NIÑO año",
        "e\u0301 combining acute", "a\u0308\u0301 two marks", "Ωmega ΣΊΣΥΦΟΣ σίσυφος", "Привет, МИР! Как дела?",
        "İstanbul ıı I", "ǅ ǆ Ǆ", "ＦＵＬＬ ｗｉｄｔｈ １２３", "日本語のテキストです。", "中文文本，包含标点符号。你好世界！",
        "한국어 텍스트 한글", "ไทย ภาษา", "עברית ومرحبا", "𠀀𠀁 ext-b", "\U0002B820\U0002B900 gap",
        "$100 + 20% = <money> ^ ~ | ` @ # &", "€5 © ™ ° ± × ÷ § ¶", "a--b...c!!!d???", "«quoted» „x“",
        "\x00nul\x07bell\x1bescape", "zero\u200bwidth\ufeffbom", "\u00adsoft hyphen", "tab\tnew\nline\rcr\x0bvt\x0cff",
        "nbsp\u00a0here em\u2003space ideo\u3000space", "\u2028line sep\u2029para sep", "\x85next line",
        "supercalifragilisticexpialidocious", "antidisestablishmentarianism", "x" * 120, "ab" * 70,
        "unknownwordqzxv qzxvqzxv", "[CLS] hello [SEP]", "[MASK] is [MASK]", "[UNK][PAD]", "[unused0] x [unused98]",
        "[cls] lower", "hello[SEP]world", "##ing ##s", "\u2581literal \u2581", "don't won't it's",
        "3.14159 1,000,000 2024-01-31 12:34:56", "email@example.com https://example.org/a?b=1",
        "\U0001F600 emoji \u2764\ufe0f", "\U0010FFFF", "",
    ]
    out = [("bert", x.encode("utf-8")) for x in s]
    out += [("bytes", b) for b in [b"\xff\xfe bad", b"a\x80b", b"\xc0\x80 overlong", b"\xed\xa0\x80 surrogate",
                                   b"trail \xe2\x82", b"\xc3"]]
    return out


def inp_strings(bge):
    """llama.cpp's own test strings for this vocabulary (its .inp beside it)."""
    parts = open(bge + ".inp", "rb").read().split(b"\n__ggml_vocab_test__\n")
    if parts and parts[-1] == b"":
        parts.pop()
    return [("bge_inp", t) for t in parts]


def write_gguf(vocab, path):
    w = gguf.GGUFWriter(path, vocab["architecture"])
    w.add_name(vocab["name"])
    w.add_tokenizer_model(vocab["model"])
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list([bytes.fromhex(h) for h in vocab["tokens_hex"]])
    w.add_token_scores([0.0] * len(vocab["tokens_hex"]))
    w.add_token_types(vocab["token_types"])
    w.add_unk_token_id(vocab["unknown_token_id"])
    w.add_sep_token_id(vocab["seperator_token_id"])
    w.add_pad_token_id(vocab["padding_token_id"])
    w.add_uint32("tokenizer.ggml.cls_token_id", vocab["cls_token_id"])
    w.add_mask_token_id(vocab["mask_token_id"])
    if "lowercase" in vocab:
        w.add_bool("tokenizer.ggml.normalizer.lowercase", vocab["lowercase"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    blob = open(path, "rb").read()
    assert tb.gguf_bytes(tb.vocab_kvs(vocab)) == blob, "the test's GGUF writer differs from GGUFWriter"
    return blob


def piece(vocab, tok):
    buf = (llama_cpp.ctypes.c_char * 512)()
    n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, True)
    assert 0 <= n <= len(buf), (tok, n)
    return bytes(buf[:n])


def record(path, strings):
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    lv = llm._model.vocab
    items = []
    for label, b in strings:
        ids_sp = llm.tokenize(b, add_bos=True, special=True)
        ids_pl = llm.tokenize(b, add_bos=True, special=False)
        ids_ns = llm.tokenize(b, add_bos=False, special=False)
        detok = b"".join(piece(lv, t) for t in ids_sp)
        items.append({"label": label, "hex": b.hex(), "ids_special": ids_sp, "ids_plain": ids_pl,
                      "ids_nobos": ids_ns, "detok_hex": detok.hex()})
    del llm
    return items


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bge", default="/work/llama-src/models/ggml-vocab-bert-bge.gguf")
    opt = ap.parse_args()
    r = gguf.GGUFReader(opt.bge)
    toks = [bytes(r.fields["tokenizer.ggml.tokens"].parts[i]) for i in r.fields["tokenizer.ggml.tokens"].data]
    types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in r.fields["tokenizer.ggml.token_type"].data]
    # make_fixtures.py's long strings cut to 600 characters (their words are
    # the short strings' words; whole they would triple the fixture)
    strings = [(label, b.decode("utf-8")[:600].encode("utf-8") if label.startswith("long_") else b)
               for label, b in mf.tokenizer_strings()] + inp_strings(opt.bge) + extra_strings()
    full = Llama(model_path=opt.bge, vocab_only=True, verbose=False)
    used = set()
    for _, b in strings:
        used.update(full.tokenize(b, add_bos=True, special=True))
        used.update(full.tokenize(b, add_bos=False, special=False))
    del full
    keep = set(range(104)) | used
    for i, t in enumerate(toks):
        s = t.decode("utf-8", errors="replace")
        if len(s) == 1 or (s.startswith("\u2581") and len(s) == 2):
            keep.add(i)
    rest = sorted(set(range(len(toks))) - keep)
    keep |= set(random.Random(7).sample(rest, SAMPLE))
    ids = sorted(keep)
    assert ids[:104] == list(range(104))
    vocab = {
        "architecture": "bert", "name": "bert-bge cut", "model": "bert", "pre": "bert-bge",
        "tokens_hex": [toks[i].hex() for i in ids], "token_types": [types[i] for i in ids],
        "unknown_token_id": 100, "seperator_token_id": 102, "padding_token_id": 0,
        "cls_token_id": 101, "mask_token_id": 103,
    }
    variant = {"lowercase": False}
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "bert.gguf")
        blob = write_gguf(vocab, p)
        vocab["gguf_sha256"] = hashlib.sha256(blob).hexdigest()
        items = record(p, strings)
        vp = os.path.join(tmp, "bert-cased.gguf")
        vblob = write_gguf({**vocab, **variant}, vp)
        variant["gguf_sha256"] = hashlib.sha256(vblob).hexdigest()
        vitems = record(vp, strings)
    print(f"vocabulary: {len(ids)} of {len(toks)} tokens; {len(items)} strings")
    obj = {
        "meta": {"source": f"llama-cpp-python {llama_cpp.__version__}",
                 "call": "llm.tokenize(bytes, add_bos=True, special=True|False) and add_bos=False, special=False; "
                         "detok = llama_token_to_piece(vocab, id, 0, special=True) of ids_special, joined"},
        "note": "strings and token texts are hex; the variant is the vocabulary with those keys added, its "
                "tokenizations in variant_items",
        "vocab": vocab, "variant": variant, "items": items, "variant_items": vitems,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
