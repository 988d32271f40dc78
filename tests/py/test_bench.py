"""`tokenloop bench`: the JSON and markdown reports of a short prefill/decode
run (llama-bench's field names, statistics recomputed from the samples), the
decode bytes per token against the tensor table read with the gguf package
(tied and untied, fused Phi-3 tensors), `--memory`, and option errors.
Speeds are only checked to be positive: the machines are shared and noisy.
Usage: TL_BIN=build/tokenloop python3 tests/py/test_bench.py
(TL_VOCAB_DIR: the shared vocabularies, for the random-weight models)"""
import json
import math
import os
import subprocess
import sys
import tempfile

import gguf

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TL_BIN = os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop"))
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")
TIMEOUT = 120

from tlcheck import check, finish, summary  # noqa: F401  (shared pass/fail counting)
import tlcheck


def bench(*args):
    return subprocess.run([TL_BIN, "bench"] + list(args), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=ROOT)


def close(a, b, rel=1e-5):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def tensor_table(path):
    """[(name, shape, nbytes)] from a GGUF header (in its first 64 MiB). gguf.GGUFReader would do,
    but it parses every metadata array (seconds for Gemma's 262k tokens), so
    this walks the header and skips the metadata."""
    import struct
    with open(path, "rb") as f:
        buf = f.read(64 << 20)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def skip_value(vt):
        nonlocal pos
        if vt == gguf.GGUFValueType.STRING:
            n = take("Q")
            pos += n
        elif vt == gguf.GGUFValueType.ARRAY:
            at, n = take("IQ")
            if at == gguf.GGUFValueType.STRING:
                for _ in range(n):
                    ln = take("Q")
                    pos += ln
            else:
                pos += n * SCALAR_SIZE[at]
        else:
            pos += SCALAR_SIZE[vt]

    magic, _version, n_tensors, n_kv = take("4sIQQ")
    assert magic == b"GGUF", path
    for _ in range(n_kv):
        ln = take("Q")
        pos += ln
        skip_value(take("I"))
    out = []
    for _ in range(n_tensors):
        ln = take("Q")
        name = buf[pos:pos + ln].decode()
        pos += ln
        shape = [take("Q") for _ in range(take("I"))]
        ttype = take("I")
        take("Q")
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
        out.append((name, shape, math.prod(shape) // block * size))
    return out


SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def expected_tensors(path):
    """(bytes one decoded token reads, tensor bytes, parameters) from the file:
    every tensor but the token embedding in full; of the embedding one row,
    or all of it when there is no output.weight (tied)."""
    table = tensor_table(path)
    names = {t[0] for t in table}
    total = params = decode = 0
    for name, shape, nb in table:
        total += nb
        params += math.prod(shape)
        if name == "token_embd.weight" and "output.weight" in names:
            decode += nb // shape[1]  # shape[1]: rows (n_vocab)
        else:
            decode += nb
    return decode, total, params


def stdev(v):
    """llama-bench's sample standard deviation."""
    n = len(v)
    if n <= 1:
        return 0.0
    m = sum(v) / n
    sq = sum(x * x for x in v)
    return math.sqrt(max(sq / (n - 1) - m * m * n / (n - 1), 0.0))


def check_json_run():
    reps = 2
    p = bench("-m", SMOL, "-p", "16", "-n", "4", "-r", str(reps), "-t", "1", "-o", "json")
    if not check(p.returncode == 0, f"json run failed: {p.stderr[-400:]}"):
        return
    try:
        res = json.loads(p.stdout)
    except ValueError as e:
        check(False, f"stdout is not JSON ({e}): {p.stdout[:300]!r}")
        return
    check(isinstance(res, list) and len(res) == 2, f"2 objects expected, got {res!r:.200}")
    if len(res) != 2:
        return
    check("prompt run" in p.stderr and "generation run" in p.stderr, "progress on stderr")
    decode, total, params = expected_tensors(SMOL)
    fields = ["model_filename", "model_type", "model_size", "model_n_params", "n_threads",
              "n_prompt", "n_gen", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
              "samples_ns", "samples_ts", "backend", "decode_bytes"]
    for o, (npr, ngen) in zip(res, [(16, 0), (0, 4)]):
        tag = f"pp{npr}" if npr else f"tg{ngen}"
        missing = [f for f in fields if f not in o]
        check(not missing, f"{tag}: fields missing: {missing}")
        if missing:
            continue
        check(o["n_prompt"] == npr and o["n_gen"] == ngen, f"{tag}: n_prompt/n_gen {o['n_prompt']}/{o['n_gen']}")
        check(o["n_threads"] == 1, f"{tag}: n_threads {o['n_threads']}")
        check(o["model_filename"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf"), f"{tag}: model_filename")
        check(o["model_type"].startswith("llama ") and "Q4_1" in o["model_type"], f"{tag}: model_type {o['model_type']}")
        check(o["model_size"] == total, f"{tag}: model_size {o['model_size']} != {total}")
        check(o["model_n_params"] == params, f"{tag}: model_n_params {o['model_n_params']} != {params}")
        check(o["backend"] in ("scalar", "avx2", "avx512", "avx512-vnni", "avx512-bf16", "amx"), f"{tag}: backend {o['backend']}")
        ns, ts = o["samples_ns"], o["samples_ts"]
        check(len(ns) == reps and len(ts) == reps, f"{tag}: {len(ns)}/{len(ts)} samples, want {reps}")
        check(all(x > 0 for x in ns) and o["avg_ts"] > 0, f"{tag}: non-positive times or speed")
        n_tok = npr + ngen
        check(all(close(t, 1e9 * n_tok / n, 1e-5) for t, n in zip(ts, ns)), f"{tag}: samples_ts != n/t")
        check(close(o["avg_ts"], sum(ts) / len(ts), 1e-5), f"{tag}: avg_ts {o['avg_ts']} != mean {ts}")
        check(abs(o["stddev_ts"] - stdev(ts)) <= 1e-5 * max(1.0, o["avg_ts"]), f"{tag}: stddev_ts {o['stddev_ts']}")
        check(o["avg_ns"] == sum(ns) // len(ns), f"{tag}: avg_ns {o['avg_ns']}")
        check(abs(o["stddev_ns"] - stdev(ns)) <= 1.0 + 1e-9 * stdev(ns), f"{tag}: stddev_ns {o['stddev_ns']}")
        check(o["decode_bytes"] == decode, f"{tag}: decode_bytes {o['decode_bytes']} != {decode}")
        size = os.path.getsize(SMOL)
        check(0.5 * size <= o["decode_bytes"] <= 1.2 * size, f"{tag}: decode_bytes vs file size {size}")
        if ngen:
            check("gbps" in o and close(o["gbps"], o["decode_bytes"] * o["avg_ts"] / 1e9, 1e-4),
                  f"{tag}: gbps {o.get('gbps')} != decode_bytes*avg_ts/1e9")
        else:
            check("gbps" not in o, f"{tag}: gbps on a prefill row")


def check_markdown():
    p = bench("-m", SMOL, "-p", "8", "-n", "2,0", "-r", "1", "-t", "1", "--no-warmup")
    if not check(p.returncode == 0, f"md run failed: {p.stderr[-400:]}"):
        return
    lines = [l for l in p.stdout.splitlines() if l.startswith("|")]
    check(len(lines) == 4, f"header, rule and 2 rows expected: {p.stdout!r}")
    if len(lines) != 4:
        return
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    check(head == ["model", "size", "params", "backend", "threads", "test", "t/s", "GB/s"], f"header {head}")
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]
    check([r[5] for r in rows] == ["pp8", "tg2"], f"tests {[r[5] for r in rows]}")
    check(all(" ± " in r[6] and float(r[6].split(" ± ")[0]) > 0 for r in rows), f"t/s {rows}")
    check(rows[0][7] == "" and float(rows[1][7]) > 0, f"GB/s only on the decode row: {rows}")
    check(rows[0][4] == "1" and rows[0][2].endswith(" M") and rows[0][1].endswith(" MiB"), f"row {rows[0]}")
    check("warmup" not in p.stderr, "--no-warmup still warmed up")


def check_decode_bytes_models():
    """Gemma 3 (tied, K-quants) and random-weight models: untied with fused
    tensors (Phi-3), untied with biases (Qwen2)."""
    with tempfile.TemporaryDirectory() as tmp:
        models = [GEMMA]
        for arch, extra in [("phi3", ["--untied", "--type", "q8_0"]), ("qwen2", ["--untied"])]:
            path = os.path.join(tmp, f"{arch}.gguf")
            mk = subprocess.run([sys.executable, MKMODEL, arch, path] + extra, capture_output=True,
                                text=True, timeout=TIMEOUT)
            if check(mk.returncode == 0, f"mkmodel {arch} failed: {mk.stderr[-300:]}"):
                models.append(path)
        for m in models:
            p = bench("-m", m, "-p", "0", "-n", "1", "-r", "1", "--no-warmup", "-t", "1", "-o", "json")
            name = os.path.basename(m)
            if not check(p.returncode == 0, f"{name}: bench failed: {p.stderr[-300:]}"):
                continue
            res = json.loads(p.stdout)
            decode, total, _ = expected_tensors(m)
            check(len(res) == 1 and res[0]["decode_bytes"] == decode,
                  f"{name}: decode_bytes {res[0].get('decode_bytes') if res else None} != {decode}")
            check(res[0]["model_size"] == total, f"{name}: model_size")


def check_no_vocab():
    """A file without a vocabulary (tokenizer.ggml.model = none, as random-weight
    benchmark files are) benchmarks like any other; text commands refuse it
    with an error that says why."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "novocab.gguf")
        mk = subprocess.run([sys.executable, MKMODEL, "llama3", path, "--type", "q8_0", "--no-vocab"],
                            capture_output=True, text=True, timeout=TIMEOUT)
        if not check(mk.returncode == 0, f"mkmodel --no-vocab failed: {mk.stderr[-300:]}"):
            return
        p = bench("-m", path, "-p", "16", "-n", "4", "-r", "1", "-t", "1", "-o", "json")
        if check(p.returncode == 0, f"bench on a vocabulary-less file failed: {p.stderr[-300:]}"):
            res = json.loads(p.stdout)
            check([(o["n_prompt"], o["n_gen"]) for o in res] == [(16, 0), (0, 4)] and
                  all(o["avg_ts"] > 0 for o in res), f"no-vocab results {res}")
        r = subprocess.run([TL_BIN, "run", "-m", path, "-p", "hello", "-n", "2"], capture_output=True,
                           text=True, timeout=TIMEOUT)
        check(r.returncode == 1 and "no vocabulary" in r.stderr, f"run on a no-vocab file: {r.returncode} {r.stderr!r}")


def check_memory():
    p = bench("--memory", "-t", "1", "-o", "json", "--mem-dram", "256")
    if not check(p.returncode == 0, f"--memory failed: {p.stderr[-400:]}"):
        return
    res = json.loads(p.stdout)
    check([o.get("test") for o in res] == ["mem_read_cache", "mem_read_dram"], f"memory tests {res}")
    for o in res:
        check(o.get("gbps", 0) > 0 and o.get("n_threads") == 1, f"memory result {o}")
    check([o.get("buffer_bytes") for o in res] == [16 << 20, 256 << 20], f"buffer sizes {res}")
    p = bench("--memory", "-t", "2", "--mem-cache", "4", "--mem-dram", "64")
    check(p.returncode == 0 and "mem_read_dram" in p.stdout and "GB/s" in p.stdout, f"--memory md: {p.stdout!r}")


def check_depth():
    """-d fills the context before each run (llama-bench's n_depth): every
    (test, depth) pair is a row, named 'tg4 @ d40' in markdown."""
    p = bench("-m", SMOL, "-p", "16", "-n", "4", "-d", "0,40", "-r", "1", "-t", "1", "-o", "json")
    if not check(p.returncode == 0, f"depth run failed: {p.stderr[-400:]}"):
        return
    res = json.loads(p.stdout)
    got = [(o["n_prompt"], o["n_gen"], o["n_depth"]) for o in res]
    check(got == [(16, 0, 0), (16, 0, 40), (0, 4, 0), (0, 4, 40)], f"rows (n_prompt, n_gen, n_depth): {got}")
    check(all(o["avg_ts"] > 0 for o in res), "depth rows: speeds")
    p = bench("-m", SMOL, "-p", "0", "-n", "2", "-d", "600", "-r", "1", "-t", "1", "--no-warmup")
    check(p.returncode == 0 and "tg2 @ d600" in p.stdout, f"md depth row: {p.stdout[-300:]!r} {p.stderr[-200:]!r}")


def check_parallel():
    """--parallel N: decode tests run N sequences side by side (the server's
    step with N streams); t/s counts every sequence's tokens, prefill tests
    are unchanged, and GB/s is a step's bytes per step (a tied dense model:
    one token's bytes, read once for all N)."""
    p = bench("-m", SMOL, "-p", "8", "-n", "4", "-d", "0,20", "-r", "2", "-t", "1", "--parallel", "3", "-o", "json")
    if not check(p.returncode == 0, f"--parallel run failed: {p.stderr[-400:]}"):
        return
    res = json.loads(p.stdout)
    got = [(o["n_prompt"], o["n_gen"], o["n_depth"], o["n_parallel"]) for o in res]
    check(got == [(8, 0, 0, 1), (8, 0, 20, 1), (0, 4, 0, 3), (0, 4, 20, 3)], f"--parallel rows: {got}")
    for o in res:
        n_tok = o["n_prompt"] or o["n_gen"] * o["n_parallel"]
        check(all(close(t, 1e9 * n_tok / n, 1e-5) for t, n in zip(o["samples_ts"], o["samples_ns"]))
              and o["avg_ts"] > 0, f"--parallel: samples_ts counts every sequence's tokens: {o}")
        if o["n_gen"]:
            check(o.get("step_bytes") == o["decode_bytes"], f"--parallel: a tied dense model's step bytes {o}")
            check("gbps" in o and close(o["gbps"], o["decode_bytes"] * o["avg_ts"] / 3 / 1e9, 1e-4),
                  f"--parallel: gbps = step bytes x steps/s: {o}")
        else:
            check("gbps" not in o and "step_bytes" not in o, f"--parallel: a prefill row {o}")
    p = bench("-m", SMOL, "-p", "0", "-n", "2", "-r", "1", "-t", "1", "-np", "2", "--no-warmup")
    row = [ln for ln in p.stdout.splitlines() if "tg2 x2" in ln]
    cell = row[0].rstrip().rstrip("|").split("|")[-1].strip() if len(row) == 1 else ""
    check(p.returncode == 0 and len(row) == 1 and float(cell or 0) > 0,
          f"--parallel markdown row 'tg2 x2' with its GB/s: {p.stdout!r} {p.stderr[-200:]!r}")


def check_step_bytes_moe():
    """A mixture's step of N sequences reads each expert with the probability
    that one of the N tokens chose it, 1 - (1 - k/n)^N (routing taken as
    uniform), the rest once and the embedding row N times: computed here
    from the file's tensors, against bench's step_bytes, and the bound it
    prints."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "moe.gguf")
        mk = subprocess.run([sys.executable, MKMODEL, "qwen3moe", path, "--untied", "--no-vocab"],
                            capture_output=True, text=True, timeout=TIMEOUT)
        if not check(mk.returncode == 0, f"mkmodel qwen3moe failed: {mk.stderr[-300:]}"):
            return
        r = gguf.GGUFReader(path)
        field = lambda k: int(r.fields[k].parts[-1][0])  # noqa: E731
        ne, k = field("qwen3moe.expert_count"), field("qwen3moe.expert_used_count")
        table = tensor_table(path)
        n_vocab = [shape[1] for name, shape, _ in table if name == "token_embd.weight"][0]
        for n_par in (1, 4, 16):
            chosen = ne * (1 - (1 - k / ne) ** n_par)
            want, n_exps = 0, 0
            for name, shape, nb in table:
                if name == "token_embd.weight":
                    want += n_par * (nb // n_vocab)
                elif "_exps" in name:
                    want += (k * (nb // ne)) if n_par == 1 else int((nb // ne) * chosen + 0.5)
                    n_exps += 1
                else:
                    want += nb
            p = bench("-m", path, "-p", "0", "-n", "1", "-r", "1", "--no-warmup", "-t", "1", "--parallel", str(n_par),
                      "-o", "json")
            if not check(p.returncode == 0, f"moe --parallel {n_par}: {p.stderr[-300:]}"):
                continue
            o = json.loads(p.stdout)[0]
            got = o.get("step_bytes", o["decode_bytes"])
            check(abs(got - want) <= n_exps, f"moe --parallel {n_par}: step bytes {got} != {want}")
            if n_par == 1:
                check(o["decode_bytes"] == want and "step_bytes" not in o, f"moe: decode bytes {o}")
            else:
                bound = f"at most {n_par * o['decode_bytes'] / got:.2f}x"
                check(bound in p.stderr and (n_par * o["decode_bytes"] / got) < n_par,
                      f"moe --parallel {n_par}: the printed bound ({bound}): {p.stderr[-300:]}")


def check_errors():
    cases = [(["--parallel", "0"], "--parallel"), (["--bogus"], "unknown option"), (["-p", "1,,2"], "-p"), (["-n", "-1"], "-n"),
             (["-r", "0"], "-r"), (["-o", "xml"], "xml"), (["-t"], "needs a value"),
             (["-p", "0", "-n", "0"], "nothing to run"), (["-d", "-1"], "-d")]
    for args, msg in cases:
        p = bench("-m", SMOL, *args)
        check(p.returncode == 2 and msg in p.stderr and p.stdout == "",
              f"{args}: rc {p.returncode}, stderr {p.stderr!r}")
    p = bench("-m", os.path.join(ROOT, "no-such-model.gguf"), "-r", "1")
    check(p.returncode == 1 and "no-such-model.gguf" in p.stderr, f"missing file: {p.returncode} {p.stderr!r}")
    p = bench("--help")
    check(p.returncode == 0 and "--memory" in p.stdout and "--no-warmup" in p.stdout, "--help")


def main():
    for f in (SMOL, GEMMA, MKMODEL):
        check(os.path.exists(f), f"missing {f} (run 'make models')")
    check(os.access(TL_BIN, os.X_OK), f"no binary at {TL_BIN}")
    if tlcheck.failed == 0:
        check_json_run()
        check_markdown()
        check_decode_bytes_models()
        check_no_vocab()
        check_memory()
        check_depth()
        check_parallel()
        check_step_bytes_moe()
        check_errors()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
