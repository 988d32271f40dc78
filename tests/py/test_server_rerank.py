"""Reranking: rank pooling in the library, `tokenloop rerank` and POST
/v1/rerank, on random Qwen3-Reranker files (scripts/mkmodel.py --rerank, as
llama.cpp's converter writes one: pooling rank, cls.output [D x 2], the rerank
template; an F32 file, a Q8_0 one with an untied head, and one without the
template, whose pairs are [BOS] query [EOS] [SEP] document [EOS] as the
vocabulary adds them), and random BERT cross-encoders (mkmodel.py bert
--rerank, as the converter writes bge-reranker: cls [D x D], cls.output
[D x 1], biases, no softmax; F32, Q8_0, and a Q8_0 one without cls as
ms-marco-MiniLM converts; pairs [CLS] query [SEP] document) against
llama.cpp's scores (tests/oracle/fixtures/rerank.json,
tests/oracle/make_fixtures_rerank.py):

- exact mode: every score bitwise llama.cpp's (a pair of 828 tokens included,
  chunked by the 512-token batch; a 400-token one on the Q8_0 encoder), but
  the F32 encoder's, within 1e-5 (measured 1.2e-6); the token counts
  llama.cpp's; the default mode within a stated gap (measured: 1.3e-5 F32,
  6e-5 without the template, 5.8e-3 Q8_0; encoders 1.1e-6 F32, 4.9e-2 Q8_0)
  with the same ranking where llama.cpp's margin allows;
- the CLI's scores equal at -b 7 and -b 512 (chunking changes no bit);
- the server (exact, --rerank): each score the CLI's and llama.cpp's bitwise,
  results by score descending, usage, top_n, return_documents, documents as
  {"text": ...}, the aliases /rerank, /v1/reranking, /reranking;
- the Q8_0 encoder through /v1/rerank (exact, --rerank): llama.cpp's and the
  CLI's bits, top_n 3 in llama.cpp's order, usage;
- 8 concurrent requests of shuffled document lists, beside a completion
  decoding: each document's score the one it gets alone (a score never
  depends on its neighbours);
- 400s in the house shape naming the field: no or empty query, no, empty or
  non-string documents, top_n 0, a bad return_documents, a pooling other than
  rank, a pair longer than the context; a model without a classification head
  (its 400 names cls.output), `serve --rerank` refused on it; /v1/embeddings
  on the reranker refuses pooling rank;
- no 5xx over 100 mutated bodies (40 under TL_ASAN).
The `cohere` client is not a dependency: the replies are read as plain JSON.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_rerank.py"""
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import TL_BIN, Server, free_port  # noqa: E402

ASAN = os.environ.get("TL_ASAN") == "1"
FIXTURE = os.path.join(ROOT, "tests", "oracle", "fixtures", "rerank.json")
# default-mode gap allowed per file (measured gaps in the docstring)
FAST_TOL = {"qwen3_rerank_f32": 1e-4, "qwen3_rerank_q8_untied": 0.02, "qwen3_rerank_plain": 5e-4,
            "bert_rerank_f32": 1e-5, "bert_rerank_q8": 0.1, "bert_rerank_direct_q8": 0.1}
# exact-mode gap allowed where the file is not bitwise yet (the F32 encoder's
# weight products, docs/NUMERICS.md; measured 1.2e-6); every other file bitwise
EXACT_TOL = {"bert_rerank_f32": 1e-5}


def f32(x):
    return np.float32(x).tobytes()


def make(tmp, name, args):
    path = os.path.join(tmp, name + ".gguf")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), args[0], path] + args[1:],
                       capture_output=True, text=True)
    check(p.returncode == 0, f"mkmodel.py {name}: {p.stderr[-300:]}")
    return path


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def cli_rerank(path, query, docs, *args):
    """index -> score (float32 bytes) and the reply, from `tokenloop rerank`."""
    cmd = [TL_BIN, "rerank", "-m", path, "-q", query, *args]
    for d in docs:
        cmd += ["-d", d]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if not check(p.returncode == 0, f"tokenloop rerank {args}: {p.stderr[-300:]}"):
        return None, None
    j = json.loads(p.stdout)
    return {r["index"]: np.float32(r["relevance_score"]) for r in j["results"]}, j


def post(url, path, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120 * (4 if ASAN else 1)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body or b"{}")
        except ValueError:
            return e.code, {"raw": body[:200].decode(errors="replace")}


def scores_of(reply):
    return {r["index"]: np.float32(r["relevance_score"]) for r in reply["results"]}


