"""`tokenloop serve` driven the way users drive it: the official openai client
(chat and completions, streamed and not, logprobs, include_usage, models),
raw HTTP for hostile bodies (each must get a 4xx JSON error, and the server must
stay healthy), --api-key, /metrics parsed as Prometheus text, /tokenize and
/detokenize, and a greedy chat reply equal to `tokenloop run --chat --temp 0`.
Needs $TL_BIN, the SmolLM2 model and the openai and prometheus_client packages
(a missing one is a failure, not a skip)."""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlserver  # noqa: E402
from tlcheck import ROOT, check, finish  # noqa: E402
from tlserver import SLOW, TL_BIN  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
T = 120 * SLOW  # seconds any one call may take
PROMPT = "What is the capital of France? Answer in one sentence."


def raw(port, method, path, body=None, headers=None, timeout=T):
    """(status, headers dict, body bytes) of one request on a fresh connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        if isinstance(body, str):
            body = body.encode()
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def Server(extra=()):
    return tlserver.Server(MODEL, ["-np", "4", "-t", "2", "-c", "2048", *extra])


def is_error_json(body):
    try:
        e = json.loads(body)["error"]
        return isinstance(e["message"], str) and e["message"] != "" and "type" in e and "code" in e
    except (ValueError, KeyError, TypeError):
        return False


def test_openai(srv, openai):
    cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=T)
    models = cl.models.list()
    check(len(models.data) == 1 and models.data[0].id.startswith("SmolLM2"), f"models {models}")
    msgs = [{"role": "user", "content": PROMPT}]
    r = cl.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=12)
    text = r.choices[0].message.content
    check(r.object == "chat.completion" and isinstance(text, str) and text, f"chat reply {r}")
    check(r.choices[0].finish_reason in ("stop", "length"), "finish_reason")
    check(r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 12 and
          r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, f"usage {r.usage}")
    check(r.usage.prompt_tokens_details is not None and
          r.usage.prompt_tokens_details.cached_tokens is not None, "cached_tokens present")
    chunks = list(cl.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=12,
                                             stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == text, f"streamed {streamed!r} != {text!r}")
    fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(fin == [r.choices[0].finish_reason], f"stream finish {fin}")
    check(chunks[-1].choices == [] and chunks[-1].usage is not None and
          chunks[-1].usage.completion_tokens == r.usage.completion_tokens, "include_usage chunk")
    check(all(c.usage is None for c in chunks[:-1]), "usage null before the last chunk")
    # The same prompt again: its prefix is now cached.
    r2 = cl.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=12)
    check(r2.choices[0].message.content == text, "repeat at temperature 0")
    check(r2.usage.prompt_tokens_details.cached_tokens > 0, f"cached_tokens {r2.usage}")

    # Chat logprobs, streamed and not.
    kw = dict(model="x", messages=msgs, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3)
    a = cl.chat.completions.create(**kw)
    lp = a.choices[0].logprobs.content
    check(len(lp) >= 1 and all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in lp), "chat logprobs")
    check(all(abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6 for e in lp), "greedy = top-1")
    sl = [e for c in cl.chat.completions.create(stream=True, **kw) if c.choices and c.choices[0].logprobs
          for e in c.choices[0].logprobs.content]
    check([(e.token, e.logprob) for e in sl] == [(e.token, e.logprob) for e in lp], "streamed logprobs")

    # Legacy completions, streamed and not.
    c1 = cl.completions.create(model="x", prompt="The capital of France is", temperature=0, max_tokens=8)
    t1 = c1.choices[0].text
    check(c1.object == "text_completion" and t1, f"completion {c1}")
    t2 = "".join(c.choices[0].text for c in cl.completions.create(
        model="x", prompt="The capital of France is", temperature=0, max_tokens=8, stream=True) if c.choices)
    check(t1 == t2, f"streamed completion {t2!r} != {t1!r}")
    c3 = cl.completions.create(model="x", prompt="The capital of France is", temperature=0,
                               max_tokens=3, logprobs=2)
    l3 = c3.choices[0].logprobs
    check(l3 is not None and len(l3.tokens) == len(l3.token_logprobs) == len(l3.top_logprobs) ==
          len(l3.text_offset) >= 1, f"legacy logprobs {l3}")
    # echo + logprobs + max_tokens 0: the prompt's own log-likelihood (lm-eval's path).
    c4 = cl.completions.create(model="x", prompt="The capital of France is Paris", temperature=0,
                               max_tokens=0, echo=True, logprobs=1)
    l4 = c4.choices[0].logprobs
    check(c4.choices[0].text == "The capital of France is Paris", f"echo text {c4.choices[0].text!r}")
    check(l4 is not None and len(l4.tokens) >= 5 and l4.token_logprobs[0] is None and
          all(x is not None and x <= 0 for x in l4.token_logprobs[1:]), f"echo logprobs {l4}")
    # Seeded sampling is reproducible.
    s = [cl.chat.completions.create(model="x", messages=msgs, temperature=0.8, seed=42, max_tokens=8)
         .choices[0].message.content for _ in range(2)]
    check(s[0] == s[1], f"seeded {s}")
    # Errors come back as openai exceptions with the server's message.
    try:
        cl.chat.completions.create(model="x", messages=[], max_tokens=4)
        check(False, "empty messages accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "messages" in str(e), f"empty messages: {e}")
    return text


def test_bad_input(srv):
    chat = "/v1/chat/completions"
    good = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [
        ("malformed", "POST", chat, b'{"messages": [', 400),
        ("not an object", "POST", chat, b"[1,2]", 400),
        ("wrong type", "POST", chat, json.dumps({**good, "temperature": "hot"}), 400),
        ("wrong type 2", "POST", chat, json.dumps({**good, "max_tokens": [1]}), 400),
        ("empty messages", "POST", chat, json.dumps({**good, "messages": []}), 400),
        ("invalid utf-8", "POST", chat, b'{"messages":[{"role":"user","content":"\xff\xfe"}]}', 400),
        ("depth bomb", "POST", chat, b"[" * 100000 + b"]" * 100000, 400),
        ("1e999", "POST", chat, json.dumps(good)[:-1].encode() + b',"temperature":1e999}', 400),
        ("2^64", "POST", chat, json.dumps(good)[:-1].encode() + b',"seed":18446744073709551616}', 400),
        ("unknown field", "POST", chat, json.dumps({**good, "frobnicate": 1}), 400),
        ("unsupported field", "POST", chat, json.dumps({**good, "tools": [{"type": "function"}]}), 400),
        ("n=2", "POST", chat, json.dumps({**good, "n": 2}), 400),
        ("too long", "POST", "/v1/completions", json.dumps({"prompt": "hi " * 3000, "max_tokens": 4}), 400),
        ("unknown path", "POST", "/v1/nothing", json.dumps(good), 404),
        ("wrong method", "GET", chat, None, 405),
        ("empty body", "POST", "/v1/completions", b"", 400),
    ]
    for name, method, path, body, want in cases:
        try:
            st, _, b = raw(srv.port, method, path, body)
            check(st == want and is_error_json(b), f"{name}: {st} {b[:200]!r}")
        except OSError as e:
            check(False, f"{name}: {e}")
    r = raw(srv.port, "POST", chat, json.dumps({**good, "seed": 1e999}).replace("Infinity", "1e999"))
    check(r[0] == 400, "seed 1e999")
    # 9 MiB declared: 413 from the headers alone, before the body is sent.
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=T)
    try:
        c.putrequest("POST", chat)
        c.putheader("Content-Type", "application/json")
        c.putheader("Content-Length", str(9 << 20))
        c.endheaders()
        c.send(b'{"messages":')
        r = c.getresponse()
        check(r.status == 413 and is_error_json(r.read()), f"9 MiB body: {r.status}")
    except OSError as e:
        check(False, f"9 MiB body: {e}")
    finally:
        c.close()
    st, _, b = raw(srv.port, "GET", "/health")
    check(st == 200 and json.loads(b)["status"] == "ok", "health after bad input")


def test_tokenize(srv):
    st, _, b = raw(srv.port, "POST", "/tokenize", json.dumps({"content": "Hello world"}))
    toks = json.loads(b).get("tokens") if st == 200 else None
    check(isinstance(toks, list) and len(toks) >= 2, f"tokenize {st} {b[:200]!r}")
    st, _, b = raw(srv.port, "POST", "/detokenize", json.dumps({"tokens": toks or []}))
    check(st == 200 and json.loads(b)["content"] == "Hello world", f"detokenize {b[:200]!r}")
    st, _, b = raw(srv.port, "POST", "/detokenize", json.dumps({"tokens": [10 ** 9]}))
    check(st == 400 and is_error_json(b), "detokenize bad id")


def test_metrics(srv):
    from prometheus_client.parser import text_string_to_metric_families
    st, h, b = raw(srv.port, "GET", "/metrics")
    check(st == 200 and h.get("content-type", "").startswith("text/plain"), f"metrics {st}")
    names = set()
    try:
        for fam in text_string_to_metric_families(b.decode()):
            names.add(fam.name)
            names.update(s.name for s in fam.samples)
    except Exception as e:  # noqa: BLE001 - any parse failure is the finding
        check(False, f"metrics do not parse: {e}")
    for n in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        check(n in names, f"metric {n} missing")


def test_cli_equal(text):
    """The server's greedy chat reply is the CLI's (the path checked against llama.cpp)."""
    out = subprocess.run([TL_BIN, "run", "-m", MODEL, "--chat", "-p", PROMPT, "--temp", "0", "-n", "12",
                          "-t", "2", "-c", "2048"], capture_output=True, timeout=T)
    cli = out.stdout.decode(errors="replace")
    if cli.endswith("\n"):
        cli = cli[:-1]
    check(out.returncode == 0 and cli == text, f"run --chat gave {cli!r}, server {text!r}")


def test_api_key(openai):
    srv = Server(["--api-key", "s3cret"])
    try:
        if not check(srv.wait_ready(), "api-key server did not start"):
            return
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        st, h, b = raw(srv.port, "POST", "/v1/chat/completions", body)
        check(st == 401 and h.get("www-authenticate") == "Bearer" and is_error_json(b), f"no key: {st}")
        st, _, _ = raw(srv.port, "POST", "/v1/chat/completions", body, {"Authorization": "Bearer s3cre"})
        check(st == 401, f"wrong key: {st}")
        st, _, _ = raw(srv.port, "GET", "/v1/models", None, {"Authorization": "Bearer s3cret!"})
        check(st == 401, f"longer key: {st}")
        st, _, _ = raw(srv.port, "POST", "/tokenize", json.dumps({"content": "x"}))
        check(st == 401, f"tokenize without key: {st}")
        st, _, _ = raw(srv.port, "GET", "/health")
        check(st == 200, "health needs no key")
        st, _, _ = raw(srv.port, "POST", "/v1/chat/completions", body, {"Authorization": "Bearer s3cret"})
        check(st == 200, f"right key: {st}")
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0, timeout=T)
        try:
            bad.models.list()
            check(False, "wrong key accepted by openai client")
        except openai.AuthenticationError:
            check(True, "")
        ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0, timeout=T)
        check(len(ok.models.list().data) == 1, "right key with openai client")
        # SIGTERM with nothing running: a clean exit 0.
        srv.proc.send_signal(signal.SIGTERM)
        check(srv.proc.wait(timeout=30 * SLOW) == 0, "SIGTERM exit code")
    finally:
        srv.stop()


def main():
    if not check(os.access(TL_BIN, os.X_OK), f"no binary at {TL_BIN}"):
        finish()
    if not check(os.path.exists(MODEL), f"missing {MODEL} (run make models)"):
        finish()
    try:
        import openai
        import prometheus_client  # noqa: F401
    except ImportError as e:
        check(False, f"{e} (run scripts/setup.sh)")
        finish()
    srv = Server()
    try:
        if check(srv.wait_ready(), "server did not become ready"):
            st, _, b = raw(srv.port, "GET", "/health")
            check(st == 200, "health")
            text = test_openai(srv, openai)
            test_bad_input(srv)
            test_tokenize(srv)
            test_metrics(srv)
            test_cli_equal(text)
            # SIGTERM drains and exits 0 (under ASan: also no leaks at exit).
            srv.proc.send_signal(signal.SIGTERM)
            rc = srv.proc.wait(timeout=60 * SLOW)
            if not check(rc == 0, f"SIGTERM exit code {rc}"):
                if srv.log is not sys.stderr:
                    srv.log.seek(0)
                    print(srv.log.read().decode(errors="replace")[-3000:])
    finally:
        srv.stop()
    test_api_key(openai)
    finish()


if __name__ == "__main__":
    main()
