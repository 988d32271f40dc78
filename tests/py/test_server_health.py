"""/health and /ready through a server's life, as llama-server's convention
has it (scripts wait on /health, then send): while the model loads, /health
answers 503 with llama-server's body ({"error": {"code": 503, "message":
"Loading model", "type": "unavailable_error"}}), /ready 503 and a completion
503; once loaded, both 200; while draining after SIGTERM, /health stays 200
(alive: a liveness probe must not kill a pod finishing its requests) and
/ready turns 503. The loading phase is held open by the test-only hook
TL_TEST_LOAD_GATE=PATH (the load starts once PATH exists), so nothing here
races a real load. Run: TL_BIN=build/tokenloop python3 tests/py/test_server_health.py"""
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
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, TL_BIN, free_port  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def req(port, method, path, body=None):
    """(status, body text), or (None, error) when nothing answers."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10 * SLOW)
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    except OSError as e:
        return None, str(e)
    finally:
        c.close()


def wait_for(port, path, want, timeout=60):
    """Polls until path answers with status want; returns the last (status, body)."""
    t_end = time.time() + timeout * SLOW
    last = (None, "")
    while time.time() < t_end:
        last = req(port, "GET", path)
        if last[0] == want:
            break
        time.sleep(0.05)
    return last


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    with tempfile.TemporaryDirectory() as tmp:
        gate = os.path.join(tmp, "gate")
        port = free_port()
        log = tempfile.TemporaryFile()
        env = dict(os.environ, TL_TEST_LOAD_GATE=gate)
        p = subprocess.Popen([TL_BIN, "serve", "-m", MODEL, "--port", str(port), "-np", "1", "-t", "2",
                              "-c", "1024", "--drain-timeout", str(60 * SLOW)],
                             stdout=log, stderr=log, env=env)
        try:
            # loading: the gate is shut, so every answer now is a loading one
            st, body = wait_for(port, "/health", 503, timeout=30)
            try:
                err = json.loads(body)
            except ValueError:
                err = None
            check(st == 503 and err == {"error": {"code": 503, "message": "Loading model",
                                                  "type": "unavailable_error"}},
                  f"/health while loading: 503 with llama-server's body, got {st} {body[:200]}")
            st, body = req(port, "GET", "/ready")
            check(st == 503 and "loading" in body, f"/ready while loading: {st} {body[:200]}")
            st, body = req(port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
            check(st == 503 and "loading" in body, f"a completion while loading: {st} {body[:200]}")
            st, _ = req(port, "GET", "/metrics")
            check(st == 200, f"/metrics while loading: {st}")
            check(p.poll() is None, "the server waits at the gate")

            # loaded
            open(gate, "w").close()
            st, body = wait_for(port, "/health", 200)
            check(st == 200 and json.loads(body or "null") == {"status": "ok"},
                  f"/health once loaded: {st} {body[:200]}")
            st, body = req(port, "GET", "/ready")
            check(st == 200, f"/ready once loaded: {st} {body[:200]}")

            # draining: a stream runs (its end-of-text tokens banned), SIGTERM
            s = socket.create_connection(("127.0.0.1", port), timeout=30 * SLOW)
            body = json.dumps({"prompt": "Count from one to one thousand:", "max_tokens": 900, "stream": True,
                               "logit_bias": {"0": -100, "2": -100}}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            got = b""
            while b"data: {" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            check(b"data: {" in got, "the stream started before SIGTERM")
            p.send_signal(signal.SIGTERM)
            st, body = wait_for(port, "/ready", 503, timeout=10)
            check(st == 503 and "draining" in body, f"/ready while draining: {st} {body[:200]}")
            st, body = req(port, "GET", "/health")
            check(st == 200, f"/health while draining stays 200: {st} {body[:200]}")
            s.close()  # the client goes: its sequence is freed and the drain ends
            try:
                rc = p.wait(timeout=60 * SLOW)
            except subprocess.TimeoutExpired:
                rc = None
            check(rc == 0, f"exit 0 after draining: {rc}")

            # a signal while held at the gate ends the wait: exit 0
            gate2 = os.path.join(tmp, "never")
            port2 = free_port()
            p2 = subprocess.Popen([TL_BIN, "serve", "-m", MODEL, "--port", str(port2)], stdout=log, stderr=log,
                                  env=dict(os.environ, TL_TEST_LOAD_GATE=gate2))
            st, _ = wait_for(port2, "/health", 503, timeout=30)
            check(st == 503, f"second server loading: {st}")
            p2.send_signal(signal.SIGTERM)
            try:
                rc = p2.wait(timeout=30 * SLOW)
            except subprocess.TimeoutExpired:
                p2.kill()
                rc = None
            check(rc == 0, f"SIGTERM while loading: exit {rc}")
        finally:
            for proc in (p, locals().get("p2")):
                if proc and proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
            if tlcheck.failed:
                log.seek(0)
                print(log.read().decode(errors="replace")[-3000:])
    tlcheck.finish()


if __name__ == "__main__":
    main()
