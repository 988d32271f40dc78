#!/usr/bin/env python3
"""test_quantize: `tokenloop quantize` against the gguf Python package and
llama.cpp's llama-quantize rules. Quantizes the real SmolLM2 model to several
types and a synthetic model whose shapes trigger every rule (Q6_K output,
Q4_K_S mixture, fallbacks for rows that are no whole number of blocks); checks
the metadata is copied, each tensor's type is what llama-quantize picks,
converted blocks are byte-identical to gguf.quants.quantize of the dequantized
source (types gguf can quantize) or within the type's error (K-quants), that
the engine runs the result, and that bad arguments fail cleanly without
leaving files. Run: TL_BIN=build/tokenloop python3 tests/py/test_quantize.py"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tlcheck import check, finish, summary  # noqa: F401  (shared pass/fail counting)
import tlcheck


try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError as e:  # no silent skip: a missing package is a failure
    check(False, f"the gguf Python package is required: {e}")
    finish()

TL_BIN = os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop"))
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
# LLAMA_FTYPE per target (K-quants: the _S mix), from llama.cpp's llama.h.
FTYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
         "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17,
         "Q6_K": 18, "IQ4_XS": 30, "BF16": 32}
GGUF_CAN_QUANTIZE = {QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0}
# Relative RMS error bounds for values of N(0, s) rows (measured errors are
# about 2/3 of these): the types gguf cannot quantize are checked this way.
REL_RMSE = {QT.Q4_K: 0.13, QT.Q5_K: 0.065, QT.Q6_K: 0.035}


def run(args, timeout=120):
    return subprocess.run([TL_BIN] + args, capture_output=True, text=True, timeout=timeout)


def quantize(src, dst, qtype, pure=False):
    args = ["quantize", "-t", "2"] + (["--pure"] if pure else []) + [src, dst, qtype]
    r = run(args)
    ok = r.returncode == 0 and os.path.isfile(dst)
    check(ok, f"quantize {qtype}{' --pure' if pure else ''} {os.path.basename(src)}: rc {r.returncode}: {r.stderr[-400:]}")
    check(not os.path.exists(dst + ".tmp"), f"{dst}.tmp left behind")
    if ok:
        check("quantize:" in r.stderr.splitlines()[-1], f"{qtype}: no final summary line on stderr")
    return ok


class Tensor:
    """A tensor of a GGUF file: shape as ne (innermost first), data as bytes
    shaped (rows, bytes per row)."""

    def __init__(self, name, shape, qt, data):
        self.name, self.shape, self.tensor_type, self.data = name, shape, qt, data


def read_gguf(path):
    """A fast GGUF reader for the checks (gguf.GGUFReader takes seconds on a
    49k-token vocabulary): {key: (type, raw value bytes)} and the tensors."""
    import struct
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    b = buf.tobytes() if len(buf) < (1 << 16) else bytes(buf[: 1 << 24])
    assert b[:4] == b"GGUF", path
    _, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    pos = 24
    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(t, p):
        if t in scalar:
            return p + scalar[t]
        if t == 8:
            return p + 8 + struct.unpack_from("<Q", b, p)[0]
        et, n = struct.unpack_from("<IQ", b, p)
        p += 12
        if et in scalar:
            return p + n * scalar[et]
        for _ in range(n):
            p = skip(et, p)
        return p

    kvs = {}
    for _ in range(n_kv):
        klen = struct.unpack_from("<Q", b, pos)[0]
        key = b[pos + 8: pos + 8 + klen].decode()
        t = struct.unpack_from("<I", b, pos + 8 + klen)[0]
        v0 = pos + 12 + klen
        pos = skip(t, v0)
        kvs[key] = (t, b[v0:pos])
    infos = []
    for _ in range(n_t):
        nlen = struct.unpack_from("<Q", b, pos)[0]
        name = b[pos + 8: pos + 8 + nlen].decode()
        pos += 8 + nlen
        nd = struct.unpack_from("<I", b, pos)[0]
        ne = list(struct.unpack_from(f"<{nd}Q", b, pos + 4))
        qt, off = struct.unpack_from("<IQ", b, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        infos.append((name, ne, QT(qt), off))
    align = 32
    if "general.alignment" in kvs:
        align = struct.unpack("<I", kvs["general.alignment"][1])[0]
    data0 = (pos + align - 1) // align * align
    tensors = []
    for name, ne, qt, off in infos:
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        row = ne[0] // bs * ts
        rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
        data = buf[data0 + off: data0 + off + row * rows].reshape(rows, row)
        tensors.append(Tensor(name, ne, qt, data))
    return kvs, tensors


def to_f32(t, rows):
    d = np.ascontiguousarray(t.data[rows])
    if t.tensor_type == QT.F32:
        return d.view(np.float32)
    if t.tensor_type == QT.F16:
        return d.view(np.float16).astype(np.float32)
    return gguf.quants.dequantize(d, t.tensor_type).astype(np.float32)


def check_metadata(src, out, qtype, what):
    for k, v in src.items():
        if k in ("general.file_type", "general.quantization_version"):
            continue
        check(out.get(k) == v, f"{what}: key {k} not copied byte for byte")
    check(out.get("general.file_type") == (4, FTYPE[qtype].to_bytes(4, "little")), f"{what}: general.file_type")
    check(out.get("general.quantization_version") == (4, (2).to_bytes(4, "little")),
          f"{what}: general.quantization_version")


def check_with_gguf_package(src_path, out_path, what):
    """The gguf package reads the output: same fields (but the two set), same tensors."""
    try:
        src, out = gguf.GGUFReader(src_path), gguf.GGUFReader(out_path)
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: gguf.GGUFReader: {e}")
        return
    for k, f in src.fields.items():
        if k.startswith("GGUF.") or k in ("general.file_type", "general.quantization_version"):
            continue
        check(k in out.fields and f.contents() == out.fields[k].contents(), f"{what}: gguf sees key {k} differ")
    st = {t.name: list(t.shape) for t in src.tensors}
    ot = {t.name: list(t.shape) for t in out.tensors}
    check(st == ot, f"{what}: gguf sees other tensors or shapes")


def sample_rows(n):
    """All rows of small tensors; the first and last 96 of big ones (time)."""
    return slice(None) if n <= 192 else np.r_[0:96, n - 96:n]


def check_data(st, ot, what):
    """ot's data is st's, copied (same type) or converted as llama.cpp does."""
    rows = sample_rows(st.data.shape[0])
    if st.tensor_type == ot.tensor_type:
        check(np.array_equal(st.data[rows], ot.data[rows]), f"{what}: copied bytes differ")
        return
    x = to_f32(st, rows)
    if ot.tensor_type in GGUF_CAN_QUANTIZE:
        want = gguf.quants.quantize(x, ot.tensor_type)
        same = np.array_equal(np.ascontiguousarray(want).view(np.uint8).reshape(-1),
                              np.ascontiguousarray(ot.data[rows]).reshape(-1))
        check(same, f"{what}: {ot.tensor_type.name} blocks differ from gguf.quants.quantize")
        return
    y = to_f32(ot, rows).reshape(x.shape)
    rel = float(np.sqrt(np.mean((y - x) ** 2)) / max(np.sqrt(np.mean(x ** 2)), 1e-30))
    bound = REL_RMSE[ot.tensor_type]
    check(rel <= bound, f"{what}: {ot.tensor_type.name} relative RMS error {rel:.4f} > {bound}")


def compare(src_path, out_path, qtype, expect, what):
    """expect(name, src tensor) -> the type llama-quantize gives that tensor."""
    (skv, stl), (okv, otl) = read_gguf(src_path), read_gguf(out_path)
    check_metadata(skv, okv, qtype, what)
    st = {t.name: t for t in stl}
    ot = {t.name: t for t in otl}
    check(set(st) == set(ot), f"{what}: tensor names differ")
    for name in sorted(set(st) & set(ot)):
        s, o = st[name], ot[name]
        check(s.shape == o.shape, f"{what}: {name} shape {o.shape}")
        want = expect(name, s)
        check(o.tensor_type == want, f"{what}: {name} is {o.tensor_type.name}, llama-quantize gives {want.name}")
        if o.tensor_type == want:
            check_data(s, o, f"{what}: {name}")


# ---- the rules, written from llama.cpp's llama-quant.cpp ------------------------

BLOCK = {QT.F32: 1, QT.F16: 1, QT.BF16: 1, QT.Q4_0: 32, QT.Q4_1: 32, QT.Q5_0: 32, QT.Q5_1: 32,
         QT.Q8_0: 32, QT.Q4_K: 256, QT.Q5_K: 256, QT.Q6_K: 256}


def smol_expect(qtype, pure):
    """SmolLM2: tied (no output.weight), 576 wide (no multiple of 256), 30 layers."""
    target = QT[qtype[:4] if qtype[1:3] in ("4_", "5_") and qtype.endswith(("_S", "_M")) else qtype]

    def expect(name, t):
        dims = [d for d in t.shape if d > 1]
        if len(dims) < 2 or not name.endswith("weight") or "_norm.weight" in name:
            return t.tensor_type
        if target in (QT.F32, QT.F16, QT.BF16):
            return target
        ncols = int(t.shape[0])
        new = target
        if not pure and name == "token_embd.weight":
            new = QT.Q8_0 if ncols % BLOCK[target] else (target if target == QT.Q8_0 else QT.Q6_K)
        if not pure and qtype == "Q4_K_S":  # first 4 attn_v, first 30/8 ffn_down
            layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
            if name.endswith("attn_v.weight") and layer < 4:
                new = QT.Q5_K
            if "ffn_down" in name and layer < 30 // 8:
                new = QT.Q5_K
        if ncols % BLOCK[new]:
            new = {QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0}.get(new, new)
            if ncols % BLOCK[new]:
                new = QT.F16
        return new
    return expect


def test_smollm(tmp):
    if not os.path.isfile(SMOL):
        check(False, f"{SMOL} missing (run scripts/fetch-models.sh)")
        return
    cases = [("Q8_0", False), ("Q4_0", True), ("Q4_1", False), ("Q4_K_S", False), ("Q6_K", True),
             ("F16", False), ("bf16", False)]
    for qtype, pure in cases:
        out = os.path.join(tmp, f"smol-{qtype}{'-pure' if pure else ''}.gguf")
        if not quantize(SMOL, out, qtype, pure):
            continue
        what = f"SmolLM2 -> {qtype}{' --pure' if pure else ''}"
        compare(SMOL, out, qtype.upper(), smol_expect(qtype.upper(), pure), what)
        if qtype == "Q4_0":  # the package is slow on this vocabulary: once
            check_with_gguf_package(SMOL, out, what)
        r = run(["run", "-m", out, "-p", "Hello", "-n", "4", "--temp", "0"])
        check(r.returncode == 0, f"{what}: tokenloop run failed: {r.stderr[-300:]}")
        os.remove(out)


# ---- a synthetic model whose shapes trigger every rule -----------------------------

N_LAYER, D, KV, FF, VOCAB = 8, 256, 128, 512, 320


def write_synthetic(path, tied):
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("quantize-test")
    w.add_block_count(N_LAYER)
    w.add_embedding_length(D)
    w.add_file_type(0)
    w.add_array("general.tags", ["a", "b"])
    w.add_float32("test.f32", 1.5)
    mat = lambda r, c: (rng.standard_normal((r, c)) * 0.05).astype(np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", mat(VOCAB, D))
    w.add_tensor("output_norm.weight", np.ones(D, dtype=np.float32))
    if not tied:
        w.add_tensor("output.weight", mat(VOCAB, D))
    w.add_tensor("extra.narrow.weight", mat(8, 80))    # 80: no whole 32-block -> F16
    w.add_tensor("extra.mid.weight", mat(8, 288))      # 288: 32-blocks, no 256-block
    w.add_tensor("extra.row.weight", mat(1, 256))      # one row: ggml sees 1-D
    w.add_tensor("extra.bias", mat(4, 256))            # not a "weight"
    w.add_tensor("extra.attn_norm.weight", mat(4, 256))  # a norm, though 2-D
    for i in range(N_LAYER):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(D, dtype=np.float32))
        for n, r, c in (("attn_q", D, D), ("attn_k", KV, D), ("attn_v", KV, D), ("attn_output", D, D),
                        ("ffn_gate", FF, D), ("ffn_up", FF, D), ("ffn_down", D, FF)):
            w.add_tensor(b + n + ".weight", mat(r, c))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def synth_expect(table):
    """table: name or name-pattern -> type, applied in order; '*' = the rest."""
    def expect(name, t):
        for key, qt in table:
            if key == name or (key.endswith("*") and name.startswith(key[:-1])) or key == "*":
                return qt if qt is not None else t.tensor_type
        raise KeyError(name)
    return expect


KEEP = [("output_norm.weight", None), ("extra.row.weight", None), ("extra.bias", None),
        ("extra.attn_norm.weight", None)] + [(f"blk.{i}.attn_norm.weight", None) for i in range(N_LAYER)]


def test_synthetic(tmp):
    tied, untied = os.path.join(tmp, "tied.gguf"), os.path.join(tmp, "untied.gguf")
    write_synthetic(tied, True)
    write_synthetic(untied, False)
    q4k_mix = [(f"blk.{i}.attn_v.weight", QT.Q5_K) for i in range(4)] + [("blk.0.ffn_down.weight", QT.Q5_K)]
    cases = [
        # (source, type, pure, expected types): llama-quantize's choices.
        (tied, "Q4_0", False, [("token_embd.weight", QT.Q6_K), ("extra.narrow.weight", QT.F16), ("*", QT.Q4_0)]),
        (tied, "Q4_0", True, [("extra.narrow.weight", QT.F16), ("*", QT.Q4_0)]),
        (untied, "Q4_0", False, [("output.weight", QT.Q6_K), ("extra.narrow.weight", QT.F16), ("*", QT.Q4_0)]),
        (tied, "Q8_0", False, [("extra.narrow.weight", QT.F16), ("*", QT.Q8_0)]),
        (tied, "Q4_K_S", False, [("token_embd.weight", QT.Q6_K), ("extra.narrow.weight", QT.F16),
                               ("extra.mid.weight", QT.Q5_0)] + q4k_mix + [("*", QT.Q4_K)]),
        (untied, "Q4_K_M", True, [("extra.narrow.weight", QT.F16), ("extra.mid.weight", QT.Q5_0), ("*", QT.Q4_K)]),
        (tied, "Q5_K_S", True, [("extra.narrow.weight", QT.F16), ("extra.mid.weight", QT.Q5_1), ("*", QT.Q5_K)]),
        (untied, "Q6_K", False, [("extra.narrow.weight", QT.F16), ("extra.mid.weight", QT.Q8_0), ("*", QT.Q6_K)]),
        (tied, "F16", False, [("*", QT.F16)]),
        (untied, "BF16", True, [("*", QT.BF16)]),
    ]
    for src, qtype, pure, table in cases:
        out = os.path.join(tmp, "synth-out.gguf")
        what = f"synthetic {os.path.basename(src)} -> {qtype}{' --pure' if pure else ''}"
        if quantize(src, out, qtype, pure):
            compare(src, out, qtype, synth_expect(KEEP + table), what)
            check_with_gguf_package(src, out, what)
            os.remove(out)
    # Requantizing a quantized file: from the Q4_K file to Q8_0 (dequantize, quantize).
    mid = os.path.join(tmp, "synth-q4k.gguf")
    out = os.path.join(tmp, "synth-q8.gguf")
    if quantize(tied, mid, "Q4_K_S", True) and quantize(mid, out, "Q8_0", True):
        table = [("extra.narrow.weight", QT.F16), ("*", QT.Q8_0)]  # F16 already: copied
        compare(mid, out, "Q8_0", synth_expect(KEEP + table), "requantize Q4_K -> Q8_0")


# ---- the _S/_M mixes against llama-quantize's own choices ---------------------------
#
# Files whose shapes make every mix rule visible (rows of 256, so K-quants need
# no fallback): a dense llama with grouped KV heads, Mixtral's 8 experts, a
# qwen2moe with a shared expert (two ffn_down per layer, so the counter and the
# layer differ), and an 80-layer llama with grouped KV heads (llama.cpp's 70B
# rule). tests/oracle/make_fixtures_quantize.py ran llama-quantize on them:
# the fixture holds each tensor's type and a sha256 of its bytes.

MIX_FIXTURE = os.path.join(ROOT, "tests", "oracle", "fixtures", "quantize_mix.json")
MIX_KINDS = {
    # kind: (arch, layers, experts, used, shared expert width)
    "dense": ("llama", 16, 0, 0, 0),
    "mixtral": ("llama", 8, 8, 2, 0),
    "qwen2moe": ("qwen2moe", 16, 4, 2, 256),
    "llama80": ("llama", 80, 0, 0, 0),
}
MIX_TYPES = ["Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_M", "Q5_K_M", "Q4_K_S", "Q5_K_S", "IQ4_XS"]
# llama-quantize's aliases: the _M mixes
MIX_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}


def write_mix(path, kind):
    arch, n_layer, n_exp, n_used, ff_sh = MIX_KINDS[kind]
    d, n_head, n_kv, ff, vocab = 256, 8, 2, 256, 256
    rng = np.random.default_rng(11)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(n_layer)
    w.add_context_length(512)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d // n_head)
    w.add_file_type(1)
    if n_exp:
        w.add_expert_count(n_exp)
        w.add_expert_used_count(n_used)
        if arch == "qwen2moe":
            w.add_expert_feed_forward_length(ff)
            w.add_expert_shared_feed_forward_length(ff_sh)
    mat = lambda *shape: (rng.standard_normal(shape) * 0.05).astype(np.float16)  # noqa: E731
    w.add_tensor("token_embd.weight", mat(vocab, d))
    w.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    w.add_tensor("output.weight", mat(vocab, d))
    kv = d // n_head * n_kv
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(d, dtype=np.float32))
        w.add_tensor(b + "ffn_norm.weight", np.ones(d, dtype=np.float32))
        if kind == "llama80":  # the rule reads attn_v alone: the rest left out
            w.add_tensor(b + "attn_v.weight", mat(kv, d))
            continue
        for n, r, c in (("attn_q", d, d), ("attn_k", kv, d), ("attn_v", kv, d), ("attn_output", d, d)):
            w.add_tensor(b + n + ".weight", mat(r, c))
        if not n_exp:
            for n, r, c in (("ffn_gate", ff, d), ("ffn_up", ff, d), ("ffn_down", d, ff)):
                w.add_tensor(b + n + ".weight", mat(r, c))
            continue
        w.add_tensor(b + "ffn_gate_inp.weight", (rng.standard_normal((n_exp, d)) * 0.05).astype(np.float32))
        for n, r, c in (("ffn_gate_exps", ff, d), ("ffn_up_exps", ff, d), ("ffn_down_exps", d, ff)):
            w.add_tensor(b + n + ".weight", mat(n_exp, r, c))
        if ff_sh:
            w.add_tensor(b + "ffn_gate_inp_shexp.weight", (rng.standard_normal(d) * 0.05).astype(np.float32))
            for n, r, c in (("ffn_gate_shexp", ff_sh, d), ("ffn_up_shexp", ff_sh, d), ("ffn_down_shexp", d, ff_sh)):
                w.add_tensor(b + n + ".weight", mat(r, c))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tensor_digests(path):
    """A GGUF file's tensor types {name: type name} and one sha256 over all
    tensors' bytes in name order."""
    import hashlib
    _, tensors = read_gguf(path)
    h = hashlib.sha256()
    for t in sorted(tensors, key=lambda t: t.name):
        h.update(t.name.encode() + b"\0" + np.ascontiguousarray(t.data).tobytes())
    return {"types": {t.name: t.tensor_type.name for t in tensors}, "sha256": h.hexdigest()}


