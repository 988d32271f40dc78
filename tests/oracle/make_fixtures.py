#!/usr/bin/env python3
"""Writes the oracle fixtures in tests/oracle/fixtures/ from llama.cpp (through
llama-cpp-python): tokenizations, top-20 logits, greedy generations and a
perplexity. Run by hand via make_fixtures.sh; the outputs are committed and
tests/py/test_oracle.py checks tokenloop against them without llama_cpp.

Usage: make_fixtures.py [--only tokenizer,logits,greedy,perplexity] [--tool-result JSON]
(--only none --tool-result '{...}' records a real llama-perplexity run's result in
the existing perplexity.json; that tool is built by hand, not by this script.)
"""
import argparse
import hashlib
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(HERE, "fixtures")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
GPT2_VOCAB = "/work/shared/vocab/ggml-vocab-gpt-2.gguf"
SPM_VOCAB = "/work/shared/vocab/ggml-vocab-llama-spm.gguf"

N_THREADS = 2
N_CTX = 2048
N_BATCH = 512
SEED = 1234
TOPK = 20

import llama_cpp  # noqa: E402  (the only non-stdlib dependency besides numpy/jinja2)
from llama_cpp import Llama  # noqa: E402


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def meta(model_path, **extra):
    m = {
        "generator": "tests/oracle/make_fixtures.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "model": os.path.basename(model_path),
        "model_sha256": sha256(model_path),
        "settings": {"n_threads": N_THREADS, "n_ctx": N_CTX, "n_batch": N_BATCH,
                     "seed": SEED, "flash_attn": "disabled (llama-cpp-python default)"},
    }
    m["settings"].update(extra)
    return m


