"""The Python package (python/): built into a wheel by pip from this checkout
(its library linked from the suite's build folder, TL_BIN's), installed into a
temporary folder and imported from there in a child Python, which checks it
against the CLI on SmolLM2: greedy and seeded text identical to `tokenloop
run`, streaming pieces that join to the same text, chat() identical to `run
--chat`, JSON Schemas and grammars obeyed, tokens round trip, OpenAI-shaped
dicts and chunks, C errors raised as exceptions, the GIL free while it
computes, n_threads honoured, and every ctypes structure laid out as the
header's.

Under TL_ASAN=1 (`make asan`) the library is linked from the sanitized objects
and the child runs with the sanitizer's runtime preloaded."""
import ctypes
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402

TL_BIN = os.path.abspath(os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop")))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
ASAN = os.environ.get("TL_ASAN") == "1"
# The Makefile's asan target's SAN: the shared object links its runtime the same way.
ASAN_SAN = "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
N = 12 if ASAN else 40  # tokens per reply (the sanitized library is slow)


# ---------------------------------------------------------------- the driver

def can_build_offline():
    """setuptools and a bdist_wheel here: pip needs no isolated build
    environment (nothing fetched from PyPI)."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    if importlib.util.find_spec("wheel") is not None:
        return True
    return importlib.util.find_spec("setuptools.command.bdist_wheel") is not None


def build_and_install(tmp):
    """pip wheel ./python, then pip install --target; the site folder or None."""
    env = dict(os.environ)
    # the suite's build folder: its objects are built, so this only links
    env["TOKENLOOP_BUILD_DIR"] = os.path.abspath(os.environ.get("TL_PYPKG_BUILD") or os.path.dirname(TL_BIN))
    if ASAN:
        env["SAN"] = ASAN_SAN
    wheels = os.path.join(tmp, "wheels")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, os.path.join(ROOT, "python")]
    if can_build_offline():
        cmd.insert(4, "--no-build-isolation")
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if not check(r.returncode == 0, f"pip wheel ./python: {' '.join(cmd)}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"):
        return None
    whl = glob.glob(os.path.join(wheels, "tokenloop-*.whl"))
    if not check(len(whl) == 1 and re.search(r"-py3-none-linux_\w+\.whl$", whl[0]), f"one platform wheel: {whl}"):
        return None
    print(f"built {os.path.basename(whl[0])} ({os.path.getsize(whl[0]) / 1e6:.2f} MB) in {time.time() - t0:.1f} s")
    site = os.path.join(tmp, "site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", site,
                        whl[0]], capture_output=True, text=True)
    if not check(r.returncode == 0, f"pip install --target: {r.stdout[-2000:]}{r.stderr[-2000:]}"):
        return None
    check(os.path.isfile(os.path.join(site, "tokenloop", "libtokenloop.so")), "the wheel carries libtokenloop.so")
    return site


def asan_env(env):
    cc = os.environ.get("CC", "cc")
    rt = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    env["LD_PRELOAD"] = rt
    # Python's own allocations are not ours to judge; the library's errors abort the child
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0"
    return env


def driver():
    if not check(os.path.isfile(MODEL), f"{MODEL} missing: run 'make models'"):
        return
    if not check(os.access(TL_BIN, os.X_OK), f"{TL_BIN} missing: build it first (or set TL_BIN)"):
        return
    tmp = tempfile.mkdtemp(prefix="tl-pypkg-")
    try:
        site = build_and_install(tmp)
        if not site:
            return
        env = dict(os.environ, PYTHONPATH=site, TL_PYPKG_SITE=site, TL_BIN=TL_BIN)
        env.pop("TOKENLOOP_LIB", None)
        if ASAN:
            env = asan_env(env)
        # the child starts outside the repository: nothing imports python/ by accident
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--checks"], env=env, cwd=tmp,
                           capture_output=True, text=True, timeout=600)
        out = r.stdout + r.stderr
        print(out[-6000:])
        m = re.findall(r"^(\d+) passed, (\d+) failed$", r.stdout, re.M)
        if check(bool(m), f"the checks printed no summary (rc {r.returncode})"):
            p, f = map(int, m[-1])
            tlcheck.passed += p
            tlcheck.failed += f
            check(r.returncode == (1 if f else 0), f"the checks' exit status {r.returncode}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- the checks (child)

def cli(*args):
    r = subprocess.run([TL_BIN, *args], capture_output=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"tokenloop {' '.join(args)}: {r.stderr.decode(errors='replace')[-500:]}")
    out = r.stdout.decode("utf-8", "replace")
    return out[:-1] if out.endswith("\n") else out  # run ends the text with a newline


def check_layouts(tl):
    """Each structure's size and field offsets as the C compiler lays them out."""
    from tokenloop import _lib
    structs = {"tl_error": _lib.Error, "tl_ctx_params": _lib.CtxParams, "tl_logit_bias": _lib.LogitBias,
               "tl_sampler_params": _lib.SamplerParams, "tl_token_prob": _lib.TokenProb,
               "tl_gen_event": _lib.GenEvent, "tl_gen_params": _lib.GenParams, "tl_gen_stats": _lib.GenStats,
               "tl_batch": _lib.Batch, "tl_thread_stats": _lib.ThreadStats}
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "tokenloop.h"', "int main(void) {"]
    for cname, cls in structs.items():
        lines.append(f'    printf("{cname} size %zu\\n", sizeof({cname}));')
        for f, _ in cls._fields_:
            if f != "_spare":
                lines.append(f'    printf("{cname} {f} %zu\\n", offsetof({cname}, {f}));')
    lines += ["    return 0;", "}"]
    d = tempfile.mkdtemp()
    try:
        src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        r = subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Wextra", "-Werror", "-I",
                            os.path.join(ROOT, "include"), src, "-o", exe], capture_output=True, text=True)
        if not check(r.returncode == 0, f"compiling the layout program: {r.stderr[-1000:]}"):
            return
        got = subprocess.run([exe], capture_output=True, text=True).stdout.split("\n")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    bad = []
    for line in filter(None, got):
        cname, field, val = line.split()
        cls, val = structs[cname], int(val)
        if field == "size":
            if "_spare" in dict(cls._fields_):  # C's size: the fields before the spare bytes, padded
                end = cls._spare.offset
                if not 0 <= val - end < 8:
                    bad.append(f"{cname} size: C {val}, ctypes fields end at {end}")
            elif val != ctypes.sizeof(cls):
                bad.append(f"{cname} size: C {val}, ctypes {ctypes.sizeof(cls)}")
        elif getattr(cls, field).offset != val:
            bad.append(f"{cname}.{field}: C offset {val}, ctypes {getattr(cls, field).offset}")
    check(not bad, "ctypes layouts differ from include/tokenloop.h: " + "; ".join(bad))
    check(len(got) > 60, f"layout program printed {len(got)} lines")


