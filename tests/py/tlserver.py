"""One `tokenloop serve` on a free port for the server tests: start, wait
until /ready, and stop() that always leaves no process. TL_SERVER_LOG=1 shows
the server's output; otherwise it is kept and printed if it never got ready."""
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

from tlcheck import ROOT

TL_BIN = os.path.abspath(os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop")))
# ASan makes every step several times slower; waits stretch to match.
SLOW = 4 if os.environ.get("TL_ASAN") == "1" else 1


def metric(port, name, timeout=30):
    """A gauge or counter from the server's /metrics, or None when absent."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout * SLOW)
    try:
        c.request("GET", "/metrics")
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    finally:
        c.close()
    return None


def post_json(port, path, body, timeout=300):
    """POST body as JSON; the reply's JSON, or RuntimeError naming the HTTP
    status and the start of the reply."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout * SLOW)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        reply = json.loads(r.read())
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {json.dumps(reply)[:300]}")
        return reply
    finally:
        c.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model, args=(), prefix=()):
        """prefix: a command the server runs under (valgrind and its options)."""
        self.port = free_port()
        self.log = sys.stderr if os.environ.get("TL_SERVER_LOG") else tempfile.TemporaryFile()
        self.proc = subprocess.Popen([*prefix, TL_BIN, "serve", "-m", model, "--port", str(self.port), *args],
                                     stdout=self.log, stderr=self.log)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout=60):
        t_end = time.time() + timeout * SLOW
        while time.time() < t_end and self.proc.poll() is None:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                try:
                    c.request("GET", "/ready")
                    if c.getresponse().status == 200:
                        return True
                finally:
                    c.close()
            except OSError:
                pass
            time.sleep(0.1)
        if self.log is not sys.stderr:
            self.log.seek(0)
            print(self.log.read().decode(errors="replace")[-3000:])
        return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def serve_ready(model, args, env_extra=None, prefix=(), until="ready ("):
    """Starts `tokenloop serve` on a free port and reads its output up to the
    ready line (or the first holding `until`); returns (process, port, that
    line or None, all output so far). Stop it with stop_ready."""
    port = free_port()
    env = dict(os.environ, **(env_extra or {}))
    p = subprocess.Popen([*prefix, TL_BIN, "serve", "-m", model, "--port", str(port), "-t", "2", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines, ready = [], None
    t_end = time.time() + 60 * SLOW
    while time.time() < t_end:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if until in line:
            ready = line
            break
    return p, port, ready, "".join(lines)


def stop_ready(p):
    p.kill()
    p.wait(timeout=30)


def raise_fd_limit(n):
    """Lets this process, and what it starts, open n descriptors; returns how many it may."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(hard, n)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


def flood(port, n, src="127.0.0.2"):
    """n connections from address src to port, each sending part of a
    completion's headers and body and then nothing. Returns (open sockets,
    how many the server closed within half a second, how many connects failed)."""
    part = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{")
    socks, refused = [], 0
    for _ in range(n):
        s = socket.socket()
        s.settimeout(2)
        try:
            s.bind((src, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(part)
            socks.append(s)
        except OSError:
            refused += 1
            s.close()
    # the ones over a cap are closed at once: reading them gives EOF or a reset
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
    return socks, closed, refused
