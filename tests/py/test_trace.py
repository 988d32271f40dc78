"""The loop's trace (docs/TRACE.md) on SmolLM2: every line of runs that cover
a prompt in several prefill chunks, decode, speculative verification, tokens
the grammar forced and a cached chat prefix validates against
docs/trace.schema.json; the tokens' texts joined are the output; the steps
count up, the totals add up and the phases are where they belong; each
token's probability equals the server's logprobs for the same request;
--show-loop prints a row per call.
Run: TL_BIN=build/tokenloop python3 tests/py/test_trace.py"""
import json
import math
import os
import subprocess
import sys
import tempfile

import jsonschema
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, TL_BIN, Server  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
with open(os.path.join(ROOT, "docs", "trace.schema.json"), encoding="utf-8") as f:
    SCHEMA = json.load(f)
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
          "built a machine that pressed inked metal letters onto paper. Before that,")


def run(tmp, args, stdin=None, cmd="run"):
    path = os.path.join(tmp, "t.jsonl")
    p = subprocess.run([TL_BIN, cmd, "-m", MODEL, "-t", "2", "--trace", path, *args], input=stdin,
                       capture_output=True, timeout=300 * SLOW)
    lines = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(x) for x in f]
        os.remove(path)
    return p, lines


def validate(lines, label):
    bad = 0
    for ln in lines:
        try:
            jsonschema.validate(ln, SCHEMA)
        except jsonschema.ValidationError as e:
            bad += 1
            if bad == 1:
                print(f"  {label}: {e.message} in {json.dumps(ln)[:300]}")
    check(lines and not bad, f"{label}: {len(lines)} lines, {bad} invalid")
    steps = [ln["step"] for ln in lines]
    out = [ln["totals"]["tokens_out"] for ln in lines]
    emitted = [sum(1 for s in ln["seqs"] for t in s["tokens"] if t["id"] >= 0) for ln in lines]
    check(steps == list(range(len(lines))) and all(out[i] == sum(emitted[:i + 1]) for i in range(len(lines)))
          and all(ln["rows"] == sum(s["fed"] for s in ln["seqs"]) for ln in lines),
          f"{label}: steps count up, tokens_out adds up, rows are the tokens fed")


def tokens(lines):
    return [t for ln in lines for s in ln["seqs"] for t in s["tokens"]]


