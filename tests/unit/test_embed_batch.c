/* test_embed_batch: tl_ctx_embed_batch gives each text the bits
 * tl_ctx_embed gives it alone. Texts of mixed lengths (one longer than the
 * batch, so chunked, for the decoders) on SmolLM2 and random files of each
 * embedding family (tests/run.sh makes them): encoders (bert CLS, nomic-bert
 * mean), a plain decoder, sliding windows (gemma4) and a recurrent one
 * (qwen35); with the file's pooling, none and last; with sequences for every
 * text, for fewer (lanes taken in turn) and for none. */
#include <stdint.h>
#include <string.h>

#include "tokenloop.h"
#include "tl_test.h"

#define N_TEXTS 6
#define N_BATCH 32

static const char *const FILES[] = {
    "models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/random/batch_bert.gguf",   "models/random/batch_nomic-bert.gguf",
    "models/random/batch_qwen3.gguf",         "models/random/batch_gemma4.gguf", "models/random/batch_qwen35.gguf",
};

/* The same lengths for every file: an encoder's are cut to the batch. */
static const size_t LEN[N_TEXTS] = {5, 45, 1, 17, 9, 31};

static void check_file(const char *path) {
    tl_model *m = NULL;
    tl_error err = {0};
    if (tl_model_load(path, &m, &err)) {
        CHECK(0, "cannot load %s: %s (run make models)", path, err.msg);
        return;
    }
    const int d = tl_model_n_embd(m), nv = tl_model_n_vocab(m), enc = tl_model_is_encoder(m);
    int32_t *tok[N_TEXTS] = {0};
    size_t n[N_TEXTS];
    float *alone[N_TEXTS] = {0}, *got[N_TEXTS] = {0};
    uint32_t rng = 12345;
    int ok = 1;
    for (int i = 0; i < N_TEXTS; i++) {
        n[i] = enc && LEN[i] > N_BATCH ? N_BATCH : LEN[i];
        tok[i] = malloc(n[i] * sizeof *tok[i]);
        alone[i] = malloc(n[i] * (size_t)d * sizeof *alone[i]);
        got[i] = malloc(n[i] * (size_t)d * sizeof *got[i]);
        ok = ok && tok[i] && alone[i] && got[i];
        for (size_t t = 0; tok[i] && t < n[i]; t++) {
            rng = rng * 1664525u + 1013904223u;
            tok[i][t] = (int32_t)((rng >> 8) % (uint32_t)nv);
        }
    }
    CHECK(ok, "out of memory");
    static const int SEQS[] = {N_TEXTS, 2, 0}; /* extra sequences beside sequence 0 */
    static const int POOLS[] = {TL_POOL_MODEL, TL_POOL_NONE, TL_POOL_LAST};
    for (size_t si = 0; ok && si < sizeof SEQS / sizeof *SEQS; si++) {
        tl_ctx_params cp = {.n_ctx = 128, .n_batch = N_BATCH, .n_threads = 2, .n_seq_embd = SEQS[si]};
        tl_ctx *c = NULL;
        if (tl_ctx_new(m, &cp, &c, &err)) {
            CHECK(0, "%s: context: %s", path, err.msg);
            break;
        }
        for (size_t pi = 0; pi < sizeof POOLS / sizeof *POOLS; pi++) {
            const int pool = POOLS[pi];
            for (int i = 0; i < N_TEXTS; i++) {
                const int rows = tl_ctx_embed(c, tok[i], n[i], pool, 1, alone[i], &err);
                CHECK(rows > 0, "%s: text %d alone: %s", path, i, err.msg);
                memset(got[i], 0xff, n[i] * (size_t)d * sizeof *got[i]);
            }
            const int st = tl_ctx_embed_batch(c, (const int32_t *const *)tok, n, N_TEXTS, pool, 1, got, &err);
            CHECK(st == TL_OK, "%s: batch: %s", path, err.msg);
            for (int i = 0; i < N_TEXTS; i++) {
                const size_t rows = pool == TL_POOL_NONE ? n[i] : 1;
                CHECK(!memcmp(alone[i], got[i], rows * (size_t)d * sizeof *got[i]),
                      "%s: %d sequences, pooling %d: text %d (%zu tokens) differs from its vector alone", path,
                      SEQS[si], pool, i, n[i]);
            }
        }
        /* every sequence it opened is closed again, and sequence 0 cleared */
        CHECK(tl_ctx_n_past(c) == 0, "%s: sequence 0 holds %d positions", path, tl_ctx_n_past(c));
        int seq = 0;
        for (int k = 0; k < SEQS[si]; k++) CHECK(tl_seq_open(c, &seq, &err) == TL_OK, "%s: a sequence left open", path);
        tl_ctx_free(c);
    }
    for (int i = 0; i < N_TEXTS; i++) {
        free(tok[i]);
        free(alone[i]);
        free(got[i]);
    }
    tl_model_free(m);
}

/* Bad arguments are errors, not crashes, and name the text. */
static void check_errors(void) {
    tl_model *m = NULL;
    tl_error err = {0};
    if (tl_model_load(FILES[0], &m, &err)) return;
    tl_ctx_params cp = {.n_ctx = 64, .n_batch = 16, .n_threads = 1, .n_seq_embd = 2};
    tl_ctx *c = NULL;
    if (!tl_ctx_new(m, &cp, &c, &err)) {
        const int32_t a[2] = {1, 2}, bad[1] = {-5};
        const int32_t *t[2] = {a, bad};
        size_t n[2] = {2, 1};
        float o0[576], o1[576];
        float *o[2] = {o0, o1};
        CHECK(tl_ctx_embed_batch(c, t, n, 2, TL_POOL_MEAN, 1, o, &err) == TL_ERR_ARG, "a bad token id");
        n[1] = 65;
        t[1] = a;
        CHECK(tl_ctx_embed_batch(c, t, n, 2, TL_POOL_MEAN, 1, o, &err) == TL_ERR_CONTEXT_FULL, "a text past n_ctx");
        CHECK(tl_ctx_embed_batch(c, t, n, 0, TL_POOL_MEAN, 1, o, &err) == TL_OK, "no texts");
        CHECK(tl_ctx_embed_batch(c, t, n, 1, 99, 1, o, &err) == TL_ERR_UNSUPPORTED, "an unknown pooling");
        tl_ctx_free(c);
    }
    tl_model_free(m);
}

int main(void) {
    for (size_t i = 0; i < sizeof FILES / sizeof *FILES; i++) check_file(FILES[i]);
    check_errors();
    return tl_test_summary();
}
