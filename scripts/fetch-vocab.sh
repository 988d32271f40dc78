#!/usr/bin/env bash
# The tokenizer tests use the vocabulary-only GGUF files and reference
# tokenizations of ../shared/vocab. Where that folder is absent, this fetches
# the same files (llama.cpp's models/ggml-vocab-*) from PyPI's llama-cpp-python
# source distribution into models/vocab/ (git-ignored). Prints the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${TL_VOCAB_DIR:-}" ] && [ -d "$TL_VOCAB_DIR" ]; then echo "$TL_VOCAB_DIR"; exit 0; fi
if [ -f ../shared/vocab/ggml-vocab-gpt-2.gguf ]; then (cd ../shared/vocab && pwd); exit 0; fi
dest=models/vocab
if [ -f "$dest/ggml-vocab-starcoder.gguf.out" ]; then (cd "$dest" && pwd); exit 0; fi
mkdir -p "$dest"
echo "vocab: ../shared/vocab not found; fetching llama.cpp's vocab files from PyPI (llama-cpp-python 0.3.36 sdist)" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" llama-cpp-python==0.3.36 >&2; then
    echo "vocab: error: could not download llama-cpp-python's source from PyPI (offline?)" >&2
    exit 1
fi
names="baichuan deepseek-coder deepseek-llm falcon gpt-2 gpt-neox llama-spm mpt phi-3 refact starcoder"
pats=()
for n in $names; do pats+=("*/vendor/llama.cpp/models/ggml-vocab-$n.gguf*"); done
tar -xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp" --wildcards "${pats[@]}"
find "$tmp" -path '*/vendor/llama.cpp/models/ggml-vocab-*' -exec cp {} "$dest"/ \;
echo "vocab: $(ls "$dest" | wc -l) files in $dest" >&2
(cd "$dest" && pwd)
