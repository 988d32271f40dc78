/* sampler: turns one row of logits into a token. Owns the sampling chain
 * (logit bias, penalties, top-k, top-p, min-p, temperature, draw, in
 * llama.cpp's default order), the penalty history, the RNG and the n_vocab
 * work buffers, all allocated once in tl_sampler_new so sampling never allocates. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"

struct tl_sampler {
    tl_sampler_params p; /* p.logit_bias points at bias below */
    tl_logit_bias *bias;
    int n_vocab;
    uint64_t rng[4]; /* xoshiro256** */
    uint64_t n_seeds; /* distinguishes random reseeds within one clock tick */

    float *work;  /* logits after bias and penalties */
    float *prob;  /* unnormalised probabilities of the candidates */
    int32_t *ids; /* candidate ids (heap, then sorted prefix) */
    int32_t *ids2; /* top-p: the bucket that needs sorting */

    /* Penalty history: counts over the window and the list of tokens with a
     * nonzero count, so applying costs O(distinct) and accepting O(1). */
    int penalties_on;
    int32_t *ring; /* last penalty_last_n tokens; NULL when unbounded */
    int ring_cap, ring_len, ring_head;
    int32_t *count;
    int32_t *present, *present_pos;
    int n_present;

    const uint32_t *allow; /* the mask for the next draw (tl_sampler_set_allowed), or NULL */
};

tl_sampler_params tl_sampler_default_params(void) {
    tl_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temp = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.freq_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    p.penalty_last_n = 64;
    p.seed = TL_SEED_RANDOM;
    return p;
}

/* ---- RNG: splitmix64 expands the seed into xoshiro256** state ---------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t *s) {
    uint64_t result = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

/* A random seed mixes both clocks, the object's address and a per-object
 * counter, so two samplers or two resets in the same tick still differ. */
static void rng_seed(tl_sampler *s) {
    uint64_t seed = s->p.seed;
    if (seed == TL_SEED_RANDOM) {
        struct timespec a, b;
        clock_gettime(CLOCK_REALTIME, &a);
        clock_gettime(CLOCK_MONOTONIC, &b);
        seed = ((uint64_t)a.tv_sec * 1000000000ull + (uint64_t)a.tv_nsec) ^
               rotl64((uint64_t)b.tv_nsec + (uint64_t)b.tv_sec, 32) ^
               rotl64((uint64_t)(uintptr_t)s, 17) ^ (++s->n_seeds * 0xd1b54a32d192ed03ull);
    }
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&seed);
}

/* ---- lifecycle ------------------------------------------------------------------ */

static int penalties_enabled(const tl_sampler_params *p) {
    return p->penalty_last_n != 0 &&
           (p->repeat_penalty != 1.0f || p->freq_penalty != 0.0f || p->presence_penalty != 0.0f);
}

static int validate(const tl_sampler_params *p, int n_vocab, tl_error *err) {
    if (n_vocab <= 0) return tl_fail(err, TL_ERR_ARG, "sampler: n_vocab %d must be positive", n_vocab);
    if (isnan(p->temp) || isinf(p->temp))
        return tl_fail(err, TL_ERR_ARG, "sampler: temperature must be finite");
    if (isnan(p->top_p) || p->top_p < 0.0f)
        return tl_fail(err, TL_ERR_ARG, "sampler: top_p %g must be a number >= 0", (double)p->top_p);
    if (isnan(p->min_p)) return tl_fail(err, TL_ERR_ARG, "sampler: min_p is NaN");
    if (!isfinite(p->repeat_penalty) || p->repeat_penalty <= 0.0f)
        return tl_fail(err, TL_ERR_ARG, "sampler: repeat_penalty %g must be finite and > 0",
                       (double)p->repeat_penalty);
    if (!isfinite(p->freq_penalty) || !isfinite(p->presence_penalty))
        return tl_fail(err, TL_ERR_ARG, "sampler: frequency/presence penalties must be finite");
    if (p->penalty_last_n < -1)
        return tl_fail(err, TL_ERR_ARG, "sampler: penalty_last_n %d must be >= -1", p->penalty_last_n);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return tl_fail(err, TL_ERR_ARG, "sampler: bad logit_bias array (%d entries)", p->n_logit_bias);
    for (int i = 0; i < p->n_logit_bias; i++) {
        const tl_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return tl_fail(err, TL_ERR_ARG, "sampler: logit_bias token %d outside the vocabulary (%d)",
                           (int)b->token, n_vocab);
        /* +inf would make the softmax inf/inf; -inf is the documented ban */
        if (isnan(b->bias) || b->bias == INFINITY)
            return tl_fail(err, TL_ERR_ARG, "sampler: logit_bias for token %d must be a number or -inf",
                           (int)b->token);
    }
    return TL_OK;
}

