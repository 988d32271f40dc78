"""tokenloop serve under load, as clients drive it: 200 concurrent openai
clients (mixed streaming) all succeed; a tiny queue answers 503 + Retry-After +
JSON, never 500 or a hang; clients that vanish mid-stream or mid-prefill free
their sequences within 2 s; SIGTERM lets an in-flight stream finish, turns
/ready and new requests to 503 and exits 0. Run: TL_BIN=./tokenloop python3 tests/py/test_server_load.py"""
import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
import tlserver  # noqa: E402
from tlcheck import check  # noqa: E402
from tlserver import SLOW, TL_BIN  # noqa: E402

ROOT = tlcheck.ROOT
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
ASAN = os.environ.get("TL_ASAN") == "1"
N_CLIENTS = 40 if ASAN else 200


class Server(tlserver.Server):
    def __init__(self, *args):
        super().__init__(MODEL, args)


def get(port, path, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout * SLOW)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace"), dict(r.getheaders())
    finally:
        c.close()


def post(port, path, body, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout * SLOW)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace"), {k.lower(): v for k, v in r.getheaders()}
    finally:
        c.close()


def metric(port, name):
    """The value of an unlabelled sample from /metrics (None if absent)."""
    from prometheus_client.parser import text_string_to_metric_families
    _, text, _ = get(port, "/metrics")
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and not s.labels:
                return s.value
    return None


def chat_body(content, max_tokens=8, stream=False):
    return {"model": "m", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}


# ---- 200 concurrent clients ----------------------------------------------------------

async def one_client(client, i):
    msgs = [{"role": "user", "content": f"Say something about the number {i}."}]
    if i % 2:
        stream = await client.chat.completions.create(model="m", messages=msgs, max_tokens=8, stream=True,
                                                      temperature=0.7, seed=i)
        text, finish = "", None
        async for ch in stream:
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
        return finish in ("stop", "length")
    r = await client.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0.7, seed=i)
    return r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 8


async def crowd(port, n, max_retries):
    from openai import AsyncOpenAI
    # The default pool allows 1,000 connections: every client gets its own.
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=max_retries,
                         timeout=120 * SLOW)

    async def guarded(i):
        try:
            return await one_client(client, i)
        except Exception as e:  # the 503 case inspects these
            return e

    try:
        return await asyncio.wait_for(asyncio.gather(*[guarded(i) for i in range(n)]), 170 * SLOW)
    finally:
        await client.close()


def test_crowd(srv):
    t0 = time.time()
    res = asyncio.run(crowd(srv.port, N_CLIENTS, 2))
    ok = sum(1 for r in res if r is True)
    errs = [r for r in res if r is not True]
    check(ok == N_CLIENTS, f"{N_CLIENTS} concurrent clients: {ok} succeeded; first error: {errs[:1]}")
    print(f"  {N_CLIENTS} clients in {time.time() - t0:.1f} s")


