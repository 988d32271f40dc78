"""Ollama's API on the server's own port, driven by the official `ollama`
Python client (ollama.Client(host=...)) against a SmolLM2 server:

- version, list() (the loaded model, with Ollama's fields: name, model,
  modified_at, size, digest, details{format gguf, family, parameter_size,
  quantization_level}), show() (template, details, model_info,
  capabilities), ps();
- embed(): a string and strings, unit length, equal to /v1/embeddings'
  vectors bit for bit; the older embeddings() (prompt -> the raw vector);
- chat() and generate(), whole and streamed (NDJSON by default): at
  temperature 0 the streamed pieces join to the whole reply, and both equal
  /v1/chat/completions' (the same request path underneath); the last line
  has done, done_reason and the counts; options (num_predict, stop, seed,
  top_k, top_p, min_p, repeat_penalty, num_ctx accepted), keep_alive
  accepted, think false;
- format "json" and a JSON schema: the reply parses and fits;
- a raw generate; generate with no prompt (Ollama's load call);
- tools: a call in Ollama's shape (arguments an object) whole and streamed,
  the client's parser accepts it, and the history with the call and its
  result goes back through client.chat;
- errors as Ollama's {"error": "..."} with a 4xx (ollama.ResponseError);
- no 5xx over mutated bodies on every POST;
- on a random hybrid qwen35 with Qwen 3.5's template: an XML tool call in
  Ollama's shape (whole = streamed), think's reasoning as message.thinking
  (whole = streamed), /api/embed equal to `tokenloop embed` bit for bit.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_ollama.py"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import numpy as np
import ollama
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import Server  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
MSGS = [{"role": "user", "content": "Name three colours."}]
OPTS = {"temperature": 0, "num_predict": 24, "seed": 1}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def raw(url, path, body):
    """(status, [parsed lines]) of a POST."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, [json.loads(x) for x in r.read().decode().splitlines() if x.strip()]
    except urllib.error.HTTPError as e:
        return e.code, [json.loads(e.read() or b"{}")]


def model_checks(cl):
    name = os.path.basename(MODEL)
    lst = cl.list()
    m = lst.models[0] if len(lst.models) == 1 else None
    check(m is not None and m.model == name and m.size and m.size > 0 and len(m.digest) == 64 and m.modified_at
          and m.details.format == "gguf" and m.details.family == "llama" and m.details.parameter_size == "135M"
          and m.details.quantization_level == "Q4_1", f"list(): {lst}")
    with urllib.request.urlopen(str(cl._client.base_url.join("/api/tags")), timeout=30) as r:
        tags = json.loads(r.read())
    check(tags["models"][0]["name"] == name, f"/api/tags: name {tags}")
    s = cl.show(name)
    check(s.template and "im_start" in s.template and s.details.family == "llama" and s.modelinfo
          and s.modelinfo.get("general.architecture") == "llama" and s.modelinfo.get("llama.context_length") == 8192
          and "completion" in (s.capabilities or []) and "embedding" in (s.capabilities or []), f"show(): {s}")
    p = cl.ps()
    check(len(p.models) == 1 and p.models[0].model == name and p.models[0].context_length == 1024
          and p.models[0].expires_at, f"ps(): {p}")
    with urllib.request.urlopen(str(cl._client.base_url.join("/api/version")), timeout=30) as r:
        v = json.loads(r.read())
    check(isinstance(v.get("version"), str) and v["version"].count(".") == 2, f"/api/version: {v}")


def embed_checks(cl, url):
    texts = ["Hello world", "The cat sat on the mat."]
    e = cl.embed(model="m", input=texts)
    oc = openai.OpenAI(base_url=url + "/v1", api_key="x")
    ref = [np.array(d.embedding, dtype=np.float32) for d in oc.embeddings.create(model="m", input=texts,
                                                                                 encoding_format="float").data]
    got = [np.array(v, dtype=np.float32) for v in e.embeddings]
    check(len(got) == 2 and all(a.tobytes() == b.tobytes() for a, b in zip(got, ref)),
          "embed(): /v1/embeddings' vectors, bit for bit")
    check(all(abs(float(np.linalg.norm(v.astype(np.float64))) - 1) < 1e-5 for v in got), "embed(): unit length")
    check(e.prompt_eval_count and e.prompt_eval_count > 0 and e.model, f"embed(): counts {e.prompt_eval_count}")
    one = cl.embed(model="m", input=texts[0])
    check(len(one.embeddings) == 1 and np.array(one.embeddings[0], dtype=np.float32).tobytes() == ref[0].tobytes(),
          "embed(): one string")
    old = cl.embeddings(model="m", prompt=texts[0])
    v = np.array(old.embedding, dtype=np.float32)
    check(len(v) == 576 and abs(float(np.linalg.norm(v)) - 1) > 1e-3 and
          float(np.dot(v, ref[0]) / np.linalg.norm(v)) > 0.9999, "embeddings(): the raw (unnormalized) vector")