def check_splitter():
    """Replies into content, reasoning and calls: gpt-oss's channels through
    the library's harmony parser, Hermes calls held back when streamed."""
    from tokenloop import _reply
    from tokenloop.model import Event

    def split(harmony, pieces):
        s = _reply.Splitter(harmony, True)
        streamed, calls = [], []
        for p in pieces:
            s.push(Event(p, 1, 0))
            t = s.take()
            streamed += t.content
            calls += t.calls
        s.end()
        last = s.take()
        last.calls = calls + last.calls
        return streamed + last.content, last

    s = _reply.Splitter(True, True)
    for piece in ["<|channel|>analysis<|message|>Let me", " think<|end|><|start|>assistant<|channel|>final",
                  "<|message|>Hel", "lo"]:
        s.push(Event(piece, 1, 0))
    s.end()
    p = s.take()
    check("".join(p.reasoning) == "Let me think" and "".join(p.content) == "Hello" and not p.calls,
          f"harmony: {p.reasoning} {p.content} {p.calls}")
    content, p = split(True, ['<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":',
                              '"Paris"}<|call|>'])
    check(p.calls == [("get_weather", '{"city":"Paris"}')] and not content, f"harmony call: {p.calls} {content}")
    content, p = split(False, ["Sure", ", calling <tool", '_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'])
    check(content == ["Sure", ", calling "] and p.calls == [("f", {"a": 1})], f"hermes call: {content} {p.calls}")
    content, p = split(False, ["a <to", "day>"])
    check("".join(content) == "a <today>" and not p.calls, f"held text that is no call: {content}")
    content, p = split(False, ["x <tool_call>not json"])
    check("".join(content) == "x <tool_call>not json" and not p.calls, f"a broken call stays text: {content}")


