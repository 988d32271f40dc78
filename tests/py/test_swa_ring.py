"""Sliding-window layers kept in per-sequence rings (Gemma 3 and 4, gpt-oss):
by default a sequence keeps only the last window plus a batch of those
layers' positions, as llama.cpp's iSWA cache does, and the pool holds the
other layers alone. The rows are the same bytes read in the same order, so
the logits must be bit for bit those of --swa-full (every position in the
pool), in both numerics modes, past the window; `info`, the server's ready
line and /metrics give the memory each way (from the file's own metadata,
read with the gguf package); a server answers a conversation's turns with
the same tokens either way, and the ring server resumes a cached prompt
(from a snapshot of the window where the last turn ended).
Run: TL_BIN=build/tokenloop python3 tests/py/test_swa_ring.py"""
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
import tlserver  # noqa: E402
from tlcheck import check  # noqa: E402
from tlserver import TL_BIN  # noqa: E402

ROOT = tlcheck.ROOT
GEMMA = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
PY = sys.executable


def gemma_kv_figures():
    """(bytes per position of the global layers, of the window layers, window), f16, from the metadata."""
    import gguf
    r = gguf.GGUFReader(GEMMA)

    def val(key):
        f = r.fields[key]
        return int(f.parts[f.data[0]][0])
    n_layer, n_kv = val("gemma3.block_count"), val("gemma3.attention.head_count_kv")
    hd, window = val("gemma3.attention.key_length"), val("gemma3.attention.sliding_window")
    n_global = sum(1 for i in range(n_layer) if i % 6 == 5)  # llama.cpp: every 6th layer is global
    per_layer = 2 * n_kv * hd * 2  # K and V in f16
    return n_global * per_layer, (n_layer - n_global) * per_layer, window


