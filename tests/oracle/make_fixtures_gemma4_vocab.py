#!/usr/bin/env python3
"""Writes tests/oracle/fixtures/gemma4_vocab.json: a small Gemma-4-style
vocabulary (tokenizer.ggml.model = "gemma4") and llama.cpp's tokenizations of
many strings with it, through llama-cpp-python 0.3.36. Run by hand in a venv
with llama_cpp and gguf (e.g. the one make_fixtures.sh makes, plus
`pip install gguf`); tests/py/test_gemma4_vocab.py checks tokenloop against
the committed output with the standard library only.

The vocabulary is built deterministically here, laid out like
conversion/gemma.py's Gemma4Model.set_vocab writes a real one:
  - special tokens (<pad> <eos> <bos> <unk>, <|turn> <turn|> ... as CONTROL;
    <|channel> <channel|> <|tool_call> <tool_call|> <|tool_response>
    <tool_response|> <|"|> as USER_DEFINED, the converter's visible tokens;
    a NORMAL </s>, which llama.cpp keeps normal beside <|tool_response>);
  - the byte tokens <0x00>..<0xFF> (BYTE), less <0x7F>, so a byte with no
    token is dropped as llama.cpp drops it;
  - runs of newlines as tokens ("\\n" x 1, 2, 3, 4, 8) with merges for only
    "\\n\\n" and "\\n\\n\\n\\n", so whole-run lookup (llama.cpp PR 21343) and
    merging both show;
  - every character of a training text (spaces as U+2581) and the merges of a
    plain BPE trained on it (most frequent pair first, ties by the pair's
    text), plus a merge whose result is no token ("x q"), which llama.cpp
    spells as the byte tokens of its text.
The GGUF is written with gguf-py's GGUFWriter; the test rebuilds it from the
fixture with its own writer and checks the sha256 recorded here.

Usage: make_fixtures_gemma4_vocab.py [--keep FILE.gguf]
"""
import argparse
import collections
import hashlib
import json
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(HERE, "fixtures", "gemma4_vocab.json")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

import gguf  # noqa: E402
import llama_cpp  # noqa: E402
from llama_cpp import Llama  # noqa: E402

import make_fixtures as mf  # noqa: E402  (its tokenizer_strings())
import test_gemma4_vocab as tg  # noqa: E402  (the test's GGUF writer, to check it matches)

SP = "\u2581"
N_MERGES = 700
# token_type values (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6

