#!/usr/bin/env python3
"""Independent reference tokenizations of SmolLM2 from Hugging Face `tokenizers`.

Rebuilds SmolLM2's tokenizer from the vocabulary and merges stored in the GGUF
file (read with the `gguf` package) the way its tokenizer.json defines it:
BPE model, pre-tokenizer Sequence[Digits(individual_digits), ByteLevel(no
prefix space, GPT-2 regex)], the control tokens as special added tokens.
Writes tests/oracle/fixtures/hf_smollm2.txt, one line per string:
"<hex of the UTF-8 bytes>\t<ids separated by spaces>", which
tests/unit/test_tokenizer.c checks (with parse_special, as HF always splits out
added tokens). Run by hand: python3 tests/oracle/hf_tokenize.py
"""
import os
import sys

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(HERE, "fixtures", "hf_smollm2.txt")

STRINGS = [
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    "I can't believe it's not butter; they'd've known.",
    "The year 2024 had 366 days, or 31,622,400 seconds.",
    "    indented code\n\tand tabs\n\n\nnewlines",
    "trailing spaces   ",
    "   ",
    "def add(a, b):\n    return a + b  # sum\n",
    "naïve café résumé coöperate Ångström",
    "Привет, мир! Γειά σου κόσμε. שלום עולם",
    "日本語のテキストです。中文文本，包含标点符号。",
    "emoji 😀😁 👍🏽 👨‍👩‍👧 ❤️ 🇫🇷 test",
    "x² + y² = z²; ∑∫∂ ≤ ≥ ≠ ∞",
    "https://example.org/path?q=1&r=2#frag email@example.com",
    "ALL CAPS WITH NUMBERS 1234567890 AND PUNCTUATION!!!???",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more",
    "\u00a0nbsp\u3000ideographic\u2003em space",
    "a\u200bzero\u200bwidth",
    "line one\r\nline two\rline three",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "----====****____",
    "{\"key\": [1, 2.5, -3e10, true, null]}",
    "",
]


def build():
    r = gguf.GGUFReader(MODEL)
    f = r.fields

    def strs(name):
        fl = f[name]
        return [bytes(fl.parts[i]).decode("utf-8") for i in fl.data]

    tokens = strs("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strs("tokenizer.ggml.merges")]
    tt = f["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(specials)
    return tok


def main():
    tok = build()
    lines = []
    for s in STRINGS:
        ids = tok.encode(s, add_special_tokens=False).ids
        lines.append(s.encode("utf-8").hex() + "\t" + " ".join(str(i) for i in ids))
    with open(OUT, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} strings to {os.path.relpath(OUT, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
