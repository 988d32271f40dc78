"""Requests that can never run are answered 4xx, not 503: 503 with Retry-After
is for overload and draining, and a proxy's `retry-on 503` (HAProxy's, in
deploy/haproxy/) would replay a hopeless request on every replica. On a server
whose KV cache (--kv-mem 8: 352 positions) is smaller than its context (-c
1024), through each vendor's own client and raw HTTP, streamed and not:
- a request needing more KV cache than the whole pool: 400
  context_length_exceeded, the message naming both numbers;
- prompt + max_tokens beyond -c, and a prompt alone beyond it: 400
  context_length_exceeded naming the context;
- a grammar past what the matcher can follow: 400;
each with the OpenAI error shape ({"error":{message,type,param,code}}) on
/v1/chat/completions, /v1/completions and /v1/responses, Anthropic's
({"type":"error","error":{"type":"invalid_request_error","message"}}) on
/v1/messages, no Retry-After, and a stream refused with its status before
any 200. A request that fits still runs. Needs $TL_BIN, the SmolLM2 model
and the openai and anthropic packages (missing is a failure, not a skip).
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_errors.py"""
import http.client
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlserver  # noqa: E402
from tlcheck import ROOT, check, finish  # noqa: E402
from tlserver import SLOW, TL_BIN  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
T = 120 * SLOW
CTX, KV_MIB = 1024, 8
MSGS = [{"role": "user", "content": "Name three colours."}]
# root ::= a a ... "x" with a ::= "" | "": 2^30 ways to the one state after "x"
BAD_GRAMMAR = "root ::= " + "a " * 30 + '"x"\na ::= "" | ""\n'


