/* The forward pass on the real SmolLM2 model: logits must be bitwise the
 * same however the prompt is split into batches, whatever the thread count,
 * and whether a token is decoded alone after a prefill or inside it. Also
 * sanity of the logits and the context-full and bad-token errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl_test.h"
#include "tokenloop.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct collected {
    int32_t ids[64];
    int n;
} collected;

static int collect(const tl_gen_event *ev, void *user) {
    collected *c = user;
    if (ev->token >= 0 && c->n < 64) c->ids[c->n++] = ev->token;
    return 0;
}

static float *run(tl_model *m, const int32_t *ids, int n, int n_batch, int n_threads, int split) {
    tl_ctx_params cp = {.n_ctx = 256, .n_batch = n_batch, .n_threads = n_threads};
    tl_ctx *ctx;
    tl_error err = {0};
    if (tl_ctx_new(m, &cp, &ctx, &err)) {
        CHECK(0, "ctx: %s", err.msg);
        return NULL;
    }
    int nv = tl_model_n_vocab(m);
    float *out = malloc((size_t)n * nv * sizeof *out);
    /* split > 0: prefill the first `split` tokens, then decode the rest one by one */
    int done = 0;
    while (done < n) {
        int step = split > 0 ? (done == 0 ? split : 1) : n;
        if (tl_ctx_eval(ctx, ids + done, (size_t)step, 1, &err)) {
            CHECK(0, "eval: %s", err.msg);
            break;
        }
        for (int i = 0; i < step; i++) memcpy(out + (size_t)(done + i) * nv, tl_ctx_logits(ctx, i), (size_t)nv * sizeof *out);
        done += step;
    }
    tl_ctx_free(ctx);
    return out;
}

/* Gemma 3 (sliding window 512, GeGLU, sandwich norms): the last rows' logits
 * of a prompt longer than the window must be bitwise the same whatever the
 * batch size and thread count, and whether the tail is decoded token by
 * token. Only the last `keep` rows are kept (262144-entry vocabulary). */
#define GEMMA "models/gemma-3-270m-q4_k_m.gguf"

static float *gemma_run(tl_model *m, const int32_t *ids, int n, int n_batch, int n_threads,
                        int split, int keep, tl_ctx **keep_ctx) {
    tl_ctx_params cp = {.n_ctx = 640, .n_batch = n_batch, .n_threads = n_threads};
    tl_ctx *ctx;
    tl_error err = {0};
    if (tl_ctx_new(m, &cp, &ctx, &err)) {
        CHECK(0, "gemma ctx: %s", err.msg);
        return NULL;
    }
    int nv = tl_model_n_vocab(m);
    float *out = malloc((size_t)keep * nv * sizeof *out);
    int done = 0, ok = out != NULL;
    while (ok && done < n) {
        int step = done == 0 ? split : 1;
        if (tl_ctx_eval(ctx, ids + done, (size_t)step, 0, &err)) {
            CHECK(0, "gemma eval: %s", err.msg);
            ok = 0;
            break;
        }
        done += step;
        if (done > n - keep)
            memcpy(out + (size_t)(done - (n - keep) - 1) * nv, tl_ctx_logits(ctx, -1),
                   (size_t)nv * sizeof *out);
    }
    if (keep_ctx && ok) *keep_ctx = ctx;
    else tl_ctx_free(ctx);
    if (!ok) {
        free(out);
        return NULL;
    }
    return out;
}

