/* test_attn_sinks: attention sinks and the output projection's bias (the
 * gpt-oss attention's additions) through the whole forward pass, in both
 * numerics modes, on SmolLM2 with sink and bias tensors of our own put into
 * its attention blocks (no small gpt-oss file is at hand; llama.cpp's side is
 * checked once one is). Checks that hold whatever the weights:
 *  - sinks of -inf and a zero bias change no bit (the sink adds exp(-inf) = 0);
 *  - sinks far above every score silence attention (weights underflow to 0),
 *    so each row's logits are those of its token alone at position 0, plus
 *    the bias, which must show;
 *  - with ordinary sinks and a bias, a prompt past one attention segment (512
 *    positions) gives the same bits in one batch, in batches of 7 on 2
 *    threads, and with its tail decoded token by token on 2 threads (the
 *    split-by-segment path: the sink is counted once per row there too). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load/model.h"
#include "tl_test.h"
#include "tokenloop.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static uint64_t rs = 88172645463325252ull;
static float frand(void) { /* [-1, 1) */
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)(rs >> 40) / 8388608.0f - 1.0f;
}

/* One F32 vector tensor over data (what a GGUF file's 1-D tensor binds to). */
static tl_gguf_tensor vec_tensor(const float *data, int n) {
    tl_gguf_tensor t;
    memset(&t, 0, sizeof t);
    t.n_dims = 1;
    t.ne[0] = n, t.ne[1] = t.ne[2] = t.ne[3] = 1;
    t.type = TL_F32;
    t.nbytes = (uint64_t)n * sizeof(float);
    t.data = data;
    return t;
}

typedef struct extras {
    float *sinks, *bias;        /* [n_layer][n_head], [n_layer][d] */
    tl_gguf_tensor *st, *bt;    /* [n_layer] each */
} extras;

/* Points every attention block's sinks and bo at ours (on), or at nothing. */
static void attach(tl_model *m, extras *e, int on) {
    for (int i = 0; i < m->hp.n_layer; i++) {
        tl_attn_block *A = &m->layers[i].block[0].u.attn;
        A->sinks = on ? &e->st[i] : NULL;
        A->bo = on ? &e->bt[i] : NULL;
    }
}

/* Logits of ids[0..n): prefill of `split` tokens then one by one (split > 0),
 * else in batches of n_batch. */
static float *run(tl_model *m, const int32_t *ids, int n, int n_batch, int n_threads, int split, int numerics) {
    tl_ctx_params cp = {.n_ctx = 640, .n_batch = n_batch, .n_threads = n_threads, .numerics = numerics};
    tl_ctx *ctx;
    tl_error err = {0};
    if (tl_ctx_new(m, &cp, &ctx, &err)) {
        CHECK(0, "ctx: %s", err.msg);
        return NULL;
    }
    const int nv = tl_model_n_vocab(m);
    float *out = malloc((size_t)n * nv * sizeof *out);
    for (int done = 0; out && done < n;) {
        const int step = split > 0 ? (done == 0 ? split : 1) : (n - done < n_batch ? n - done : n_batch);
        if (tl_ctx_eval(ctx, ids + done, (size_t)step, 1, &err)) {
            CHECK(0, "eval: %s", err.msg);
            free(out);
            out = NULL;
            break;
        }
        for (int i = 0; i < step; i++)
            memcpy(out + (size_t)(done + i) * nv, tl_ctx_logits(ctx, i), (size_t)nv * sizeof *out);
        done += step;
    }
    tl_ctx_free(ctx);
    return out;
}

