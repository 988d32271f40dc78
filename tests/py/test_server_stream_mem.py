"""A long streamed reply does not grow the server's memory beyond its KV cache.
On a tiny random model (scripts/mkmodel.py: 2 layers, 512 bytes of KV a
token, so the KV's own growth is small beside what a per-token leak would
add), one streamed completion of N tokens (end tokens banned by logit_bias,
so it runs to max_tokens) is read to its end while /proc/PID/status VmRSS is
sampled. After a warm-up request (first-call buffers), the growth of the
server's peak RSS, less the KV blocks the stream wrote (/metrics:
tokenloop_kv_blocks_touched x tokenloop_kv_block_bytes), must stay under a
bound. The server once kept every event of a stream (~300 bytes a token and
its text) until the request ended: 20,000 tokens grew it 4.7 MiB beyond the
9.8 MiB of KV they wrote (now -1.6: nothing beyond it). Run: TL_BIN=build/tokenloop python3 tests/py/test_server_stream_mem.py"""
import http.client
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlserver  # noqa: E402
from tlcheck import ROOT, check, finish  # noqa: E402
from tlserver import SLOW, TL_BIN  # noqa: E402

MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")
N = 20000        # tokens streamed
CTX = 24576      # -c: room for them
BOUND_MIB = 2.0  # peak RSS growth beyond the KV written: measured -1.6 MiB now, +4.7 with the old code
T = 600 * SLOW


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=T)
    try:
        c.request("GET", "/metrics")
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    finally:
        c.close()
    return -1.0


def stream(port, n, pid=None):
    """Streams an n-token completion to its end; returns (chunks, finish reason, peak RSS KiB)."""
    # the end tokens of the llama-spm vocabulary (<unk>, <s>, </s>) are banned: it runs to n
    body = {"prompt": "Once upon a time", "max_tokens": n, "stream": True, "temperature": 1.0, "seed": 7,
            "logit_bias": {"0": -100, "1": -100, "2": -100}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=T)
    chunks, finish, peak = 0, None, 0
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return 0, f"status {r.status}: {r.read()[:200]!r}", 0
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            chunks += 1
            ch = json.loads(line[6:])["choices"][0]
            finish = ch.get("finish_reason") or finish
            if pid and chunks % 200 == 0:
                peak = max(peak, rss_kib(pid))
    finally:
        c.close()
    if pid:
        peak = max(peak, rss_kib(pid))
    return chunks, finish, peak


def main():
    if not check(os.access(TL_BIN, os.X_OK), f"no binary at {TL_BIN}"):
        finish()
    if os.environ.get("TL_ASAN") == "1":
        # ASan keeps freed memory in a quarantine (256 MiB) to catch use after
        # free, so every freed event would still count in RSS: without it,
        # freed blocks are reused as under the plain allocator
        opts = os.environ.get("ASAN_OPTIONS", "")
        os.environ["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "quarantine_size_mb=0"
        global BOUND_MIB, N
        BOUND_MIB = 3.0  # its shadow and redzones: +1.1 measured under ASan
        # a shorter stream: 20,000 tokens take 3 minutes under the sanitizers
        # (the plain run streams them all; a leak of the old kind, 300 bytes
        # a token, would still add 1.4 MiB here)
        N = 5000
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        mk = subprocess.run([sys.executable, MKMODEL, "qwen2", model], capture_output=True, text=True, timeout=300)
        if not check(mk.returncode == 0, f"mkmodel failed: {mk.stderr[-500:]}"):
            finish()
        srv = tlserver.Server(model, ["-np", "1", "-c", str(CTX), "-t", "2", "--no-loop", "--spec", "off"])
        try:
            if not check(srv.wait_ready(), "server did not become ready"):
                finish()
            pid = srv.proc.pid
            n, fin, _ = stream(srv.port, 300)  # warm-up: buffers made at the first calls
            check(n >= 300 and fin == "length", f"warm-up stream: {n} chunks, finish {fin}")
            rss0 = rss_kib(pid)
            kv0 = metric(srv.port, "tokenloop_kv_blocks_touched")
            n, fin, peak = stream(srv.port, N, pid)
            check(n >= N and fin == "length", f"long stream: {n} chunks, finish {fin}")
            kv1 = metric(srv.port, "tokenloop_kv_blocks_touched")
            block = metric(srv.port, "tokenloop_kv_block_bytes")
            kv_mib = (kv1 - kv0) * block / 2**20
            grew = (peak - rss0) / 1024
            print(f"{N}-token stream: RSS {rss0 / 1024:.1f} -> peak {peak / 1024:.1f} MiB (+{grew:.1f}), "
                  f"KV written {kv_mib:.1f} MiB, beyond it {grew - kv_mib:.1f} MiB (bound {BOUND_MIB})")
            check(kv1 >= kv0 and block > 0, f"KV metrics: {kv0} -> {kv1} blocks of {block} bytes")
            check(grew - kv_mib < BOUND_MIB,
                  f"RSS grew {grew:.1f} MiB over a {N}-token stream, {grew - kv_mib:.1f} MiB beyond the "
                  f"{kv_mib:.1f} MiB of KV it wrote (bound {BOUND_MIB} MiB)")
        finally:
            srv.stop()
    finish()


if __name__ == "__main__":
    main()
