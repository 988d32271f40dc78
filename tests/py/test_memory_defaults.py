"""Defaults that fit the machine (issue 30): `tokenloop serve` without -c
takes the model's training context when -np sequences of its KV fit 3/4 of
the memory left after the model file and 256 MiB, else the longest that does; its pool
is np x ctx positions (never the 1.5x of before), cut to that budget; the
ready line says what it chose and why; a request that cannot fit a cut pool
gets a 4xx naming the limit, never a crash. The memory figure is injected
with TL_MEM_AVAILABLE (the policy's input, as a measured cost is injected
elsewhere), and measured for real under `ulimit -v` (prlimit), which the
server must read and survive.
Run: TL_BIN=build/tokenloop python3 tests/py/test_memory_defaults.py"""
import http.client
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
import tlserver  # noqa: E402
from tlcheck import check  # noqa: E402
from tlserver import SLOW  # noqa: E402

ROOT = tlcheck.ROOT
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
ASAN = os.environ.get("TL_ASAN") == "1"
MIB = 1 << 20
PER_POS = {"f16": 23040, "q8_0": 12240}  # SmolLM2: 30 layers x 2 x 3 KV heads x 64
TRAIN = 8192


def serve(args, env_extra=None, prefix=()):
    """(process, port, its ready line or None, all output) of a server of MODEL."""
    return tlserver.serve_ready(MODEL, args, env_extra, prefix)


stop = tlserver.stop_ready


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120 * SLOW)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        c.close()


def pool_positions(ready):
    m = re.search(r"(\d+) blocks of 16 positions", ready or "")
    return int(m.group(1)) * 16 if m else None


def context_of(ready):
    m = re.search(r"context (\d+) per sequence", ready or "")
    return int(m.group(1)) if m else None


def main():
    size = os.path.getsize(MODEL)
    # plenty of memory: the training context, a pool of exactly np x ctx
    p, port, ready, out = serve(["-np", "4"], {"TL_MEM_AVAILABLE": str(64 << 30)})
    try:
        if check(ready is not None, f"server ready with plenty of memory: {out[-500:]}"):
            print("  " + ready.strip())
            check(context_of(ready) == TRAIN, f"default context is the training length {TRAIN}: {ready}")
            check(pool_positions(ready) == 4 * TRAIN, f"pool is -np x ctx = {4 * TRAIN} positions: {ready}")
            check("training length" in ready and "TL_MEM_AVAILABLE" in ready, f"the ready line says why: {ready}")
            st, body = post(port, {"prompt": "The sky is", "max_tokens": 8, "temperature": 0})
            check(st == 200, f"a request is served ({st} {body})")
    finally:
        stop(p)
    # 100 MiB left after the model and the 256 MiB kept aside: 75 MiB of
    # budget holds 3,408 f16 positions
    # (23,040 bytes each), less than one sequence of 4096: ctx stays at
    # min(training, 4096), the pool is cut to the budget, and a request that
    # wants more than the pool is refused
    budget = (100 * MIB) // 4 * 3
    p, port, ready, out = serve(["-np", "4"], {"TL_MEM_AVAILABLE": str(size + 356 * MIB)})
    try:
        if check(ready is not None, f"server ready with 100 MiB left: {out[-500:]}"):
            print("  " + ready.strip())
            want = budget // (PER_POS["f16"] * 16) * 16
            check(context_of(ready) == 4096, f"context falls back to 4096: {ready}")
            check(pool_positions(ready) == want, f"pool cut to {want} positions: {ready}")
            check("cut from" in ready, f"the ready line says the pool was cut and why: {ready}")
            st, body = post(port, {"prompt": "The sky is", "max_tokens": 8, "temperature": 0})
            check(st == 200, f"a small request is served ({st})")
            # wants every position of the context, more than the cut pool holds: a 4xx, and the server lives
            st, body = post(port, {"prompt": "The sky is", "max_tokens": 4090, "temperature": 0})
            msg = json.dumps(body)
            check(400 <= st < 500 and "KV cache" in msg and str(want) in msg and "memory" in msg,
                  f"a request larger than the pool: 4xx naming the limit ({st} {msg[:300]})")
            check(p.poll() is None, "the server still runs")
            st, _ = post(port, {"prompt": "Again", "max_tokens": 4, "temperature": 0})
            check(st == 200, f"and serves the next request ({st})")
    finally:
        stop(p)
    # q8_0 halves the bytes per position: the same memory holds the training
    # context for 4 sequences
    mem = size + 256 * MIB + (4 * TRAIN * PER_POS["q8_0"]) * 4 // 3 + 16 * MIB
    p, port, ready, out = serve(["-np", "4", "--kv-type", "q8_0"], {"TL_MEM_AVAILABLE": str(mem)})
    try:
        if check(ready is not None, f"q8_0 server ready: {out[-500:]}"):
            print("  " + ready.strip())
            check(context_of(ready) == TRAIN and pool_positions(ready) == 4 * TRAIN,
                  f"q8_0: the training context for 4 sequences fits where f16's would not: {ready}")
            check(f"{PER_POS['q8_0']} bytes per position" in ready, f"q8_0: bytes per position in the ready line: {ready}")
    finally:
        stop(p)
    p, port, ready, out = serve(["-np", "4"], {"TL_MEM_AVAILABLE": str(mem)})
    try:
        if check(ready is not None, f"f16 server with the same memory ready: {out[-500:]}"):
            check(context_of(ready) < TRAIN or pool_positions(ready) < 4 * TRAIN,
                  f"f16: the same memory does not hold it: {ready}")
    finally:
        stop(p)
    # the real thing: ulimit -v (the address space left is what the pool may
    # take). ASan reserves terabytes of shadow address space, so no limit can
    # be set under it: that case is covered by the injected figures above.
    if ASAN:
        print("  (ulimit -v: not run under ASan, whose shadow memory needs an unlimited address space)")
    else:
        limit = 700 * MIB
        p, port, ready, out = serve(["-np", "4", "-c", str(TRAIN)], None,
                                    prefix=("prlimit", f"--as={limit}", "--"))
        try:
            if check(ready is not None, f"server under ulimit -v {limit // MIB} MiB ready: {out[-800:]}"):
                print("  " + ready.strip())
                check("ulimit -v" in ready and "cut from" in ready, f"the pool is cut to ulimit -v's room: {ready}")
                pos = pool_positions(ready)
                check(pos is not None and pos * PER_POS["f16"] < limit // 2, f"the pool fits the limit: {ready}")
                st, body = post(port, {"prompt": "The sky is", "max_tokens": 32, "temperature": 0})
                check(st == 200, f"served under the limit ({st} {body})")
                # the whole context: a 4xx naming the limit where the cut pool
                # holds less than that (the address space the server itself
                # takes varies a little), else served; never a crash
                st, body = post(port, {"prompt": "The sky is", "max_tokens": TRAIN - 10, "temperature": 0})
                if pos is not None and pos < TRAIN:
                    check(400 <= st < 500 and "memory" in json.dumps(body),
                          f"a request above the pool is refused with a 4xx naming the limit ({st} "
                          f"{json.dumps(body)[:200]})")
                else:
                    check(st == 200, f"a whole-context request within the pool is served ({st})")
                st, body = post(port, {"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0})
                check(st == 200 and p.poll() is None, f"the server still serves under the limit ({st})")
        finally:
            stop(p)
    tlcheck.finish()


if __name__ == "__main__":
    main()
