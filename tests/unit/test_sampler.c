/* Tests for the sampler: every filter's kept set, the penalties and the
 * draw frequencies are checked against expectations recomputed here from the
 * definitions (sorting, softmax in double), never against our own outputs. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl_test.h"
#include "tokenloop.h"
#include "base/util.h"

/* ---- helpers --------------------------------------------------------------------- */

static uint64_t g_rng = 0x1234567887654321ull;
static double urand(void) { /* xorshift64*, test-side only */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (double)((g_rng * 0x2545f4914f6cdd1dull) >> 11) * 0x1.0p-53;
}

static tl_sampler_params plain(float temp) { /* every filter and penalty off */
    tl_sampler_params p = tl_sampler_default_params();
    p.temp = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 42;
    return p;
}

static tl_sampler *mk(const tl_sampler_params *p, int nv) {
    tl_sampler *s = NULL;
    tl_error err = {0};
    int rc = tl_sampler_new(p, nv, &s, &err);
    CHECK(rc == TL_OK && s, "tl_sampler_new failed: %s", err.msg);
    return s;
}

static int ref_argmax(const double *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static const double *g_sort_v;
static int cmp_desc(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (g_sort_v[x] != g_sort_v[y]) return g_sort_v[x] > g_sort_v[y] ? -1 : 1;
    return x - y;
}

/* Reference chain on logits v[0..n): fills keep[] with 1 for tokens that
 * survive top-k, top-p and min-p. Returns 0 if a cut is too close to call
 * (a rounding-level boundary), 1 otherwise. */
static int ref_kept(const double *v, int n, int top_k, double top_p, double min_p, char *keep) {
    int *ord = malloc((size_t)n * sizeof *ord);
    for (int i = 0; i < n; i++) ord[i] = i;
    g_sort_v = v;
    qsort(ord, (size_t)n, sizeof *ord, cmp_desc);
    int m = (top_k > 0 && top_k < n) ? top_k : n, ok = 1;
    if (top_p < 1.0) {
        double sum = 0, cum = 0;
        for (int i = 0; i < m; i++) sum += exp(v[ord[i]] - v[ord[0]]);
        for (int i = 0; i < m; i++) {
            cum += exp(v[ord[i]] - v[ord[0]]) / sum;
            if (fabs(cum - top_p) < 1e-5) ok = 0;
            if (cum >= top_p) {
                m = i + 1;
                break;
            }
        }
    }
    if (min_p > 0.0) { /* p_i >= min_p * p_max over the survivors */
        int j = 1;
        for (; j < m; j++) {
            double r = exp(v[ord[j]] - v[ord[0]]);
            if (fabs(r - min_p) < 1e-5) ok = 0;
            if (r < min_p) break;
        }
        m = j;
    }
    memset(keep, 0, (size_t)n);
    for (int i = 0; i < m; i++) keep[ord[i]] = 1;
    free(ord);
    return ok;
}

/* Draws at a huge temperature: the kept set becomes near uniform, so every
 * member shows up and the observed support is exactly the kept set. */
static int support_matches(tl_sampler_params p, const float *lf, const char *keep, int n, int draws) {
    p.temp = 1e4f;
    tl_sampler *s = mk(&p, n);
    if (!s) return 0;
    char *seen = calloc((size_t)n, 1);
    for (int d = 0; d < draws; d++) {
        int32_t t = tl_sampler_sample(s, lf, NULL, NULL, 0);
        if (t >= 0 && t < n) seen[t] = 1;
    }
    int same = memcmp(seen, keep, (size_t)n) == 0;
    if (!same)
        for (int i = 0; i < n; i++)
            if (seen[i] != keep[i]) {
                fprintf(stderr, "  token %d: seen %d expected %d (logit %g)\n", i, seen[i], keep[i],
                        (double)lf[i]);
                break;
            }
    free(seen);
    tl_sampler_free(s);
    return same;
}

/* ---- tests --------------------------------------------------------------------------- */

static void test_defaults_and_validation(void) {
    tl_sampler_params d = tl_sampler_default_params();
    CHECK(d.temp == 0.8f && d.top_k == 40 && d.top_p == 0.95f && d.min_p == 0.05f, "defaults");
    CHECK(d.repeat_penalty == 1.0f && d.freq_penalty == 0 && d.presence_penalty == 0 &&
              d.penalty_last_n == 64 && d.seed == TL_SEED_RANDOM && d.n_logit_bias == 0,
          "penalty defaults");

    tl_sampler *s = NULL;
    tl_error err = {0};
    CHECK(tl_sampler_new(&d, 0, &s, &err) == TL_ERR_ARG && !s && err.msg[0], "n_vocab 0");
    tl_sampler_params p = d;
    p.temp = NAN;
    CHECK(tl_sampler_new(&p, 10, &s, &err) == TL_ERR_ARG && !s, "NaN temp");
    p = d;
    p.top_p = -0.1f;
    CHECK(tl_sampler_new(&p, 10, &s, &err) == TL_ERR_ARG && !s, "negative top_p");
    p = d;
    p.min_p = NAN;
    CHECK(tl_sampler_new(&p, 10, &s, &err) == TL_ERR_ARG && !s, "NaN min_p");
    p = d;
    p.repeat_penalty = 0.0f;
    CHECK(tl_sampler_new(&p, 10, &s, &err) == TL_ERR_ARG && !s, "zero repeat penalty");
    p = d;
    p.penalty_last_n = -2;
    CHECK(tl_sampler_new(&p, 10, &s, &err) == TL_ERR_ARG && !s, "penalty_last_n -2");
    tl_logit_bias lb = {10, 1.0f};
    p = d;
    p.logit_bias = &lb;
    p.n_logit_bias = 1;
    err.msg[0] = 0;
    CHECK(tl_sampler_new(&p, 10, &s, &err) == TL_ERR_ARG && !s && strstr(err.msg, "10"),
          "bias token out of range: %s", err.msg);
    lb.token = 3;
    lb.bias = NAN;
    CHECK(tl_sampler_new(&p, 10, &s, &err) == TL_ERR_ARG && !s, "NaN bias");
    p.logit_bias = NULL;
    CHECK(tl_sampler_new(&p, 10, &s, &err) == TL_ERR_ARG && !s, "NULL bias array");
    CHECK(tl_sampler_new(&d, 10, NULL, &err) == TL_ERR_ARG, "NULL out");
    CHECK(tl_sampler_new(NULL, 10, &s, &err) == TL_OK && s, "NULL params = defaults");
    tl_sampler_free(s);
    tl_sampler_free(NULL);
}

static void test_greedy(void) {
    const float lf[8] = {0.5f, 3.0f, -1.0f, 7.25f, 7.25f, 2.0f, -9.0f, 7.0f};
    tl_sampler_params p = tl_sampler_default_params(); /* top-k etc. on: ignored */
    p.temp = 0.0f;
    p.top_k = 2;
    p.repeat_penalty = 5.0f;
    p.freq_penalty = 3.0f;
    p.presence_penalty = 2.0f;
    tl_sampler *s = mk(&p, 8);
    if (!s) return;
    for (int i = 0; i < 10; i++) tl_sampler_accept(s, 3); /* penalised heavily, still chosen */
    double v[8];
    for (int i = 0; i < 8; i++) v[i] = lf[i];
    int want = ref_argmax(v, 8);
    for (int i = 0; i < 20; i++) {
        int32_t t = tl_sampler_sample(s, lf, NULL, NULL, 0);
        CHECK(t == want, "greedy %d want %d (lowest id of the tie)", t, want);
    }
    tl_sampler_free(s);

    /* negative temperature is greedy too; random vectors */
    p.temp = -1.0f;
    s = mk(&p, 1000);
    if (!s) return;
    float *r = malloc(1000 * sizeof *r);
    double *rv = malloc(1000 * sizeof *rv);
    for (int trial = 0; trial < 20; trial++) {
        for (int i = 0; i < 1000; i++) rv[i] = r[i] = (float)(urand() * 20 - 10);
        CHECK(tl_sampler_sample(s, r, NULL, NULL, 0) == ref_argmax(rv, 1000), "greedy random");
    }
    free(r);
    free(rv);
    tl_sampler_free(s);
}

static void test_top_k1_is_argmax(void) {
    const float temps[] = {0.1f, 0.8f, 1.0f, 3.0f, 100.0f};
    float lf[300];
    double v[300];
    for (int ti = 0; ti < 5; ti++) {
        tl_sampler_params p = plain(temps[ti]);
        p.top_k = 1;
        p.seed = 7 + (uint64_t)ti;
        tl_sampler *s = mk(&p, 300);
        if (!s) return;
        int bad = 0;
        for (int trial = 0; trial < 50; trial++) {
            for (int i = 0; i < 300; i++) v[i] = lf[i] = (float)(urand() * 4 - 2);
            if (tl_sampler_sample(s, lf, NULL, NULL, 0) != ref_argmax(v, 300)) bad++;
        }
        CHECK(bad == 0, "top-k 1 at temp %g: %d mismatches", (double)temps[ti], bad);
        tl_sampler_free(s);
    }
}

/* Random small vectors; the kept set of each filter (and the whole chain)
 * must equal the reference set. */
static void test_filter_sets(void) {
    enum { N = 40 };
    float lf[N];
    double v[N];
    char keep[N];
    const double tps[] = {0.3, 0.5, 0.8, 0.9, 0.95};
    const double mps[] = {0.02, 0.05, 0.1, 0.3, 0.7};
    int checked = 0, bad_p = 0, bad_m = 0, bad_chain = 0;
    for (int trial = 0; trial < 10; trial++) {
        double scale = 0.5 + trial * 0.4;
        for (int i = 0; i < N; i++) v[i] = lf[i] = (float)(urand() * 2 * scale - scale);
        for (int j = 0; j < 5; j++) {
            tl_sampler_params p = plain(1.0f);
            p.top_p = (float)tps[j];
            if (ref_kept(v, N, 0, (float)tps[j], 0, keep)) {
                checked++;
                bad_p += !support_matches(p, lf, keep, N, 3000);
            }
            p = plain(1.0f);
            p.min_p = (float)mps[j];
            if (ref_kept(v, N, 0, 1.0, (float)mps[j], keep)) {
                checked++;
                bad_m += !support_matches(p, lf, keep, N, 3000);
            }
            p = plain(1.0f);
            p.top_k = 5 + 5 * j;
            p.top_p = (float)tps[4 - j];
            p.min_p = (float)mps[j];
            if (ref_kept(v, N, p.top_k, p.top_p, p.min_p, keep)) {
                checked++;
                bad_chain += !support_matches(p, lf, keep, N, 3000);
            }
        }
    }
    CHECK(checked >= 120, "only %d filter cases clear of boundaries", checked);
    CHECK(bad_p == 0, "top-p kept set wrong in %d cases", bad_p);
    CHECK(bad_m == 0, "min-p kept set wrong in %d cases", bad_m);
    CHECK(bad_chain == 0, "top-k/top-p/min-p chain kept set wrong in %d cases", bad_chain);
}

/* Top-p over an unsorted vocabulary whose nucleus is wider than the first
 * partial selection (256): exercises the growing selection. */
static void test_top_p_wide(void) {
    enum { N = 4000, HI = 600 };
    float *lf = malloc(N * sizeof *lf);
    double *v = malloc(N * sizeof *v);
    char *keep = malloc(N);
    for (int i = 0; i < N; i++) v[i] = lf[i] = (float)(-30.0 + urand());
    for (int i = 0; i < HI; i++) { /* spread over the vocabulary */
        int t = (int)(urand() * N);
        v[t] = lf[t] = (float)(urand() * 0.5);
    }
    tl_sampler_params p = plain(1.0f);
    p.top_p = 0.9f;
    int ok = ref_kept(v, N, 0, p.top_p, 0, keep), n = 0;
    for (int i = 0; i < N; i++) n += keep[i];
    CHECK(ok && n > 300, "wide nucleus should exceed 256 tokens (%d)", n);
    CHECK(support_matches(p, lf, keep, N, 8000), "wide top-p kept set");

    /* the cut inside a block of 600 exact ties: the lowest ids are kept */
    for (int i = 0; i < N; i++) v[i] = lf[i] = -30.0f;
    for (int i = 0; i < HI; i++) v[i * 6 + 1] = lf[i * 6 + 1] = 1.0f;
    p.top_p = 0.4991f; /* 299.46 tokens' worth: 300 kept */
    ok = ref_kept(v, N, 0, p.top_p, 0, keep);
    n = 0;
    for (int i = 0; i < N; i++) n += keep[i];
    CHECK(ok && n == 300 && keep[1] && !keep[300 * 6 + 1], "reference tie cut (%d)", n);
    CHECK(support_matches(p, lf, keep, N, 8000), "top-p cut within ties");
    free(lf);
    free(v);
    free(keep);
}

/* Reference penalised logits over the last `last_n` tokens of hist. */
static void ref_penalise(double *v, int n, const int *hist, int nh, int last_n, double rp, double fp,
                         double pp) {
    int *cnt = calloc((size_t)n, sizeof *cnt);
    int from = (last_n < 0 || last_n > nh) ? 0 : nh - last_n;
    if (last_n == 0) from = nh;
    for (int i = from; i < nh; i++) cnt[hist[i]]++;
    for (int t = 0; t < n; t++) {
        if (!cnt[t]) continue;
        v[t] = v[t] <= 0 ? v[t] * rp : v[t] / rp;
        v[t] -= cnt[t] * fp + pp;
    }
    free(cnt);
}

/* With top-k 1 the sampler returns the argmax of the penalised logits, so
 * the penalties are observable exactly; near ties are skipped. */
static void test_penalties(void) {
    enum { N = 12 };
    const int last_ns[] = {-1, 0, 1, 5, 16};
    int cases = 0, bad = 0;
    for (int trial = 0; trial < 400; trial++) {
        tl_sampler_params p = plain(1.0f);
        p.top_k = 1;
        p.penalty_last_n = last_ns[trial % 5];
        p.repeat_penalty = (float)(0.5 + urand() * 2.0);
        p.freq_penalty = (float)(urand() * 1.0 - 0.2);
        p.presence_penalty = (float)(urand() * 1.5 - 0.3);
        float lf[N];
        double v[N];
        for (int i = 0; i < N; i++) v[i] = lf[i] = (float)(urand() * 6 - 3);
        int hist[60], nh = (int)(urand() * 60);
        for (int i = 0; i < nh; i++) hist[i] = (int)(urand() * N);
        ref_penalise(v, N, hist, nh, p.penalty_last_n, p.repeat_penalty, p.freq_penalty,
                     p.presence_penalty);
        int want = ref_argmax(v, N), close = 0;
        for (int i = 0; i < N; i++)
            if (i != want && fabs(v[i] - v[want]) < 1e-4) close = 1;
        if (close) continue;
        tl_sampler *s = mk(&p, N);
        if (!s) return;
        tl_sampler_accept(s, -1); /* out of range: ignored */
        tl_sampler_accept(s, N);
        for (int i = 0; i < nh; i++) tl_sampler_accept(s, hist[i]);
        int32_t got = tl_sampler_sample(s, lf, NULL, NULL, 0);
        cases++;
        if (got != want) {
            bad++;
            fprintf(stderr, "  penalties trial %d: got %d want %d (last_n %d)\n", trial, got, want,
                    p.penalty_last_n);
        }
        /* reset forgets the history: back to the raw argmax */
        double raw[N];
        for (int i = 0; i < N; i++) raw[i] = lf[i];
        tl_sampler_reset(s);
        CHECK(tl_sampler_sample(s, lf, NULL, NULL, 0) == ref_argmax(raw, N), "reset clears history");
        tl_sampler_free(s);
    }
    CHECK(cases > 300 && bad == 0, "penalties: %d wrong of %d", bad, cases);

    /* the documented arithmetic on a hand-sized case: [2, -1, 1.9] with
     * token 0 seen twice and token 1 once, repeat 1.25, freq 0.1, presence 0.05:
     * 2/1.25 - 0.2 - 0.05 = 1.35 < 1.9, so token 2 wins */
    tl_sampler_params p = plain(1.0f);
    p.top_k = 1;
    p.repeat_penalty = 1.25f;
    p.freq_penalty = 0.1f;
    p.presence_penalty = 0.05f;
    const float lf[3] = {2.0f, -1.0f, 1.9f};
    tl_sampler *s = mk(&p, 3);
    if (!s) return;
    CHECK(tl_sampler_sample(s, lf, NULL, NULL, 0) == 0, "no history: raw argmax");
    tl_sampler_accept(s, 0);
    tl_sampler_accept(s, 0);
    tl_sampler_accept(s, 1);
    CHECK(tl_sampler_sample(s, lf, NULL, NULL, 0) == 2, "penalised token 0 loses");
    tl_sampler_free(s);
}

static void test_logit_bias(void) {
    enum { N = 50 };
    float lf[N];
    for (int i = 0; i < N; i++) lf[i] = (float)(urand() * 2);
    lf[17] = 10.0f; /* would dominate */
    lf[3] = 9.0f;
    tl_logit_bias b[2] = {{17, -INFINITY}, {3, -INFINITY}};
    tl_sampler_params p = tl_sampler_default_params();
    p.seed = 5;
    p.logit_bias = b;
    p.n_logit_bias = 2;
    tl_sampler *s = mk(&p, N);
    if (!s) return;
    int hits = 0;
    for (int i = 0; i < 2000; i++) {
        int32_t t = tl_sampler_sample(s, lf, NULL, NULL, 0);
        hits += (t == 17 || t == 3);
    }
    CHECK(hits == 0, "banned tokens drawn %d times", hits);
    tl_sampler_free(s);

    /* greedy honours bias: the ban and a boost */
    p.temp = 0.0f;
    s = mk(&p, N);
    if (!s) return;
    double v[N];
    for (int i = 0; i < N; i++) v[i] = lf[i];
    v[17] = v[3] = -INFINITY;
    CHECK(tl_sampler_sample(s, lf, NULL, NULL, 0) == ref_argmax(v, N), "greedy skips banned");
    tl_sampler_free(s);
    tl_logit_bias boost = {40, 20.0f};
    p.logit_bias = &boost;
    p.n_logit_bias = 1;
    s = mk(&p, N);
    if (!s) return;
    CHECK(tl_sampler_sample(s, lf, NULL, NULL, 0) == 40, "greedy takes the boosted token");
    tl_sampler_free(s);

    /* all banned but one, no filters: always that one */
    tl_logit_bias all[N - 1];
    for (int i = 0, j = 0; i < N; i++)
        if (i != 29) all[j++] = (tl_logit_bias){i, -INFINITY};
    p = plain(1.5f);
    p.logit_bias = all;
    p.n_logit_bias = N - 1;
    s = mk(&p, N);
    if (!s) return;
    int other = 0;
    for (int i = 0; i < 500; i++) other += tl_sampler_sample(s, lf, NULL, NULL, 0) != 29;
    CHECK(other == 0, "only the unbanned token may be drawn (%d others)", other);
    tl_sampler_free(s);
}

static void draws(uint64_t seed, const float *lf, int n, int32_t *out, int k) {
    tl_sampler_params p = tl_sampler_default_params();
    p.temp = 1.5f;
    p.seed = seed;
    tl_sampler *s = mk(&p, n);
    if (!s) return;
    for (int i = 0; i < k; i++) out[i] = tl_sampler_sample(s, lf, NULL, NULL, 0);
    tl_sampler_reset(s); /* a fixed seed replays after reset */
    int same = 1;
    for (int i = 0; i < k; i++) same &= tl_sampler_sample(s, lf, NULL, NULL, 0) == out[i];
    CHECK(same, "reset replays seed %llu", (unsigned long long)seed);
    tl_sampler_free(s);
}

static void test_reproducible(void) {
    enum { N = 100, K = 1000 };
    float lf[N];
    for (int i = 0; i < N; i++) lf[i] = (float)(urand() * 3);
    static int32_t a[K], b[K], c[K];
    draws(1234, lf, N, a, K);
    draws(1234, lf, N, b, K);
    draws(1235, lf, N, c, K);
    int same_ab = memcmp(a, b, sizeof a) == 0, diff_ac = 0, distinct = 0;
    for (int i = 0; i < K; i++) diff_ac += a[i] != c[i];
    char seen[N] = {0};
    for (int i = 0; i < K; i++)
        if (a[i] >= 0 && a[i] < N && !seen[a[i]]) seen[a[i]] = 1, distinct++;
    CHECK(same_ab, "same seed, same draws");
    CHECK(diff_ac > K / 2, "different seeds differ in only %d of %d draws", diff_ac, K);
    CHECK(distinct > 5, "draws are not random (%d distinct)", distinct);

    /* random seeds: two samplers should not agree on 200 draws */
    tl_sampler_params p = tl_sampler_default_params();
    p.temp = 1.5f;
    tl_sampler *s1 = mk(&p, N), *s2 = mk(&p, N);
    if (!s1 || !s2) return;
    int diff = 0;
    for (int i = 0; i < 200; i++)
        diff += tl_sampler_sample(s1, lf, NULL, NULL, 0) != tl_sampler_sample(s2, lf, NULL, NULL, 0);
    CHECK(diff > 0, "TL_SEED_RANDOM samplers agree on every draw");
    tl_sampler_free(s1);
    tl_sampler_free(s2);
}

/* 200k draws with every filter off must follow softmax(logits / temp). With
 * 8 cells the statistic has 7 degrees of freedom; P(chi2_7 > 40) = 1.3e-6.
 * Each cell must also lie within 5 standard errors (sqrt(p(1-p)/n)). */
static void freq_check(float temp, uint64_t seed) {
    enum { N = 8, DRAWS = 200000 };
    const float lf[N] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.5f, -3.0f};
    double e[N], sum = 0;
    for (int i = 0; i < N; i++) sum += e[i] = exp((double)lf[i] / temp);
    tl_sampler_params p = plain(temp);
    p.seed = seed;
    tl_sampler *s = mk(&p, N);
    if (!s) return;
    long cnt[N] = {0};
    for (int d = 0; d < DRAWS; d++) {
        int32_t t = tl_sampler_sample(s, lf, NULL, NULL, 0);
        if (t >= 0 && t < N) cnt[t]++;
    }
    tl_sampler_free(s);
    double chi2 = 0, worst = 0;
    for (int i = 0; i < N; i++) {
        double pi = e[i] / sum, ex = pi * DRAWS;
        chi2 += (cnt[i] - ex) * (cnt[i] - ex) / ex;
        double z = fabs(cnt[i] / (double)DRAWS - pi) / sqrt(pi * (1 - pi) / DRAWS);
        if (z > worst) worst = z;
    }
    printf("temp %.2f: chi2 %.2f (7 dof), worst cell %.2f sigma\n", (double)temp, chi2, worst);
    CHECK(chi2 < 40.0, "temp %g: chi2 %g", (double)temp, chi2);
    CHECK(worst < 5.0, "temp %g: a cell is %g sigma off", (double)temp, worst);
}

