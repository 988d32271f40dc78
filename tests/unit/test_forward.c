/* The forward pass on the real SmolLM2 model: logits must be bitwise the
 * same however the prompt is split into batches, whatever the thread count,
 * and whether a token is decoded alone after a prefill or inside it. Also
 * sanity of the logits and the context-full and bad-token errors. */
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
    CHECK(base && b7 && !memcmp(base, b7, bytes), "batch 7 / 2 threads differs from batch 512 / 1 thread");
    CHECK(base && t3 && !memcmp(base, t3, bytes), "3 threads differ from 1 thread");
    CHECK(base && dec && !memcmp(base, dec, bytes), "decoding the last 6 tokens one by one differs from prefill");
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
    return tl_test_summary();
}
