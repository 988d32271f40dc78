"""A hybrid model (Gated DeltaNet layers with a recurrent state beside
attention layers: a random qwen35moe made by scripts/mkmodel.py) through the
server, at temperature 0, in both numerics modes:
- a prompt served again comes from the prefix cache (cached_tokens, resumed
  from a snapshot of the recurrent state) with the same tokens and
  log-probabilities as cold, bit for bit;
- a prompt that extends a served conversation (its prompt, its answer, more)
  resumes from the snapshot kept when the first request ended, and answers as
  a cold server does;
- speculative decoding (n-gram guesses, rejected ones rolled back in the
  state) gives the same tokens as --spec off, and did guess;
- a prompt among 15 other streams (their states updated in the same forward
  calls) answers as it does alone;
- with --cache-dir, a restarted server serves the prompt from disk (its KV
  blocks and the state at their last boundary, under DIR/states) as cold;
- the trace and /metrics report the state.
A qwen35 and a qwen35moe file carrying a multi-token prediction block after
their layers (nextn_predict_layers, as Qwen3.5's files do) run as the same
files without it: llama.cpp leaves that block to its draft, and so do we.
And Gemma 4 (a random gemma4 with per-layer inputs and layers that read an
earlier layer's KV cache, and a gemma4moe): a cached prompt and a speculative
run answer as cold.
Run: TL_BIN=build/tokenloop python3 tests/py/test_hybrid.py"""
import concurrent.futures
import glob
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
import tlserver  # noqa: E402
from tlcheck import check  # noqa: E402
from tlserver import SLOW  # noqa: E402

ROOT = tlcheck.ROOT
MODEL = os.path.join(ROOT, "models", "random", "hybrid_qwen35moe.gguf")
GEMMA4 = {a: os.path.join(ROOT, "models", "random", f"hybrid_{a}.gguf") for a in ("gemma4", "gemma4moe")}
# repetitive, so that n-gram guesses get accepted; ~300 tokens
PROMPT = "Inventory log. " + " ".join(
    f"Shelf {i % 7} holds {['jars', 'ropes', 'lamps'][i % 3]} number {i % 5}." for i in range(40))
EXTRA = " Shelf 3 holds jars number 2. Shelf 4 holds"