def oracle_checks(fx, paths):
    """The CLI against llama.cpp, both modes; chunking changes no bit.
    Returns each file's exact-mode scores (index -> float32)."""
    q, exact = fx["query"], {}
    for name, m in fx["models"].items():
        docs = m.get("documents", fx["documents"])  # the encoders' own (512 positions)
        ref = [np.float32(c["scores"][0]) for c in m["cases"]]
        n_ids = sum(len(c["ids"]) for c in m["cases"])
        got, j = cli_rerank(paths[name], q, docs, "--numerics", "exact")
        if got is None:
            continue
        exact[name] = got
        same = sum(f32(got[i]) == f32(ref[i]) for i in range(len(ref)))
        xgap = max(abs(float(got[i]) - float(ref[i])) for i in range(len(ref)))
        if name in EXACT_TOL:
            check(xgap <= EXACT_TOL[name], f"{name} exact: gap {xgap} > {EXACT_TOL[name]}")
        else:
            check(same == len(ref), f"{name} exact: {same}/{len(ref)} scores bitwise llama.cpp's")
        check(j["usage"]["prompt_tokens"] == n_ids, f"{name}: {j['usage']['prompt_tokens']} tokens, llama.cpp {n_ids}")
        check(len(m["cases"][0]["scores"]) == m["n_cls_out"] == (2 if name.startswith("qwen3") else 1),
              f"{name}: n_cls_out {m['n_cls_out']}")
        if m["n_cls_out"] == 2:  # the softmax's other output: the two sum to 1 as llama.cpp's do
            check(all(abs(c["scores"][0] + c["scores"][1] - 1) < 1e-6 for c in m["cases"]), f"{name}: fixture softmax")
        fast, _ = cli_rerank(paths[name], q, docs)
        if fast is None:
            continue
        gap = max(abs(float(fast[i]) - float(ref[i])) for i in range(len(ref)))
        print(f"  {name}: default mode max |score - llama.cpp| = {gap:.3g}; exact mode {same}/{len(ref)} bitwise"
              f" (max gap {xgap:.3g})")
        check(gap <= FAST_TOL[name], f"{name} default mode: gap {gap} > {FAST_TOL[name]}")
        order = sorted(range(len(ref)), key=lambda i: -ref[i])
        for a, b in zip(order, order[1:]):
            if float(ref[a] - ref[b]) > 2 * FAST_TOL[name]:
                check(fast[a] > fast[b], f"{name} default mode: the order of {a} and {b} (llama.cpp's margin "
                                         f"{float(ref[a] - ref[b]):.3g})")
    name, docs = "qwen3_rerank_f32", fx["documents"]
    b7, _ = cli_rerank(paths[name], q, docs, "--numerics", "exact", "-b", "7")
    ref = [np.float32(c["scores"][0]) for c in fx["models"][name]["cases"]]
    check(b7 is not None and all(f32(b7[i]) == f32(ref[i]) for i in range(len(ref))),
          "-b 7 (every pair chunked): the same bits")
    return exact