def logits(model, ids_file, extra):
    """(bytes, sha256) of the logits `logits` writes, streamed from its stdout
    (Gemma's 262,144-entry rows: a file of them would take gigabytes)."""
    p = subprocess.Popen([TL_BIN, "logits", "-m", model, "--ids-file", ids_file, "-o", "/dev/stdout", "-t", "2",
                          *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    h, n = hashlib.sha256(), 0
    while True:
        b = p.stdout.read(1 << 20)
        if not b:
            break
        h.update(b)
        n += len(b)
    err = p.stderr.read().decode(errors="replace")
    rc = p.wait(timeout=600 * tlserver.SLOW)
    if not check(rc == 0, f"logits {' '.join(extra)}: {err[-300:]}"):
        return None
    return n, h.hexdigest()


def ring_equals_full(model, n_ids, n_vocab, extra, what):
    rng = random.Random(7)
    ids = [2] + [rng.randrange(3, n_vocab) for _ in range(n_ids - 1)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ids, f)
        ids_file = f.name
    try:
        for mode in ("fast", "exact"):
            ring = logits(model, ids_file, [*extra, "--numerics", mode])
            full = logits(model, ids_file, [*extra, "--numerics", mode, "--swa-full"])
            if ring is not None and full is not None:
                check(ring[0] == n_ids * n_vocab * 4 and ring == full,
                      f"{what} ({mode}): {n_ids} positions in rings = the windows kept whole, bit for bit")
    finally:
        os.unlink(ids_file)


def info_lines():
    r = subprocess.run([TL_BIN, "info", GEMMA], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"info runs: {r.stderr[-200:]}")
    return r.stdout


def serve(args):
    return tlserver.serve_ready(GEMMA, ["-np", "2", "-c", "4096", *args])


def turns(port):
    """A long prompt, the same extended by its answer and more, and its first half: (texts, cached tokens)."""
    text = " ".join(f"Step {i}: the lantern lit {5 * i + 3} rooms of the tower." for i in range(70))
    out, cached = [], []
    for prompt in (text, None, text[: len(text) // 2]):
        if prompt is None:
            prompt = text + out[0] + " And then"
        body = tlserver.post_json(port, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0})
        out.append(body["choices"][0]["text"])
        cached.append(body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
    return out, cached


def commands_alike():
    """run, perplexity and bench with and without --swa-full (their exact
    spelling; chat parses its options with run's, and this file has no chat
    template): the same tokens and figures, rings on (-c 2048 or 640, -b 64)."""
    text = " ".join(f"Step {i}: the lantern lit {5 * i + 3} rooms of the tower." for i in range(110))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
        path = f.name
    cases = [("run", ["run", "-f", path, "-n", "24", "--temp", "0", "--ids", "-c", "2048", "-b", "64"], "stdout"),
             ("perplexity", ["perplexity", "-f", path, "-c", "640", "-b", "64", "--chunks", "1"], "ppl"),
             ("bench", ["bench", "-p", "64", "-n", "4", "-d", "600", "-r", "1", "-o", "json"], "rc")]
    try:
        for what, args, cmp in cases:
            got = []
            for extra in ([], ["--swa-full"]):
                r = subprocess.run([TL_BIN, args[0], "-m", GEMMA, "-t", "2", *args[1:], *extra],
                                   capture_output=True, text=True, errors="replace", timeout=600 * tlserver.SLOW)
                check(r.returncode == 0, f"{what} {' '.join(extra)}: {r.stderr[-300:]}")
                ppl = [ln for ln in (r.stdout + r.stderr).splitlines() if "Final estimate" in ln]
                got.append(r.stdout if cmp == "stdout" else ppl if cmp == "ppl" else r.returncode)
            check(got[0] == got[1] and (cmp != "ppl" or got[0]), f"{what}: the same with and without --swa-full: {got}")
    finally:
        os.unlink(path)


def main():
    if not check(os.path.exists(GEMMA), f"{GEMMA} exists (make models)"):
        return tlcheck.finish()
    g_pos, w_pos, window = gemma_kv_figures()
    out = info_lines()
    check(f"KV cache per position: f16 {g_pos} bytes" in out, f"info: the pool's {g_pos} bytes per position: {out}")
    check(f"sliding-window layers: {w_pos} bytes per position more in f16" in out and f"its last {window}" in out,
          f"info: the window layers' {w_pos} bytes and window {window}: {out}")

    commands_alike()
    # past the window (512) in calls of 64: a ring of 36 blocks gone round
    ring_equals_full(GEMMA, 1100, 262144, ["-c", "2048", "-b", "64"], "Gemma 3 270M")
    with tempfile.TemporaryDirectory() as d:
        for arch in ("gpt-oss", "gemma4"):  # windows of 16, calls of 5: rings of 2 blocks
            path = os.path.join(d, f"{arch}.gguf")
            r = subprocess.run([PY, os.path.join(ROOT, "scripts", "mkmodel.py"), arch, path, "--seed", "5"],
                               capture_output=True, text=True, timeout=600)
            if check(r.returncode == 0, f"mkmodel {arch}: {r.stderr[-300:]}"):
                import gguf
                n_vocab = next(int(t.shape[1]) for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight")
                ring_equals_full(path, 200, n_vocab, ["-c", "256", "-b", "5"], f"random {arch}")

    procs = []
    try:
        ring = serve([])
        procs.append(ring[0])
        full = serve(["--swa-full"])
        procs.append(full[0])
        if check(ring[2] is not None and full[2] is not None, f"servers ready: {ring[3][-300:]} {full[3][-300:]}"):
            print("  " + ring[2].strip())
            check(f"{g_pos} bytes per position" in ring[2] and "sliding-window layers: a ring of" in ring[2],
                  f"ring server's ready line: {ring[2]}")
            check(f"{g_pos + w_pos} bytes per position" in full[2] and "sliding-window" not in full[2],
                  f"--swa-full server's ready line: {full[2]}")
            rp = tlserver.metric(ring[1], "tokenloop_kv_bytes_per_position")
            fp = tlserver.metric(full[1], "tokenloop_kv_bytes_per_position")
            check(rp == g_pos and fp == g_pos + w_pos,
                  f"/metrics: bytes per position in the pool, each way ({rp}, {fp}; {g_pos}, {g_pos + w_pos})")
            wb = tlserver.metric(ring[1], "tokenloop_kv_window_bytes_per_sequence")
            check(wb is not None and wb >= w_pos * window and tlserver.metric(
                full[1], "tokenloop_kv_window_bytes_per_sequence") is None,
                f"/metrics: a ring's bytes ({wb}) hold at least the window")
            a, ca = turns(ring[1])
            b, cb = turns(full[1])
            check(a == b, f"the same tokens with rings and with whole windows: {a} vs {b}")
            check(ca[1] > 2 * window and cb[1] > 2 * window,
                  f"the second turn resumes its cached prompt past the window (rings {ca}, whole {cb})")
    finally:
        for p in procs:
            tlserver.stop_ready(p)
    return tlcheck.finish()


if __name__ == "__main__":
    sys.exit(main())