def write_json(name, obj):
    path = os.path.join(FIX, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def load(model_path, vocab_only=False, logits_all=False):
    return Llama(model_path=model_path, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                 n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, seed=SEED,
                 logits_all=logits_all, vocab_only=vocab_only, verbose=False)


# ---------------------------------------------------------------- tokenizer

def tokenizer_strings():
    """Returns [(label, bytes)], covering the pre-tokenizer's and BPE's corners."""
    s = []

    def add(label, x):
        s.append((label, x.encode("utf-8") if isinstance(x, str) else x))

    prose = [
        "Hello world", "Hello, world!", " Hello world", "hello  world", "The quick brown fox jumps over the lazy dog.",
        "It was the best of times, it was the worst of times.",
        "Once upon a time, in a land far, far away, there lived a king who had three daughters.",
        "What is the capital of France?", "I don't know; maybe it's Paris?!", "e.g. i.e. etc. Mr. Smith vs. Dr. Who",
        "ALL CAPS SENTENCE WITH NUMBERS 123 AND PUNCTUATION!!!", "CamelCaseIdentifierWithHTTPServer",
        "snake_case_identifier_with_123", "email@example.com https://example.org/path?q=1&r=2#frag",
        "\"Quoted\" 'single' `backtick` «guillemets» „German“ ‘curly’ “double”",
        "Tabs\tand\tspaces  mixed \t here", "line one\nline two\r\nline three\rline four",
        "...", "!!!???", "---", "a-b_c.d,e;f:g", "(parentheses) [brackets] {braces} <angles>",
    ]
    for p in prose:
        add("prose", p)
    contractions = ["I'm", "you're", "he's", "she'll", "we've", "they'd", "can't", "won't",
                    "IT'S", "I'M HERE", "YOU'RE", "THEY'LL", "WE'VE", "HE'D", "DON'T",
                    "rock 'n' roll", "'tis", "o'clock", "the dog's bone's", "''", "'s 't 're 've 'm 'll 'd",
                    "'S 'T 'RE 'VE 'M 'LL 'D", "x'sy", "James' car"]
    for c in contractions:
        add("contraction", c)
    code = [
        "def f(x):\n    return x * 2\n",
        "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
        "for (let i = 0; i < n; i++) { console.log(`i=${i}`); }",
        "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![1, 2, 3];\n    Ok(())\n}",
        "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC;",
        "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
        "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
        "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
        "    if x:\n        pass\n    else:\n        raise ValueError('bad')\n",
        "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
        "x <<= 2; y >>= 3; z **= 4; a //= b; c != d && e || !f",
        "$ ls -la | grep '^d' > out.txt 2>&1 && echo done",
        "```python\nprint('hello')\n```",
        "public static void Main(string[] args) => Console.WriteLine(args?.Length ?? 0);",
        "λx.λy.x y  -- lambda calculus; f ∘ g ≤ ∀x ∈ ℝ",
    ]
    for c in code:
        add("code", c)
    ws = [" ", "  ", "   ", "    ", "     ", " " * 8, " " * 16, " " * 33, "\t", "\t\t", "\t\t\t\t",
          "\n", "\n\n", "\n\n\n", "\n" * 7, "\r\n", "\r\n\r\n", " \n", "\n ", " \n \n ", "\t \t \n",
          "a  b", "a   b", "a \t b", "a\n\nb", "a\n \nb", "  leading", "trailing  ", "   both   ",
          "word\n    indented", "x" + " " * 100 + "y", "\u00a0nbsp\u00a0", "\u3000ideographic\u3000space",
          "\u2003em\u2002en\u2009thin", "\u200bzero\u200bwidth"]
    for w in ws:
        add("whitespace", w)
    nums = ["0", "7", "42", "123", "1234", "12345", "123456", "1234567", "12345678901234567890",
            "3.14159", "-0.5", "1e-9", "1,000,000", "2024-01-31", "12:34:56", "0xDEADBEEF", "0b1010",
            "v1.2.3", "100%", "$9.99", "1st 2nd 3rd 4th", "a1b22c333d4444", "٣٤٥", "１２３", "Ⅻ"]
    for n in nums:
        add("number", n)
    uni = [
        "日本語のテキストです。", "中文文本，包含标点符号。", "한국어 텍스트입니다.", "漢字かな交じり文",
        "café résumé naïve coöperate", "Ångström Øre Æsir ß ŁÓDŹ", "e\u0301 a\u0300 o\u0308 n\u0303",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349a\u0337lgo",
        "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Привет, мир! Ёжик",
        "Γειά σου Κόσμε", "Բարեւ աշխարհ", "ᚠᛇᚻ᛫ᛒᛦᚦ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "\U0001F600", "\U0001F600\U0001F601\U0001F602",
        "👍🏽", "👋🏿 👋🏻", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "❤️", "🇫🇷🇯🇵", "1️⃣",
        "emoji 🤖 in 🚀 text", "mixed 日本 English العربية", "\ufeffBOM at start", "\ufffd replacement",
        "\U0010FFFF max codepoint", "\ue000 private use",
    ]
    for u in uni:
        add("unicode", u)
    special = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start", "im_start|>", "<|im_end",
               "<|im_start|>user\nhi<|im_end|>",
               "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
               "text<|endoftext|>more text", "<|im_start|><|im_end|>", "<<|im_start|>>", " <|im_end|> ",
               "<|unknown_token|>", "<s></s><unk>", "<|endoftext|><|endoftext|>", "<|IM_START|>",
               "<repo_name>", "<filename>x.py", "<file_sep>", "<jupyter_code>"]
    for t in special:
        add("special", t)
    ctrl = ["\x00", "a\x00b", "\x01\x02\x03", "\x07bell", "\x1b[31mred\x1b[0m", "\x7f", "\x0b\x0c",
            "\u0085next line", "\u2028line sep\u2029para sep"]
    for c in ctrl:
        add("control", c)
    invalid = [b"\xff", b"\xfe\xff", b"\xc3", b"abc\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(", b"\xf0\x9f\x98",
               b"\x80\x80\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80",
               b"hello \xff world", b"\xf0\x9f\x98\x80\xf0\x9f"]
    for b in invalid:
        add("invalid_utf8", b)
    add("empty", "")
    # Long inputs exercise the pre-tokenizer's splitting over many KB.
    long_prose = (" ".join(p for p in prose[4:9]) + " ") * 40
    add("long_prose", long_prose[:4000])
    add("long_code", ("".join(code[:4]) * 10)[:3000])
    add("long_mixed", ("Hello 世界 🌍 123456 \t\n" * 120)[:2500])
    add("long_spaces", " " * 2000)
    add("long_newlines", "\n" * 1000)
    add("long_digits", "".join(str(i) for i in range(1000)))
    add("long_word", "a" * 3000)
    return s


def spm_strings():
    """Invalid UTF-8 where a SentencePiece-style vocabulary (spaces as U+2581)
    splits otherwise than the text's characters: a lead byte takes bytes of
    the U+2581 after it. (Not for byte-level BPE: llama.cpp aborts there.)"""
    return [("invalid_lead_space", b) for b in
            (b"\xda ", b"\xda \xda ", b"a\xc3 b", b"\xe2 \xf0  x", b" \xdf", b"\xf4 \xc2 \xe0 ", b"\xcc" * 3 + b"   ")]


