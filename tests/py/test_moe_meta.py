#!/usr/bin/env python3
"""Mixture-of-experts metadata as llama.cpp 0.3.36 reads it, on random files
made by scripts/mkmodel.py (found by differential runs against llama.cpp):
- <arch>.expert_weights_scale is read by llama.cpp only for DeepSeek-like
  architectures: a qwen3moe or Mixtral file carrying it gives the logits of
  the same file without it, in both numerics modes;
- a file routing each token to more than 32 experts (40 of 64) runs.
Run: TL_BIN=build/tokenloop python3 tests/py/test_moe_meta.py"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402

TL_BIN = os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop"))
MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")
IDS = ",".join(str(i) for i in (1, 15043, 3186, 29892, 445, 338, 263, 1243, 310, 278, 6055, 29889) * 3)


def mkmodel(path, arch, *args):
    p = subprocess.run([sys.executable, MKMODEL, arch, path, "--seed", "77", *args], capture_output=True, text=True,
                       timeout=300)
    return check(p.returncode == 0, f"mkmodel.py {arch} {' '.join(args)}: {p.stderr[-300:]}")


def logits(path, numerics, out):
    r = subprocess.run([TL_BIN, "logits", "-m", path, "--ids", IDS, "-o", out, "--numerics", numerics],
                       capture_output=True, text=True, timeout=300)
    if not check(r.returncode == 0, f"{os.path.basename(path)} [{numerics}]: logits: {r.stderr.strip()[-300:]}"):
        return None
    with open(out, "rb") as f:
        return f.read()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.bin")
        for arch in ("qwen3moe", "mixtral"):
            plain, scaled = os.path.join(tmp, f"{arch}.gguf"), os.path.join(tmp, f"{arch}_scaled.gguf")
            if not (mkmodel(plain, arch) and mkmodel(scaled, arch, "--expert-weights-scale", "2.5")):
                continue
            for numerics in ("fast", "exact"):
                a, b = logits(plain, numerics, out), logits(scaled, numerics, out)
                if a is not None and b is not None:
                    check(a and a == b, f"{arch} [{numerics}]: expert_weights_scale changed the logits")
        many = os.path.join(tmp, "many.gguf")
        if mkmodel(many, "qwen3moe", "--experts", "64,40"):
            for numerics in ("fast", "exact"):
                got = logits(many, numerics, out)
                check(got is not None and len(got) == 36 * 32000 * 4,
                      f"40 of 64 experts [{numerics}]: {0 if got is None else len(got)} bytes of logits")
    tlcheck.finish()


if __name__ == "__main__":
    main()