static void test_frequencies(void) {
    freq_check(1.0f, 99);  /* the model's own distribution */
    freq_check(0.5f, 100); /* sharper: softmax(l / 0.5) */
    freq_check(2.0f, 101); /* flatter */
}

static void test_reported_probs(void) {
    enum { N = 500 };
    float lf[N];
    for (int i = 0; i < N; i++) lf[i] = (float)(urand() * 8 - 4);
    lf[10] = lf[20] = 5.0f; /* a tie at the top: lower id first */
    lf[7] = -INFINITY;
    double mx = 5.0, sum = 0;
    for (int i = 0; i < N; i++) sum += exp((double)lf[i] - mx);
    tl_sampler_params p = tl_sampler_default_params();
    p.seed = 3;
    tl_sampler *s = mk(&p, N);
    if (!s) return;
    static tl_token_prob top[N];
    tl_token_prob ch;
    int32_t t = tl_sampler_sample(s, lf, &ch, top, N);
    double tot = 0;
    int sorted = 1, uniq = 1;
    char seen[N] = {0};
    for (int i = 0; i < N; i++) {
        tot += exp((double)top[i].logprob);
        if (i && (top[i].prob > top[i - 1].prob ||
                  (top[i].prob == top[i - 1].prob && top[i].token < top[i - 1].token)))
            sorted = 0;
        if (top[i].token < 0 || top[i].token >= N || seen[top[i].token]) uniq = 0;
        else seen[top[i].token] = 1;
    }
    CHECK_NEAR(tot, 1.0, 1e-5, "sum of exp(logprob) over the vocabulary");
    CHECK(sorted && uniq, "top list sorted by probability and a permutation");
    CHECK(top[0].token == 10 && top[1].token == 20, "tie order %d %d", top[0].token, top[1].token);
    CHECK(top[N - 1].token == 7 && top[N - 1].prob == 0.0f && isinf(top[N - 1].logprob),
          "banned-by-model token last with prob 0");
    CHECK(ch.token == t, "chosen token");
    double lp = (double)lf[t] - mx - log(sum);
    CHECK_NEAR(ch.logprob, lp, 1e-5, "chosen logprob");
    CHECK_NEAR(ch.prob, exp(lp), 1e-6, "chosen prob");
    CHECK_NEAR(top[5].logprob, (double)lf[top[5].token] - mx - log(sum), 1e-5, "top[5] logprob");
    tl_sampler_free(s);

    /* extreme logits stay finite; a short top list; chosen only */
    float ext[4] = {1000.0f, -1000.0f, 999.0f, 0.0f};
    s = mk(&p, 4);
    if (!s) return;
    tl_token_prob t2[2];
    tl_sampler_sample(s, ext, &ch, t2, 2);
    CHECK(t2[0].token == 0 && t2[1].token == 2, "extreme order");
    CHECK_NEAR(t2[0].logprob, -log1p(exp(-1.0)), 1e-5, "stable logprob at 1000");
    CHECK(isfinite(ch.logprob) && ch.prob > 0.0f, "chosen finite");
    int32_t g = tl_sampler_sample(s, ext, &ch, NULL, 0);
    CHECK(ch.token == g, "chosen filled without a top list");
    tl_sampler_free(s);
}