def server_trace(srv, cl):
    """GET /v1/loop while two requests run: valid records, and per sequence
    the texts join to that request's reply with the same logprobs."""
    import http.client
    import threading
    recs, ready = [], threading.Event()

    def follow():
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60 * SLOW)
        c.request("GET", "/v1/loop")
        resp = c.getresponse()
        ready.set()
        while True:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                recs.append(json.loads(line[6:]))
                if recs[-1].get("stop"):
                    break
    th = threading.Thread(target=follow, daemon=True)
    th.start()
    ready.wait(30 * SLOW)
    import time
    time.sleep(0.2)
    outs = [None, None]

    def ask(i):
        outs[i] = cl.completions.create(model="m", prompt=["Rivers of Europe:", "A short poem:"][i], max_tokens=20,
                                        temperature=0.9, seed=i + 7, logprobs=2, stop=["\n\n"])
    ts = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    time.sleep(0.5)
    validate(list(recs), "server trace")
    by_id = {}
    for ln in recs:
        for q in ln["seqs"]:
            by_id.setdefault(q["id"], []).extend(q["tokens"])
    matched = 0
    for o in outs:
        text = o.choices[0].text
        lps = o.choices[0].logprobs.token_logprobs
        for toks in by_id.values():
            if "".join(t["text"] for t in toks) == text:
                mine = [t["logprob"] for t in toks if t["id"] >= 0]
                matched += len(mine) == len(lps) and all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5)
                                                         for a, b in zip(lps, mine))
                break
    shared = sum(1 for ln in recs if len(ln["seqs"]) > 1)
    check(matched == 2, f"server trace: each request's tokens, texts and logprobs ({matched} of 2 matched; "
                        f"{len(recs)} records, {shared} calls shared by both)")


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    with tempfile.TemporaryDirectory(prefix="tl-trace-") as tmp:
        # prefill in chunks of 8, then decode, greedy
        p, lines = run(tmp, ["-p", PROMPT, "-n", "24", "--temp", "0", "-b", "8", "--spec", "off"])
        check(p.returncode == 0, f"run: {p.stderr[-300:]!r}")
        validate(lines, "chunked prefill")
        text = "".join(t["text"] for t in tokens(lines))
        check(p.stdout.decode() == text + "\n", f"texts joined are the output: {text!r} vs {p.stdout.decode()!r}")
        phases = [s["phase"] for ln in lines for s in ln["seqs"]]
        n_pre = phases.count("prefill")
        fed = [s["fed"] for ln in lines for s in ln["seqs"] if s["phase"] == "prefill"]
        check(n_pre >= 3 and phases[:n_pre] == ["prefill"] * n_pre and set(phases[n_pre:]) == {"decode"}
              and all(f <= 8 for f in fed) and lines[-1]["totals"]["tokens_in"] == sum(fed),
              f"prefill chunks of at most 8 ({fed}), then decode steps: {phases}")
        first = lines[n_pre - 1]["seqs"][0]["tokens"]
        check(len(first) == 1 and all(not ln["seqs"][0]["tokens"] for ln in lines[:n_pre - 1])
              and lines[-1]["totals"]["ttft_ms"] is not None and lines[-1]["totals"]["tokens_out"] == 24,
              "the last prefill chunk carries the first token; 24 tokens out")
        check(all(t["top"][0]["p"] >= t["p"] - 1e-6 and len(t["top"]) == 5 for t in tokens(lines) if t["id"] >= 0)
              and all(t["source"] == "sampled" and t["top"][0]["id"] == t["id"] for t in tokens(lines)
                      if t["id"] >= 0),
              "greedy: each token is its step's most probable, with 5 alternatives")
        check(all(ln["weight_bytes"] > 50e6 and ln["kv_bytes"] > 0 and ln["gbps"] > 0 for ln in lines),
              "bytes read and GB/s")
        check(all(ln["state_bytes"] == 0 for ln in lines), "no recurrent state read by a transformer")
        greedy = tokens(lines)

        # the same request through the server: the same tokens and probabilities
        srv = Server(MODEL, ["-np", "1", "-t", "2", "-c", "2048"])
        try:
            if check(srv.wait_ready(), "server ready"):
                cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120 * SLOW)
                r = cl.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0, logprobs=5)
                lp = r.choices[0].logprobs
                mine = [t for t in greedy if t["id"] >= 0]
                same = len(lp.token_logprobs) == len(mine) and all(
                    math.isclose(a, t["logprob"], rel_tol=1e-4, abs_tol=1e-5)
                    for a, t in zip(lp.token_logprobs, mine))
                check(same and r.choices[0].text == text,
                      f"the trace's logprobs are the server's: {lp.token_logprobs[:4]} vs "
                      f"{[t['logprob'] for t in mine[:4]]}")
                server_trace(srv, cl)
        finally:
            srv.stop()

        # speculation: prompt lookup on a repetitive prompt verifies guesses
        rep = "one two three four five six seven eight nine ten " * 4
        p, lines = run(tmp, ["-p", rep, "-n", "40", "--temp", "0", "--spec", "ngram"])
        validate(lines, "speculation")
        ver = [s for ln in lines for s in ln["seqs"] if s["phase"] == "verify"]
        drafts = [t for t in tokens(lines) if t.get("source") == "draft"]
        check(ver and sum(s["accepted"] for s in ver) == len(drafts) > 0
              and all(s["fed"] == s["drafted"] + 1 and s["accepted"] <= s["drafted"] for s in ver)
              and "".join(t["text"] for t in tokens(lines)) + "\n" == p.stdout.decode(),
              f"verify steps: {len(ver)}, {len(drafts)} draft tokens kept")

        # a grammar that leaves one choice: those tokens are the grammar's
        schema = os.path.join(tmp, "s.json")
        with open(schema, "w") as f:
            json.dump({"type": "object", "properties": {"answer": {"const": "the printing press changed Europe"},
                                                        "year": {"type": "integer"}},
                       "required": ["answer", "year"], "additionalProperties": False}, f)
        p, lines = run(tmp, ["-p", "Answer in JSON:", "-n", "60", "--temp", "0.7", "--seed", "3",
                             "--json-schema", schema])
        validate(lines, "grammar")
        srcs = [t["source"] for t in tokens(lines) if t["id"] >= 0]
        check(srcs.count("grammar") >= 1 and "".join(t["text"] for t in tokens(lines)) + "\n" == p.stdout.decode(),
              f"tokens the grammar forced: {srcs.count('grammar')} of {len(srcs)}")

        # chat: the second turn finds the first in the cache
        p, lines = run(tmp, ["-n", "12", "--temp", "0"], stdin=b"Hello!\nAnd again?\n", cmd="chat")
        validate(lines, "chat")
        firsts = [ln["seqs"][0] for ln in lines if ln["seqs"][0]["phase"] == "prefill"]
        cached = [s["cached"] for s in firsts]
        check(p.returncode == 0 and cached[0] == 0 and max(cached) > 20 and lines[-1]["totals"]["tokens_cached"] > 20,
              f"the second turn's prompt came from the cache: cached {cached}")

        # --show-loop: a header and a row per call on stderr
        p = subprocess.run([TL_BIN, "run", "-m", MODEL, "-t", "2", "-p", PROMPT, "-n", "6", "--temp", "0",
                            "--spec", "off", "--show-loop"], capture_output=True, timeout=300 * SLOW)
        rows = [x for x in p.stderr.decode().splitlines() if x.startswith("\x1b[2m") and "phase" not in x]
        check(p.returncode == 0 and "phase" in p.stderr.decode() and len(rows) == 6,
              f"--show-loop rows: {len(rows)}: {p.stderr.decode()[-400:]!r}")
    tlcheck.finish()


if __name__ == "__main__":
    main()