static void gemma_checks(void) {
    tl_model *m;
    tl_error err = {0};
    if (tl_model_load(GEMMA, &m, &err)) {
        CHECK(0, "load %s: %s", GEMMA, err.msg);
        return;
    }
    char text[8192] = "";
    for (int i = 0; i < 60; i++) {
        char line[96];
        snprintf(line, sizeof line, "Step %d: the river carried %d stones past the old mill. ", i, 3 * i + 7);
        strcat(text, line);
    }
    int32_t *ids;
    size_t n_all;
    CHECK(tl_tokenize(m, text, strlen(text), TL_TOK_ADD_BOS, &ids, &n_all, &err) == 0, "%s", err.msg);
    const int n = 560, keep = 4; /* past the 512-position window */
    CHECK(n_all >= (size_t)n, "gemma text has only %zu tokens", n_all);
    if (n_all >= (size_t)n) {
        int nv = tl_model_n_vocab(m);
        size_t bytes = (size_t)keep * nv * sizeof(float);
        tl_ctx *ring = NULL;
        float *base = gemma_run(m, ids, n, 512, 2, n - keep + 1, keep, NULL);
        float *dec = gemma_run(m, ids, n, 512, 2, n - 60, keep, NULL); /* decode across pos 512 */
        float *b8 = gemma_run(m, ids, n, 8, 3, n - 40, keep, &ring); 
        /* the whole prompt in runs of 2 tokens, whose 2 x 4 query rows per KV
         * block read the cache directly (AVX-512); 3 threads: not split by
         * segment, so the run itself folds at position 512. Its last row only. */
        float *b2 = gemma_run(m, ids, n, 2, 3, n, keep, NULL);
        CHECK(base && dec && !memcmp(base, dec, bytes), "gemma: decoding the tail differs from prefill");
        CHECK(base && b2 && !memcmp(base + (size_t)(keep - 1) * nv, b2 + (size_t)(keep - 1) * nv, (size_t)nv * sizeof(float)),
              "gemma: batch 2, 3 threads differs");
        free(b2);
        CHECK(base && b8 && !memcmp(base, b8, bytes), "gemma: batch 8, 3 threads differs");
        if (ring) {
            /* every layer keeps full-length KV now: rewinding below the
             * window's start and evaluating the tail again gives the same bits */
            CHECK(tl_ctx_truncate(ring, 40, &err) == 0, "gemma: rewind to 40: %s", err.msg);
            CHECK(tl_ctx_eval(ring, ids + 40, (size_t)(n - 40), 0, &err) == 0, "gemma: re-eval: %s", err.msg);
            const float *last = tl_ctx_logits(ring, -1);
            CHECK(base && last && !memcmp(last, base + (size_t)(keep - 1) * nv, (size_t)nv * sizeof(float)),
                  "gemma: rewound and re-evaluated tail differs");
            CHECK(tl_ctx_truncate(ring, 0, &err) == 0, "gemma: clearing: %s", err.msg);
            tl_ctx_free(ring);
        }
        free(b8);
        int finite = 1;
        for (size_t i = 0; base && i < (size_t)keep * nv; i++) finite &= isfinite(base[i]) != 0;
        CHECK(base && finite, "gemma: non-finite logits");
        free(base);
        free(dec);
    }
    tl_free(ids);
    tl_model_free(m);
}