SPECIALS = [
    ("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN),
    ("<mask>", CONTROL), ("<|turn>", CONTROL), ("<turn|>", CONTROL), ("<|think|>", CONTROL),
    ("<|channel>", USER_DEFINED), ("<channel|>", USER_DEFINED), ("<|tool_call>", USER_DEFINED),
    ("<tool_call|>", USER_DEFINED), ("<|tool_response>", USER_DEFINED),
    ("<tool_response|>", USER_DEFINED), ('<|"|>', USER_DEFINED), ("<|tool>", CONTROL),
    ("<tool|>", CONTROL), ("<|image|>", CONTROL), ("<unused0>", CONTROL), ("<unused1>", CONTROL),
    ("</s>", NORMAL),
]
NEWLINE_TOKENS = ["\n", "\n\n", "\n\n\n", "\n\n\n\n", "\n" * 8]
NEWLINE_MERGES = [("\n", "\n"), ("\n\n", "\n\n")]
MISSING_BYTES = {0x7F}

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran
back into the forest where the other foxes were waiting for their dinner.
It was the best of times, it was the worst of times; it was the age of wisdom, it was
the age of foolishness, it was the epoch of belief, it was the epoch of incredulity.
Once upon a time, in a land far away, there lived a king who had three daughters. The
youngest daughter was the most beautiful, and the sun itself was astonished whenever it
shone upon her face. What is the capital of France? The capital of France is Paris.
I don't know; maybe it's Paris?! She said: "Hello, world!" and he answered 'hi there'.
Questions and answers: how many people live in the city? About two million people.
The history of Rome begins with the founding of the city in 753 BC, according to legend.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 3.14159 42 1,000,000 $9.99 100%.
Dates like 2024-01-31 and times like 12:34:56 appear in logs and reports every day.
Email me at someone@example.com or visit https://example.org/path?q=1&r=2 for details.

def main(argv):
    parser = make_parser()
    args = parser.parse_args(argv)
    for item in args.items:
        if item is None:
            continue
        print("item:", item)
    return 0

int main(void) {
\tint x = 42;
\tfor (int i = 0; i < 10; i++) {
\t\tprintf("%d\\n", x + i);
\t}
\treturn 0;
}

    if value > limit:
        raise ValueError("value too large")
    else:
        result = [value * 2 for value in values]
SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC;
<html><body><p class="note">Hello &amp; goodbye</p></body></html>
{"key": [1, 2.5, -3, true, null], "nested": {"a": "b"}}
Café résumé naïve façade déjà vu; Ärger über Öl und Straße; señor niño año.
Γειά σου κόσμε, η γλώσσα είναι ελληνική. Привет, мир! Как дела? Хорошо, спасибо.
日本語のテキストです。これはテストです。中文文本，包含标点符号。你好，世界！
Emoji are rare here: 😀 only this one, and a heart ❤ too.
Spaces:  two  spaces,   three   spaces,    four    spaces, and        eight.
A line with trailing spaces   
    indented by four spaces
        indented by eight spaces
Tabs\tbetween\twords\tand\t\tdouble\ttabs.
"""


def train_bpe(text, n_merges):
    """A plain BPE on the words of text (spaces as U+2581, lines alone, each
    word a run of U+2581 then the rest): the most frequent adjacent pair is
    merged first, ties by the pair's text. Returns (alphabet, merges)."""
    words = collections.Counter()
    for line in text.replace(" ", SP).split("\n"):
        for w in re.findall(SP + "?[^" + SP + "]+|" + SP + "+", line):
            words[tuple(w)] += 1
    alphabet = sorted({c for w in words for c in w})
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        new = collections.Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += n
        words = new
    return alphabet, merges


def build_vocab():
    tokens, types = [], []

    def add(text, ty):
        if text in index:
            return
        index[text] = len(tokens)
        tokens.append(text)
        types.append(ty)

    index = {}
    for text, ty in SPECIALS:
        add(text, ty)
    for b in range(256):
        if b not in MISSING_BYTES:
            add(f"<0x{b:02X}>", BYTE)
    for t in NEWLINE_TOKENS:
        add(t, NORMAL)
    alphabet, merges = train_bpe(CORPUS, N_MERGES)
    for c in alphabet:
        add(c, NORMAL)
    for a, b in merges:
        add(a + b, NORMAL)
    dangling = ("x", "q")
    assert "xq" not in index and all(c in index for c in dangling)
    merge_list = NEWLINE_MERGES + merges + [dangling]
    return tokens, types, [f"{a} {b}" for a, b in merge_list], index


def extra_strings():
    """Strings for this tokenizer's own corners, beside make_fixtures.py's."""
    s = []
    for k in list(range(1, 11)) + [15, 16, 17, 33]:
        s.append(("newlines", "\n" * k))
    s += [("newlines", x) for x in [
        "a\nb", "a\n\nb", "a\n\n\nb", "a\n\n\n\nb", "a\n\n\n\n\nb", "a" + "\n" * 7 + "b", "x\n\n\n\n\n",
        "\n\n\n\n\n x", " \n\n\n ", "\r\n\r\n\r\n", "\n\r\n\n", "end.\n\n\nNext paragraph.\n\n"]]
    s += [("spaces", x) for x in [
        "the  the   the    the", "  two leading", "trailing two  ", " ", "  ", " " * 9, "a" + " " * 12 + "b",
        "\u2581literal\u2581block\u2581", "mixed \u2581 both", "\u2581\u2581 \u2581", " \t \t", "\t\tdouble tab"]]
    s += [("gemma4_special", x) for x in [
        "<bos>", "<bos>hello", "<eos>", "<pad><mask><unk>", "<|turn>user\nHello there<turn|>\n<|turn>model\n",
        "<|turn>system\n<|think|>You are helpful.<turn|>\n",
        "<|channel>thought\nLet me think.<channel|>The answer is 4.",
        "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>",
        "<|tool_response>response:get_weather{temp:20}<tool_response|>",
        "<|tool>declaration:f{}<tool|>", "a</s>b", "</s>", "</s></s>", "<unused0>x<unused1>", "<|image|>",
        " <|turn> ", "<|turn", "turn|>", "<|\"|>", "<<|\"|>>", "<|tool_response><|tool_response>",
        "<|turn>user\n  spaced  <turn|>"]]
    s += [("fallback", x) for x in [
        "xq", "xqx", "xq xq", "quick xq", "\x7f", "a\x7fb", "😀😃", "🤖 robot", "❤️",
        "完全未知的汉字", "ქართული", "Ελληνικά και русский", "ñ ü ß", "\u00a0", "\u200b", "\U0010FFFF"]]
    return [(label, x.encode("utf-8")) for label, x in s]


def piece(vocab, tok):
    buf = (llama_cpp.ctypes.c_char * 512)()
    n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, True)
    assert 0 <= n <= len(buf), (tok, n)
    return bytes(buf[:n])