def raw(port, path, body):
    """(status, headers, parsed JSON or the raw bytes) of one POST."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=T)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        b = r.read()
        try:
            b = json.loads(b)
        except ValueError:
            pass
        return r.status, {k.lower(): v for k, v in r.getheaders()}, b
    finally:
        c.close()


def openai_shape(b, code):
    e = b.get("error") if isinstance(b, dict) else None
    return (isinstance(e, dict) and set(e) == {"message", "type", "param", "code"} and e["type"] == "invalid_request_error"
            and isinstance(e["message"], str) and e["message"] != "" and e["code"] == code)


def anthropic_shape(b):
    e = b.get("error") if isinstance(b, dict) else None
    return (isinstance(b, dict) and b.get("type") == "error" and isinstance(e, dict)
            and e.get("type") == "invalid_request_error" and isinstance(e.get("message"), str) and e["message"] != "")


def test_raw(port, kv_positions):
    """Status, headers and body shape on each endpoint, streamed and not."""
    kv = {"max_tokens": 600}  # fits -c 1024, not a 352-position pool
    cases = [
        ("chat, more KV than the pool", "/v1/chat/completions", {"messages": MSGS, **kv}, "context_length_exceeded",
         ["KV cache", str(kv_positions), "--kv-mem"]),
        ("chat, no max_tokens: the whole context, more KV than the pool", "/v1/chat/completions",
         {"messages": MSGS}, "context_length_exceeded", ["KV cache", str(kv_positions), "max_tokens"]),
        ("completion, more KV than the pool", "/v1/completions", {"prompt": "Once upon a time", **kv},
         "context_length_exceeded", ["KV cache", str(kv_positions)]),
        ("chat, beyond -c", "/v1/chat/completions", {"messages": MSGS, "max_tokens": 1010}, "context_length_exceeded",
         [str(CTX)]),
        ("completion, the prompt alone beyond -c", "/v1/completions", {"prompt": "hi " * 1500, "max_tokens": 4},
         "context_length_exceeded", [str(CTX)]),
        ("chat, a grammar the matcher cannot follow", "/v1/chat/completions",
         {"messages": MSGS, "max_tokens": 4, "grammar": BAD_GRAMMAR}, None, ["grammar"]),
        ("responses, more KV than the pool", "/v1/responses", {"input": "hi", "max_output_tokens": 600},
         "context_length_exceeded", ["KV cache", str(kv_positions)]),
    ]
    for name, path, body, code, words in cases:
        for stream in (False, True):
            st, hdr, b = raw(port, path, {**body, "stream": stream})
            what = f"{name}{' (stream)' if stream else ''}"
            check(st == 400, f"{what}: status {st}, want 400: {str(b)[:300]}")
            check("retry-after" not in hdr, f"{what}: no Retry-After")
            check(hdr.get("content-type", "").startswith("application/json"), f"{what}: a JSON body, not a stream")
            check(openai_shape(b, code), f"{what}: the OpenAI error shape with code {code}: {str(b)[:300]}")
            msg = b["error"]["message"] if openai_shape(b, code) else ""
            check(all(w in msg for w in words), f"{what}: the message names the limit {words}: {msg!r}")
    for stream in (False, True):
        st, hdr, b = raw(port, "/v1/messages", {"model": "m", "messages": MSGS, "max_tokens": 600, "stream": stream})
        what = f"messages, more KV than the pool{' (stream)' if stream else ''}"
        check(st == 400 and "retry-after" not in hdr and anthropic_shape(b), f"{what}: {st} {str(b)[:300]}")
        check(anthropic_shape(b) and "KV cache" in b["error"]["message"], f"{what}: the message names the limit")
    st, _, b = raw(port, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 8, "temperature": 0})
    check(st == 200 and b["usage"]["completion_tokens"] > 0, f"a request that fits runs: {st} {str(b)[:200]}")


def test_openai(url, openai):
    cl = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=T)
    calls = [
        ("chat", lambda s: cl.chat.completions.create(model="m", messages=MSGS, max_tokens=600, stream=s),
         "context_length_exceeded"),
        ("completions", lambda s: cl.completions.create(model="m", prompt="Once upon", max_tokens=600, stream=s),
         "context_length_exceeded"),
        ("chat, grammar", lambda s: cl.chat.completions.create(model="m", messages=MSGS, max_tokens=4, stream=s,
                                                               extra_body={"grammar": BAD_GRAMMAR}), None),
        ("responses", lambda s: cl.responses.create(model="m", input="hi", max_output_tokens=600, stream=s),
         "context_length_exceeded"),
    ]
    for name, call, code in calls:
        for stream in (False, True):
            what = f"openai {name}{' (stream)' if stream else ''}"
            try:
                r = call(stream)
                if stream:
                    list(r)
                check(False, f"{what}: no error")
            except openai.BadRequestError as e:
                check(e.status_code == 400 and e.code == code and e.type == "invalid_request_error",
                      f"{what}: BadRequestError code {e.code!r} type {e.type!r}")
            except Exception as e:  # noqa: BLE001 - any other outcome is the failure reported
                check(False, f"{what}: {type(e).__name__} {e}")


def test_anthropic(url, anthropic):
    ac = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=T)
    for stream in (False, True):
        what = f"anthropic messages{' (stream)' if stream else ''}"
        try:
            r = ac.messages.create(model="m", messages=MSGS, max_tokens=600, stream=stream)
            if stream:
                list(r)
            check(False, f"{what}: no error")
        except anthropic.BadRequestError as e:
            check(e.status_code == 400 and anthropic_shape(e.body), f"{what}: BadRequestError body {e.body}")
        except Exception as e:  # noqa: BLE001
            check(False, f"{what}: {type(e).__name__} {e}")


def main():
    if not check(os.access(TL_BIN, os.X_OK), f"no binary at {TL_BIN}"):
        finish()
    if not check(os.path.exists(MODEL), f"missing {MODEL} (run make models)"):
        finish()
    try:
        import anthropic
        import openai
    except ImportError as e:
        check(False, f"{e} (run scripts/setup.sh)")
        finish()
    srv = tlserver.Server(MODEL, ["-np", "2", "-t", "2", "-c", str(CTX), "--kv-mem", str(KV_MIB)])
    try:
        if check(srv.wait_ready(), "server did not become ready"):
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=T)
            c.request("GET", "/metrics")
            m = c.getresponse().read().decode()
            c.close()
            blocks = [ln.split()[1] for ln in m.splitlines() if ln.startswith("tokenloop_kv_blocks_total ")]
            kv_positions = int(float(blocks[0])) * 16 if blocks else -1
            check(0 < kv_positions < CTX, f"the pool ({kv_positions} positions) is smaller than -c {CTX}")
            test_raw(srv.port, kv_positions)
            test_openai(srv.url, openai)
            test_anthropic(srv.url, anthropic)
    finally:
        srv.stop()
    finish()


if __name__ == "__main__":
    main()