void tl_sampler_free(tl_sampler *s) {
    if (!s) return;
    free(s->bias);
    free(s->work);
    free(s->prob);
    free(s->ids);
    free(s->ids2);
    free(s->ring);
    free(s->count);
    free(s->present);
    free(s->present_pos);
    free(s);
}

static int alloc_buffers(tl_sampler *s) {
    size_t nv = (size_t)s->n_vocab;
    s->work = malloc(nv * sizeof *s->work);
    s->prob = malloc(nv * sizeof *s->prob);
    s->ids = malloc(nv * sizeof *s->ids);
    s->ids2 = malloc(nv * sizeof *s->ids2);
    if (!s->work || !s->prob || !s->ids || !s->ids2) return -1;
    if (s->p.n_logit_bias > 0) {
        s->bias = malloc((size_t)s->p.n_logit_bias * sizeof *s->bias);
        if (!s->bias) return -1;
        memcpy(s->bias, s->p.logit_bias, (size_t)s->p.n_logit_bias * sizeof *s->bias);
    }
    s->p.logit_bias = s->bias;
    if (!s->penalties_on) return 0;
    s->count = calloc(nv, sizeof *s->count);
    s->present = malloc(nv * sizeof *s->present);
    s->present_pos = malloc(nv * sizeof *s->present_pos);
    if (!s->count || !s->present || !s->present_pos) return -1;
    if (s->p.penalty_last_n > 0) {
        s->ring_cap = s->p.penalty_last_n;
        s->ring = malloc((size_t)s->ring_cap * sizeof *s->ring);
        if (!s->ring) return -1;
    }
    return 0;
}

int tl_sampler_new(const tl_sampler_params *params, int n_vocab, tl_sampler **out, tl_error *err) {
    if (!out) return tl_fail(err, TL_ERR_ARG, "sampler: out is NULL");
    *out = NULL;
    tl_sampler_params p = params ? *params : tl_sampler_default_params();
    int rc = validate(&p, n_vocab, err);
    if (rc) return rc;
    tl_sampler *s = calloc(1, sizeof *s);
    if (!s) return tl_fail(err, TL_ERR_NOMEM, "sampler: out of memory");
    s->p = p;
    s->n_vocab = n_vocab;
    s->penalties_on = penalties_enabled(&p);
    if (alloc_buffers(s)) {
        tl_sampler_free(s);
        return tl_fail(err, TL_ERR_NOMEM, "sampler: out of memory for %d-token buffers", n_vocab);
    }
    rng_seed(s);
    *out = s;
    return TL_OK;
}

/* ---- penalty history ---------------------------------------------------------------- */

static void count_add(tl_sampler *s, int32_t t, int delta) {
    int32_t c = s->count[t];
    s->count[t] = c + delta;
    if (c == 0) { /* became present */
        s->present_pos[t] = s->n_present;
        s->present[s->n_present++] = t;
    } else if (c + delta == 0) { /* swap-remove from the present list */
        int32_t pos = s->present_pos[t], last = s->present[--s->n_present];
        s->present[pos] = last;
        s->present_pos[last] = pos;
    }
}

