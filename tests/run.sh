#!/usr/bin/env bash
# Runs the whole suite: every C unit-test binary, then the Python checks
# against the oracle fixtures and the gguf package. Each program prints a last
# line "N passed, N failed"; this sums them and ends with the total.
# Usage: tests/run.sh BUILD_DIR [--unit]
set -u
build=${1:-build}
unit_only=${2:-}
cd "$(dirname "$0")/.."
total_pass=0 total_fail=0 failed_progs=()
# The shared vocabularies (or a fetched copy of the same files).
TL_VOCAB_DIR=$(scripts/fetch-vocab.sh) || { echo "!! no vocabulary files"; exit 1; }
export TL_VOCAB_DIR

# A program that hangs fails alone, named, instead of taking the CI's whole
# 90 minutes with it: each gets TL_TEST_TIMEOUT seconds (the slowest takes
# about 300 under the sanitizers on 2 cores).
limit=${TL_TEST_TIMEOUT:-900}

run_one() { # name, command...
    local name=$1; shift
    echo "== $name"
    local out rc t0=$SECONDS
    out=$(timeout -k 10 "$limit" "$@" 2>&1); rc=$?
    printf '%s\n' "$out" | tail -n 40
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "!! $name ran past $limit s and was stopped (TL_TEST_TIMEOUT)"
    echo "   ($name: $((SECONDS - t0)) s)"
    local line p f
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -z "$line" ]; then
        echo "!! $name printed no summary (rc=$rc)"; p=0; f=1
    else
        p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    fi
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
    [ "$f" -eq 0 ] || failed_progs+=("$name")
}

# Random mixtures of experts and hybrids for test_batch (Q8_0: the packed, tiled path).
PYM=${PYTHON:-python3}
[ -x .venv/bin/python ] && PYM=.venv/bin/python
for a in qwen3moe qwen2moe qwen35 qwen35moe gemma4 gemma4moe; do
    "$PYM" scripts/mkmodel.py "$a" "models/random/batch_$a.gguf" --seed 11 --type q8_0 ||
        echo "!! scripts/mkmodel.py $a failed"
done
# And the embedding families for test_embed_batch (F32: the unpacked path):
# the encoders and a plain decoder (the hybrids are the files above).
for a in bert nomic-bert qwen3; do
    "$PYM" scripts/mkmodel.py "$a" "models/random/batch_$a.gguf" --seed 11 --type f32 ||
        echo "!! scripts/mkmodel.py $a failed"
done

for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done

# Batch invariance and prefill = decode again in the exact numerics mode (the
# loop above ran the default, fast one).
# (Under the sanitizers test_batch only: test_forward's exact run adds minutes
# there, and the exact kernels stay under them through test_batch, test_quant
# and test_oracle_archs.)
exact_again="test_batch test_forward"
[ "${TL_ASAN:-}" = 1 ] && exact_again="test_batch"
for t in $exact_again; do
    [ -x "$build/tests/$t" ] && run_one "$t (--numerics exact)" env TL_NUMERICS=exact "$build/tests/$t"
done

# The AVX-512 kernels under SIMDe emulation, whatever this CPU has.
if [ -x "$build/simde/test_kernels_bench" ]; then
    run_one "test_kernels_bench (AVX-512 under SIMDe)" "$build/simde/test_kernels_bench"
else
    echo "!! $build/simde/test_kernels_bench not built: SIMDe missing (scripts/setup.sh installs libsimde-dev)"
    total_fail=$((total_fail + 1)); failed_progs+=("simde")
fi

if [ "$unit_only" != "--unit" ]; then
    PY=${PYTHON:-python3}
    [ -x .venv/bin/python ] && PY=.venv/bin/python
    # The sanitizer run looks for memory errors in our code within CI's 90
    # minutes: it leaves out the checks whose C paths the others already take
    # under it, named here (the plain run above runs them all): the real
    # models' logits, greedy text and perplexity against llama.cpp (the CLI's
    # forward pass: test_forward, test_batch, test_embed, test_oracle_archs),
    # HAProxy's routing between replicas and the page in a browser (the
    # server: every test_server_*), the bench command's report, dequantization
    # against the gguf package (test_quant), the grammar CLI (test_grammar,
    # test_server_grammar), the Python package's build (the library) and the
    # server's batch invariance, a property of the numbers (its crowd of
    # requests: test_server_load, test_server_embed, test_server_rerank), and
    # the sliding-window rings' logits against whole windows (test_batch's
    # rings() takes the same paths on random files).
    asan_skip=" test_oracle.py test_oracle_gemma.py test_cluster.py test_page.py test_bench.py test_dequant.py"
    asan_skip+=" test_grammar_cli.py test_python_pkg.py test_server_invariance.py test_swa_ring.py "
    for t in tests/py/test_*.py; do
        [ -f "$t" ] || continue
        if [ "${TL_ASAN:-}" = 1 ] && [[ "$asan_skip" == *" $(basename "$t") "* ]]; then
            echo "== $(basename "$t"): not run under the sanitizers (tests/run.sh: asan_skip)"
            continue
        fi
        run_one "$(basename "$t")" env TL_BIN="$build/tokenloop" "$PY" "$t"
    done
fi

echo
echo "suite time: $SECONDS s"
[ ${#failed_progs[@]} -eq 0 ] || echo "failing: ${failed_progs[*]}"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
