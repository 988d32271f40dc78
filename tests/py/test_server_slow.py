"""One client that opens thousands of connections and never finishes them
cannot lock the others out: 4,000 connections from 127.0.0.2, each sending
part of a request's headers and body and then nothing, while /health from
127.0.0.1 answers within a second and a completion succeeds; the server caps
one address's connections (--max-conns-per-client 128 here; 512 by default)
and closes the rest at once. Afterwards everything still answers.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_slow.py"""
import json
import os
import resource
import socket
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, Server  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
N = 4000


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, N + 256) if hard != resource.RLIM_INFINITY else N + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    n = min(N, want - 256)
    srv = Server(MODEL, ["-np", "2", "-t", "2", "-c", "1024", "--max-conns-per-client", "128"])
    socks = []
    try:
        if not check(srv.wait_ready(), "server ready"):
            tlcheck.finish()
        part = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        refused = 0
        t0 = time.time()
        for _ in range(n):
            s = socket.socket()
            s.settimeout(2)
            try:
                s.bind(("127.0.0.2", 0))
                s.connect(("127.0.0.1", srv.port))
                s.sendall(part)
                socks.append(s)
            except OSError:
                refused += 1
                s.close()
        opened = time.time() - t0
        # the server closes the ones over the cap: reading them gives EOF or a reset
        time.sleep(0.5)
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        held = len(socks) - closed
        t1 = time.time()
        try:
            code = urllib.request.urlopen(srv.url + "/health", timeout=5).status
        except OSError as e:  # reset: the connections ran out for everyone
            code = str(e)
        dt = time.time() - t1
        check(code == 200 and dt < 1.0 * SLOW, f"/health from another address while {n} connections hang: "
                                               f"{code} in {dt * 1e3:.0f} ms")
        body = json.dumps({"prompt": "Hello", "max_tokens": 4, "temperature": 0}).encode()
        req = urllib.request.Request(srv.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        try:
            usage = json.loads(urllib.request.urlopen(req, timeout=60 * SLOW).read())["usage"]
        except OSError as e:
            usage = {"error": str(e)}
        check(usage.get("completion_tokens") == 4, f"a completion while they hang: {usage}")
        print(f"{n} connections from 127.0.0.2: {held} held, {closed} closed by the server, {refused} refused")
        check(held <= 128, f"one address holds at most 128 connections: {held} held, {closed + refused} refused "
                           f"of {n} (opened in {opened:.1f} s)")
        m = urllib.request.urlopen(srv.url + "/metrics", timeout=5).read()
        check(b"tokenloop_requests_total" in m, "/metrics answers too")
    finally:
        for s in socks:
            s.close()
        srv.stop()
    tlcheck.finish()


if __name__ == "__main__":
    main()
