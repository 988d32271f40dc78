/* fuzz_gguf: libFuzzer target for the GGUF reader (tl_gguf_open_buffer). Not
 * built by `make all`. Build and run from the repository root with:
 *
 *   clang -std=c11 -g -O1 -D_GNU_SOURCE -Iinclude -Isrc \
 *     -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
 *     tests/fuzz/fuzz_gguf.c src/load/gguf.c src/quant/quant.c src/base/util.c -lm -o fuzz_gguf
 *   mkdir -p corpus && ./fuzz_gguf -max_total_time=120 -max_len=4096 corpus SEED_DIR
 *
 * SEED_DIR: a few small valid GGUF files (e.g. written with gguf-py's GGUFWriter). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "load/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tl_gguf *g = NULL;
    tl_error err;
    if (tl_gguf_open_buffer(data, size, &g, &err) == TL_OK) {
        /* touch what open promised is safe to read */
        volatile uint8_t sink = 0;
        for (uint64_t i = 0; i < g->n_kv; i++) {
            const tl_gguf_kv *kv = &g->kv[i];
            if (kv->arr_str)
                for (uint64_t j = 0; j < kv->arr_n; j++)
                    if (kv->arr_str[j].len) sink ^= (uint8_t)kv->arr_str[j].ptr[kv->arr_str[j].len - 1];
            if (kv->type == GGUF_TYPE_ARRAY && kv->arr_n) {
                double d = tl_gguf_arr_float(kv, kv->arr_n - 1);
                uint64_t bits;
                memcpy(&bits, &d, 8);
                sink ^= (uint8_t)tl_gguf_arr_int(kv, kv->arr_n - 1) ^ (uint8_t)bits;
            }
            (void)tl_gguf_find(g, "general.architecture");
        }
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const tl_gguf_tensor *t = &g->tensors[i];
            if (t->nbytes) sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
        }
        int64_t v;
        tl_str s;
        (void)tl_gguf_get_int(g, "k.u64", &v);
        (void)tl_gguf_get_str(g, "general.architecture", &s);
        (void)sink;
        tl_gguf_close(g);
    } else if (g != NULL || err.msg[0] == '\0') {
        __builtin_trap(); /* a failure must leave *out NULL and say why */
    }
    return 0;
}
