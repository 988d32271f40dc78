"""One `tokenloop serve` on a free port for the server tests: start, wait
until /ready, and stop() that always leaves no process. TL_SERVER_LOG=1 shows
the server's output; otherwise it is kept and printed if it never got ready."""
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time

from tlcheck import ROOT

TL_BIN = os.path.abspath(os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop")))
# ASan makes every step several times slower; waits stretch to match.
SLOW = 4 if os.environ.get("TL_ASAN") == "1" else 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model, args=()):
        self.port = free_port()
        self.log = sys.stderr if os.environ.get("TL_SERVER_LOG") else tempfile.TemporaryFile()
        self.proc = subprocess.Popen([TL_BIN, "serve", "-m", model, "--port", str(self.port), *args],
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
