"""A served model is resident once: after start-up and after one request,
`tokenloop serve`'s RSS stays within 1.1x the file plus the KV cache touched
plus 64 MiB (issue 29), on SmolLM2, Gemma 3 and a random mixture of experts.
The packed weights replace the file's pages (their pages are dropped once
packed), and the KV pool's first blocks of each layer are on small pages, so
a short request does not make 2 MiB per layer resident.
Under ASan (TL_ASAN=1) the shadow memory and allocator add their own share:
the bound there is 2x the file plus 160 MiB, and the file pages must still be
dropped (RssFile).
Run: TL_BIN=build/tokenloop python3 tests/py/test_rss.py"""
import http.client
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
import tlserver  # noqa: E402
from tlcheck import check  # noqa: E402

ROOT = tlcheck.ROOT
ASAN = os.environ.get("TL_ASAN") == "1"
MIB = 1 << 20


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssFile", "RssAnon"):
                out[k] = int(v.split()[0]) * 1024
    return out


def kv_touched(model_info, n_tokens):
    """Bytes of f16 K and V the request's positions fill, in whole 16-position
    blocks, plus a 4 KiB page per layer's K and V for the rounding."""
    layers, kv_dim = model_info
    blocks = (n_tokens + 15) // 16
    return layers * 2 * (blocks * 16 * kv_dim * 2 + 4096)


def complete(port, prompt):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": prompt, "max_tokens": 24, "temperature": 0}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        return r.status, body
    finally:
        c.close()


def one(path, info, what):
    size = os.path.getsize(path)
    srv = tlserver.Server(path, ("-np", "4", "-t", "2"))
    try:
        if not check(srv.wait_ready(), f"{what}: server ready"):
            return
        st0 = status(srv.proc.pid)
        code, body = complete(srv.port, "The three most important inventions of the nineteenth century were")
        if not check(code == 200, f"{what}: request answered ({code})"):
            return
        n = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        st1 = status(srv.proc.pid)
        kv = kv_touched(info, n)
        bound = 2 * size + 160 * MIB if ASAN else int(1.1 * size) + kv + 64 * MIB
        for when, st in (("after start-up", st0), ("after one request", st1)):
            print(f"  {what} {when}: RSS {st['VmRSS'] / MIB:.1f} MiB (file pages {st['RssFile'] / MIB:.1f}, "
                  f"anonymous {st['RssAnon'] / MIB:.1f}); file {size / MIB:.1f} MiB, KV touched {kv / MIB:.2f} MiB, "
                  f"bound {bound / MIB:.1f} MiB")
            check(st["VmRSS"] <= bound, f"{what} {when}: RSS {st['VmRSS'] / MIB:.1f} MiB > {bound / MIB:.1f} MiB")
            # the packed copy is what is read: the file is not resident beside it
            check(st["RssFile"] < 0.25 * size + 32 * MIB,
                  f"{what} {when}: {st['RssFile'] / MIB:.1f} MiB of the file stays resident")
    finally:
        srv.stop()


def main():
    smol = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    gemma = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
    moe = os.path.join(ROOT, "models", "random", "rss_qwen3moe.gguf")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), "qwen3moe", moe, "--seed", "41",
                        "--type", "q8_0"], capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"mkmodel.py qwen3moe: {p.stderr[-300:]}")
    for path in (tlserver.TL_BIN, smol, gemma, moe):
        check(os.path.exists(path), f"{path} exists")
    if tlcheck.failed:
        tlcheck.finish()
    # (layers, KV width) of each: SmolLM2 30 x 3 heads of 64, Gemma 3 270M 18 x 1 of 256,
    # mkmodel's qwen3moe 2 x 2 of 32
    one(smol, (30, 192), "SmolLM2")
    one(gemma, (18, 256), "Gemma 3")
    one(moe, (2, 64), "random qwen3moe")
    tlcheck.finish()


if __name__ == "__main__":
    main()