void tl_sampler_accept(tl_sampler *s, int32_t token) {
    if (!s || !s->penalties_on || token < 0 || token >= s->n_vocab) return;
    if (s->ring) {
        if (s->ring_len == s->ring_cap) { /* full: the oldest leaves the window */
            count_add(s, s->ring[s->ring_head], -1);
            s->ring[s->ring_head] = token;
            s->ring_head = (s->ring_head + 1) % s->ring_cap;
        } else {
            s->ring[(s->ring_head + s->ring_len) % s->ring_cap] = token;
            s->ring_len++;
        }
    }
    count_add(s, token, +1);
}

/* Clears the history and reseeds: a fixed seed replays the same draws, a
 * random one draws a fresh seed (as llama.cpp's dist sampler does). */
void tl_sampler_reset(tl_sampler *s) {
    if (!s) return;
    if (s->penalties_on) {
        for (int i = 0; i < s->n_present; i++) s->count[s->present[i]] = 0;
        s->n_present = 0;
        s->ring_len = s->ring_head = 0;
    }
    rng_seed(s);
}

/* ---- exp over whole rows --------------------------------------------------------------- */

/* exp for arguments <= 0, four lanes at a time with the compilers' generic
 * vector extension (plain SSE2 on x86-64): glibc's scalar expf made the
 * O(n_vocab) passes the sampler's main cost. Cephes polynomial, relative
 * error < 1e-7; -inf (a banned token) and NaN give exactly 0. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f vexp(v4f x) {
    const v4f lo = {-87.0f, -87.0f, -87.0f, -87.0f};
    v4i dead = ~(x >= lo); /* NaN too: a NaN logit gets probability 0 */
    v4f xc = (v4f)(((v4i)x & ~dead) | ((v4i)lo & dead));
    v4f n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f; /* round to nearest */
    v4f r = xc - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
    v4f p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    v4f e = p * r * r + r + 1.0f;
    v4i bits = (__builtin_convertvector(n, v4i) + 127) << 23; /* 2^n */
    v4f res = e * (v4f)bits;
    return (v4f)((v4i)res & ~dead);
}

static inline float exp_le0(float x) {
    v4f v = {x, 0.0f, 0.0f, 0.0f};
    return vexp(v)[0];
}

/* out[i] = exp((in[i] - sub) * mul) for i < n; returns the sum in double. */
static double exp_row(const float *in, float sub, float mul, float *out, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        v4f a;
        memcpy(&a, in + i, sizeof a);
        a = vexp((a - sub) * mul);
        memcpy(out + i, &a, sizeof a);
    }
    for (; i < n; i++) out[i] = exp_le0((in[i] - sub) * mul);
    double acc[4] = {0, 0, 0, 0}; /* four chains: the adds pipeline */
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        acc[0] += out[j];
        acc[1] += out[j + 1];
        acc[2] += out[j + 2];
        acc[3] += out[j + 3];
    }
    for (; j < n; j++) acc[0] += out[j];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

/* The sum of exp((in[i] - sub) * mul), nothing stored (probabilities for a
 * report need only the normaliser). */
static double exp_sum(const float *in, float sub, float mul, int n) {
    v4f acc0 = {0, 0, 0, 0}, acc1 = {0, 0, 0, 0};
    double total = 0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v4f a, b;
        memcpy(&a, in + i, sizeof a);
        memcpy(&b, in + i + 4, sizeof b);
        acc0 += vexp((a - sub) * mul);
        acc1 += vexp((b - sub) * mul);
        if ((i & 1023) == 1016) { /* into double now and then: float lanes would lose the small terms */
            v4f t = acc0 + acc1;
            total += (double)t[0] + (double)t[1] + (double)t[2] + (double)t[3];
            acc0 = acc1 = (v4f){0, 0, 0, 0};
        }
    }
    v4f t = acc0 + acc1;
    total += (double)t[0] + (double)t[1] + (double)t[2] + (double)t[3];
    for (; i < n; i++) total += exp_le0((in[i] - sub) * mul);
    return total;
}