def mix_cases():
    """(kind, type) pairs: the 80-layer file only for the types its rule touches."""
    return [(k, q) for k in MIX_KINDS for q in MIX_TYPES
            if k != "llama80" or q in ("Q3_K_S", "Q3_K_M", "Q4_K_M")]


def test_mixes(tmp):
    import json
    try:
        with open(MIX_FIXTURE) as f:
            fix = json.load(f)
    except OSError as e:
        check(False, f"{MIX_FIXTURE}: {e}")
        return
    made = {}
    for kind, qtype in mix_cases():
        src = os.path.join(tmp, f"mix-{kind}.gguf")
        if kind not in made:
            write_mix(src, kind)
            made[kind] = src
        key = f"{kind} {qtype}"
        want = fix["files"].get(key)
        if not check(want is not None, f"{key}: not in {MIX_FIXTURE}"):
            continue
        out = os.path.join(tmp, "mix-out.gguf")
        if not quantize(src, out, qtype):
            continue
        got = tensor_digests(out)
        gt, wt = got["types"], want["types"]
        check(set(gt) == set(wt), f"{key}: tensor names differ from llama-quantize's")
        bad = [n for n in wt if n in gt and gt[n] != wt[n]]
        check(not bad, f"{key}: types differ from llama-quantize's: " +
              ", ".join(f"{n} {gt[n]} (want {wt[n]})" for n in bad[:6]))
        if not bad:
            check(got["sha256"] == want["sha256"], f"{key}: the tensors' bytes differ from llama-quantize's")
        if kind == "dense":  # info names the file type as quantize takes it
            r = run(["info", out])
            check(r.returncode == 0 and f"file type: {qtype} (general.file_type {FTYPE[qtype]})" in r.stdout,
                  f"{key}: info's file type line: {r.stdout[:400]}")
        os.remove(out)
    # the aliases write what their _M mix writes, with its file type
    src = made.get("dense")
    for alias, full in MIX_ALIASES.items():
        out = os.path.join(tmp, "mix-alias.gguf")
        want = fix["files"].get(f"dense {full}")
        if src and want and quantize(src, out, alias):
            check(tensor_digests(out) == want, f"{alias}: not llama-quantize's {full}")
            check(read_gguf(out)[0].get("general.file_type") == (4, FTYPE[full].to_bytes(4, "little")),
                  f"{alias}: general.file_type is not {full}'s")
            os.remove(out)
    for src in made.values():
        os.remove(src)


