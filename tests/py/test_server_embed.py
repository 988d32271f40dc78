"""POST /v1/embeddings, driven by the official openai client
(client.embeddings.create), against `tokenloop embed` on the same texts:

- SmolLM2 (no pooling_type: mean) and a random qwen3 served with
  --pooling last (scripts/mkmodel.py, as test_embed makes it): each vector
  equals the CLI's bitwise (float and base64, which decodes to the same
  float32s), normalized by default, raw with normalize false or
  llama-server's embd_normalize -1; a request's pooling overrides the
  server's;
- inputs as a string, strings, token ids and arrays of token ids (the ids of
  a text give its vector); usage counts the tokens;
- an input longer than a batch (the server's 512 tokens, with -c 1024) is
  chunked: the CLI's vector, never a 500;
- 12 concurrent requests of 1-4 inputs of mixed lengths (one chunked),
  while a chat completion decodes, give the vectors each gives alone,
  bitwise: the scheduler runs inputs side by side as their own sequences in
  one forward call (tl_ctx_embed_batch), and no vector depends on its
  neighbours;
- 400s in OpenAI's shape: empty input, an empty string, bad token ids, an
  unknown pooling, dimensions other than the model's width, an input longer
  than the context, a bad encoding_format; and the server still answers;
- no 5xx over 150 mutated bodies.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_embed.py"""
import base64
import json
import os
import random
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import TL_BIN, Server, post_json  # noqa: E402

SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN = os.path.join(ROOT, "models", "random", "embed_qwen3.gguf")
TEXTS = ["Hello world",
         "The cat sat on the mat and looked at the birds outside the window for a long time.",
         "Embeddings turn text into vectors; similar texts land near each other, which is what retrieval needs. "
         "This one is longer than a batch of sixteen tokens, several times over, so the server chunks it.",
         "<|im_start|>special tokens are parsed"]


def cli_embed(path, texts, *args):
    cmd = [TL_BIN, "embed", "-m", path, *args]
    for t in texts:
        cmd += ["-p", t]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return None
    return [np.array(d["embedding"], dtype=np.float32) for d in json.loads(p.stdout)["data"]]


def same(a, b):
    return a is not None and b is not None and len(a) == len(b) and all(
        x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b))


def vec(d):
    if isinstance(d.embedding, str):
        return np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")
    return np.array(d.embedding, dtype=np.float32)


def create(oc, inp, **kw):
    return [vec(d) for d in oc.embeddings.create(model="m", input=inp, **kw).data]


