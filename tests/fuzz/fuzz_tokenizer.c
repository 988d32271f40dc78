/* libFuzzer target for the tokenizer: loads the GPT-2 vocabulary once, then
 * tokenizes arbitrary bytes with and without parse_special, detokenizes the
 * result through the streaming detokenizer's byte logic and checks that
 * nothing crashes and valid UTF-8 input round-trips.
 *
 * Build and run from the repo root (clang with libFuzzer):
 *   clang -std=c11 -g -O1 -D_GNU_SOURCE -Iinclude -Isrc \
 *     -fsanitize=fuzzer,address,undefined tests/fuzz/fuzz_tokenizer.c \
 *     src/tokenize/tokenizer.c src/tokenize/unicode.c src/tokenize/detok.c src/load/gguf.c src/quant/quant.c src/base/util.c \
 *     -lpcre2-8 -lm -o /tmp/fuzz_tokenizer
 *   /tmp/fuzz_tokenizer -max_total_time=60 -max_len=4096
 * TL_FUZZ_VOCAB overrides the vocabulary (default ../shared/vocab/ggml-vocab-gpt-2.gguf). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load/gguf.h"
#include "tokenize/tokenizer.h"

/* tl_detok_push needs a model; the fuzzer drives tl_detok_feed_bytes with the
 * same pieces instead, so it links without model.c. */
size_t tl_token_piece(const tl_model *model, int32_t id, int special, char *out, size_t cap);
size_t tl_token_piece(const tl_model *model, int32_t id, int special, char *out, size_t cap) {
    (void)model, (void)id, (void)special, (void)out, (void)cap;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tl_gguf *g_gguf;
static tl_tokenizer *g_tok;

static void load_once(void) {
    if (g_tok) return;
    const char *path = getenv("TL_FUZZ_VOCAB");
    if (!path) path = "../shared/vocab/ggml-vocab-gpt-2.gguf";
    tl_error err = {0};
    if (tl_gguf_open(path, &g_gguf, &err) || tl_tokenizer_load(g_gguf, &g_tok, &err)) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err.msg);
        abort();
    }
}

static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || len > n - i) return 0;
        uint32_t cp = len == 1 ? c : (uint32_t)(c & (0x7F >> len));
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

static void run(const uint8_t *data, size_t size, int flags) {
    int32_t *ids = NULL;
    size_t n = 0;
    tl_error err = {0};
    if (tl_tokenizer_encode(g_tok, (const char *)data, size, flags, &ids, &n, &err) != TL_OK) abort();
    char *out = malloc(size * 4 + 64), piece[256], chunk[300];
    size_t k = 0;
    tl_detok d;
    tl_detok_init(&d, 1);
    for (size_t i = 0; out && i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tl_tokenizer_n_vocab(g_tok)) abort();
        size_t len = tl_tokenizer_piece(g_tok, ids[i], 1, piece, sizeof piece);
        if (len > sizeof piece) abort(); /* no GPT-2 token is that long */
        size_t m = tl_detok_feed_bytes(&d, piece, len, chunk, sizeof chunk);
        if (k + m > size * 4 + 64) abort();
        memcpy(out + k, chunk, m);
        k += m;
    }
    if (out) k += tl_detok_flush(&d, out + k, size * 4 + 64 - k);
    /* GPT-2 spells every byte, so valid UTF-8 comes back exactly (special
     * tokens, when parsed, are shown as their text) */
    if (out && valid_utf8(data, size) && (k != size || memcmp(out, data, size) != 0)) abort();
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_once();
    run(data, size, 0);
    run(data, size, TL_TOK_PARSE_SPECIAL);
    return 0;
}