def do_tokenizer(model_path, out_name, extra=()):
    llm = load(model_path, vocab_only=True)
    items = []
    for label, b in tokenizer_strings() + list(extra):
        ids_sp = llm.tokenize(b, add_bos=False, special=True)
        ids_pl = llm.tokenize(b, add_bos=False, special=False)
        items.append({"label": label, "hex": b.hex(), "ids_special": ids_sp, "ids_plain": ids_pl})
    obj = {"meta": meta(model_path, vocab_only=True,
                        call="llm.tokenize(bytes, add_bos=False, special=True|False)"),
           "note": "strings are stored as hex of the raw bytes (invalid UTF-8 kept exact); "
                   "ids_special = parse_special true, ids_plain = parse_special false",
           "items": items}
    write_json(out_name, obj)
    del llm
    return items


# ---------------------------------------------------------------- model helpers

def model_add_bos(llm):
    return bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))


def is_eog(llm, tok):
    return bool(llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok))


def eval_fresh(llm, tokens):
    """Evaluates tokens from an empty KV cache; returns the logits rows (copy)."""
    llm.reset()
    llm._ctx.kv_cache_clear()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


def greedy(llm, prompt_ids, n, stop_at_eog):
    """Greedy decode: prompt in one eval, then one token per eval. Returns
    (generated ids, per-step top1-top2 margins, per-step top1 logit)."""
    llm.reset()
    llm._ctx.kv_cache_clear()
    llm.eval(prompt_ids)
    out, margins = [], []
    for _ in range(n):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        top2 = np.argpartition(-row, 2)[:2]
        top2 = top2[np.argsort(-row[top2], kind="stable")]
        tok = int(np.argmax(row))
        margins.append(round(float(row[top2[0]] - row[top2[1]]), 5))
        out.append(tok)
        if stop_at_eog and is_eog(llm, tok):
            break
        llm.eval([tok])
    return out, margins


def topk_rows(rows, k=TOPK):
    res = []
    for row in rows:
        idx = np.argpartition(-row, k)[:k]
        idx = idx[np.lexsort((idx, -row[idx]))]
        res.append([[int(i), round(float(row[i]), 5)] for i in idx])
    return res


# ---------------------------------------------------------------- chat template

def render_chat(llm, user_text):
    import jinja2
    tmpl = llm.metadata["tokenizer.chat_template"]
    env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False)
    return env.from_string(tmpl).render(messages=[{"role": "user", "content": user_text}],
                                        add_generation_prompt=True,
                                        bos_token="<|im_start|>", eos_token="<|im_end|>")


def llama_builtin_chat(llm, user_text):
    """llama.cpp's own llama_chat_apply_template (its built-in chatml) for cross-checking."""
    import ctypes
    tmpl = llm.metadata["tokenizer.chat_template"].encode()
    role, content = b"user", user_text.encode()
    msgs = (llama_cpp.llama_chat_message * 1)()
    msgs[0].role, msgs[0].content = role, content
    buf = ctypes.create_string_buffer(65536)
    n = llama_cpp.llama_chat_apply_template(tmpl, msgs, 1, True, buf, len(buf))
    return buf.raw[:n].decode("utf-8") if n > 0 else None


# ---------------------------------------------------------------- logits

LONG_PROMPT = (
    "The history of computing is a story of people trying to make machines do arithmetic faster and "
    "more reliably than humans could. Early mechanical calculators, such as those designed by Pascal "
    "and Leibniz in the seventeenth century, could add and multiply using gears and wheels. In the "
    "nineteenth century Charles Babbage designed the Difference Engine and later the Analytical Engine, "
    "a general purpose machine that was never completed in his lifetime. Ada Lovelace wrote notes on "
    "the Analytical Engine that included what is often described as the first computer program. In the "
    "twentieth century, electromechanical relays and then vacuum tubes made electronic computers "
    "possible. Machines such as the Colossus in Britain and the ENIAC in the United States were built "
    "during and just after the Second World War. The invention of the transistor at Bell Labs in 1947 "
    "and of the integrated circuit a decade later allowed computers to become smaller, cheaper and far "
    "more powerful. By the 1970s the microprocessor put an entire central processing unit on a single "
    "chip, and personal computers soon followed. The spread of networking, and eventually of the "
    "Internet, connected these machines together, changing how people work, learn and communicate. "
    "Today, computers are found in nearly every device, from telephones to cars to kitchen appliances, "
    "and researchers continue to explore new ideas such as quantum computing and machine learning. "
    "Looking back over this long history, one can see a few recurring themes:"
)