# ---- errors ---------------------------------------------------------------------

def expect_failure(args, out, needle, what):
    r = run(args)
    check(r.returncode == 1, f"{what}: exit {r.returncode}, want 1")
    check(needle in r.stderr, f"{what}: message lacks '{needle}': {r.stderr.strip()[-300:]}")
    check(not os.path.exists(out) and not os.path.exists(out + ".tmp"), f"{what}: left a file behind")


def test_errors(tmp):
    src = os.path.join(tmp, "tied.gguf")
    out = os.path.join(tmp, "err-out.gguf")
    expect_failure(["quantize", src, out, "Q3_X"], out, "unknown type", "unknown type")
    expect_failure(["quantize", os.path.join(tmp, "missing.gguf"), out, "Q4_0"], out, "missing.gguf",
                   "missing input")
    cut = os.path.join(tmp, "truncated.gguf")
    with open(src, "rb") as f:
        data = f.read()
    with open(cut, "wb") as f:
        f.write(data[: len(data) // 2])
    expect_failure(["quantize", cut, out, "Q4_0"], out, "truncated.gguf", "truncated input")
    before = os.path.getsize(src)
    r = run(["quantize", src, src, "Q4_0"])
    check(r.returncode == 1 and "same file" in r.stderr, f"same file: rc {r.returncode} {r.stderr.strip()[-200:]}")
    check(os.path.getsize(src) == before, "same file: the input changed")
    r = run(["quantize", src, out])
    check(r.returncode == 2 and not os.path.exists(out), f"missing TYPE: rc {r.returncode}")
    # An unwritable output directory: an error, nothing created.
    bad = os.path.join(tmp, "no-such-dir", "out.gguf")
    expect_failure(["quantize", src, bad, "Q4_0"], bad, "cannot create", "unwritable output")


def main():
    if not os.path.isfile(TL_BIN):
        check(False, f"{TL_BIN} not found (set TL_BIN)")
        finish()
    tmp = tempfile.mkdtemp(prefix="tl-quantize-")
    try:
        test_synthetic(tmp)
        test_mixes(tmp)
        test_errors(tmp)
        test_smollm(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
