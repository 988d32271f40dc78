#!/usr/bin/env python3
"""Writes tests/oracle/fixtures/quantize_mix.json: each tensor's type and a sha256 of
all tensors' bytes that llama.cpp's llama-quantize writes for the files of
tests/py/test_quantize.py's write_mix, for each of its mix_cases(). Run by
hand with llama.cpp's llama-quantize (LLAMA_QUANTIZE, default the one
bench/compare-llamacpp builds):
python3 tests/oracle/make_fixtures_quantize.py"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
import test_quantize as tq  # noqa: E402

LLAMA_QUANTIZE = os.environ.get("LLAMA_QUANTIZE", os.path.join(
    ROOT, "bench", ".cache", "llama-cpp-python-0.3.36", "build", "bin", "llama-quantize"))


def main():
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, qtype in tq.mix_cases():
            src = os.path.join(tmp, f"{kind}.gguf")
            if not os.path.exists(src):
                tq.write_mix(src, kind)
            out = os.path.join(tmp, "out.gguf")
            subprocess.run([LLAMA_QUANTIZE, src, out, qtype, "2"], check=True, capture_output=True)
            files[f"{kind} {qtype}"] = tq.tensor_digests(out)
            print(kind, qtype, "done", file=sys.stderr)
    with open(os.path.join(HERE, "fixtures", "quantize_mix.json"), "w") as f:
        json.dump({"made_by": "llama.cpp 0.3.36 llama-quantize (llama-cpp-python's source)", "files": files}, f,
                  indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