def chatml(user, system=None):
    s = ""
    if system:
        s += f"<|im_start|>system\n{system}<|im_end|>\n"
    return s + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


LOGIT_PROMPTS = [
    ("chat_capital", chatml("What is the capital of France?", "You are a helpful AI assistant named SmolLM, trained by Hugging Face")),
    ("chat_poem", chatml("Write a short poem about the sea.")),
    ("chat_math", chatml("What is 17 times 23? Explain step by step.", "You are a careful math tutor.")),
    ("prose", "The quick brown fox jumps over the lazy dog. Then the fox"),
    ("prose_story", "Once upon a time, in a small village at the edge of a great forest, there lived"),
    ("code_python", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("code_c", "#include <stdio.h>\n\nint main(void) {\n    int i;\n    for (i = 0; i < 10; i++) {\n"),
    ("long", LONG_PROMPT),
    ("special_mix", "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>Hello<|im_start|>assistant\n"),
    ("list", "Here is a list of fruits:\n1. Apple\n2. Banana\n3."),
    ("single_token", "The"),
    ("unicode", "Translate to English: Bonjour, je m'appelle Marie et j'habite à Paris. 日本語も少し話せます。"),
]


def do_logits(llm, n_gen=32):
    add_bos = model_add_bos(llm)
    items = []
    for name, text in LOGIT_PROMPTS:
        prompt_ids = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
        gen, _ = greedy(llm, prompt_ids, n_gen, stop_at_eog=False)
        seq = prompt_ids + gen
        rows = eval_fresh(llm, seq)
        items.append({"name": name, "prompt": text, "n_prompt": len(prompt_ids), "tokens": seq,
                      "top20": topk_rows(rows)})
        m = rows.max(axis=1)
        print(f"logits {name}: {len(seq)} tokens, max logit range [{m.min():.2f}, {m.max():.2f}]")
    obj = {"meta": meta(MODEL, logits_all=True, add_bos=add_bos, n_gen=n_gen,
                        procedure="tokenize(special=True, add_bos=model), greedy 32 tokens by "
                                  "eval+argmax, then tokens = prompt+generated evaluated in one "
                                  "eval from an empty cache; top20 per position sorted by logit desc"),
           "items": items}
    write_json("logits.json", obj)


# ---------------------------------------------------------------- greedy

GREEDY_PLAIN = [
    "The capital of France is",
    "Once upon a time",
    "def is_prime(n):",
    "1, 2, 3, 4, 5,",
    "The three primary colors are",
    "In machine learning, a neural network is",
]
GREEDY_CHAT = [
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain what a hash table is in two sentences.",
    "What is 2+2?",
    "Give me three tips for sleeping better.",
    "Write a Python function that reverses a string.",
    "Hi!",
]


def do_greedy(llm, n_gen=64):
    add_bos = model_add_bos(llm)
    items = []
    cases = [("plain", p, p) for p in GREEDY_PLAIN] + [("chat", p, render_chat(llm, p)) for p in GREEDY_CHAT]
    for kind, user, text in cases:
        ids = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
        gen, margins = greedy(llm, ids, n_gen, stop_at_eog=True)
        decoded = llm.detokenize(gen).decode("utf-8", errors="replace")
        item = {"kind": kind, "prompt": user, "rendered": text, "prompt_ids": ids, "ids": gen,
                "text": decoded, "margins": margins, "stopped_at_eog": bool(gen and is_eog(llm, gen[-1]))}
        if kind == "chat":
            item["llama_builtin_template"] = llama_builtin_chat(llm, user)
            item["builtin_template_matches"] = item["llama_builtin_template"] == text
        items.append(item)
        print(f"greedy {kind} {user[:30]!r}: {len(gen)} tokens, min margin {min(margins):.4f}: {decoded[:60]!r}")
    obj = {"meta": meta(MODEL, logits_all=True, add_bos=add_bos, n_gen=n_gen, temp=0,
                        procedure="tokenize(rendered, special=True, add_bos=model); prompt in one eval, "
                                  "then one token per eval, argmax of raw logits; stop after an "
                                  "end-of-generation token (llama_vocab_is_eog), which is included; "
                                  "margins[i] = top1 - top2 logit at step i; chat prompts rendered "
                                  "with jinja2 from tokenizer.chat_template, add_generation_prompt=True"),
           "eog_ids": [t for t in range(llm.n_vocab()) if is_eog(llm, t)],
           "items": items}
    write_json("greedy.json", obj)


# ---------------------------------------------------------------- perplexity

PPL_TEXT_SOURCE = ("prose paragraphs (code blocks and grammar dropped) from Python 3.11's "
                   "pydoc_data.topics, i.e. the Python Language Reference, PSF License")


def record_tool_result(result):
    """Adds a real llama-perplexity run's result to an existing perplexity.json."""
    path = os.path.join(FIX, "perplexity.json")
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    obj["llama_perplexity_tool"] = result
    write_json("perplexity.json", obj)


def ppl_protocol(llm, tokens, n_ctx=512):
    """llama-perplexity's default protocol (no stride): non-overlapping chunks of
    n_ctx from an empty cache, BOS replacing the first token when the vocab adds
    one, scoring next-token NLL at positions n_ctx/2 .. n_ctx-2."""
    add_bos = model_add_bos(llm)
    bos = llm.token_bos()
    n_chunk = len(tokens) // n_ctx
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    per_chunk = []
    for i in range(n_chunk):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if add_bos:
            chunk[0] = bos
        rows = eval_fresh(llm, chunk).astype(np.float64)
        for j in range(first, n_ctx - 1):
            row = rows[j]
            mx = row.max()
            lse = mx + math.log(np.exp(row - mx).sum())
            v = lse - row[tokens[i * n_ctx + j + 1]]
            nll += v
            nll2 += v * v
        count += n_ctx - first - 1
        per_chunk.append(round(math.exp(nll / count), 4))
        print(f"[{i + 1}]{per_chunk[-1]:.4f}", end=",", flush=True)
    print()
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    stderr = math.sqrt(var / (count - 1)) * ppl
    return {"ppl": ppl, "stderr": stderr, "n_chunks": n_chunk, "count": count,
            "running_ppl": per_chunk}


def do_perplexity(llm, real_tool_result=None):
    path = os.path.join(FIX, "ppl_text.txt")
    with open(path, "rb") as f:
        text = f.read()
    # llama-perplexity tokenizes with common_tokenize(ctx, text, add_special=true,
    # parse_special=false): BOS only if the vocab wants it; specials as plain text.
    tokens = llm.tokenize(text, add_bos=model_add_bos(llm), special=False)
    res = ppl_protocol(llm, tokens, 512)
    res.update({"n_tokens": len(tokens), "n_ctx": 512, "text_file": "ppl_text.txt",
                "text_source": PPL_TEXT_SOURCE,
                "text_sha256": hashlib.sha256(text).hexdigest()})
    print(f"perplexity: {res['ppl']:.4f} +/- {res['stderr']:.5f} over {res['n_chunks']} chunks, {len(tokens)} tokens")
    obj = {"meta": meta(MODEL, logits_all=True, ppl_n_ctx=512,
                        procedure="tools/perplexity/perplexity.cpp default protocol reimplemented in "
                                  "Python on llama.cpp logits: one chunk per fresh cache")}
    obj.update(res)
    if real_tool_result:
        obj["llama_perplexity_tool"] = real_tool_result
    write_json("perplexity.json", obj)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="tokenizer,logits,greedy,perplexity")
    ap.add_argument("--tool-result", help="JSON object: a real llama-perplexity run's result to "
                    "record (with --only without perplexity: added to the existing file)")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    os.makedirs(FIX, exist_ok=True)
    if args.tool_result and "perplexity" not in parts:
        record_tool_result(json.loads(args.tool_result))
    if not os.path.exists(MODEL):
        sys.exit(f"missing model {MODEL} (run scripts/fetch-models.sh)")
    if "tokenizer" in parts:
        do_tokenizer(MODEL, "tokenizer.json")
        do_tokenizer(GPT2_VOCAB, "tokenizer_gpt2.json")
        do_tokenizer(SPM_VOCAB, "tokenizer_llama_spm.json", spm_strings())
    if parts & {"logits", "greedy", "perplexity"}:
        llm = load(MODEL, logits_all=True)
        if "logits" in parts:
            do_logits(llm)
        if "greedy" in parts:
            do_greedy(llm)
        if "perplexity" in parts:
            do_perplexity(llm, json.loads(args.tool_result) if args.tool_result else None)


if __name__ == "__main__":
    main()