def ask(srv, prompt, n=40):
    body = tlserver.post_json(srv.port, "/v1/completions",
                              {"prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 3})
    ch, u = body["choices"][0], body["usage"]
    return {"text": ch["text"], "tokens": ch["logprobs"]["tokens"], "lp": ch["logprobs"]["token_logprobs"],
            "cached": (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "prompt": u["prompt_tokens"], "spec": u.get("speculative") or {}}


def serve(numerics, *args, model=MODEL):
    srv = tlserver.Server(model, ["-np", "2", "-t", "2", "-c", "1024", "--numerics", numerics, *args])
    check(srv.wait_ready(), f"{numerics} {' '.join(args)}: server ready")
    return srv


def same(a, b, what):
    return check(a["tokens"] == b["tokens"] and a["lp"] == b["lp"],
                 f"{what}: {a['text'][:60]!r} vs {b['text'][:60]!r}")


def run(numerics):
    srv = serve(numerics, "--spec", "off")
    try:
        cold = ask(srv, PROMPT)
        check(cold["cached"] == 0 and cold["prompt"] > 200, f"[{numerics}] cold: {cold['cached']} cached of "
              f"{cold['prompt']}")
        again = ask(srv, PROMPT)
        check(again["cached"] >= 192, f"[{numerics}] the same prompt again: {again['cached']} cached")
        same(again, cold, f"[{numerics}] from the state's snapshot = cold")
        longer = PROMPT + cold["text"] + EXTRA
        ext = ask(srv, longer)
        check(ext["cached"] >= cold["prompt"] // 16 * 16,
              f"[{numerics}] the conversation extended: {ext['cached']} cached (the first prompt had "
              f"{cold['prompt']})")
        m = tlserver.metric(srv.port, "tokenloop_state_bytes_per_sequence")
        check(m is not None and m > 0, f"[{numerics}] /metrics: state bytes per sequence {m}")
        m = tlserver.metric(srv.port, "tokenloop_state_snapshots")
        check(m is not None and m >= 1, f"[{numerics}] /metrics: {m} state snapshots")
    finally:
        srv.stop()
    ref = serve(numerics, "--spec", "off")
    try:
        same(ext, ask(ref, longer), f"[{numerics}] an extended conversation from a snapshot = cold")
    finally:
        ref.stop()
    crowd = tlserver.Server(MODEL, ["-np", "16", "-t", "2", "-c", "4096", "--numerics", numerics, "--spec", "off"])
    try:
        if check(crowd.wait_ready(), f"[{numerics}] -np 16 server ready"):
            others = [f"Note {i}: " + PROMPT[: 40 + 13 * i] for i in range(15)]
            with concurrent.futures.ThreadPoolExecutor(16) as ex:
                futs = [ex.submit(ask, crowd, o, 40) for o in others]
                mine = ex.submit(ask, crowd, PROMPT)
                for f in futs:
                    f.result(timeout=600 * SLOW)
                same(mine.result(timeout=600 * SLOW), cold, f"[{numerics}] among 15 other streams = alone")
    finally:
        crowd.stop()
    with tempfile.TemporaryDirectory(prefix="tl-hyb-disk-") as d:
        for run_i in range(2):
            disk = serve(numerics, "--spec", "off", "--cache-dir", d)
            try:
                got = ask(disk, PROMPT)
                same(got, cold, f"[{numerics}] --cache-dir, run {run_i + 1}")
                if run_i == 1:
                    check(got["cached"] >= 192, f"[{numerics}] after a restart: {got['cached']} cached from disk")
            finally:
                disk.stop()
        check(len(glob.glob(os.path.join(d, "states", "*.kvb"))) >= 1, f"[{numerics}] states written under DIR/states")
    spec = serve(numerics, "--spec", "ngram")
    try:
        s = ask(spec, PROMPT)
        same(s, cold, f"[{numerics}] speculative = --spec off")
        check(s["spec"].get("drafted", 0) > 0, f"[{numerics}] n-gram guesses were made: {s['spec']}")
    finally:
        spec.stop()


def run_gemma4(arch, numerics):
    """Gemma 4: served again from the prefix cache, and speculatively, as cold."""
    srv = serve(numerics, "--spec", "off", model=GEMMA4[arch])
    try:
        cold = ask(srv, PROMPT)
        again = ask(srv, PROMPT)
        check(again["cached"] >= 192, f"{arch} [{numerics}] the same prompt again: {again['cached']} cached")
        same(again, cold, f"{arch} [{numerics}] from the prefix cache = cold")
    finally:
        srv.stop()
    spec = serve(numerics, "--spec", "ngram", model=GEMMA4[arch])
    try:
        s = ask(spec, PROMPT)
        same(s, cold, f"{arch} [{numerics}] speculative = --spec off")
        check(s["spec"].get("drafted", 0) > 0, f"{arch} [{numerics}] n-gram guesses were made: {s['spec']}")
    finally:
        spec.stop()


def run_mtp(tmp):
    """An MTP block after the layers changes no logit (both modes)."""
    ids = ",".join(str(i) for i in (1, 15043, 3186, 29892, 445, 338, 263, 1243, 310, 278, 6055, 29889) * 6)
    for arch in ("qwen35", "qwen35moe"):
        files = {}
        for mtp in (0, 1):
            path = os.path.join(tmp, f"{arch}_mtp{mtp}.gguf")
            p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), arch, path, "--seed", "43",
                                "--mtp", str(mtp)], capture_output=True, text=True)
            if check(p.returncode == 0, f"mkmodel.py {arch} --mtp {mtp}: {p.stderr[-300:]}"):
                files[mtp] = path
        if len(files) < 2:
            continue
        for numerics in ("fast", "exact"):
            out = {}
            for mtp, path in files.items():
                o = os.path.join(tmp, f"logits{mtp}.bin")
                r = subprocess.run([tlserver.TL_BIN, "logits", "-m", path, "--ids", ids, "-o", o, "--numerics", numerics],
                                   capture_output=True, text=True)
                if check(r.returncode == 0, f"{arch} mtp {mtp} [{numerics}]: logits: {r.stderr.strip()[-300:]}"):
                    with open(o, "rb") as f:
                        out[mtp] = f.read()
            if len(out) == 2:
                check(len(out[0]) > 0 and out[0] == out[1],
                      f"{arch} [{numerics}]: the file with an MTP block gives other logits than without it")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        run_mtp(tmp)
    for arch, path in GEMMA4.items():
        p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), arch, path, "--seed", "42",
                            "--type", "q8_0"], capture_output=True, text=True)
        if check(p.returncode == 0, f"mkmodel.py {arch}: {p.stderr[-300:]}"):
            for numerics in ("fast", "exact"):
                run_gemma4(arch, numerics)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), "qwen35moe", MODEL, "--seed",
                        "41", "--type", "q8_0"], capture_output=True, text=True)
    if not check(p.returncode == 0, f"mkmodel.py qwen35moe: {p.stderr[-300:]}"):
        tlcheck.finish()
    for numerics in ("fast", "exact"):
        run(numerics)
    tlcheck.finish()


if __name__ == "__main__":
    main()