int main(void) {
    tl_model *m;
    tl_error err = {0};
    if (tl_model_load(MODEL, &m, &err)) {
        CHECK(0, "load %s: %s (run 'make models')", MODEL, err.msg);
        return tl_test_summary();
    }
    const char *text = "<|im_start|>user\nWhat is the tallest mountain on Earth, and how tall is it?<|im_end|>\n"
                       "<|im_start|>assistant\nMount Everest is the tallest mountain";
    int32_t *ids;
    size_t n;
    CHECK(tl_tokenize(m, text, strlen(text), TL_TOK_PARSE_SPECIAL, &ids, &n, &err) == 0, "%s", err.msg);
    int nv = tl_model_n_vocab(m);
    size_t bytes = n * (size_t)nv * sizeof(float);
    float *base = run(m, ids, (int)n, 512, 1, 0);
    float *b7 = run(m, ids, (int)n, 7, 2, 0);
    float *t3 = run(m, ids, (int)n, 512, 3, 0);
    float *dec = run(m, ids, (int)n, 512, 2, (int)n - 6);
    float *b2 = run(m, ids, (int)n, 2, 2, 0); /* runs of 2 tokens (a verification step's shape) */
    CHECK(base && b7 && !memcmp(base, b7, bytes), "batch 7 / 2 threads differs from batch 512 / 1 thread");
    CHECK(base && t3 && !memcmp(base, t3, bytes), "3 threads differ from 1 thread");
    CHECK(base && dec && !memcmp(base, dec, bytes), "decoding the last 6 tokens one by one differs from prefill");
    CHECK(base && b2 && !memcmp(base, b2, bytes), "batch 2 / 2 threads differs from batch 512 / 1 thread");
    free(b2);
    /* sanity: finite logits, and the model predicts " Everest"-like continuation text sensibly */
    int finite = 1;
    for (size_t i = 0; base && i < n * (size_t)nv; i++) finite &= isfinite(base[i]) != 0;
    CHECK(finite, "non-finite logits");

    /* errors: bad token id, context full */
    tl_ctx_params cp = {.n_ctx = 8, .n_threads = 1};
    tl_ctx *ctx;
    CHECK(tl_ctx_new(m, &cp, &ctx, &err) == 0, "%s", err.msg);
    int32_t bad = nv + 5;
    CHECK(tl_ctx_eval(ctx, &bad, 1, 0, &err) == TL_ERR_ARG && strstr(err.msg, "out of range"), "bad id: %s", err.msg);
    CHECK(tl_ctx_eval(ctx, ids, 9, 0, &err) == TL_ERR_CONTEXT_FULL, "context full not reported");
    CHECK(tl_ctx_eval(ctx, ids, 8, 0, &err) == 0 && tl_ctx_n_past(ctx) == 8, "exactly full context");
    CHECK(tl_ctx_eval(ctx, ids, 1, 0, &err) == TL_ERR_CONTEXT_FULL, "context full after 8");
    CHECK(tl_ctx_truncate(ctx, 3, &err) == 0 && tl_ctx_n_past(ctx) == 3, "truncate");
    tl_ctx_free(ctx);

    /* greedy generation is deterministic and stops at the length cap */
    tl_sampler_params sp = tl_sampler_default_params();
    sp.temp = 0;
    collected gen[2] = {{{0}, 0}, {{0}, 0}};
    for (int r = 0; r < 2; r++) {
        tl_sampler *s = NULL;
        tl_ctx_params cp2 = {.n_ctx = 256, .n_threads = r + 1, .n_batch = r ? 5 : 512};
        CHECK(tl_ctx_new(m, &cp2, &ctx, &err) == 0 && tl_sampler_new(&sp, nv, &s, &err) == 0, "%s", err.msg);
        tl_gen_stats st;
        tl_gen_params gp = {.n_predict = 16, .on_token = collect, .user = &gen[r]};
        CHECK(tl_generate(ctx, s, ids, n, &gp, &st, &err) == 0, "%s", err.msg);
        CHECK(st.n_gen >= 1 && st.n_gen <= 16 && st.n_prompt == (int)n, "stats n_gen=%d", st.n_gen);
        CHECK(gen[r].n == st.n_gen, "callback saw %d tokens, stats %d", gen[r].n, st.n_gen);
        CHECK(tl_ctx_n_past(ctx) == (int)n + st.n_gen - 1, "n_past %d after %d generated", tl_ctx_n_past(ctx), st.n_gen);
        /* greedy: the first token is the argmax of the prompt's last logits */
        int best = 0;
        for (int i = 1; i < nv; i++)
            if (base[(n - 1) * (size_t)nv + i] > base[(n - 1) * (size_t)nv + best]) best = i;
        CHECK(gen[r].n > 0 && gen[r].ids[0] == best, "first greedy token %d, argmax %d", gen[r].ids[0], best);
        tl_sampler_free(s);
        tl_ctx_free(ctx);
    }
    CHECK(gen[0].n == gen[1].n && !memcmp(gen[0].ids, gen[1].ids, sizeof gen[0].ids),
          "threads/batch size changed the greedy tokens");
    free(base);
    free(b7);
    free(t3);
    free(dec);
    tl_free(ids);
    tl_model_free(m);
    gemma_checks();
    return tl_test_summary();
}