static void fill(tl_model *m, extras *e, float sink_lo, float sink_span, float bias_scale) {
    const int L = m->hp.n_layer, H = m->hp.n_head, d = m->hp.n_embd;
    rs = 0x9E3779B97F4A7C15ull; /* the same values in both modes */
    for (int i = 0; i < L * H; i++) e->sinks[i] = sink_lo + sink_span * (0.5f * frand() + 0.5f);
    for (int i = 0; i < L * d; i++) e->bias[i] = bias_scale * frand();
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* The checks of one mode; its logits of ids with the ordinary sinks and
 * without any (rows past the first) go to with[] and without[], unless
 * long_part is 0: then the checks past a segment are left out. */
static void check_mode(tl_model *m, extras *e, int numerics, const int32_t *ids, int n, int long_part, float **with,
                       float **without) {
    const char *mode = numerics == TL_NUMERICS_EXACT ? "exact" : "fast";
    const int nv = tl_model_n_vocab(m), ns = 12;
    const size_t row = (size_t)nv * sizeof(float);
    attach(m, e, 0);
    float *plain = run(m, ids, ns, 512, 2, 0, numerics);
    /* neutral: sinks -inf, bias 0 */
    fill(m, e, -INFINITY, 0.0f, 0.0f);
    attach(m, e, 1);
    float *neutral = run(m, ids, ns, 512, 2, 0, numerics);
    CHECK(plain && neutral && !memcmp(plain, neutral, ns * row), "%s: sinks of -inf and a zero bias changed logits",
          mode);
    /* drowned: attention silenced, each row its token alone, the bias seen */
    fill(m, e, 1e4f, 0.0f, 0.05f);
    float *drowned = run(m, ids, ns, 512, 2, 0, numerics);
    int alone_ok = 1;
    for (int p = 0; drowned && p < ns; p++) {
        float *one = run(m, ids + p, 1, 512, 1, 0, numerics);
        alone_ok &= one && !memcmp(one, drowned + (size_t)p * nv, row);
        if (p == 0) {
            attach(m, e, 0);
            float *nob = run(m, ids, 1, 512, 1, 0, numerics);
            CHECK(nob && one && memcmp(nob, one, row), "%s: the output bias changed nothing", mode);
            free(nob);
            attach(m, e, 1);
        }
        free(one);
    }
    CHECK(drowned && alone_ok, "%s: with sinks far above the scores a row is not its token alone", mode);
    CHECK(drowned && all_finite(drowned, (size_t)ns * nv), "%s: with sinks far above the scores logits are not finite",
          mode);
    CHECK(drowned && plain && memcmp(drowned + row / sizeof(float), plain + row / sizeof(float), (ns - 1) * row),
          "%s: large sinks changed nothing", mode);
    free(plain), free(neutral), free(drowned);
    if (!long_part) return;
    /* ordinary sinks: batch invariance past a segment */
    fill(m, e, -1.0f, 4.0f, 0.05f);
    float *base = run(m, ids, n, 512, 1, 0, numerics);
    float *b7 = run(m, ids, n, 7, 2, 0, numerics);
    float *dec = run(m, ids, n, 512, 2, n - 6, numerics);
    const size_t bytes = (size_t)n * row;
    CHECK(base && b7 && !memcmp(base, b7, bytes), "%s, sinks: batches of 7 on 2 threads differ from one batch", mode);
    CHECK(base && dec && !memcmp(base, dec, bytes), "%s, sinks: decoding the tail on 2 threads differs from prefill",
          mode);
    attach(m, e, 0);
    float *ref = run(m, ids, n, 512, 1, 0, numerics);
    CHECK(base && ref && memcmp(base + (size_t)(n - 1) * nv, ref + (size_t)(n - 1) * nv, row),
          "%s: ordinary sinks changed nothing", mode);
    *with = base, *without = ref;
    free(b7), free(dec);
}

static double mean_abs(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += fabs((double)a[i] - b[i]);
    return s / (double)n;
}

int main(void) {
    tl_model *m;
    tl_error err = {0};
    if (tl_model_load(MODEL, &m, &err)) {
        CHECK(0, "load %s: %s (run 'make models')", MODEL, err.msg);
        return tl_test_summary();
    }
    const int L = m->hp.n_layer, H = m->hp.n_head, d = m->hp.n_embd;
    extras e = {malloc((size_t)L * H * sizeof(float)), malloc((size_t)L * d * sizeof(float)),
                malloc((size_t)L * sizeof(tl_gguf_tensor)), malloc((size_t)L * sizeof(tl_gguf_tensor))};
    enum { N = 530 }; /* past TL_ATTN_SEG (512) */
    int32_t ids[N];
    CHECK(e.sinks && e.bias && e.st && e.bt, "alloc");
    if (e.sinks && e.bias && e.st && e.bt) {
        for (int i = 0; i < L; i++) {
            e.st[i] = vec_tensor(e.sinks + (size_t)i * H, H);
            e.bt[i] = vec_tensor(e.bias + (size_t)i * d, d);
        }
        for (int i = 0; i < N; i++) ids[i] = 100 + (int32_t)((frand() + 1.0f) * 20000.0f);
        float *fw = NULL, *fo = NULL, *xw = NULL, *xo = NULL;
        /* the sanitizer run (make asan) takes the checks past a segment in
         * the fast mode only: the exact mode's 530-token runs take minutes
         * there and go through the same segment loop */
        const int asan = getenv("TL_ASAN") != NULL;
        check_mode(m, &e, TL_NUMERICS_FAST, ids, N, 1, &fw, &fo);
        check_mode(m, &e, TL_NUMERICS_EXACT, ids, N, !asan, &xw, &xo);
        /* the two modes' sinks are the same softmax: exact and fast stay as
         * close with sinks as without, while the sinks move logits further */
        if (fw && fo && xw && xo) {
            const size_t nn = (size_t)N * tl_model_n_vocab(m);
            const double modes_with = mean_abs(fw, xw, nn), modes_without = mean_abs(fo, xo, nn);
            const double sinks_fast = mean_abs(fw, fo, nn), sinks_exact = mean_abs(xw, xo, nn);
            printf("mean abs: fast vs exact %.4g with sinks, %.4g without; sinks vs none %.4g fast, %.4g exact\n",
                   modes_with, modes_without, sinks_fast, sinks_exact);
            CHECK(modes_with < 0.25 * sinks_fast && modes_with < 0.25 * sinks_exact,
                  "fast and exact attention disagree on the sinks");
        }
        free(fw), free(fo), free(xw), free(xo);
    }
    attach(m, &e, 0);
    free(e.sinks), free(e.bias), free(e.st), free(e.bt);
    tl_model_free(m);
    return tl_test_summary();
}