/* A NaN logit (a broken model row) must never be drawn nor crash anything. */
static void test_nan_logits(void) {
    enum { N = 64 };
    float lf[N];
    for (int i = 0; i < N; i++) lf[i] = (i % 3 == 0) ? NAN : (float)(urand() * 2);
    for (int mode = 0; mode < 4; mode++) {
        tl_sampler_params p = mode == 0 ? tl_sampler_default_params() : plain(mode == 1 ? 0.0f : 1.0f);
        if (mode == 3) p.top_p = 0.5f;
        p.seed = 11;
        tl_sampler *s = mk(&p, N);
        if (!s) return;
        int bad = 0;
        tl_token_prob ch, top[5];
        for (int i = 0; i < 300; i++) {
            int32_t t = tl_sampler_sample(s, lf, &ch, top, 5);
            bad += t < 0 || t >= N || isnan(lf[t]);
        }
        CHECK(bad == 0, "mode %d: %d NaN/invalid tokens drawn", mode, bad);
        if (mode == 0) { /* top-k 1 ignores the NaNs: the real argmax */
            tl_sampler_free(s);
            p.top_k = 1;
            s = mk(&p, N);
            if (!s) return;
            double v[N];
            for (int i = 0; i < N; i++) v[i] = isnan(lf[i]) ? -INFINITY : lf[i];
            CHECK(tl_sampler_sample(s, lf, NULL, NULL, 0) == ref_argmax(v, N), "top-k 1 with NaNs");
        }
        tl_sampler_free(s);
    }
}