def server_checks(fx, path):
    q, docs = fx["query"], fx["documents"]
    cli, _ = cli_rerank(path, q, docs, "--numerics", "exact")
    ref = {i: np.float32(c["scores"][0]) for i, c in enumerate(fx["models"]["qwen3_rerank_f32"]["cases"])}
    n_ids = [len(c["ids"]) for c in fx["models"]["qwen3_rerank_f32"]["cases"]]
    srv = Server(path, ["-c", "1024", "-np", "2", "--numerics", "exact", "--rerank"])
    try:
        if not check(srv.wait_ready(), "reranker server ready"):
            return
        st, j = post(srv.url, "/v1/rerank", {"model": "m", "query": q, "documents": docs})
        if not check(st == 200 and "results" in j, f"/v1/rerank: {st} {str(j)[:300]}"):
            return
        got = scores_of(j)
        check(cli is not None and all(f32(got[i]) == f32(cli[i]) for i in range(len(docs))),
              "the server's scores are the CLI's bitwise")
        check(all(f32(got[i]) == f32(ref[i]) for i in range(len(docs))), "the server's scores are llama.cpp's bitwise")
        s = [r["relevance_score"] for r in j["results"]]
        check(s == sorted(s, reverse=True) and sorted(r["index"] for r in j["results"]) == list(range(len(docs))),
              "results by score, the best first, each document once")
        check(j.get("object") == "list" and j.get("model") and j["usage"]["prompt_tokens"] == sum(n_ids)
              and j["usage"]["total_tokens"] == sum(n_ids) and all("document" not in r for r in j["results"]),
              f"the reply's shape and usage: {j.get('usage')}")
        st, j3 = post(srv.url, "/v1/rerank", {"query": q, "documents": docs, "top_n": 3, "return_documents": True})
        check(st == 200 and [r["index"] for r in j3["results"]] == [r["index"] for r in j["results"][:3]]
              and all(r["document"] == {"text": docs[r["index"]]} for r in j3["results"]),
              f"top_n 3 with return_documents: {str(j3)[:300]}")
        st, jo = post(srv.url, "/v1/rerank", {"query": q, "documents": [{"text": d} for d in docs], "top_n": 99})
        check(st == 200 and jo["results"] == j["results"], "documents as {text} objects, top_n past the count")
        for alias in ("/rerank", "/v1/reranking", "/reranking"):
            st, ja = post(srv.url, alias, {"query": q, "documents": docs})
            check(st == 200 and ja["results"] == j["results"], f"{alias}: the same reply")
        # Text Embeddings Inference's shape, as llama-server reads it: "texts",
        # "return_text", a bare array with "score"
        st, jt = post(srv.url, "/rerank", {"query": q, "texts": docs, "top_n": 2, "return_text": True})
        check(st == 200 and isinstance(jt, list)
              and jt == [{"index": r["index"], "score": r["relevance_score"], "text": docs[r["index"]]}
                         for r in j["results"][:2]], f"TEI's shape (texts, return_text): {str(jt)[:300]}")
        st, jt = post(srv.url, "/rerank", {"query": q, "texts": docs})
        check(st == 200 and jt == [{"index": r["index"], "score": r["relevance_score"]} for r in j["results"]],
              f"TEI's shape without text: {str(jt)[:300]}")
        st, jt = post(srv.url, "/rerank", {"query": q, "texts": []})
        check(st == 400 and "texts" in json.dumps(jt), f"TEI's empty texts: {st} {jt}")
        concurrent(srv.url, q, docs, got)
        errors(srv.url, q)
        st, je = post(srv.url, "/v1/embeddings", {"input": "x"})
        check(st == 400 and "/v1/rerank" in json.dumps(je), f"/v1/embeddings with --rerank: {st} {je}")
        fuzz(srv.url, q, docs, 40 if ASAN else 100)
        st, j2 = post(srv.url, "/v1/rerank", {"query": q, "documents": docs})
        check(st == 200 and j2["results"] == j["results"], "the same reply after the errors and the fuzz")
    finally:
        srv.stop()


def bert_server_checks(fx, path, name, cli):
    """A BERT cross-encoder through /v1/rerank: llama.cpp's scores bitwise
    (Q8_0, exact mode; a 400-token pair included), the CLI's bits (cli),
    [CLS] query [SEP] doc counted."""
    m = fx["models"][name]
    q, docs = fx["query"], m["documents"]
    srv = Server(path, ["-np", "1", "--numerics", "exact", "--rerank"])
    try:
        if not check(srv.wait_ready(), f"{name} server ready"):
            return
        st, j = post(srv.url, "/v1/rerank", {"query": q, "documents": docs, "top_n": 3})
        if not check(st == 200 and "results" in j, f"{name} /v1/rerank: {st} {str(j)[:300]}"):
            return
        got = scores_of(j)
        ref = [np.float32(c["scores"][0]) for c in m["cases"]]
        best = sorted(range(len(ref)), key=lambda i: (-ref[i], i))[:3]
        check([r["index"] for r in j["results"]] == best, f"{name}: top 3 {list(got)}, llama.cpp's {best}")
        check(cli is not None and all(f32(got[i]) == f32(ref[i]) == f32(cli[i]) for i in got),
              f"{name}: the server's scores are llama.cpp's and the CLI's bitwise")
        check(j["usage"]["prompt_tokens"] == sum(len(c["ids"]) for c in m["cases"]), f"{name} usage: {j['usage']}")
    finally:
        srv.stop()


