#!/usr/bin/env bash
# Makes the random-weight Llama-3.2-1B-shaped models for benchmarks, if missing:
# models/random/llama1b-f16.gguf (scripts/mkmodel.py llama1b), then
# llama1b-q4_0.gguf and llama1b-q8_0.gguf from it with `tokenloop quantize`.
# The quantized files use llama.cpp's default rule (no --pure), so they are
# what llama-quantize makes from the same F16 file (byte for byte): in the
# Q4_0 file the tied 128256x2048 token embedding / output matrix is Q6_K.
# Usage: scripts/mkmodel-1b.sh   (env: TL_BIN, the tokenloop binary; TL_VOCAB_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
out=models/random
bin=${TL_BIN:-./tokenloop}
vocab_name=ggml-vocab-llama-bpe.gguf

# The Llama 3 BPE vocabulary: the shared folder, a fetched copy, or llama.cpp's
# models/ folder from PyPI's llama-cpp-python source (as scripts/fetch-vocab.sh).
find_vocab() {
    local d
    for d in "${TL_VOCAB_DIR:-}" ../shared/vocab models/vocab "${LLAMA_CPP_DIR:-}/models"; do
        if [ -n "$d" ] && [ -f "$d/$vocab_name" ]; then echo "$d/$vocab_name"; return 0; fi
    done
    mkdir -p models/vocab
    echo "mkmodel-1b: $vocab_name not found; fetching it from PyPI (llama-cpp-python 0.3.36 sdist)" >&2
    local tmp
    tmp=$(mktemp -d)
    if ! python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" llama-cpp-python==0.3.36 >&2; then
        rm -rf "$tmp"
        echo "mkmodel-1b: error: cannot get $vocab_name (offline? set TL_VOCAB_DIR or LLAMA_CPP_DIR)" >&2
        return 1
    fi
    tar -xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp" --wildcards "*/vendor/llama.cpp/models/$vocab_name"
    find "$tmp" -name "$vocab_name" -exec cp {} models/vocab/ \;
    rm -rf "$tmp"
    echo "models/vocab/$vocab_name"
}

mkdir -p "$out"
if [ ! -f "$out/llama1b-f16.gguf" ]; then
    vocab=$(find_vocab)
    echo "mkmodel-1b: writing $out/llama1b-f16.gguf" >&2
    python3 scripts/mkmodel.py llama1b "$out/llama1b-f16.gguf.part" --type f16 --vocab "$vocab"
    mv "$out/llama1b-f16.gguf.part" "$out/llama1b-f16.gguf"
fi
if [ ! -x "$bin" ]; then
    echo "mkmodel-1b: $bin not found: run make first (or set TL_BIN)" >&2
    exit 1
fi
for t in q4_0 q8_0; do
    if [ ! -f "$out/llama1b-$t.gguf" ]; then
        "$bin" quantize "$out/llama1b-f16.gguf" "$out/llama1b-$t.gguf" "$t" 2> >(tail -n 1 >&2)
    fi
done
ls -l "$out"/llama1b-*.gguf
