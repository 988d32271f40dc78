#!/usr/bin/env python3
"""test_dequant: tokenloop's dequantization and quantization against the gguf
Python package, bit for bit. Uses the helper build/tools/dequant_tensor (found
next to $TL_BIN's directory) on a tensor of every type in both real models,
on synthetic GGUF files written with gguf.GGUFWriter (every format tokenloop
reads that gguf can quantize, plus random blocks of the K-quants), and runs
our quantizers against gguf.quants.quantize. Run: TL_BIN=build/tokenloop
python3 tests/py/test_dequant.py"""
import os
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

TL_BIN = os.environ.get("TL_BIN", "build/tokenloop")
TOOL = os.path.join(os.path.dirname(os.path.abspath(TL_BIN)), "tools", "dequant_tensor")
MODELS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": {"Q4_1", "Q8_0", "F32"},
    "gemma-3-270m-q4_k_m.gguf": {"Q5_0", "Q4_K", "Q6_K", "Q8_0", "F32"},
}
ROWS_WHOLE_LIMIT = 1 << 22  # elements; bigger tensors are compared on slices of rows
SLICE_ROWS = 96


def same_bits(ours, want, what):
    ours = np.ascontiguousarray(ours, dtype=np.float32)
    want = np.ascontiguousarray(want, dtype=np.float32)
    if ours.shape != want.shape:
        check(False, f"{what}: shape {ours.shape} vs gguf {want.shape}")
        return
    diff = ours.view(np.uint32) != want.view(np.uint32)
    n = int(diff.sum())
    where = ""
    if n:
        i = int(np.flatnonzero(diff.ravel())[0])
        where = f" (first at flat index {i}: {ours.ravel()[i]!r} vs {want.ravel()[i]!r})"
    check(n == 0, f"{what}: {n} of {want.size} values differ from gguf{where}")


def run_tool(args):
    r = subprocess.run([TOOL] + [str(a) for a in args], capture_output=True, text=True)
    if r.returncode != 0:
        check(False, f"dequant_tensor {' '.join(map(str, args))} failed: {r.stderr.strip()}")
        return False
    return True


def dequant_ours(path, name, ne0, row0=None, nrows=None, tmp=None):
    out = os.path.join(tmp, "out.bin")
    args = [path, name, out] + ([row0, nrows] if row0 is not None else [])
    if not run_tool(args):
        return None
    return np.fromfile(out, dtype="<f4").reshape(-1, ne0)


def dequant_gguf(t, rows):
    """The gguf package's dequantization of rows `rows` of reader tensor t."""
    ne0 = int(t.shape[0])
    data = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data.reshape(1, -1)
    if t.tensor_type in (QT.F32, QT.F16):
        data = data.reshape(-1, ne0)
    return gguf.quants.dequantize(np.ascontiguousarray(data[rows]), t.tensor_type).reshape(-1, ne0)


