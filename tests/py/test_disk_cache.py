"""The prefix cache on disk (serve --cache-dir, issue 30): a prompt served,
the server stopped and started again on the same directory, and the same
prompt comes back from disk (cached_tokens) with the same tokens and
log-probabilities as the first time, bit for bit; files computed with
another KV type in the same directory are ignored and logged, never used; a
block file damaged on disk is refused by its checksum (logged, deleted) and
its positions computed again, with the same answer; the directory keeps to
--cache-disk-mem, the least recently used blocks deleted first. A Phi-3
LongRoPE model rotates its keys by other factors at a context above its
original one: blocks written at -c 1024 are not used by a server at -c 256.
Run: TL_BIN=build/tokenloop python3 tests/py/test_disk_cache.py"""
import glob
import http.client
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
import tlserver  # noqa: E402
from tlcheck import check  # noqa: E402
from tlserver import SLOW, metric  # noqa: E402

ROOT = tlcheck.ROOT
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
# about 1,500 tokens
PREFIX = "Reference notes, read carefully. " + " ".join(
    f"Item {i}: the entry for {['owls', 'glass', 'tea', 'maps'][i % 4]} records value {i * 37 % 101}." for i in range(90))
PROMPT = PREFIX + "\nQuestion: which item records value 5? Answer:"


def start(cache_dir, *args):
    p, port, line, out = tlserver.serve_ready(MODEL, ["-np", "2", "-c", "2048", "--cache-dir", cache_dir, *args],
                                              until="tokenloop serve: disk cache")
    return p, port if line else None, out


def stop(p, graceful=True):
    """SIGTERM: the server drains and writes what is queued; returns the rest of its output."""
    if graceful:
        p.terminate()
    else:
        p.kill()
    out, _ = p.communicate(timeout=60 * SLOW)
    return out or ""


