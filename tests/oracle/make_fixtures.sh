#!/usr/bin/env bash
# Regenerates the committed oracle fixtures (tests/oracle/fixtures/*.json) from
# llama.cpp via llama-cpp-python. Run BY HAND only, never in CI: the pip install
# compiles llama.cpp from source (~5 minutes). The venv lives in
# tests/oracle/.venv (git-ignored). Extra arguments go to make_fixtures.py,
# e.g. --only tokenizer,greedy
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --upgrade pip
    CMAKE_ARGS="-DLLAMA_BUILD_UI=OFF -DGGML_NATIVE=ON" \
        "$venv/bin/pip" install --no-cache-dir llama-cpp-python==0.3.36 jinja2 numpy
fi
exec "$venv/bin/python" "$here/make_fixtures.py" "$@"
