"""Long context past the original one, through the server's paged cache and
its prefix cache (issue 30): a small random qwen2 with YaRN (factor 8 over
4,096 positions, trained to 32,768) is served with its default context (its
training length, which fits), and llama.cpp's log-probabilities at positions
4,089-4,096 and 32,759-32,766 of a 32,768-id sequence
(tests/oracle/fixtures/longctx_yarn.json) are compared with the top
log-probabilities of the first token the server would generate after each
prefix. The first request of each segment prefills it; the next ones reuse
the cached blocks (asserted) and run only their tail (7 s in all here).
Run: TL_BIN=build/tokenloop python3 tests/py/test_longctx.py"""
import hashlib
import http.client
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
import tlserver  # noqa: E402
from tlcheck import check  # noqa: E402
from tlserver import SLOW  # noqa: E402

ROOT = tlcheck.ROOT
FIX = os.path.join(ROOT, "tests", "oracle", "fixtures", "longctx_yarn.json")
MODEL = os.path.join(ROOT, "models", "random", "longctx_yarn.gguf")
# the default numerics: log-probabilities within the fidelity rules' 0.1 of
# llama.cpp's, and the same top token where llama.cpp's is decisive
TOL = 0.1
MARGIN = 0.3


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def complete(port, ids):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900 * SLOW)
    try:
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": ids, "max_tokens": 1, "temperature": 0,
                                                              "logprobs": 20}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {json.dumps(body)[:300]}")
        top = body["choices"][0]["logprobs"]["top_logprobs"][0]
        cached = (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return top, cached
    finally:
        c.close()


def main():
    with open(FIX) as f:
        fx = json.load(f)
    meta = fx["meta"]
    os.makedirs(os.path.dirname(MODEL), exist_ok=True)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), meta["mkmodel_args"][0], MODEL]
                       + meta["mkmodel_args"][1:], capture_output=True, text=True, timeout=300)
    if not check(p.returncode == 0 and sha256(MODEL) == meta["model_sha256"],
                 f"the fixture's model is made again, byte for byte ({p.stderr[-200:]})"):
        tlcheck.finish()
    srv = tlserver.Server(MODEL, ["-np", "1", "-t", "2", "--spec", "off"])
    try:
        if not check(srv.wait_ready(120), "server ready"):
            tlcheck.finish()
        rows = fx["rows"]
        ids = fx["ids"]
        if os.environ.get("TL_ASAN") == "1":
            # the sanitizer run takes the first segment only: the 32k prefill
            # goes through the same paged blocks, 8x more of them, and takes
            # over a minute there (the plain run checks both)
            rows = [r for r in rows if r["pos"] < 8192]
            print(f"  sanitizer run: {len(rows)} of {len(fx['rows'])} positions (those below 8192)")
        worst, n_cached = 0.0, 0
        tok_of = {}
        for i, row in enumerate(rows):
            pos = row["pos"]
            top, cached = complete(srv.port, ids[:pos + 1])
            if i > 0 and rows[i - 1]["pos"] == pos - 1:
                n_cached += 1
                check(cached >= (pos + 1) // 16 * 16 - 16,
                      f"position {pos}: the prefix comes from the prefix cache ({cached} cached of {pos + 1})")
            ref = {t: v - row["lse"] for t, v in row["top"]}
            got = top  # the server names its alternatives by text
            best_ref = row["top"][0][0]
            # llama.cpp's ids as text (the server's /detokenize), ids whose
            # text another of the 20 shares left out (one key in the reply)
            for t in ref:
                if t not in tok_of:
                    tok_of[t] = detok(srv.port, t)
            texts = [tok_of[t] for t in ref]
            common = [t for t in ref if tok_of[t] in got and texts.count(tok_of[t]) == 1]
            check(len(common) >= 10, f"position {pos}: {len(common)} of llama.cpp's top 20 among the server's top 20")
            d = max(abs(got[tok_of[t]] - ref[t]) for t in common) if common else 1e9
            worst = max(worst, d)
            check(d <= TOL, f"position {pos}: log-probabilities differ by {d:.3g} > {TOL}")
            server_best = max(got, key=got.get)
            decisive = row["top"][0][1] - row["top"][1][1] > MARGIN
            check(not decisive or server_best == tok_of[best_ref],
                  f"position {pos}: top token {server_best!r}, llama.cpp's {tok_of[best_ref]!r}")
        print(f"  {len(rows)} positions up to {rows[-1]['pos']}: max |log p - llama.cpp's| {worst:.3g}; "
              f"{n_cached} requests on a cached prefix")
    finally:
        srv.stop()
    tlcheck.finish()


def detok(port, tok):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", "/detokenize", body=json.dumps({"tokens": [tok]}), headers={"Content-Type": "application/json"})
        return json.loads(c.getresponse().read())["content"]
    finally:
        c.close()


if __name__ == "__main__":
    main()