/* ---- candidate selection --------------------------------------------------------------- */

/* Candidate order: higher logit first, ties by lower id (deterministic). */
static inline int better(const float *v, int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

/* Min-heap on `better`: the root is the worst of the kept ones. */
static void sift_down(const float *v, int32_t *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(v, h[w], h[l])) w = l;
        if (r < n && better(v, h[w], h[r])) w = r;
        if (w == i) return;
        int32_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Writes the k best of the n ids src[] (NULL: 0..n-1) into out[0..k), best
 * first. O(n log k), mostly O(n) as most tokens lose to the root at once.
 * out may be src when k == n (an in-place sort). */
static int select_top(const float *v, const int32_t *src, int n, int k, int32_t *out) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    for (int i = 0; i < k; i++) out[i] = src ? src[i] : i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(v, out, k, i);
    /* the root's value lives in a register: the scan's hot compare then
     * does not wait on a load through out[0] */
    float wv = v[out[0]];
    int32_t wid = out[0];
    for (int i = k; i < n; i++) {
        if (!src && (i & 3) == 0 && i + 4 <= n) { /* skip four losers at once */
            v4f x, w = {wv, wv, wv, wv};
            memcpy(&x, v + i, sizeof x);
            v4i ge = x >= w;
            if (!(ge[0] | ge[1] | ge[2] | ge[3])) {
                i += 3;
                continue;
            }
        }
        int32_t id = src ? src[i] : i;
        float x = v[id];
        if (x > wv || (x == wv && id < wid)) {
            out[0] = id;
            sift_down(v, out, k, 0);
            wv = v[wid = out[0]];
        }
    }
    for (int m = k - 1; m > 0; m--) { /* heap sort: the worst go to the back */
        int32_t t = out[0];
        out[0] = out[m];
        out[m] = t;
        sift_down(v, out, m, 0);
    }
    return k;
}

/* The candidate set: ids[0..n) (sorted best first if `sorted`), or, while
 * `all`, the whole vocabulary in id order. */
typedef struct cands {
    int n, sorted, all;
} cands;

static void apply_bias(tl_sampler *s) {
    for (int i = 0; i < s->p.n_logit_bias; i++) s->work[s->bias[i].token] += s->bias[i].bias;
}

/* As llama_sampler_penalties_apply: shrink by repeat_penalty toward (or
 * past) zero, then subtract count*freq and presence. */
static void apply_penalties(tl_sampler *s) {
    const float rp = s->p.repeat_penalty, fp = s->p.freq_penalty, pp = s->p.presence_penalty;
    for (int i = 0; i < s->n_present; i++) {
        int32_t t = s->present[i];
        float l = s->work[t];
        l = l <= 0.0f ? l * rp : l / rp;
        s->work[t] = l - (float)s->count[t] * fp - pp;
    }
}

/* NaN entries are skipped (x > m is false for them). */
static float max_over(const float *v, const int32_t *ids, int n) {
    float m = -INFINITY;
    int i = 0;
    if (!ids) { /* four independent lanes instead of one long chain */
        v4f mv = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (; i + 4 <= n; i += 4) {
            v4f x;
            memcpy(&x, v + i, sizeof x);
            v4i gt = x > mv;
            mv = (v4f)(((v4i)x & gt) | ((v4i)mv & ~gt));
        }
        for (int j = 0; j < 4; j++) m = mv[j] > m ? mv[j] : m;
    }
    for (; i < n; i++) {
        float x = v[ids ? ids[i] : i];
        m = x > m ? x : m;
    }
    return m;
}

/* Buckets for top-p over the unsorted vocabulary: 1024 slices of the 32
 * logits below the max (~0.03 each); lower logits share the last one. */
enum { TP_BUCKETS = 1024 };
#define TP_SCALE (TP_BUCKETS / 32.0f)