def write_gguf(vocab, path):
    """Writes the vocabulary with gguf-py; returns the file's bytes, checked
    equal to what the test's own writer makes of the fixture."""
    w = gguf.GGUFWriter(path, vocab["architecture"])
    w.add_name(vocab["name"])
    w.add_tokenizer_model(vocab["model"])
    if "pre" in vocab:
        w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list([bytes.fromhex(h) for h in vocab["tokens_hex"]])
    w.add_token_scores([0.0] * len(vocab["tokens_hex"]))
    w.add_token_types(vocab["token_types"])
    w.add_token_merges([bytes.fromhex(h) for h in vocab["merges_hex"]])
    w.add_bos_token_id(vocab["bos_token_id"])
    w.add_eos_token_id(vocab["eos_token_id"])
    w.add_unk_token_id(vocab["unknown_token_id"])
    w.add_pad_token_id(vocab["padding_token_id"])
    w.add_add_bos_token(vocab["add_bos_token"])
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
        blob = f.read()
    assert tg.gguf_bytes(tg.vocab_kvs(vocab)) == blob, "the test's GGUF writer differs from GGUFWriter"
    return blob


def record(path, strings):
    """llama.cpp's ids (special parsing on and off, BOS added) and the joined
    pieces of the special-parsed ids, for each string."""
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    lv = llm._model.vocab
    assert llama_cpp.llama_vocab_get_add_bos(lv)
    items = []
    for label, b in strings:
        ids_sp = llm.tokenize(b, add_bos=True, special=True)
        ids_pl = llm.tokenize(b, add_bos=True, special=False)
        detok = b"".join(piece(lv, t) for t in ids_sp)
        items.append({"label": label, "hex": b.hex(), "ids_special": ids_sp, "ids_plain": ids_pl,
                      "detok_hex": detok.hex()})
    eog = [t for t in range(llama_cpp.llama_vocab_n_tokens(lv)) if llama_cpp.llama_vocab_is_eog(lv, t)]
    del llm
    return items, eog


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", help="also keep the GGUF file here")
    opt = ap.parse_args()
    tokens, types, merges, index = build_vocab()
    vocab = {
        "architecture": "llama",
        "name": "gemma4-style test vocabulary",
        "model": "gemma4",
        "tokens_hex": [t.encode("utf-8").hex() for t in tokens],
        "token_types": types,
        "merges_hex": [m.encode("utf-8").hex() for m in merges],
        "bos_token_id": index["<bos>"], "eos_token_id": index["<eos>"],
        "unknown_token_id": index["<unk>"], "padding_token_id": index["<pad>"],
        "add_bos_token": True,
    }
    # llama.cpp gives Gemma 4's pre-tokenizer type to this "gpt2" vocabulary too
    variant = {"model": "gpt2", "pre": "granite-embed-multi-311m"}
    # make_fixtures.py's strings (its long ones cut to 600 characters: this
    # tokenizer's split is trivial, and they would triple the fixture)
    strings = [(label, b.decode("utf-8")[:600].encode("utf-8") if label.startswith("long_") else b)
               for label, b in mf.tokenizer_strings()] + extra_strings()
    with tempfile.TemporaryDirectory() as tmp:
        path = opt.keep or os.path.join(tmp, "gemma4-vocab.gguf")
        blob = write_gguf(vocab, path)
        vocab["gguf_sha256"] = hashlib.sha256(blob).hexdigest()
        print(f"vocabulary: {len(tokens)} tokens, {len(merges)} merges, GGUF {len(blob)} bytes")
        items, eog = record(path, strings)
        vpath = os.path.join(tmp, "granite-vocab.gguf")
        vblob = write_gguf({**vocab, **variant}, vpath)
        variant["gguf_sha256"] = hashlib.sha256(vblob).hexdigest()
        vitems, veog = record(vpath, strings)
        assert vitems == items and veog == eog, "the granite-embed-multi-311m variant tokenizes differently"
    obj = {
        "meta": {
            "generator": "tests/oracle/make_fixtures_gemma4_vocab.py",
            "llama_cpp_python_version": llama_cpp.__version__,
            "gguf_py_version": getattr(gguf, "__version__", "?"),
            "call": "llm = Llama(gguf, vocab_only=True); llm.tokenize(bytes, add_bos=True, special=True|False); "
                    "detok = llama_token_to_piece(vocab, id, lstrip=0, special=True) of ids_special, joined",
            "eog_ids": eog,
        },
        "note": "strings are hex of the raw bytes; ids_special = parse_special true, "
                "ids_plain = parse_special false; the vocabulary's texts are hex of UTF-8; "
                "each variant is the vocabulary with those keys replaced, and llama.cpp gives "
                "every string the same ids and pieces with it",
        "vocab": vocab,
        "variants": [variant],
        "items": items,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes, {len(items)} strings)")


if __name__ == "__main__":
    main()
