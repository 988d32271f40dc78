"""One client that opens thousands of connections and never finishes them
cannot lock the others out: 4,000 connections from 127.0.0.2, each sending
part of a request's headers and body and then nothing, while /health from
127.0.0.1 answers within a second and a completion succeeds; the server caps
one address's connections (--max-conns-per-client 128 here; 512 by default)
and closes the rest at once. Afterwards everything still answers.

Then the read deadline (--read-timeout 2 here, 30 by default): a client that
sends its headers or its body a byte now and then, or keeps an idle
keep-alive connection after a reply, is cut within a second or so of the
deadline; replies that take longer than the deadline, whole or streamed,
are not.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_slow.py"""
import http.client
import json
import os
import socket
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, Server, flood, raise_fd_limit  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
N = 4000
N_LONG = 1500  # tokens: longer than the 2 s deadline on one thread
if os.environ.get("TL_ASAN") == "1":
    N_LONG = 400  # the sanitizers slow decoding ~6x: still well past the deadline


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    n = min(N, raise_fd_limit(N + 256) - 256)
    srv = Server(MODEL, ["-np", "2", "-t", "2", "-c", "1024", "--max-conns-per-client", "128"])
    socks = []
    try:
        if not check(srv.wait_ready(), "server ready"):
            tlcheck.finish()
        t0 = time.time()
        socks, closed, refused = flood(srv.port, n)
        opened = time.time() - t0
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
    deadline()
    tlcheck.finish()


def cut_after(s, drip=None, every=0.4, limit=15):
    """Seconds until the server closes socket s; drip: bytes sent one at a time meanwhile."""
    t0 = time.time()
    s.settimeout(every)
    i = 0
    while time.time() - t0 < limit * SLOW:
        try:
            if s.recv(4096) == b"":
                return time.time() - t0
        except socket.timeout:
            pass
        except OSError:
            return time.time() - t0
        if drip is not None:
            try:
                s.sendall(drip[i % len(drip):i % len(drip) + 1])
            except OSError:
                return time.time() - t0
            i += 1
    return None


def deadline():
    srv = Server(MODEL, ["-np", "2", "-t", "1", "-c", "2048", "--read-timeout", "2"])
    try:
        if not check(srv.wait_ready(), "server ready (--read-timeout 2)"):
            return
        lim = 2 + 1.5 * SLOW
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        dt = cut_after(s, drip=b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n")
        s.close()
        check(dt is not None and 1.8 < dt < lim, f"headers a byte at a time: cut after {dt} s (deadline 2)")
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        dt = cut_after(s, drip=b" ")
        s.close()
        check(dt is not None and 1.8 < dt < lim, f"a body a byte at a time: cut after {dt} s")
        # an idle keep-alive connection: the deadline counts from the end of the reply
        s = socket.create_connection(("127.0.0.1", srv.port))
        time.sleep(1.2)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = s.recv(4096)
        dt = cut_after(s)
        s.close()
        check(got.startswith(b"HTTP/1.1 200") and dt is not None and 1.8 < dt < lim,
              f"idle after a reply (sent 1.2 s after connecting): cut {dt} s after the reply")
        # replies longer than the deadline are not cut
        bias = {"0": -100, "2": -100}
        for stream in (False, True):
            body = json.dumps({"prompt": "Once upon a time", "max_tokens": N_LONG, "temperature": 0,
                               "logit_bias": bias, "stream": stream,
                               **({"stream_options": {"include_usage": True}} if stream else {})}).encode()
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120 * SLOW)
            t0 = time.time()
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            dt = time.time() - t0
            n = None
            if stream:
                ev = [json.loads(l[6:]) for l in data.decode().split("\n") if l.startswith("data: {")]
                n = ev[-1]["usage"]["completion_tokens"] if ev and ev[-1].get("usage") else None
                done = data.rstrip().endswith(b"data: [DONE]")
            else:
                n = json.loads(data)["usage"]["completion_tokens"]
                done = True
            check(r.status == 200 and done and n == N_LONG and dt > 2,
                  f"{'streamed' if stream else 'whole'} reply of {dt:.1f} s (deadline 2): {n} tokens")
            # the same connection serves the next request
            conn.request("GET", "/health")
            check(conn.getresponse().read() == b'{"status":"ok"}', "keep-alive after the long reply")
            conn.close()
        m = urllib.request.urlopen(srv.url + "/metrics", timeout=5).read().decode()
        cut = [l for l in m.splitlines() if l.startswith("tokenloop_connections_timed_out_total")]
        check(cut and float(cut[0].split()[-1]) >= 3, f"/metrics counts the cut connections: {cut}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