def chat_checks(cl, url):
    whole = cl.chat(model="m", messages=MSGS, options=OPTS, stream=False, keep_alive="5m")
    check(whole.done and whole.done_reason in ("stop", "length") and whole.message.role == "assistant"
          and whole.message.content and whole.eval_count > 0 and whole.prompt_eval_count > 0
          and whole.total_duration > 0, f"chat() whole: {whole}")
    parts = list(cl.chat(model="m", messages=MSGS, options=OPTS, stream=True))
    text = "".join(p.message.content or "" for p in parts)
    check(parts and parts[-1].done and not any(p.done for p in parts[:-1]) and text == whole.message.content
          and parts[-1].eval_count == whole.eval_count, f"chat() streamed = whole: {text!r} vs {whole.message.content!r}")
    oc = openai.OpenAI(base_url=url + "/v1", api_key="x")
    ref = oc.chat.completions.create(model="m", messages=MSGS, temperature=0, max_tokens=24, seed=1,
                                     top_p=0.9, extra_body={"top_k": 40})
    # Ollama's default repeat_penalty (1.1) is not chat's: ask for 1 to compare
    same = cl.chat(model="m", messages=MSGS, options={**OPTS, "repeat_penalty": 1.0, "num_ctx": 4096}, stream=False)
    check(same.message.content == ref.choices[0].message.content,
          f"chat() = /v1/chat/completions at temperature 0: {same.message.content!r} vs {ref.choices[0].message.content!r}")
    st = cl.chat(model="m", messages=MSGS, options={**OPTS, "stop": [","]}, stream=False)
    check("," not in st.message.content and st.done_reason == "stop", f"options.stop: {st.message.content!r}")
    nt = cl.chat(model="m", messages=MSGS, options={**OPTS, "top_k": 5, "top_p": 0.5, "min_p": 0.1}, think=False,
                 stream=False)
    check(nt.done and nt.message.content, "top_k, top_p, min_p, think false")
    js = cl.chat(model="m", messages=[{"role": "user", "content": "Give me a JSON object about a cat."}],
                 format="json", options={"temperature": 0, "num_predict": 64}, stream=False)
    try:
        ok = isinstance(json.loads(js.message.content), dict)
    except ValueError:
        ok = js.done_reason == "length"  # cut by num_predict: still JSON so far
    check(ok, f"format json: {js.message.content!r}")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    sj = cl.chat(model="m", messages=[{"role": "user", "content": "A person as JSON."}], format=schema,
                 options={"temperature": 0, "num_predict": 64}, stream=False)
    try:
        o = json.loads(sj.message.content)
        ok = isinstance(o.get("name"), str) and isinstance(o.get("age"), int)
    except ValueError:
        ok = False
    check(ok, f"format schema: {sj.message.content!r}")


def generate_checks(cl):
    whole = cl.generate(model="m", prompt="Why is the sky blue?", options=OPTS, stream=False)
    check(whole.done and whole.response and whole.eval_count > 0, f"generate() whole: {whole}")
    parts = list(cl.generate(model="m", prompt="Why is the sky blue?", options=OPTS, stream=True))
    text = "".join(p.response or "" for p in parts)
    check(parts and parts[-1].done and text == whole.response, f"generate() streamed = whole: {text!r}")
    sys_ = cl.generate(model="m", prompt="Hi", system="Answer in French.", options=OPTS, stream=False)
    check(sys_.done and sys_.response, "generate() with a system prompt")
    rw = cl.generate(model="m", prompt="The capital of France is", raw=True, options={**OPTS, "num_predict": 4},
                     stream=False)
    check(rw.done and rw.response and rw.eval_count == 4 and rw.prompt_eval_count <= 6,
          f"generate() raw: {rw.response!r} {rw.prompt_eval_count}")
    load = cl.generate(model="m", prompt="", stream=False)
    check(load.done and load.done_reason == "load", f"generate() with no prompt: {load}")