def ask(port):
    body = tlserver.post_json(port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                        "logprobs": 5})
    ch = body["choices"][0]
    lp = ch["logprobs"]
    return {"text": ch["text"], "tokens": lp["tokens"], "lp": lp["token_logprobs"],
            "top": [sorted(d.items()) for d in lp["top_logprobs"]],
            "cached": (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "prompt": body["usage"]["prompt_tokens"]}


def tokenize():
    """The prompt's token ids, from a server of its own without a disk cache."""
    srv = tlserver.Server(MODEL, ["-np", "1", "-t", "1", "-c", "2048"])
    try:
        if not srv.wait_ready():
            return []
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        c.request("POST", "/tokenize", body=json.dumps({"content": PROMPT}), headers={"Content-Type": "application/json"})
        return json.loads(c.getresponse().read())["tokens"]
    finally:
        srv.stop()


def same(a, b):
    return a["text"] == b["text"] and a["tokens"] == b["tokens"] and a["lp"] == b["lp"] and a["top"] == b["top"]


def longrope(tmp):
    """Blocks keyed by the LongRoPE factors their keys were rotated with."""
    model, d = os.path.join(tmp, "phi3_longrope.gguf"), os.path.join(tmp, "cache-longrope")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), "phi3", model, "--seed", "109",
                        "--longrope", "--rope-orig-ctx", "256"], capture_output=True, text=True)
    if not check(p.returncode == 0, f"mkmodel.py phi3 --longrope: {p.stderr[-300:]}"):
        return
    prompt = " ".join(f"note {i} says {i * 7 % 13}." for i in range(15))  # ~120 tokens
    answers = {}
    for ctx in ("1024", "256", "256"):  # long factors; short: the long ones' blocks ignored; short again: its own
        srv = tlserver.Server(model, ["-np", "1", "-t", "2", "-c", ctx, "--cache-dir", d])
        try:
            if not check(srv.wait_ready(), f"-c {ctx} --cache-dir: server ready"):
                return
            body = tlserver.post_json(srv.port, "/v1/completions", {"prompt": prompt, "max_tokens": 4,
                                                                   "temperature": 0, "logprobs": 3})
            cached = (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            answers.setdefault(ctx, []).append((cached, body["choices"][0]["logprobs"]["token_logprobs"]))
        finally:
            srv.stop()
    (c_long, _), = answers["1024"]
    (c_short, lp_short), (c_again, lp_again) = answers["256"]
    check(c_long == 0 and c_short == 0, f"blocks of the long factors are not used at -c 256 ({c_short} cached)")
    check(c_again > 0 and lp_again == lp_short, f"-c 256 again: its own blocks from disk ({c_again} cached), "
                                                f"the same log-probabilities")


def main():
    tmp = tempfile.mkdtemp(prefix="tl-disk-")
    d = os.path.join(tmp, "cache")
    try:
        p, port, out = start(d)
        if not check(port is not None, f"first server ready: {out[-500:]}"):
            stop(p)
            tlcheck.finish()
        check("0 blocks" in out, f"an empty directory: {out.splitlines()[-1]}")
        cold = ask(port)
        check(cold["cached"] == 0, f"the first request computes its prompt ({cold['cached']} cached)")
        stop(p)
        files = glob.glob(os.path.join(d, "*.kvb"))
        n_blocks = cold["prompt"] // 16
        check(len(files) >= n_blocks, f"every full block of the prompt is on disk after a stop ({len(files)} files, "
                                      f"{n_blocks} full blocks)")
        check(not glob.glob(os.path.join(d, "*.tmp")), "no half-written files")

        # a restart: the prompt from disk, the same answer bit for bit
        p, port, out = start(d)
        if check(port is not None, f"restarted server ready: {out[-500:]}"):
            check(f"{len(files)} blocks" in out, f"the directory is indexed at start: {out.splitlines()[-1]}")
            warm = ask(port)
            check(warm["cached"] >= cold["prompt"] - 16, f"after a restart the prompt comes from disk "
                                                         f"({warm['cached']} of {warm['prompt']} cached)")
            check(same(cold, warm), f"the same tokens and log-probabilities as before the restart "
                                    f"({warm['text']!r} vs {cold['text']!r})")
            check((metric(port, "tokenloop_disk_cache_loaded_total") or 0) >= n_blocks - 1,
                  "/metrics counts the blocks read back")
        stop(p)

        # another KV type in the same directory: the files are not its own
        p, port, out = start(d, "--kv-type", "q8_0")
        if check(port is not None, f"q8_0 server ready: {out[-500:]}"):
            check("disk cache" in out and " 0 blocks" in out and "another model, numerics mode or KV type" in out,
                  f"the f16 blocks are ignored and logged: {out[-600:]}")
            q8 = ask(port)
            check(q8["cached"] == 0, f"nothing of another KV type is used ({q8['cached']} cached)")
        rest = stop(p)
        n_q8 = len(glob.glob(os.path.join(d, "*.kvb"))) - len(files)
        check(n_q8 >= n_blocks, f"the q8_0 server keeps its own blocks beside them ({n_q8})")

        # a damaged file (a flipped byte in block 3's data): refused by its
        # checksum, recomputed, the same answer
        ids = tokenize()
        victim = None
        for f in files:  # the file of block 3 (positions 48-63): its header holds those tokens
            with open(f, "rb") as fh:
                head = fh.read(56 + 64)
            if list(struct.unpack("<16i", head[56:120])) == ids[48:64]:
                victim = f
        check(victim is not None, "block 3's file is found by its tokens")
        victim = victim or files[0]
        with open(victim, "r+b") as fh:
            fh.seek(os.path.getsize(victim) - 1000)
            b = fh.read(1)
            fh.seek(os.path.getsize(victim) - 1000)
            fh.write(bytes([b[0] ^ 0x40]))
        p, port, out = start(d)
        if check(port is not None, f"server ready after the damage: {out[-500:]}"):
            again = ask(port)
            time.sleep(0.2)
            check(same(cold, again), f"a damaged block is computed again: the same answer ({again['text']!r})")
            check(again["cached"] == 48, f"blocks 0-2 come from disk, the damaged block 3 does not "
                                         f"({again['cached']} cached)")
            check((metric(port, "tokenloop_disk_cache_rejected_total") or 0) >= 1, "/metrics counts the refusal")
        rest = stop(p)
        check("fails its checksum" in rest, f"the damaged file is logged: {rest[-400:]}")

        # the budget: 4 MiB holds about 11 blocks of SmolLM2's 368 KiB
        d2 = os.path.join(tmp, "small")
        p, port, out = start(d2, "--cache-disk-mem", "4")
        if check(port is not None, f"server with a 4 MiB budget ready: {out[-500:]}"):
            ask(port)
            # the first eviction comes with the 12th file, whenever the
            # writer gets there; the directory is measured once it has
            # drained (a stopped server has written what was queued)
            t_end = time.time() + 30 * SLOW
            while time.time() < t_end and (metric(port, "tokenloop_disk_cache_evicted_total") or 0) == 0:
                time.sleep(0.1)
            check((metric(port, "tokenloop_disk_cache_evicted_total") or 0) > 0, "the oldest blocks were deleted")
            stop(p)
            used = sum(os.path.getsize(f) for f in glob.glob(os.path.join(d2, "*.kvb")))
            check(used <= 4 << 20, f"the directory keeps to its budget ({used} bytes)")
        else:
            stop(p)
        longrope(tmp)
    except Exception as e:  # a failed request is a failed check, not a traceback without summary
        check(False, f"unexpected error: {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tlcheck.finish()


if __name__ == "__main__":
    main()