static inline int tp_bucket(float mx, float l) {
    float d = (mx - l) * TP_SCALE;
    return d < (float)(TP_BUCKETS - 1) ? (int)d : TP_BUCKETS - 1; /* NaN, -inf: last */
}

/* Top-p over the whole vocabulary without sorting it (llama.cpp's bucket
 * idea): histogram the mass by logit, find the bucket where the running
 * mass crosses the target, and sort only that bucket. The kept set equals
 * the best-first prefix; it is left unsorted. */
static void top_p_all(tl_sampler *s, cands *c) {
    /* locals: stores through the id arrays could alias *s otherwise */
    const int nv = s->n_vocab;
    const float *v = s->work, *prob = s->prob;
    int32_t *ids = s->ids, *ids2 = s->ids2;
    float mx = max_over(v, NULL, nv);
    if (!(mx > -INFINITY)) return; /* everything banned: the draw handles it */
    double target = (double)s->p.top_p * exp_row(v, mx, 1.0f, s->prob, nv);
    double mass[TP_BUCKETS] = {0}, cum = 0.0;
    int32_t *bucket = ids; /* each token's bucket, compacted over below */
    for (int i = 0; i < nv; i++) bucket[i] = tp_bucket(mx, v[i]);
    for (int i = 0; i < nv; i++) mass[bucket[i]] += prob[i];
    int cut = 0;
    while (cut < TP_BUCKETS && cum + mass[cut] < target) cum += mass[cut++];
    if (cut == TP_BUCKETS) return; /* rounding kept the mass short: keep all */
    int n = 0, m = 0;
    /* branch-free compaction (flat rows make the branches unpredictable);
     * n <= i, so each bucket[i] is read before that slot is written */
    for (int32_t i = 0; i < nv; i++) {
        int b = bucket[i];
        ids[n] = i;
        n += b < cut;
        ids2[m] = i;
        m += b == cut;
    }
    select_top(v, ids2, m, m, ids2);
    for (int i = 0; i < m && cum < target; i++) {
        cum += prob[ids2[i]];
        ids[n++] = ids2[i];
    }
    c->n = n;
    c->all = 0;
    c->sorted = 0;
}

/* Smallest best-first prefix whose softmax mass reaches top_p. */
static void filter_top_p(tl_sampler *s, cands *c) {
    if (c->all) {
        top_p_all(s, c);
        return;
    }
    const float *v = s->work;
    float mx = v[s->ids[0]]; /* sorted: after top-k */
    if (!(mx > -INFINITY)) return;
    double sum = 0.0, cum = 0.0;
    for (int i = 0; i < c->n; i++) sum += exp_le0(v[s->ids[i]] - mx);
    double target = (double)s->p.top_p * sum;
    for (int i = 0; i < c->n; i++) {
        cum += exp_le0(v[s->ids[i]] - mx);
        if (cum >= target) {
            c->n = i + 1;
            return;
        }
    }
}

/* Keeps tokens with p >= min_p * p_max, i.e. logit >= max + log(min_p). */
static void filter_min_p(tl_sampler *s, cands *c) {
    const float *v = s->work;
    if (c->sorted) {
        float thr = v[s->ids[0]] + logf(s->p.min_p);
        int i = 1; /* the best always stays */
        while (i < c->n && v[s->ids[i]] >= thr) i++;
        c->n = i;
        return;
    }
    const int32_t *src = c->all ? NULL : s->ids;
    float thr = max_over(v, src, c->n) + logf(s->p.min_p);
    int n = 0;
    for (int i = 0; i < c->n; i++) { /* in place: n never passes i */
        int32_t id = src ? src[i] : i;
        if (v[id] >= thr) s->ids[n++] = id;
    }
    if (n == 0) return; /* all -inf or NaN: the set is unchanged */
    c->n = n;
    c->all = 0;
}