def tool_checks(cl, url):
    body = {"model": "m", "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [WEATHER], "tool_choice": "required", "options": {"temperature": 0, "num_predict": 64},
            "stream": False}
    st, lines = raw(url, "/api/chat", body)
    msg = lines[0].get("message", {}) if lines else {}
    calls = msg.get("tool_calls") or []
    check(st == 200 and calls and calls[0]["function"]["name"] == "get_weather"
          and isinstance(calls[0]["function"]["arguments"], dict) and "city" in calls[0]["function"]["arguments"],
          f"a tool call in Ollama's shape: {st} {lines}")
    parsed = ollama.ChatResponse.model_validate(lines[0]) if lines else None
    check(parsed is not None and parsed.message.tool_calls and parsed.message.tool_calls[0].function.name == "get_weather",
          "the client's model accepts it")
    st2, slines = raw(url, "/api/chat", {**body, "stream": True})
    scalls = [c for ln in slines for c in (ln.get("message", {}).get("tool_calls") or [])]
    check(st2 == 200 and slines[-1].get("done") and scalls and scalls[0]["function"] == calls[0]["function"]
          if calls else False, f"the streamed call, whole in one line: {slines[-2:]}")
    if calls:
        hist = [body["messages"][0], {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "content": "Sunny, 21 C", "tool_name": "get_weather"}]
        back = cl.chat(model="m", messages=hist, tools=[WEATHER], options={"temperature": 0, "num_predict": 16},
                       stream=False)
        check(back.done, "the call and its result back through client.chat")


def error_checks(cl, url):
    for path, body, what in [("/api/chat", {"model": "m"}, "no messages"),
                             ("/api/chat", {"model": "m", "messages": MSGS, "format": 3}, "a bad format"),
                             ("/api/chat", {"model": "m", "messages": MSGS, "think": "maybe"}, "a bad think"),
                             ("/api/generate", {"model": "m", "prompt": 5}, "a prompt not a string"),
                             ("/api/chat", {"model": "m", "messages": MSGS, "options": {"temperature": "hot"}},
                              "a bad option"),
                             ("/api/embed", {"model": "m", "input": []}, "empty embed input"),
                             ("/api/embed", {"model": "m", "input": [1, 2]}, "token ids to /api/embed"),
                             ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "x " * 3000}],
                                            "stream": False}, "longer than the context")]:
        st, lines = raw(url, path, body)
        check(400 <= st < 500 and lines and isinstance(lines[0].get("error"), str) and lines[0]["error"],
              f"{what}: {st} {lines[:1]}")
    try:
        cl.chat(model="m", messages=[])
        check(False, "chat([]): no error")
    except ollama.ResponseError as e:
        check(400 <= e.status_code < 500, f"chat([]): {e.status_code}")


ODD = [None, 0, -1, 1.5, 1e300, "", "x" * 300, [], {}, True, [[[[[]]]]], {"type": "text"}, "\u0000",
       -(2 ** 63), 2 ** 64, "é" * 40, "€" * 30, "😀" * 20, "json", {"type": "object"}]


def mutate(body, rnd):
    """body with 1-3 random changes (a key dropped, a value made odd, a list
    element repeated), sometimes cut short: bytes."""
    b = json.loads(json.dumps(body))
    for _ in range(rnd.randint(1, 3)):
        paths, stack = [], [((), b)]
        while stack:
            p, v = stack.pop()
            paths.append(p)
            if isinstance(v, dict):
                stack += [(p + (k,), x) for k, x in v.items()]
            elif isinstance(v, list):
                stack += [(p + (i,), x) for i, x in enumerate(v)]
        if len(paths) < 2:
            continue
        p = rnd.choice(paths[1:])
        parent = b
        for k in p[:-1]:
            parent = parent[k]
        op = rnd.random()
        if op < 0.3 and isinstance(parent, dict):
            del parent[p[-1]]
        elif op < 0.4 and isinstance(parent, list):
            parent.append(json.loads(json.dumps(parent[p[-1]])))
        else:
            parent[p[-1]] = json.loads(json.dumps(rnd.choice(ODD)))
    data = json.dumps(b).encode()
    return data[:rnd.randrange(len(data))] if rnd.random() < 0.08 else data