def status_of(url, body):
    req = urllib.request.Request(url + "/v1/embeddings", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def smol_checks(srv):
    oc = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
    ref = cli_embed(SMOL, TEXTS)
    raw = cli_embed(SMOL, TEXTS, "--no-normalize")
    cls = cli_embed(SMOL, TEXTS[:2], "--pooling", "cls")
    if not check(ref is not None and raw is not None and cls is not None, "tokenloop embed failed"):
        return
    got = create(oc, TEXTS)
    check(same(got, ref), "float vectors equal tokenloop embed's bitwise")
    check(all(abs(float(np.linalg.norm(v.astype(np.float64))) - 1) < 1e-5 for v in got), "unit length by default")
    check(same(create(oc, TEXTS, encoding_format="base64"), ref), "base64 decodes to the same float32s")
    # the openai client itself asks for base64 when no format is given, and decodes it
    r = oc.embeddings.create(model="m", input=TEXTS[0])
    check(r.object == "list" and r.data[0].object == "embedding" and r.data[0].index == 0 and r.model
          and r.usage.prompt_tokens == r.usage.total_tokens > 0, f"the reply's shape: {r.model} {r.usage}")
    check(same([np.array(r.data[0].embedding, dtype=np.float32)], ref[:1]), "the client's default (base64) decode")
    check(same(create(oc, TEXTS[1]), ref[1:2]), "a single string")
    check(same(create(oc, TEXTS, extra_body={"normalize": False}), raw), "normalize false: the raw pooled vectors")
    check(same(create(oc, TEXTS, extra_body={"embd_normalize": -1}), raw), "embd_normalize -1 (llama-server's)")
    check(same(create(oc, TEXTS[:2], extra_body={"pooling": "cls"}), cls), "a request's pooling (cls)")
    check(same(create(oc, TEXTS, dimensions=576), ref), "dimensions equal to the width")
    chunked = " ".join(TEXTS[1:3]) * 12  # ~700 tokens: two forward calls of the server's 512
    cref = cli_embed(SMOL, [chunked])
    check(same(create(oc, chunked), cref), "an input longer than a batch: chunked, the CLI's vector")
    # token ids: the text's own ids give its vector
    tok = post_json(srv.port, "/tokenize", {"content": TEXTS[1], "add_special": False})  # SmolLM2 adds no BOS
    ids = tok.get("tokens") if isinstance(tok, dict) else None
    if check(isinstance(ids, list) and ids, f"/tokenize: {tok}"):
        ids = [t if isinstance(t, int) else t["id"] for t in ids]
        check(same(create(oc, ids), ref[1:2]), "an array of token ids")
        check(same(create(oc, [ids, ids]), [ref[1], ref[1]]), "an array of arrays of token ids")
        n = oc.embeddings.create(model="m", input=[ids, ids]).usage.prompt_tokens
        check(n == 2 * len(ids), f"usage counts the tokens: {n} vs {2 * len(ids)}")
    # concurrency: 12 at once, of mixed lengths (one chunked), with a chat completion decoding beside them
    pool = TEXTS + [chunked]
    ref5 = ref + cref
    # (6 under the sanitizers: the chunked text is in most of them)
    picks = [[(i + k) % 5 for k in range(1 + i % 4)] for i in range(6 if os.environ.get("TL_ASAN") == "1" else 12)]
    results = [None] * len(picks)
    chat = {}

    def one(i):
        results[i] = create(oc, [pool[k] for k in picks[i]])

    def talk():
        chat["r"] = oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "Count to twenty."}],
                                               max_tokens=48, temperature=0)

    th = [threading.Thread(target=one, args=(i,)) for i in range(len(picks))] + [threading.Thread(target=talk)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    check(all(same(results[i], [ref5[k] for k in picks[i]]) for i in range(len(picks))),
          f"{len(picks)} concurrent requests of mixed lengths: each vector the CLI's alone, bitwise")
    check("r" in chat and chat["r"].choices[0].message.content, "the chat completion beside them")
    # errors: 400s in OpenAI's shape
    long_text = "hello " * 1100
    bad = [({"input": []}, "empty input"), ({"input": ""}, "an empty string"), ({"input": [1, 2, 10 ** 9]}, "bad ids"),
           ({"input": [[]]}, "an empty id array"), ({"input": "x", "pooling": "max"}, "an unknown pooling"),
           ({"input": "x", "dimensions": 3}, "dimensions not the width"), ({"input": long_text}, "longer than -c"),
           ({"input": "x", "encoding_format": "int8"}, "encoding_format"), ({}, "no input"),
           ({"input": [1.5]}, "a float id"), ({"input": {"a": 1}}, "an object"),
           ({"input": "x", "embd_normalize": 1}, "embd_normalize 1")]
    for body, what in bad:
        st, j = status_of(srv.url, body)
        check(st == 400 and isinstance(j.get("error"), dict) and j["error"].get("message")
              and j["error"].get("type") == "invalid_request_error", f"{what}: {st} {j}")
    try:
        oc.embeddings.create(model="m", input="x", dimensions=3)
        check(False, "dimensions 3 through the client: no error")
    except openai.BadRequestError:
        check(True, "")
    check(same(create(oc, TEXTS[:1]), ref[:1]), "the server still answers after the errors")
    fuzz(srv.url)


def fuzz(url, n=150):
    """No 5xx over mutated bodies (odd values for each field, inputs of every shape)."""
    rnd = random.Random(7)
    odd = [None, 0, -1, 1.5, 1e300, "", "x" * 300, [], {}, True, [[[[[]]]]], [[1, 2], "a"], [-1], [2 ** 40],
           "é" * 40, "😀" * 20, "none", "base64", "float", 576, [[]], ["", "a"]]
    bases = [{"model": "m", "input": ["a", "b c"], "encoding_format": "base64", "dimensions": 576, "pooling": "mean"},
             {"model": "m", "input": [[1, 2, 3], [4]], "normalize": False, "embd_normalize": 2, "user": "u"},
             {"model": "m", "input": "hello", "pooling": "none"}]
    n5 = 0
    for i in range(n):
        b = json.loads(json.dumps(bases[i % len(bases)]))
        for _ in range(rnd.randint(1, 3)):
            k = rnd.choice(list(b) + ["extra"])
            if rnd.random() < 0.25 and k in b:
                del b[k]
            else:
                b[k] = json.loads(json.dumps(rnd.choice(odd)))
        data = json.dumps(b).encode()
        if rnd.random() < 0.08:
            data = data[:rnd.randrange(len(data))]
        req = urllib.request.Request(url + "/v1/embeddings", data=data, headers={"Content-Type": "application/json"},
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
                code = r.status
        except urllib.error.HTTPError as e:
            code = e.code
            e.read()
        if code >= 500:
            n5 += 1
            if n5 <= 3:
                print(f"  5xx: {data[:300]!r} -> {code}")
    check(n5 == 0, f"no 5xx over {n} mutated bodies: {n5}")


def qwen_checks():
    if not os.path.exists(QWEN):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), "qwen3", QWEN, "--seed", "51",
                            "--type", "f32"], capture_output=True, text=True)
        if not check(p.returncode == 0, f"mkmodel.py: {p.stderr[-300:]}"):
            return
    ref = cli_embed(QWEN, TEXTS[:3], "--pooling", "last")
    mean = cli_embed(QWEN, TEXTS[:3], "--pooling", "mean")
    srv = Server(QWEN, ["-c", "256", "-np", "2", "--pooling", "last"])
    try:
        if not check(srv.wait_ready(), "qwen3 server ready"):
            return
        oc = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
        check(same(create(oc, TEXTS[:3], encoding_format="float"), ref), "qwen3 --pooling last: the CLI's bits")
        check(same(create(oc, TEXTS[:3], extra_body={"pooling": "mean"}), mean), "qwen3, pooling mean asked")
    finally:
        srv.stop()


def main():
    if not check(os.path.exists(SMOL), f"{SMOL} is missing (make models)"):
        tlcheck.finish()
    srv = Server(SMOL, ["-c", "1024", "-np", "2"])
    try:
        if check(srv.wait_ready(), "server ready"):
            smol_checks(srv)
    finally:
        srv.stop()
    qwen_checks()
    tlcheck.finish()


if __name__ == "__main__":
    main()