def check_real_model(fname, tmp):
    path = os.path.join(ROOT, "models", fname)
    if not os.path.exists(path):
        check(False, f"model {path} is missing (run `make models`)")
        return
    reader = gguf.GGUFReader(path)
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type.name, []).append(t)
    check(set(by_type) == MODELS[fname], f"{fname}: types {sorted(by_type)}, expected {sorted(MODELS[fname])}")
    for tname, tensors in sorted(by_type.items()):
        picks = {id(x): x for x in (tensors[0], tensors[len(tensors) // 2], tensors[-1])}.values()
        for t in picks:
            ne0 = int(t.shape[0])
            nrows = int(t.n_elements) // ne0
            if t.n_elements <= ROWS_WHOLE_LIMIT:
                spans = [(0, nrows)]
            else:  # head, middle and tail rows of an embedding table
                spans = [(0, SLICE_ROWS), (nrows // 2 - 7, SLICE_ROWS), (nrows - SLICE_ROWS, SLICE_ROWS)]
            for r0, n in spans:
                ours = dequant_ours(path, t.name, ne0, r0, n, tmp)
                if ours is None:
                    continue
                want = dequant_gguf(t, slice(r0, r0 + n))
                same_bits(ours, want, f"{fname} {t.name} ({tname}) rows {r0}..{r0 + n}")


def test_data(rng, rows, ne0):
    """Blocks of varied scale and offset, plus awkward rows: zeros, a constant,
    exact ties, tiny (subnormal in half) and huge values, an outlier."""
    x = np.empty((rows, ne0), dtype=np.float32)
    for r in range(rows):
        scale = np.float32(10.0 ** rng.uniform(-4, 2, size=(ne0 // 32, 1)))
        off = rng.uniform(-0.5, 0.5, size=(ne0 // 32, 1)) * scale * (r % 2)
        x[r] = (rng.standard_normal((ne0 // 32, 32)) * scale + off).ravel()
    x[0] = 0
    x[1] = 0.75
    x[2] = (np.arange(ne0) % 64 - 32 + 0.5).astype(np.float32)
    x[3] *= np.float32(1e-6)
    x[4, ::7] = 60000.0
    x[5, 5] = -1e4
    return x


# formats tokenloop reads that gguf can also quantize; gguf's other quantizable
# formats (TQ1_0, TQ2_0, NVFP4) are not tokenloop formats
QUANTIZABLE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"]
# byte offsets of the half scale fields, to make random blocks sane
HALF_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "MXFP4": [],  # its scale is an E8M0 byte at offset 0 (random_blocks sets it)
    "IQ4_NL": [0], "IQ4_XS": [0],
}


def random_blocks(rng, qtype, rows, ne0):
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(rows, ne0 // bs, ts), dtype=np.uint8)
    for off in HALF_FIELDS[qtype.name]:
        h = rng.uniform(-0.1, 0.1, size=(rows, ne0 // bs)).astype(np.float16)
        b[:, :, off:off + 2] = h.view(np.uint8).reshape(rows, ne0 // bs, 2)
    if qtype == QT.MXFP4:  # exponents from tiny to large, the subnormal ones included
        b[:, :, 0] = rng.integers(0, 160, size=(rows, ne0 // bs), dtype=np.uint8)
    return b.reshape(rows, -1)


def check_synthetic(tmp):
    rng = np.random.default_rng(1234)
    rows, ne0 = 12, 768  # 768: three K-quant super-blocks, 24 legacy blocks
    x = test_data(rng, rows, ne0)
    path = os.path.join(tmp, "synthetic.gguf")
    w = gguf.GGUFWriter(path, "llama")
    tensors = {}
    for name in QUANTIZABLE:
        qt = QT[name]
        q = gguf.quants.quantize(x, qt)
        tensors[f"q.{name}"] = (qt, q)
    for name in HALF_FIELDS:
        tensors[f"rand.{name}"] = (QT[name], random_blocks(rng, QT[name], rows, ne0))
    for tn, (qt, q) in tensors.items():
        if qt in (QT.F32, QT.F16):
            w.add_tensor(tn, q)
        else:
            w.add_tensor(tn, q, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for tn, (qt, q) in tensors.items():
        ours = dequant_ours(path, tn, ne0, tmp=tmp)
        if ours is None:
            continue
        want = gguf.quants.dequantize(q, qt).reshape(-1, ne0)
        same_bits(ours, want, f"synthetic {tn}")
    return x


def quant_ours(qt, x, tmp):
    src, out = os.path.join(tmp, "in.f32"), os.path.join(tmp, "q.bin")
    np.ascontiguousarray(x, dtype="<f4").tofile(src)
    if not run_tool(["--quantize", int(qt), x.shape[-1], src, out]):
        return None
    return np.fromfile(out, dtype=np.uint8)


def check_quantizers(x, tmp):
    """Our weight quantizers vs gguf.quants.quantize, byte for byte."""
    for name in QUANTIZABLE:
        qt = QT[name]
        ours = quant_ours(qt, x, tmp)
        if ours is None:
            continue
        want = np.ascontiguousarray(gguf.quants.quantize(x, qt)).view(np.uint8).ravel()
        n = int((ours != want).sum()) if ours.shape == want.shape else -1
        check(n == 0, f"quantize {name}: {n} bytes differ from gguf.quants.quantize")


def check_fp16_vs_numpy(tmp):
    """tl_fp32_to_fp16 against numpy's float16 cast (round to nearest even)
    on 2^21 random float bit patterns plus every float near the half range's
    edges (subnormals, overflow)."""
    rng = np.random.default_rng(7)
    bits = [rng.integers(0, 2**32, size=1 << 21, dtype=np.uint64).astype(np.uint32)]
    for lo, hi in ((0x33000000 - 64, 0x33000000 + 64), (0x38800000 - 4096, 0x38800000 + 4096),
                   (0x477fe000, 0x47800100)):
        bits.append(np.arange(lo, hi, dtype=np.uint32))
    bits = np.concatenate(bits)
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    f = bits.view(np.float32)
    f = f[~np.isnan(f)]
    ours = quant_ours(QT.F16, f.reshape(1, -1), tmp)
    if ours is None:
        return
    with np.errstate(over="ignore"):
        want = f.astype(np.float16).view(np.uint8)
    n = int((ours != want).sum()) // 1
    check(n == 0, f"fp32->fp16: {n} bytes differ from numpy over {f.size} values")


def main():
    if not os.access(TOOL, os.X_OK):
        check(False, f"helper {TOOL} not built (make all builds tests/tools/*)")
        finish()
    with tempfile.TemporaryDirectory() as tmp:
        for fname in MODELS:
            check_real_model(fname, tmp)
        x = check_synthetic(tmp)
        check_quantizers(x, tmp)
        check_fp16_vs_numpy(tmp)
    finish()


if __name__ == "__main__":
    main()