def fuzz(url, n=120):
    """No 5xx, and the server still up, over mutated bodies on every POST."""
    rnd = random.Random(32)
    chat = {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                       {"role": "assistant", "content": "", "thinking": "hm", "tool_calls": [
                                           {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                                       {"role": "tool", "content": "Sunny", "tool_name": "get_weather"}],
            "tools": [WEATHER], "format": "json", "think": False, "keep_alive": "5m",
            "options": {"num_predict": 4, "temperature": 0, "stop": ["x"], "top_k": 5, "repeat_penalty": 1.2}}
    bases = {"/api/chat": [chat, {**chat, "stream": False}],
             "/api/generate": [{"model": "m", "prompt": "Hi", "system": "Be brief.", "options": {"num_predict": 4}},
                               {"model": "m", "prompt": "Hi", "raw": True, "stream": False,
                                "format": {"type": "object"}, "options": {"num_predict": 4, "seed": 3}}],
             "/api/embed": [{"model": "m", "input": ["a", "b"], "truncate": True, "options": {}}],
             "/api/embeddings": [{"model": "m", "prompt": "a"}],
             "/api/show": [{"model": "m", "verbose": True}]}
    for path, bs in bases.items():
        n5 = 0
        for i in range(n if path in ("/api/chat", "/api/generate") else n // 3):
            data = mutate(bs[i % len(bs)], rnd)
            req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"},
                                         method="POST")
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    r.read()
                    code = r.status
            except urllib.error.HTTPError as e:
                code = e.code
                e.read()
            if code >= 500:
                n5 += 1
                if n5 <= 3:
                    print(f"  5xx on {path}: {data[:300]!r} -> {code}")
        check(n5 == 0, f"no 5xx over mutated bodies on {path}: {n5}")
    with urllib.request.urlopen(url + "/api/version", timeout=30) as r:
        check(r.status == 200, "the server answers after the mutated bodies")


def qwen35_checks():
    """A random hybrid qwen35 with Qwen 3.5's template (as test_server_tool_formats
    makes it): tools in its XML format come back in Ollama's shape, reasoning
    as thinking (whole = streamed), and /api/embed gives `tokenloop embed`'s bits."""
    vocab = os.path.join(os.environ.get("TL_VOCAB_DIR", os.path.join(ROOT, "..", "shared", "vocab")),
                         "ggml-vocab-gpt-2.gguf")
    if not os.path.exists(vocab):
        print(f"skip qwen35: {vocab} is missing")
        return
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "qwen35.gguf")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), "qwen35", path, "--vocab", vocab,
                        "--seed", "11", "--template", os.path.join(ROOT, "tests", "templates", "qwen3.5.jinja"),
                        "--add-control", "<|im_start|>", "--add-control", "<|im_end|>", "--add-token", "<think>",
                        "--add-token", "</think>", "--eos", "<|im_end|>"], capture_output=True, text=True, timeout=300)
    if not check(p.returncode == 0, f"mkmodel qwen35: {p.stderr[-300:]}"):
        return
    srv = Server(path, ["-c", "512", "-np", "2"])
    try:
        if not check(srv.wait_ready(), "qwen35 server ready"):
            return
        cl = ollama.Client(host=srv.url)
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                   "parameters": {"type": "object", "properties": {
                                                       "city": {"type": "string", "maxLength": 12}},
                                                       "required": ["city"], "additionalProperties": False}}}]
        body = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
                "tool_choice": "required", "think": False, "options": {"temperature": 0, "num_predict": 96},
                "stream": False}
        st, lines = raw(srv.url, "/api/chat", body)
        calls = (lines[0].get("message", {}).get("tool_calls") or []) if lines else []
        check(st == 200 and calls and calls[0]["function"]["name"] == "get_weather"
              and isinstance(calls[0]["function"]["arguments"], dict), f"qwen35: an XML call as Ollama's: {lines}")
        st, slines = raw(srv.url, "/api/chat", {**body, "stream": True})
        scalls = [c for ln in slines for c in (ln.get("message", {}).get("tool_calls") or [])]
        check(st == 200 and scalls == calls, f"qwen35: streamed call = whole: {scalls} vs {calls}")
        w = cl.chat(model="m", messages=[{"role": "user", "content": "Hi"}], think=True,
                    options={"temperature": 0, "num_predict": 40}, stream=False)
        parts = list(cl.chat(model="m", messages=[{"role": "user", "content": "Hi"}], think=True,
                             options={"temperature": 0, "num_predict": 40}, stream=True))
        th = "".join(x.message.thinking or "" for x in parts)
        ct = "".join(x.message.content or "" for x in parts)
        check(w.message.thinking and th == w.message.thinking and ct == (w.message.content or ""),
              f"qwen35: thinking, streamed = whole: {th[:60]!r} vs {(w.message.thinking or '')[:60]!r}")
        texts = ["Hello world", "A longer text about the weather in Paris."]
        e = cl.embed(model="m", input=texts)
        cmd = [os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop")), "embed", "-m", path]
        for t in texts:
            cmd += ["-p", t]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        ref = [np.array(d["embedding"], dtype=np.float32) for d in json.loads(out.stdout)["data"]] if out.returncode == 0 else []
        check(len(ref) == 2 and all(np.array(a, dtype=np.float32).tobytes() == b.tobytes()
                                    for a, b in zip(e.embeddings, ref)), "qwen35 (hybrid): /api/embed = tokenloop embed")
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} is missing (make models)"):
        tlcheck.finish()
    srv = Server(MODEL, ["-c", "1024", "-np", "2"])
    try:
        if check(srv.wait_ready(), "server ready"):
            cl = ollama.Client(host=srv.url)
            model_checks(cl)
            embed_checks(cl, srv.url)
            chat_checks(cl, srv.url)
            generate_checks(cl)
            tool_checks(cl, srv.url)
            error_checks(cl, srv.url)
            fuzz(srv.url)
    finally:
        srv.stop()
    qwen35_checks()
    tlcheck.finish()


if __name__ == "__main__":
    main()