static void test_speed(void) {
    enum { N = 262144 };
    float *lf = malloc(N * sizeof *lf);
    for (int i = 0; i < N; i++) lf[i] = (float)(urand() * 10 - 5 + (urand() < 0.001 ? 8 : 0));
    struct {
        const char *name;
        int top_k;
        float top_p, temp;
    } cfg[] = {{"default (top-k 40)", 40, 0.95f, 0.8f},
               {"top-p 0.95 only", 0, 0.95f, 0.8f},
               {"no filters", 0, 1.0f, 1.0f},
               {"greedy", 0, 1.0f, 0.0f}};
    for (int c = 0; c < 4; c++) {
        tl_sampler_params p = tl_sampler_default_params();
        p.top_k = cfg[c].top_k;
        p.top_p = cfg[c].top_p;
        p.temp = cfg[c].temp;
        p.repeat_penalty = 1.1f;
        p.seed = 1;
        tl_sampler *s = mk(&p, N);
        if (!s) break;
        for (int i = 0; i < 64; i++) tl_sampler_accept(s, (int32_t)(urand() * N));
        tl_token_prob ch, top[20];
        int iters = 30, ok = 1;
        double t0 = tl_now();
        for (int i = 0; i < iters; i++) {
            int32_t t = tl_sampler_sample(s, lf, &ch, top, 20);
            ok &= t >= 0 && t < N && ch.token == t;
            tl_sampler_accept(s, t);
        }
        double ms = (tl_now() - t0) * 1e3 / iters;
        CHECK(ok, "%s: valid tokens", cfg[c].name);
        printf("speed, n_vocab %d, %s, with top-20 report: %.3f ms/token\n", N, cfg[c].name, ms);
        tl_sampler_free(s);
    }
    free(lf);
}

int main(void) {
    test_defaults_and_validation();
    test_greedy();
    test_top_k1_is_argmax();
    test_filter_sets();
    test_top_p_wide();
    test_penalties();
    test_logit_bias();
    test_reproducible();
    test_frequencies();
    test_reported_probs();
    test_nan_logits();
    test_speed();
    return tl_test_summary();
}
