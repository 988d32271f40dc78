"""Decode speed of the Python package beside the CLI (and llama-cpp-python, if
given), rounds interleaved so that a busy machine slows all alike: the numbers
in docs/PYTHON.md.

  python3 python/bench_compare.py --cli build/tokenloop [--lcp-python /path/to/venv/bin/python]

Each round: `tokenloop run -p PROMPT -n N --temp 0 --ignore-eos` (its stats
line's decode tok/s and first-token time), then Model.generate with the same
settings (stats()'s decode_tok_s: the same tl_gen_stats), the same streamed,
and llama-cpp-python's create_completion (llama_perf_context's eval time; end
of generation banned by logit_bias). tokenloop runs with --spec auto (its
default) and off; llama-cpp-python has no speculation. Prints medians."""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

LCP_SCRIPT = r"""
import json, sys, time
import llama_cpp
a = json.loads(sys.argv[1])
llm = llama_cpp.Llama(model_path=a["model"], n_ctx=2048, n_batch=512, n_threads=a["threads"],
                      n_threads_batch=a["threads"], verbose=False)
bias = {t: -1e9 for t in a["eog"]}
out = []
for _ in range(a["reps"]):
    llm.reset()
    llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
    t0 = time.perf_counter()
    first = None
    n = 0
    for ch in llm.create_completion(a["prompt"], max_tokens=a["n"], temperature=0, logit_bias=bias, stream=True):
        if first is None:
            first = time.perf_counter() - t0
        n += 1
    wall = time.perf_counter() - t0
    p = llama_cpp.llama_perf_context(llm._ctx.ctx)
    out.append({"decode_tok_s": p.n_eval / (p.t_eval_ms / 1e3), "n_eval": p.n_eval,
                "ttft_ms": first * 1e3, "prefill_ms": p.t_p_eval_ms, "wall_tok_s": n / wall})
print(json.dumps(out))
"""


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        m = re.search(r"Model name:\s*(.+)", out)
        return m.group(1).strip() if m else platform.processor()
    except OSError:
        return platform.processor()


def run_cli(a, spec):
    r = subprocess.run([a.cli, "run", "-m", a.model, "-p", a.prompt, "-n", str(a.n), "--temp", "0", "--ignore-eos",
                        "-t", str(a.threads), "--spec", spec], capture_output=True, text=True, check=True)
    m = re.search(r"first token ([\d.]+) ms \| generated (\d+) tokens, ([\d.]+) tok/s", r.stderr)
    return {"decode_tok_s": float(m.group(3)), "ttft_ms": float(m.group(1)), "n": int(m.group(2))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "tokenloop"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompt", default="The history of the Roman Empire began")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--lcp-python", help="a Python with llama-cpp-python installed")
    a = ap.parse_args()
    if sys.path and os.path.abspath(sys.path[0]) == HERE:
        del sys.path[0]  # the installed package, not the source folder beside this script
    import tokenloop
    from tokenloop._lib import lib

    res = {}

    def add(key, d):
        res.setdefault(key, []).append(d)

    models = {s: tokenloop.Model(a.model, n_threads=a.threads, spec=s) for s in ("auto", "off")}
    m = models["off"]
    eog = [t for t in range(m.n_vocab) if lib.tl_token_is_eog(m._m, t)]
    for r in range(a.rounds):
        for spec, pm in models.items():
            add(f"cli spec {spec}", run_cli(a, spec))
            pm.reset()
            pm.generate(a.prompt, max_tokens=a.n, temperature=0, ignore_eos=True)
            st = pm.stats()
            add(f"python generate spec {spec}", {"decode_tok_s": st["decode_tok_s"], "ttft_ms": st["ttft_s"] * 1e3,
                                                  "n": st["n_gen"]})
            pm.reset()
            t0 = time.perf_counter()
            first = None
            for _ in pm.generate(a.prompt, max_tokens=a.n, temperature=0, ignore_eos=True, stream=True):
                if first is None:
                    first = time.perf_counter() - t0
            st = pm.stats()
            add(f"python stream spec {spec}", {"decode_tok_s": st["decode_tok_s"], "ttft_ms": first * 1e3,
                                                "n": st["n_gen"]})
        if a.lcp_python:
            arg = json.dumps({"model": a.model, "threads": a.threads, "prompt": a.prompt, "n": a.n, "eog": eog,
                              "reps": 1})
            out = subprocess.run([a.lcp_python, "-c", LCP_SCRIPT, arg], capture_output=True, text=True, check=True)
            for d in json.loads(out.stdout):
                add("llama-cpp-python", d)
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr)
    print(f"{cpu_name()}, {a.threads} threads, {os.path.basename(a.model)}, -n {a.n}, prompt {a.prompt!r}")
    print(f"{'':34} {'decode tok/s (median, best)':>28} {'x the CLI (median of rounds)':>30} "
          f"{'first token ms (median)':>24}")
    for k, v in res.items():
        d = [x["decode_tok_s"] for x in v]
        f = [x["ttft_ms"] for x in v]
        # each round against the CLI's run of the same round (spec off for llama-cpp-python): a load
        # that comes and goes weighs on both
        ref = res["cli spec auto" if k.endswith("auto") else "cli spec off"]
        ratio = statistics.median(x["decode_tok_s"] / y["decode_tok_s"] for x, y in zip(v, ref))
        print(f"{k:34} {statistics.median(d):20.1f} {max(d):7.1f} {ratio:30.3f} {statistics.median(f):24.1f}")


if __name__ == "__main__":
    main()
