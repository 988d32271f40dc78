#!/usr/bin/env python3
# llama-bench's two tests (pp: one batch of n_prompt random tokens; tg: n_gen
# single-token decodes from position 0) for ik_llama.cpp, whose PyPI wheel
# (ik-llama-cpp-python) ships only libllama.so and ctypes bindings, no
# llama-bench. Prints a JSON array with llama-bench's field names.
#
# Usage: PYTHONPATH=<dir with ik_llama_cpp> ik_bench.py -m FILE [-p 512]
#        [-n 128] [-r 5] [-t 2]
import argparse
import ctypes
import json
import os
import random
import statistics
import sys
import time


def load_api():
    # The package's own bindings; the few calls they leave out are bound here
    # against the same library (their prototypes are in the wheel's llama.h).
    import ik_llama_cpp._ctypes_api as api
    lib = api._lib
    lib.llama_synchronize.argtypes = [ctypes.c_void_p]
    lib.llama_synchronize.restype = None
    lib.llama_model_size.argtypes = [ctypes.c_void_p]
    lib.llama_model_size.restype = ctypes.c_uint64
    lib.llama_vocab_get_add_bos.argtypes = [ctypes.c_void_p]
    lib.llama_vocab_get_add_bos.restype = ctypes.c_bool
    lib.llama_vocab_bos.argtypes = [ctypes.c_void_p]
    lib.llama_vocab_bos.restype = ctypes.c_int32
    lib.llama_print_system_info.argtypes = []
    lib.llama_print_system_info.restype = ctypes.c_char_p
    lib.llama_log_set.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.llama_log_set.restype = None
    return api, lib


class Bench:
    def __init__(self, api, lib, model, n_ctx, threads, verbose):
        self.api, self.lib, self.model = api, lib, model
        cp = api.llama_context_default_params()
        # llama-bench's settings: context just long enough, batch 2048,
        # ubatch 512, f16 KV cache; flash attention off (ik's default is on).
        cp.n_ctx = n_ctx
        cp.n_batch = 2048
        cp.n_ubatch = 512
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn = False
        self.ctx = api.llama_init_from_model(model, cp)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.vocab = api.llama_model_get_vocab(model)
        self.n_vocab = api.llama_vocab_n_tokens(self.vocab)
        self.bos = lib.llama_vocab_bos(self.vocab) if lib.llama_vocab_get_add_bos(self.vocab) else -1
        self.batch = api.llama_batch_init(max(n_ctx, 1), 0, 1)

    def close(self):
        self.api.llama_batch_free(self.batch)
        self.api.llama_free(self.ctx)

    def _decode(self, tokens, pos0):
        b = self.batch
        b.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if i == len(tokens) - 1 else 0
        rc = self.api.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def prompt(self, n_prompt):
        # One batch, as llama-bench with its default -b 2048 for n_prompt <= 2048.
        toks = [random.randrange(self.n_vocab) for _ in range(n_prompt)]
        if self.bos >= 0 and toks:
            toks[0] = self.bos
        for start in range(0, n_prompt, 2048):
            self._decode(toks[start:start + 2048], start)
        self.lib.llama_synchronize(self.ctx)

    def gen(self, n_gen):
        tok = self.bos if self.bos >= 0 else random.randrange(self.n_vocab)
        for pos in range(n_gen):
            self._decode([tok], pos)
            self.lib.llama_synchronize(self.ctx)
            tok = random.randrange(self.n_vocab)

    def clear(self):
        self.api.llama_kv_cache_clear(self.ctx)


def run_test(bench, n_prompt, n_gen, reps):
    # Warm-up as llama-bench: the whole prompt, or one generated token.
    bench.clear()
    if n_prompt:
        bench.prompt(n_prompt)
    if n_gen:
        bench.gen(1)
    samples = []
    for _ in range(reps):
        bench.clear()
        t0 = time.perf_counter_ns()
        if n_prompt:
            bench.prompt(n_prompt)
        if n_gen:
            bench.gen(n_gen)
        samples.append(time.perf_counter_ns() - t0)
    return samples


def record(path, model_size, n_prompt, n_gen, threads, samples, sysinfo, version):
    n_tok = n_prompt + n_gen
    ts = [n_tok * 1e9 / s for s in samples]
    return {
        "build_commit": version,
        "cpu_info": sysinfo,
        "model_filename": path,
        "model_size": model_size,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_threads": threads,
        "flash_attn": False,
        "samples_ns": samples,
        "samples_ts": ts,
        "avg_ns": int(statistics.mean(samples)),
        "stddev_ns": int(statistics.stdev(samples)) if len(samples) > 1 else 0,
        "avg_ts": statistics.mean(ts),
        "stddev_ts": statistics.stdev(ts) if len(ts) > 1 else 0.0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-v", action="store_true", help="keep the library's log")
    args = ap.parse_args()
    try:
        api, lib = load_api()
    except Exception as e:  # noqa: BLE001 - any import/binding failure means "n/a"
        print(f"ik_bench: cannot load ik_llama_cpp: {e}", file=sys.stderr)
        return 2
    if not args.v:
        # A no-op C callback silences the per-load chatter on stderr.
        log_cb = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(lambda *a: None)
        lib.llama_log_set(ctypes.cast(log_cb, ctypes.c_void_p), None)
    api.llama_backend_init()
    mp = api.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = api.llama_model_load_from_file(args.model.encode(), mp)
    if not model:
        print(f"ik_bench: cannot load model {args.model}", file=sys.stderr)
        return 1
    version = "ik-llama-cpp-python " + getattr(sys.modules.get("ik_llama_cpp"), "__version__", "?")
    sysinfo = lib.llama_print_system_info().decode().strip()
    size = int(lib.llama_model_size(model))
    out = []
    try:
        for n_prompt, n_gen in ((args.p, 0), (0, args.n)):
            if n_prompt + n_gen == 0:
                continue
            bench = Bench(api, lib, model, n_prompt + n_gen, args.t, args.v)
            try:
                samples = run_test(bench, n_prompt, n_gen, args.r)
            finally:
                bench.close()
            out.append(record(os.path.basename(args.model), size, n_prompt, n_gen, args.t,
                              samples, sysinfo, version))
    except RuntimeError as e:
        print(f"ik_bench: {e}", file=sys.stderr)
        return 1
    finally:
        api.llama_free_model(model)
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