def concurrent(url, q, docs, alone):
    """8 requests at once, each a shuffled subset: every score the one alone."""
    rnd = random.Random(3)
    picks = [rnd.sample(range(len(docs)), rnd.randint(2, len(docs))) for _ in range(8)]
    out = [None] * 8

    def one(k):
        out[k] = post(url, "/v1/rerank", {"query": q, "documents": [docs[i] for i in picks[k]]})

    done = {}

    def talk():  # a completion decoding beside them (the file's token_embd is its output)
        done["r"] = post(url, "/v1/completions", {"prompt": "cats", "max_tokens": 24, "temperature": 0})

    th = [threading.Thread(target=one, args=(k,)) for k in range(8)] + [threading.Thread(target=talk)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    check(done.get("r", (0,))[0] == 200, f"a completion beside them: {str(done.get('r'))[:200]}")
    ok = all(o and o[0] == 200 and all(f32(np.float32(r["relevance_score"])) == f32(alone[picks[k][r["index"]]])
                                       for r in o[1]["results"]) for k, o in enumerate(out))
    check(ok, "8 concurrent shuffled requests: each document's score is its score alone")


def errors(url, q):
    long_doc = "cats eat " * 700  # the pair runs past -c 1024
    bad = [({"documents": ["a"]}, "query", "no query"), ({"query": "", "documents": ["a"]}, "query", "empty query"),
           ({"query": 5, "documents": ["a"]}, "query", "a number as the query"),
           ({"query": q}, "documents", "no documents"), ({"query": q, "documents": []}, "documents", "empty documents"),
           ({"query": q, "documents": "a"}, "documents", "a string as documents"),
           ({"query": q, "documents": ["a", 3]}, "documents", "a number among the documents"),
           ({"query": q, "documents": [{"txt": "a"}]}, "documents", "an object without text"),
           ({"query": q, "documents": [["a"]]}, "documents", "a nested array"),
           ({"query": q, "documents": ["a"], "top_n": 0}, "top_n", "top_n 0"),
           ({"query": q, "documents": ["a"], "top_n": "2"}, "top_n", "top_n a string"),
           ({"query": q, "documents": ["a"], "return_documents": "yes"}, "return_documents", "return_documents"),
           ({"query": q, "documents": ["a"], "pooling": "mean"}, "pooling", "pooling mean"),
           ({"query": q, "documents": ["a", long_doc]}, "documents", "a pair longer than the context")]
    for body, param, what in bad:
        st, j = post(url, "/v1/rerank", body)
        e = j.get("error") if isinstance(j, dict) else None
        check(st == 400 and isinstance(e, dict) and e.get("message") and e.get("type") == "invalid_request_error"
              and e.get("param") == param, f"{what}: {st} {j}")


def fuzz(url, q, docs, n):
    """No 5xx over mutated bodies (odd values for each field, cut bodies)."""
    rnd = random.Random(11)
    odd = [None, 0, -1, 1.5, 1e300, "", "x" * 300, [], {}, True, [[[[[]]]]], [{"text": 1}], [{"text": "a"}, "b"],
           "é" * 40, "😀" * 20, "rank", 2 ** 40, ["", ""], [None], {"text": "a"}, ["{query}{document}"]]
    bases = [{"model": "m", "query": q, "documents": docs[:3], "top_n": 2, "return_documents": True},
             {"query": q, "documents": [{"text": d} for d in docs[:2]], "pooling": "rank"}]
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
        st, _ = post(url, "/v1/rerank", None, raw=data)
        if st >= 500:
            n5 += 1
            if n5 <= 3:
                print(f"  5xx: {data[:300]!r} -> {st}")
    check(n5 == 0, f"no 5xx over {n} mutated bodies: {n5}")


def no_head_checks(tmp):
    """A model without a classification head cannot rank, and says why."""
    path = make(tmp, "plain_qwen3", ["qwen3", "--seed", "64", "--type", "f32"])
    p = subprocess.run([TL_BIN, "serve", "-m", path, "--port", str(free_port()), "--rerank"], capture_output=True, text=True,
                       timeout=120)
    check(p.returncode != 0 and "cls.output" in p.stderr, f"serve --rerank without a head: {p.returncode} "
                                                          f"{p.stderr[-200:]}")
    p = subprocess.run([TL_BIN, "rerank", "-m", path, "-q", "a", "-d", "b"], capture_output=True, text=True,
                       timeout=120)
    check(p.returncode != 0 and "cls.output" in p.stderr, f"tokenloop rerank without a head: {p.stderr[-200:]}")
    srv = Server(path, ["-c", "256", "-np", "1"])
    try:
        if not check(srv.wait_ready(), "plain qwen3 server ready"):
            return
        st, j = post(srv.url, "/v1/rerank", {"query": "a", "documents": ["b"]})
        check(st == 400 and "cls.output" in j.get("error", {}).get("message", ""),
              f"/v1/rerank without a head: {st} {j}")
    finally:
        srv.stop()


def main():
    with open(FIXTURE, encoding="utf-8") as f:
        fx = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, m in fx["models"].items():
            paths[name] = make(tmp, name, m["mkmodel_args"])
            check(os.path.exists(paths[name]) and sha256(paths[name]) == m["model_sha256"],
                  f"{name}: mkmodel.py writes the fixture's file (sha256)")
        exact = oracle_checks(fx, paths)
        server_checks(fx, paths["qwen3_rerank_f32"])
        bert_server_checks(fx, paths["bert_rerank_q8"], "bert_rerank_q8", exact.get("bert_rerank_q8"))
        no_head_checks(tmp)
    tlcheck.finish()


if __name__ == "__main__":
    main()