/* Softmax at temperature `temp` over the candidates and one draw. Drawing
 * from the partial sums of the same terms that make the total ensures a hit
 * (the last positive term is the fallback against rounding). */
static int32_t draw(tl_sampler *s, const cands *c) {
    const float *v = s->work;
    const int32_t *ids = c->all ? NULL : s->ids;
    float mx = max_over(v, ids, c->n);
    if (!(mx > -INFINITY)) return ids ? ids[0] : 0; /* nothing allowed */
    const float inv_t = 1.0f / s->p.temp;
    double sum = 0.0;
    if (ids) { /* gather, then exp the packed row in place */
        for (int i = 0; i < c->n; i++) s->prob[i] = v[ids[i]];
        sum = exp_row(s->prob, mx, inv_t, s->prob, c->n);
    } else {
        sum = exp_row(v, mx, inv_t, s->prob, c->n);
    }
    double target = rng_uniform(s->rng) * sum, cum = 0.0;
    int last = 0;
    for (int i = 0; i < c->n; i++) {
        if (s->prob[i] <= 0.0f) continue;
        cum += s->prob[i];
        last = i;
        if (cum > target) break;
    }
    return ids ? ids[last] : last;
}

/* work = logits with NaN as -inf, so the orderings below stay total. */
static void load_work(tl_sampler *s, const float *logits) {
    const v4f ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int i = 0, n = s->n_vocab;
    for (; i + 4 <= n; i += 4) {
        v4f x;
        memcpy(&x, logits + i, sizeof x);
        v4i ok = x == x;
        x = (v4f)(((v4i)x & ok) | ((v4i)ninf & ~ok));
        memcpy(s->work + i, &x, sizeof x);
    }
    for (; i < n; i++) s->work[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    if (s->allow) /* the mask first: the rest of the chain sees only what may follow */
        for (i = 0; i < n; i += 32) {
            const uint32_t w = s->allow[i >> 5];
            if (w == 0xffffffffu) continue;
            for (int j = 0; j < 32 && i + j < n; j++)
                if (!(w >> j & 1)) s->work[i + j] = -INFINITY;
        }
}

void tl_sampler_set_allowed(tl_sampler *s, const uint32_t *bits) { s->allow = bits; }

/* Whether the mask leaves any token. */
static int mask_empty(const tl_sampler *s) {
    if (!s->allow) return 0;
    for (int i = 0; i < (s->n_vocab + 31) / 32; i++)
        if (s->allow[i]) return 0;
    return 1;
}

static int32_t argmax(const float *v, int n) {
    int32_t best = 0;
    float bv = -INFINITY; /* in a register: no load chained through `best`; NaN never wins */
    for (int32_t i = 0; i < n; i++)
        if (v[i] > bv) bv = v[best = i];
    return best;
}

/* ---- reporting the model's distribution ------------------------------------------------- */

static void fill_prob(tl_token_prob *tp, int32_t id, float logit, float mx, double log_sum) {
    tp->token = id;
    if (!(mx > -INFINITY) || !(logit > -INFINITY)) {
        tp->logprob = -INFINITY;
        tp->prob = 0.0f;
        return;
    }
    double lp = (double)logit - (double)mx - log_sum;
    tp->logprob = (float)lp;
    tp->prob = (float)exp(lp);
}

static int report(tl_sampler *s, const float *logits, int32_t tok, tl_token_prob *chosen,
                  tl_token_prob *top, int n_top) {
    if (!chosen && !(top && n_top > 0)) return 0;
    float mx = max_over(logits, NULL, s->n_vocab);
    double sum = mx > -INFINITY ? exp_sum(logits, mx, 1.0f, s->n_vocab) : 0.0;
    double log_sum = log(sum);
    if (chosen) fill_prob(chosen, tok, logits[tok], mx, log_sum);
    if (top && n_top > 0) {
        int n = select_top(logits, NULL, s->n_vocab, n_top, s->ids);
        for (int i = 0; i < n; i++) fill_prob(&top[i], s->ids[i], logits[s->ids[i]], mx, log_sum);
        return n;
    }
    return 0;
}

int tl_sampler_report(tl_sampler *s, const float *logits, int32_t token, tl_token_prob *chosen,
                      tl_token_prob *top, int n_top) {
    if (!s || !logits || token < 0 || token >= s->n_vocab) return 0;
    if (n_top > s->n_vocab) n_top = s->n_vocab;
    return report(s, logits, token, chosen, top, n_top);
}

/* The chain up to the draw: work = logits after bias and penalties, c = the
 * candidates the filters keep. */
static cands filter_chain(tl_sampler *s, const float *logits) {
    const tl_sampler_params *p = &s->p;
    load_work(s, logits);
    apply_bias(s);
    if (s->penalties_on) apply_penalties(s);
    cands c = {s->n_vocab, 0, 1};
    if (p->top_k > 0 && p->top_k < s->n_vocab) { /* k >= n_vocab keeps all: off */
        c.n = select_top(s->work, NULL, s->n_vocab, p->top_k, s->ids);
        c.all = 0;
        c.sorted = 1;
    }
    if (p->top_p < 1.0f) filter_top_p(s, &c);
    if (p->min_p > 0.0f) filter_min_p(s, &c);
    return c;
}

int tl_sampler_dist(tl_sampler *s, const float *logits, tl_token_prob *out, int cap) {
    if (!s || !logits || !out || cap <= 0) return 0;
    if (s->p.temp <= 0.0f) { /* greedy: all the mass on one token */
        tl_token_prob chosen;
        int32_t tok = tl_sampler_sample(s, logits, &chosen, NULL, 0);
        out[0] = (tl_token_prob){.token = tok, .prob = 1.0f, .logprob = 0.0f};
        return 1;
    }
    cands c = filter_chain(s, logits);
    const int32_t *ids = c.all ? NULL : s->ids;
    const float *v = s->work;
    float mx = max_over(v, ids, c.n);
    if (!(mx > -INFINITY)) return 0;
    double sum = 0;
    for (int i = 0; i < c.n; i++) sum += exp((double)(v[ids ? ids[i] : i] - mx) / s->p.temp);
    int n = 0;
    for (int i = 0; i < c.n; i++) {
        int32_t id = ids ? ids[i] : i;
        double pr = exp((double)(v[id] - mx) / s->p.temp) / sum;
        if (pr <= 0) continue;
        if (n < cap) {
            out[n++] = (tl_token_prob){.token = id, .prob = (float)pr, .logprob = (float)log(pr)};
        } else { /* keep the cap most probable */
            int lo = 0;
            for (int j = 1; j < n; j++)
                if (out[j].prob < out[lo].prob) lo = j;
            if (pr > out[lo].prob) out[lo] = (tl_token_prob){.token = id, .prob = (float)pr, .logprob = (float)log(pr)};
        }
    }
    return n;
}

int32_t tl_sampler_sample(tl_sampler *s, const float *logits, tl_token_prob *chosen,
                          tl_token_prob *top, int n_top) {
    if (!s || !logits) return -1;
    const tl_sampler_params *p = &s->p;
    int32_t tok;
    if (mask_empty(s)) return -1;
    if (p->temp <= 0.0f) {
        /* greedy: raw logits plus bias only, so banned tokens stay banned */
        if (p->n_logit_bias == 0 && !s->allow) {
            tok = argmax(logits, s->n_vocab);
        } else {
            load_work(s, logits);
            apply_bias(s);
            tok = argmax(s->work, s->n_vocab);
        }
    } else {
        cands c = filter_chain(s, logits);
        tok = draw(s, &c);
    }
    if (s->allow && !(s->allow[tok >> 5] >> (tok & 31) & 1)) return -1; /* every allowed logit was -inf or NaN */
    report(s, logits, tok, chosen, top, n_top);
    return tok;
}