def checks():
    import tokenloop
    site = os.environ["TL_PYPKG_SITE"]
    check(os.path.realpath(tokenloop.__file__).startswith(os.path.realpath(site)),
          f"imported from the install: {tokenloop.__file__}")
    check(tokenloop.lib_path.startswith(site), f"the bundled library: {tokenloop.lib_path}")
    with open(os.path.join(ROOT, "include", "tokenloop.h")) as f:
        ver = re.search(r'#define TL_VERSION "([^"]+)"', f.read()).group(1)
    check(tokenloop.__version__ == ver, f"version {tokenloop.__version__} == TL_VERSION {ver}")
    check_layouts(tokenloop)
    check_splitter()

    t0 = time.time()
    m = tokenloop.Model(MODEL, n_threads=2)
    print(f"loaded in {time.time() - t0:.2f} s: n_ctx {m.n_ctx}, {m.backend}, {m.numerics}")
    check(m.n_threads == 2, f"n_threads 2 -> {m.n_threads}")

    # greedy: exactly the CLI's text, and streamed pieces that join to it
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    for p in prompts:
        want = cli("run", "-m", MODEL, "-p", p, "-n", str(N), "--temp", "0", "-t", "2")
        got = m.generate(p, max_tokens=N, temperature=0)
        check(got == want, f"generate({p!r}) == run:\n  {got!r}\n  {want!r}")
        pieces = list(m.generate(p, max_tokens=N, temperature=0, stream=True))
        check("".join(pieces) == want and len(pieces) > 3, f"stream({p!r}): {pieces!r}")
    # a prompt that shares a cached prefix with the last one, then a shorter one
    for p in ["Once upon a time there was", "Once"]:
        want = cli("run", "-m", MODEL, "-p", p, "-n", str(N), "--temp", "0", "-t", "2")
        check(m.generate(p, max_tokens=N, temperature=0) == want, f"after a cached prefix: {p!r}")

    # seeded sampling with the CLI's default chain, and stop strings
    p = "My favourite food is"
    want = cli("run", "-m", MODEL, "-p", p, "-n", str(N), "--seed", "7", "-t", "2")
    check(m.generate(p, max_tokens=N, seed=7) == want, "generate(seed=7) == run --seed 7")
    check("".join(m.generate(p, max_tokens=N, seed=7, stream=True)) == want, "streamed, seed 7")
    want = cli("run", "-m", MODEL, "-p", prompts[0], "-n", str(N), "--temp", "0", "--stop", "\n\n", "-t", "2")
    got = m.generate(prompts[0], max_tokens=N, temperature=0, stop=["\n\n"])
    check(got == want and "\n\n" not in got, f"stop: {got!r} vs {want!r}")

    # chat: the template, as run --chat
    msg = "Write a haiku about the sea."
    want = cli("run", "-m", MODEL, "--chat", "-p", msg, "-n", str(N), "--temp", "0", "-t", "2")
    msgs = [{"role": "user", "content": msg}]
    got = m.chat(msgs, max_tokens=N, temperature=0)
    check(got == want, f"chat == run --chat:\n  {got!r}\n  {want!r}")
    check("".join(m.chat(msgs, max_tokens=N, temperature=0, stream=True)) == want, "chat streamed")
    sysmsg = "You are a pirate."
    want = cli("run", "-m", MODEL, "--chat", "--system", sysmsg, "-p", "Hi", "-n", str(N), "--temp", "0", "-t", "2")
    got = m.chat([{"role": "system", "content": sysmsg}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                 max_tokens=N, temperature=0)
    check(got == want, f"chat with a system message and content parts: {got!r} vs {want!r}")

    # OpenAI shapes
    r = m.create_chat_completion(msgs, max_tokens=N, temperature=0)
    c0 = r["choices"][0]
    n_rendered = len(m.tokenize(m.render_chat(msgs), special=True))
    check(r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-") and isinstance(r["created"], int)
          and c0["index"] == 0 and c0["message"]["role"] == "assistant"
          and c0["message"]["content"] == want_chat(m, msgs)
          and c0["finish_reason"] in ("stop", "length") and r["usage"]["prompt_tokens"] == n_rendered
          and r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
          and 0 < r["usage"]["completion_tokens"] <= N, f"create_chat_completion: {json.dumps(r)[:600]}")
    chunks = list(m.create_chat_completion(msgs, max_tokens=N, temperature=0, stream=True))
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks)
    check(chunks[0]["choices"][0]["delta"].get("role") == "assistant"
          and all(ch["object"] == "chat.completion.chunk" and ch["id"] == chunks[0]["id"] for ch in chunks)
          and text == c0["message"]["content"] and chunks[-1]["choices"][0]["finish_reason"] == c0["finish_reason"]
          and all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1]), f"chat chunks: {chunks[:3]}")
    r = m.create_completion(prompts[0], max_tokens=8, temperature=0, logprobs=3)
    c0 = r["choices"][0]
    lp = c0["logprobs"]
    check(r["object"] == "text_completion" and c0["text"] == m.generate(prompts[0], max_tokens=8, temperature=0)
          and r["usage"]["completion_tokens"] == 8 and c0["finish_reason"] == "length"
          and len(lp["tokens"]) == 8 and all(len(t) == 3 for t in lp["top_logprobs"])
          and all(x <= 0 for x in lp["token_logprobs"]) and "".join(lp["tokens"]) == c0["text"],
          f"create_completion: {json.dumps(r)[:600]}")
    chunks = list(m(prompts[0], max_tokens=8, temperature=0, stream=True))
    check("".join(ch["choices"][0]["text"] for ch in chunks) == c0["text"]
          and chunks[-1]["choices"][0]["finish_reason"] == "length", "completion chunks")

    # JSON Schemas, response formats and grammars
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    r = m.create_chat_completion([{"role": "user", "content": "Describe a cat as JSON."}], max_tokens=64,
                                 temperature=0, response_format={"type": "json_schema",
                                                                 "json_schema": {"name": "cat", "schema": schema}})
    try:
        obj = json.loads(r["choices"][0]["message"]["content"])
        ok = isinstance(obj.get("name"), str) and isinstance(obj.get("age"), int)
    except ValueError:
        ok = False
    check(ok, f"json_schema response: {r['choices'][0]['message']['content']!r}")
    out = m.generate("A JSON list of three colours:", json_schema={"type": "array", "items": {"type": "string"},
                                                                   "minItems": 3, "maxItems": 3},
                     max_tokens=48, temperature=0.7, seed=1)
    try:
        ok = len(json.loads(out)) == 3
    except ValueError:
        ok = False
    check(ok, f"generate(json_schema=array of 3): {out!r}")
    out = m.chat([{"role": "user", "content": "Is the sky blue?"}], grammar='root ::= "yes" | "no"', max_tokens=8)
    check(out in ("yes", "no"), f"grammar yes|no: {out!r}")
    gbnf = tokenloop.json_schema_to_gbnf(schema)
    check("root" in gbnf and "age" in gbnf, f"json_schema_to_gbnf: {gbnf[:200]!r}")

    # tokens
    for s in ["Hello world", "  spaces\tand\nnewlines ", "Grüße, 世界! 🌍", "<|im_start|>user"]:
        ids = m.tokenize(s)
        check(m.detokenize(ids) == s, f"round trip {s!r}: {ids} -> {m.detokenize(ids)!r}")
        want = json.loads(cli("tokenize", "-m", MODEL, "-p", s, "--ids", "--no-special"))
        check(ids == want, f"tokenize({s!r}) == tokenize --no-special: {ids} vs {want}")
    ids = m.tokenize("<|im_start|>user", special=True)
    check(len(ids) == 2 and m.detokenize(ids, special=True) == "<|im_start|>user"
          and m.detokenize(ids) == "user", f"special tokens: {ids}")
    check(m.tokenize("Hi", add_bos=True)[0] == m.token_bos, "add_bos")

    # embeddings: tokenloop embed's floats, bit for bit (it prints them with %.9g); generation after them
    texts = ["Hello world", "The capital of France is Paris."]
    for pool in (None, "last"):
        args = ["--pooling", pool] if pool else []
        want = [d["embedding"] for d in json.loads(cli("embed", "-m", MODEL, "-p", texts[0], "-p", texts[1],
                                                       "-t", "2", *args))["data"]]
        got = m.embed(texts, pooling=pool)
        check(got == [[float(ctypes.c_float(x).value) for x in v] for v in want] and len(got[0]) == m.n_embd,
              f"embed(pooling={pool}) == tokenloop embed: {got[0][:4]} vs {want[0][:4]}")
    # more texts than one tl_ctx_embed_batch call takes, of mixed lengths: each vector is its own alone
    many = [("word " * (1 + (7 * i) % 23)).strip() + f" {i}" for i in range(tokenloop.model.EMBED_GROUP + 5)]
    for pool in (None, "none"):
        together = m.embed(many, pooling=pool)
        check(len(together) == len(many) and all(together[i] == m.embed(t, pooling=pool) for i, t in enumerate(many)),
              f"embed of {len(many)} texts at once (pooling {pool}) == each alone, bitwise")
    per_tok = m.embed("Hello world", pooling="none")
    check(len(per_tok) == len(m.tokenize("Hello world", special=True)) and len(per_tok[0]) == m.n_embd,
          "pooling none: a vector per token")
    r = m.create_embedding(texts)
    check(r["object"] == "list" and [d["index"] for d in r["data"]] == [0, 1]
          and r["data"][0]["embedding"] == m.embed(texts[0]) and r["usage"]["prompt_tokens"] > 4,
          f"create_embedding: {json.dumps(r)[:300]}")
    check(m.generate(prompts[0], max_tokens=N, temperature=0) == want_gen(m, prompts[0]), "generate after embed")

    # errors: exceptions with the library's message; the model still works after them
    errs = [
        ("a missing file", lambda: tokenloop.Model("/nonexistent/model.gguf"), tokenloop.FileError, "nonexistent"),
        ("not a GGUF file", lambda: tokenloop.Model(os.path.join(ROOT, "README.md")), tokenloop.TokenloopError, ""),
        ("a bad grammar", lambda: m.generate("x", grammar="root ::= (", max_tokens=4), tokenloop.ArgumentError,
         "grammar"),
        ("a bad JSON Schema", lambda: m.generate("x", json_schema="{not json", max_tokens=4),
         tokenloop.TokenloopError, "json_schema"),
        ("an unknown schema keyword", lambda: m.generate("x", json_schema={"type": "string", "format": "nope"},
                                                         max_tokens=4), tokenloop.TokenloopError, ""),
        ("an over-long prompt", lambda: small.generate("word " * 300, max_tokens=4), tokenloop.ContextFullError,
         "context"),
        ("an over-long prompt, streamed", lambda: list(small.generate("word " * 300, max_tokens=4, stream=True)),
         tokenloop.ContextFullError, "context"),
        ("a bad numerics mode", lambda: tokenloop.Model(MODEL, numerics="slow"), tokenloop.ArgumentError, "slow"),
        ("a token out of range", lambda: m.detokenize([10 ** 7]), tokenloop.ArgumentError, "range"),
        ("an empty prompt", lambda: m.generate([], max_tokens=4), ValueError, "empty"),
        ("a template's exception", lambda: small.chat([{"role": "user", "content": "Hi"}], max_tokens=4),
         tokenloop.TokenloopError, "no chat here"),
        ("a message that is not a dict", lambda: m.chat(["Hi"], max_tokens=4), ValueError, "role"),
        ("an unsupported option", lambda: m.create_completion("x", mirostat_mode=2), ValueError, "mirostat"),
        ("an unknown pooling", lambda: m.embed("x", pooling="max"), tokenloop.ArgumentError, "max"),
        ("an over-long text to embed", lambda: small.embed("word " * 300), tokenloop.ContextFullError, "context"),
    ]
    small = tokenloop.Model(MODEL, n_ctx=128, n_threads=1, chat_template="{{ raise_exception('no chat here') }}")
    check(small.n_ctx == 128 and small.n_threads == 1, f"n_ctx 128, 1 thread: {small.n_ctx}, {small.n_threads}")
    for what, fn, exc, needle in errs:
        try:
            fn()
            check(False, f"{what}: no exception")
        except exc as e:
            check(needle.lower() in str(e).lower() and str(e), f"{what}: message {e!r}")
        except Exception as e:
            check(False, f"{what}: {type(e).__name__} {e!r}, wanted {exc.__name__}")
    check(issubclass(tokenloop.FileError, OSError), "FileError is an OSError")
    want = cli("run", "-m", MODEL, "-p", prompts[0], "-n", "16", "--temp", "0", "-t", "2")
    check(small.generate(prompts[0], max_tokens=16, temperature=0) == want, "the small context works after errors")
    small.generate("word " * 20, temperature=0, ignore_eos=True)
    st = small.stats()
    check(st["stop"] == "context" and st["n_prompt"] + st["n_gen"] == 128,
          f"no max_tokens runs to the full context: {st}")
    r = small.create_completion("word " * 20, max_tokens=200, temperature=0, logit_bias={small.token_eos: -1e30})
    check(r["choices"][0]["finish_reason"] == "length" and r["usage"]["total_tokens"] == 128,
          f"create_completion to the full context: {r['usage']}")
    small.close()

    # one generation at a time; an unfinished stream is the caller's to finish
    it = m.generate(prompts[0], max_tokens=N, temperature=0, stream=True)
    next(it)
    try:
        m.generate("x", max_tokens=2)
        check(False, "a second call during an open stream: no error")
    except RuntimeError:
        check(True, "")
    it.close()
    check(m.generate(prompts[0], max_tokens=N, temperature=0) == want_gen(m, prompts[0]), "after close()")

    # the GIL is free while the library computes; two threads share the model in turn
    results = {}
    one = tokenloop.Model(MODEL, n_threads=1)  # a core left for this thread on a 2-core machine

    def work(i):
        results[i] = (one if i == 0 else m).generate(prompts[i % 3], max_tokens=N, temperature=0, ignore_eos=True)

    want_gen(m, prompts[0], ignore_eos=True)
    spins, t0 = 0, time.time()
    while time.time() - t0 < 0.2:
        spins += 1
    base = spins / (time.time() - t0)
    th = threading.Thread(target=work, args=(0,))
    spins = 0
    th.start()
    t0 = time.time()
    while th.is_alive():
        time.time()
        spins += 1
    rate = spins / (time.time() - t0)
    # held through the forward calls, the GIL would leave this loop ~0 turns
    check(spins > 100 and rate > 0.02 * base and results.get(0) == want_gen(m, prompts[0], ignore_eos=True),
          f"the main thread ran during generate: {rate:.0f} loops/s, {base:.0f} alone")
    print(f"main thread during generate: {rate / base:.2f} of its speed alone")
    one.close()
    ths = [threading.Thread(target=work, args=(i,)) for i in range(1, 4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    check(all(results[i] == want_gen(m, prompts[i % 3], ignore_eos=True) for i in range(1, 4)),
          "three threads on one model")

    # llama-cpp-python's constructor
    llm = tokenloop.Llama(model_path=MODEL, n_ctx=512, n_threads=2, n_gpu_layers=-1, verbose=False, seed=3)
    r = llm.create_chat_completion(messages=msgs, max_tokens=N, temperature=0)
    check(r["choices"][0]["message"]["content"] == want_chat(m, msgs), "Llama(model_path=...)")
    llm.close()

    # exact numerics: the same as the CLI's
    ex = tokenloop.Model(MODEL, n_threads=2, numerics="exact", spec="off")
    want = cli("run", "-m", MODEL, "-p", prompts[1], "-n", str(N), "--temp", "0", "-t", "2", "--numerics", "exact")
    check(ex.numerics == "exact" and ex.generate(prompts[1], max_tokens=N, temperature=0) == want,
          "numerics exact == run --numerics exact")
    ex.close()
    m.close()
    try:
        m.generate("x")
        check(False, "a closed model: no error")
    except tokenloop.TokenloopError:
        check(True, "")


_memo = {}


def want_gen(m, p, ignore_eos=False):
    key = ("gen", p, ignore_eos)
    if key not in _memo:
        args = ["--ignore-eos"] if ignore_eos else []
        _memo[key] = cli("run", "-m", MODEL, "-p", p, "-n", str(N), "--temp", "0", "-t", "2", *args)
    return _memo[key]


def want_chat(m, msgs):
    key = ("chat", json.dumps(msgs))
    if key not in _memo:
        _memo[key] = cli("run", "-m", MODEL, "--chat", "-p", msgs[-1]["content"], "-n", str(N), "--temp", "0",
                         "-t", "2")
    return _memo[key]


if __name__ == "__main__":
    t_start = time.time()
    if "--checks" in sys.argv:
        try:
            checks()
        except Exception as e:
            import traceback
            traceback.print_exc()
            check(False, f"the checks raised {type(e).__name__}: {e}")
    else:
        driver()
    print(f"({time.time() - t_start:.1f} s)")
    tlcheck.finish()