def test_queue_full(srv):
    import openai
    res = asyncio.run(crowd(srv.port, N_CLIENTS // 2, 0))
    ok = sum(1 for r in res if r is True)
    full = [r for r in res if isinstance(r, openai.APIStatusError) and r.status_code == 503]
    other = [r for r in res if r is not True and r not in full]
    check(ok > 0, f"tiny queue: some succeed ({ok})")
    check(len(full) > 0, f"tiny queue: some get 503 ({len(full)}); others: {other[:2]}")
    check(not other, f"tiny queue: only successes and 503s: {other[:3]}")
    if full:
        e = full[0]
        check(e.response.headers.get("retry-after") is not None, "503 has Retry-After")
        body = e.body if isinstance(e.body, dict) else {}
        check(isinstance(body.get("message"), str) or isinstance(body.get("error"), dict),
              f"503 has a JSON error body: {e.body!r}")
    st, _, _ = get(srv.port, "/health")
    check(st == 200, "health after the queue overflowed")


# ---- disconnects -------------------------------------------------------------------------

def raw_request(port, body):
    s = socket.create_connection(("127.0.0.1", port), timeout=10 * SLOW)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def wait_idle(port, limit):
    t_end = time.time() + limit
    while True:
        act = metric(port, "tokenloop_sequences_active")
        wait = metric(port, "tokenloop_requests_waiting")
        if act == 0 and wait == 0:
            return True
        if time.time() > t_end:
            print(f"  still active {act}, waiting {wait}")
            return False
        time.sleep(0.05)


def test_disconnects(srv):
    # Mid-stream: read the first frames of a long stream, then vanish.
    socks = []
    for i in range(4):
        s = raw_request(srv.port, chat_body(f"Write a long story number {i}.", max_tokens=400, stream=True))
        got = b""
        t_end = time.time() + 30 * SLOW
        while b"data: {" not in got and time.time() < t_end:
            got += s.recv(4096)
        check(b"data: {" in got, f"stream {i} started")
        socks.append(s)
    check(metric(srv.port, "tokenloop_sequences_active") > 0, "streams are running")
    for s in socks:
        s.close()
    check(wait_idle(srv.port, 2 * SLOW), "mid-stream disconnects: no sequence left within 2 s")

    # Mid-prefill: a long prompt, gone right after sending it.
    long_text = "The rain in Spain stays mainly in the plain. " * 150
    socks = [raw_request(srv.port, chat_body(long_text + str(i), max_tokens=64, stream=i % 2 == 0))
             for i in range(3)]
    time.sleep(0.2)
    for s in socks:
        s.close()
    check(wait_idle(srv.port, 2 * SLOW), "mid-prefill disconnects: no sequence left within 2 s")
    used = metric(srv.port, "tokenloop_kv_blocks_used")
    check(used == 0, f"no KV blocks held after the disconnects ({used})")
    st, body, _ = post(srv.port, "/v1/chat/completions", chat_body("Hello!", max_tokens=4))
    check(st == 200 and json.loads(body)["choices"][0]["finish_reason"] in ("stop", "length"),
          f"a request after the disconnects works: {st} {body[:200]}")


# ---- SIGTERM -----------------------------------------------------------------------------

def test_sigterm():
    srv = Server("-np", "2", "-t", "2", "-c", "1024", "--drain-timeout", str(30 * SLOW))
    try:
        if not check(srv.wait_ready(), "drain server ready"):
            return
        # Long enough to be still running after the signal on a fast machine:
        # the end-of-text tokens (<|endoftext|> 0, <|im_end|> 2) are banned.
        body = chat_body("Count from one to one hundred.", max_tokens=300, stream=True)
        body["logit_bias"] = {"0": -100, "2": -100}
        s = raw_request(srv.port, body)
        got = b""
        t_end = time.time() + 30 * SLOW
        while b"data: {" not in got and time.time() < t_end:
            got += s.recv(4096)
        check(b"data: {" in got, "stream started before SIGTERM")
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        st, _, _ = get(srv.port, "/ready")
        check(st == 503, f"/ready is 503 while draining ({st})")
        st, body, hdr = post(srv.port, "/v1/chat/completions", chat_body("Hi", max_tokens=4))
        check(st == 503, f"new request while draining gets 503 ({st})")
        check("retry-after" in hdr, "draining 503 has Retry-After")
        try:
            json.loads(body)["error"]
            check(True, "")
        except (ValueError, KeyError, TypeError):
            check(False, f"draining 503 body is a JSON error: {body[:200]}")
        t_end = time.time() + 60 * SLOW
        while b"data: [DONE]" not in got and time.time() < t_end:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        s.close()
        frames = [json.loads(l[6:]) for l in got.decode("utf-8", "replace").split("\n")
                  if l.startswith("data: {")]
        fin = [f["choices"][0].get("finish_reason") for f in frames if f.get("choices")]
        check(b"data: [DONE]" in got and fin and fin[-1] in ("stop", "length"),
              f"the in-flight stream completed (finish {fin[-1:] if fin else None})")
        check(not any("error" in f for f in frames), "no error chunk in the drained stream")
        try:
            rc = srv.proc.wait(timeout=30 * SLOW)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, f"exit code 0 after draining ({rc})")
    finally:
        srv.stop()


def main():
    check(os.path.exists(TL_BIN), f"TL_BIN {TL_BIN} exists")
    check(os.path.exists(MODEL), f"model {MODEL} exists")
    if tlcheck.failed:
        tlcheck.finish()
    t0 = time.time()
    try:
        run_all()
    except Exception as e:  # a crash is a failed check, and the summary still prints
        check(False, f"unexpected error: {type(e).__name__}: {e}")
    print(f"  total {time.time() - t0:.1f} s")
    tlcheck.finish()


def run_all():
    big = Server("-np", "16", "--max-queue", "256", "-t", "2", "-c", "2048")
    try:
        if check(big.wait_ready(), "server ready"):
            test_crowd(big)
            test_disconnects(big)
    finally:
        big.stop()
    small = Server("-np", "2", "--max-queue", "4", "-t", "2", "-c", "512")
    try:
        if check(small.wait_ready(), "small-queue server ready"):
            test_queue_full(small)
    finally:
        small.stop()
    test_sigterm()


if __name__ == "__main__":
    main()
