/* gdn: the Gated DeltaNet block (tl_gdn_block) of the CPU backend and the
 * recurrent state each sequence keeps for it instead of cached keys and
 * values.
 *
 * A value head's state S (d x d) decays by a_t = exp(g_t), then takes the
 * delta rule's write: delta_t = beta_t (v_t - S^T k_t), S += k_t delta_t^T,
 * and answers o_t = S^T q_t / sqrt(d).
 *
 * Exact numerics run llama.cpp's CPU kernel (ggml_compute_forward_gated_
 * delta_net): token by token, S held transposed, its dots in ggml_vec_dot_
 * f32's order. That is batch-invariant by construction (one token at a time).
 *
 * Fast numerics run the chunked form over blocks of TL_KV_BLOCK positions
 * aligned to absolute positions, so that a row's bits never depend on how a
 * prompt was split into calls: within block [B, B+16) with state S at B,
 * cumulative decays G_t = g_B + ... + g_t,
 *   delta_t = beta_t (v_t - e^{G_t} S^T k_t - sum_{i<t} e^{G_t-G_i} (k_i.k_t) delta_i)
 *   o_t     = (e^{G_t} S^T q_t + sum_{i<=t} e^{G_t-G_i} (k_i.q_t) delta_i) / sqrt(d)
 * and at the block's end S' = e^{G_15} S + sum_i e^{G_15-G_i} k_i delta_i^T.
 * A prefill reads S once per block for all its tokens (S^T k and S^T q for
 * 16 tokens in one pass) and writes it once; a decoded token reads it once.
 * Each row is computed by the same per-row steps whatever else is in the
 * call, so a prompt run at once, in pieces or token by token gives the same
 * bits.
 *
 * What a sequence keeps per layer: S at its last two block boundaries (two
 * slots, by boundary parity), in exact mode the state after its last token,
 * and a ring of the last two blocks' and the convolution window's inputs (the
 * convolution's input row and k; exact mode's v, g and beta; the fast form's
 * delta and G). That is enough to go back
 * to any position since the previous boundary (speculation's rejected
 * guesses: replayed from the boundary in exact mode, the ring cut in fast
 * mode) and to snapshot the state at a boundary for the prefix cache. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "forward/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GDN_X86 1
#endif

#define BLK TL_KV_BLOCK
#define NONE ((size_t)-1) /* a ring field this numerics mode does not keep */

/* The few vector steps the recurrence is made of, at one CPU level; the
 * AVX2 ones give the scalar ones' bits (elementwise fma, one dot order). */
typedef struct gdn_fns {
    void (*axpy)(int n, float a, const float *x, float *y);     /* y = fma(a, x, y) */
    void (*scale)(int n, float a, const float *x, float *y);    /* y = a * x */
    float (*dot)(int n, const float *x, const float *y);        /* 8 lanes, fixed tree */
    /* acc[t][:] = fma(x[t][a], S[a][:], acc[t][:]) for a = 0..d-1, t < nt: S^T x
     * for nt vectors in one pass over S (d x d); acc starts at zero */
    void (*sdot)(int d, const float *S, int nt, const float *const *x, float *acc);
} gdn_fns;

static void axpy_ref(int n, float a, const float *x, float *y) {
    for (int i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}
static void scale_ref(int n, float a, const float *x, float *y) {
    for (int i = 0; i < n; i++) y[i] = a * x[i];
}
static float dot_ref(int n, const float *x, const float *y) {
    float l[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int k = 0; k < 8; k++) l[k] = fmaf(x[i + k], y[i + k], l[k]);
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}
static void sdot_ref(int d, const float *S, int nt, const float *const *x, float *acc) {
    memset(acc, 0, (size_t)nt * d * sizeof *acc);
    for (int a = 0; a < d; a++)
        for (int t = 0; t < nt; t++) axpy_ref(d, x[t][a], S + (size_t)a * d, acc + (size_t)t * d);
}

#ifdef GDN_X86
__attribute__((target("avx2,fma"))) static void axpy_avx2(int n, float a, const float *x, float *y) {
    const __m256 va = _mm256_set1_ps(a);
    for (int i = 0; i < n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
}
__attribute__((target("avx2,fma"))) static void scale_avx2(int n, float a, const float *x, float *y) {
    const __m256 va = _mm256_set1_ps(a);
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(x + i)));
}
__attribute__((target("avx2,fma"))) static float dot_avx2(int n, const float *x, const float *y) {
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc);
    __m128 s = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* Four tokens at a time share each load of S's row; a row of 8 floats at a
 * time keeps the accumulators in registers. */
__attribute__((target("avx2,fma"))) static void sdot_avx2(int d, const float *S, int nt, const float *const *x,
                                                            float *acc) {
    for (int j = 0; j < d; j += 8)
        for (int t0 = 0; t0 < nt; t0 += 4) {
            const int m = nt - t0 < 4 ? nt - t0 : 4;
            __m256 r0 = _mm256_setzero_ps(), r1 = r0, r2 = r0, r3 = r0;
            for (int a = 0; a < d; a++) {
                const __m256 s = _mm256_loadu_ps(S + (size_t)a * d + j);
                r0 = _mm256_fmadd_ps(_mm256_set1_ps(x[t0][a]), s, r0);
                if (m > 1) r1 = _mm256_fmadd_ps(_mm256_set1_ps(x[t0 + 1][a]), s, r1);
                if (m > 2) r2 = _mm256_fmadd_ps(_mm256_set1_ps(x[t0 + 2][a]), s, r2);
                if (m > 3) r3 = _mm256_fmadd_ps(_mm256_set1_ps(x[t0 + 3][a]), s, r3);
            }
            _mm256_storeu_ps(acc + (size_t)t0 * d + j, r0);
            if (m > 1) _mm256_storeu_ps(acc + (size_t)(t0 + 1) * d + j, r1);
            if (m > 2) _mm256_storeu_ps(acc + (size_t)(t0 + 2) * d + j, r2);
            if (m > 3) _mm256_storeu_ps(acc + (size_t)(t0 + 3) * d + j, r3);
        }
}
#endif

/* One ring entry's fields, in floats from its start (NONE: not kept). */
typedef struct gdn_ent {
    size_t conv, k, v, g, b, d, G, size;
} gdn_ent;

struct tl_gdn {
    int n_seq, n_rec, exact;
    int ds, n_kh, n_vh, kd, vd, conv_dim, d_conv;
    int ring;           /* positions kept: two blocks and the convolution's window */
    size_t s_floats;    /* one layer's state: n_vh heads of ds x ds */
    size_t lay;         /* floats per (sequence, layer): two slots, the exact run state, the ring */
    gdn_ent e;
    float *mem;         /* [n_seq][n_rec][lay] */
    int *pos, *lo;      /* [n_seq] where each state stands; the lowest position it can go back to */
    gdn_fns f;
    tl_vec_dot_fn dot_ggml; /* exact: ggml_vec_dot_f32 */
    /* one forward call's rows (n_batch each) */
    float *qkv, *z, *br, *ar;  /* projections: [conv_dim], [vd], [n_vh], [n_vh] */
    float *q, *k, *v, *g, *b;  /* after the convolution: q, k normalised; decay g, strength beta */
    float *d, *G, *o;          /* fast form's delta and cumulative decay; the output */
    float *ones;               /* silu(x) = swiglu(x, 1) */
    float *scr;                /* per thread */
    size_t scr_n;
    /* the call's runs: a sequence's tokens in position order */
    int *tidx, *run_seq, *run_t0, *run_n, *run_p0, *tok_run;
    int n_run;
};

static float *lay_of(const tl_gdn *g, int seq, int l) { return g->mem + ((size_t)seq * g->n_rec + l) * g->lay; }
static float *slot_of(const tl_gdn *g, float *lay, int b) { return lay + (size_t)((b / BLK) & 1) * g->s_floats; }
static float *run_of(const tl_gdn *g, float *lay) { return g->exact ? lay + 2 * g->s_floats : NULL; }
static float *ring_of(const tl_gdn *g, float *lay, int p) {
    return lay + (g->exact ? 3 : 2) * g->s_floats + (size_t)(p % g->ring) * g->e.size;
}

size_t tl_gdn_snap_bytes(const tl_cpu *c) {
    const tl_gdn *g = c->gdn;
    return (size_t)g->n_rec * (g->s_floats + (size_t)(g->d_conv - 1) * g->conv_dim) * sizeof(float);
}

size_t tl_gdn_seq_bytes(const tl_cpu *c) { return (size_t)c->gdn->n_rec * c->gdn->lay * sizeof(float); }

int tl_gdn_pos(const tl_cpu *c, int seq) { return c->gdn->pos[seq]; }

void tl_gdn_free(tl_gdn *g) {
    if (!g) return;
    tl_big_free(g->mem);
    float *bufs[] = {g->qkv, g->z, g->br, g->ar, g->q, g->k, g->v, g->g, g->b, g->d, g->G, g->o, g->ones, g->scr};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) tl_cpu_free_buf(bufs[i]);
    int *ib[] = {g->pos, g->lo, g->tidx, g->run_seq, g->run_t0, g->run_n, g->run_p0, g->tok_run};
    for (size_t i = 0; i < sizeof ib / sizeof *ib; i++) tl_cpu_free_buf(ib[i]);
    free(g);
}

int tl_gdn_new(tl_cpu *c, int n_seq, tl_error *err) {
    const tl_hparams *hp = &c->m->hp;
    tl_gdn *g = calloc(1, sizeof *g);
    if (!g) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    g->n_seq = n_seq;
    g->n_rec = hp->n_rec_layer;
    g->exact = c->kern.mode == TL_NUM_EXACT;
    g->ds = hp->ssm_d_state;
    g->n_kh = hp->ssm_n_kh;
    g->n_vh = hp->ssm_n_vh;
    g->kd = g->n_kh * g->ds;
    g->vd = g->n_vh * g->ds;
    g->conv_dim = 2 * g->kd + g->vd;
    g->d_conv = hp->ssm_d_conv;
    g->s_floats = (size_t)g->n_vh * g->ds * g->ds;
    /* exact mode replays from k, v, g and beta; the fast form reads k,
     * delta and G of the block's earlier positions */
    size_t o = 0;
    g->e = (gdn_ent){NONE, NONE, NONE, NONE, NONE, NONE, NONE, 0};
    g->e.conv = o, o += (size_t)g->conv_dim;
    g->e.k = o, o += (size_t)g->kd;
    if (g->exact) {
        g->e.v = o, o += (size_t)g->vd;
        g->e.g = o, o += (size_t)g->n_vh;
        g->e.b = o, o += (size_t)g->n_vh;
    } else {
        g->e.d = o, o += (size_t)g->vd;
        g->e.G = o, o += (size_t)g->n_vh;
    }
    g->e.size = (o + 15) & ~(size_t)15;
    g->ring = 2 * BLK + g->d_conv - 1;
    /* the state after the last token: exact mode's alone */
    g->lay = (g->exact ? 3 : 2) * g->s_floats + (size_t)g->ring * g->e.size;
    g->f = (gdn_fns){axpy_ref, scale_ref, dot_ref, sdot_ref};
#ifdef GDN_X86
    if (c->kern.level >= TL_CPU_AVX2) g->f = (gdn_fns){axpy_avx2, scale_avx2, dot_avx2, sdot_avx2};
#endif
    g->dot_ggml = c->kern.vec_dot_id[TL_F32];
    const size_t nb = (size_t)c->n_batch;
    const int nt = tl_pool_size(c->pool);
    int fail = 0;
    g->mem = tl_big_alloc((size_t)n_seq * g->n_rec * g->lay * sizeof(float));
    if (!g->mem) fail = 1;
    g->pos = tl_cpu_calloc((size_t)n_seq, sizeof(int), &fail);
    g->lo = tl_cpu_calloc((size_t)n_seq, sizeof(int), &fail);
    g->qkv = tl_cpu_calloc(nb * g->conv_dim, sizeof(float), &fail);
    g->z = tl_cpu_calloc(nb * g->vd, sizeof(float), &fail);
    g->br = tl_cpu_calloc(nb * g->n_vh, sizeof(float), &fail);
    g->ar = tl_cpu_calloc(nb * g->n_vh, sizeof(float), &fail);
    g->q = tl_cpu_calloc(nb * g->kd, sizeof(float), &fail);
    g->k = tl_cpu_calloc(nb * g->kd, sizeof(float), &fail);
    g->v = tl_cpu_calloc(nb * g->vd, sizeof(float), &fail);
    g->g = tl_cpu_calloc(nb * g->n_vh, sizeof(float), &fail);
    g->b = tl_cpu_calloc(nb * g->n_vh, sizeof(float), &fail);
    g->d = tl_cpu_calloc(nb * g->vd, sizeof(float), &fail);
    g->G = tl_cpu_calloc(nb * g->n_vh, sizeof(float), &fail);
    g->o = tl_cpu_calloc(nb * g->vd, sizeof(float), &fail);
    g->ones = tl_cpu_calloc((size_t)(g->conv_dim > g->vd ? g->conv_dim : g->vd), sizeof(float), &fail);
    /* per thread: the convolution's row (or the gate's silu); or S^T k and
     * S^T q of a block's tokens and a row each of delta's and o's sums */
    g->scr_n = (size_t)g->conv_dim + 2 * BLK * (size_t)g->ds + 2 * (size_t)g->ds + 64;
    g->scr_n = (g->scr_n + 15) & ~(size_t)15;
    g->scr = tl_cpu_calloc((size_t)nt * g->scr_n, sizeof(float), &fail);
    g->tidx = tl_cpu_calloc(nb, sizeof(int), &fail);
    g->tok_run = tl_cpu_calloc(nb, sizeof(int), &fail);
    g->run_seq = tl_cpu_calloc(nb, sizeof(int), &fail);
    g->run_t0 = tl_cpu_calloc(nb, sizeof(int), &fail);
    g->run_n = tl_cpu_calloc(nb, sizeof(int), &fail);
    g->run_p0 = tl_cpu_calloc(nb, sizeof(int), &fail);
    if (fail) {
        tl_gdn_free(g);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory for the recurrent states of %d sequences", n_seq);
    }
    for (int i = 0; i < (g->conv_dim > g->vd ? g->conv_dim : g->vd); i++) g->ones[i] = 1.0f;
    c->gdn = g;
    return TL_OK;
}

/* ---------------------------------------------------------------- the call */

/* Groups the call's tokens by sequence, in position order (the context
 * gives a sequence's tokens consecutive positions in batch order). */
static void plan_runs(tl_cpu *c, int n) {
    tl_gdn *g = c->gdn;
    g->n_run = 0;
    int k = 0;
    for (int t = 0; t < n; t++) {
        int r = 0;
        while (r < g->n_run && g->run_seq[r] != c->tseq[t]) r++;
        if (r == g->n_run) {
            g->run_seq[r] = c->tseq[t];
            g->run_n[r] = 0;
            g->n_run++;
        }
        g->run_n[r]++;
        g->tok_run[t] = r;
    }
    for (int r = 0; r < g->n_run; r++) {
        g->run_t0[r] = k;
        k += g->run_n[r];
        g->run_n[r] = 0;
    }
    for (int t = 0; t < n; t++) {
        const int r = g->tok_run[t];
        if (g->run_n[r] == 0) g->run_p0[r] = c->tpos[t];
        g->tidx[g->run_t0[r] + g->run_n[r]++] = t;
    }
}

/* The convolution's input row of position p of run r: the call's, the
 * ring's, or zeros before the sequence's start. */
static const float *conv_row(const tl_gdn *g, float *lay, int r, int p) {
    if (p < 0) return NULL;
    if (p >= g->run_p0[r]) return g->qkv + (size_t)g->tidx[g->run_t0[r] + p - g->run_p0[r]] * g->conv_dim;
    return ring_of(g, lay, p) + g->e.conv;
}

/* L2 normalisation as llama.cpp builds it: rms_norm(x, eps/n) * (1/sqrt(n)). */
static void l2norm(float *y, const float *x, int n, float eps) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n), scale = 1.0f / sqrtf(mean + eps / (float)n), post = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) y[i] = (x[i] * scale) * post;
}

typedef struct gdn_job {
    tl_cpu *c;
    const tl_gdn_block *G;
    atomic_int next;
} gdn_job;

/* Per token: the causal convolution, SiLU, q and k normalised, v; the
 * decay g = softplus(alpha + dt_bias) * a and the strength sigmoid(beta). */
static void conv_tokens(tl_cpu *c, int t0, int t1, int ith, void *arg) {
    const tl_gdn_block *G = arg;
    tl_gdn *g = c->gdn;
    float *row = g->scr + (size_t)ith * g->scr_n;
    const float eps = c->m->hp.norm_eps;
    const int il = G->rec_layer, K = g->d_conv, cd = g->conv_dim;
    const float *w = G->conv->data, *dtb = G->dt_bias->data, *A = G->a->data;
    for (int i = t0; i < t1; i++) {
        const int t = g->tidx[i], r = g->tok_run[t], p = c->tpos[t];
        float *lay = lay_of(g, c->tseq[t], il);
        const float *in[16];
        for (int j = 0; j < K; j++) in[j] = conv_row(g, lay, r, p - (K - 1) + j);
        for (int ch = 0; ch < cd; ch++) {
            float s = 0.0f;
            /* ggml_ssm_conv: a float sum, each product rounded (no fma) */
            for (int j = 0; j < K; j++) s += (in[j] ? in[j][ch] : 0.0f) * w[(size_t)ch * K + j];
            row[ch] = s;
        }
        c->kern.math.swiglu(cd, row, row, g->ones);
        for (int h = 0; h < g->n_kh; h++) {
            l2norm(g->q + (size_t)t * g->kd + h * g->ds, row + h * g->ds, g->ds, eps);
            l2norm(g->k + (size_t)t * g->kd + h * g->ds, row + g->kd + h * g->ds, g->ds, eps);
        }
        memcpy(g->v + (size_t)t * g->vd, row + 2 * g->kd, (size_t)g->vd * sizeof(float));
        for (int h = 0; h < g->n_vh; h++) {
            const float x = g->ar[(size_t)t * g->n_vh + h] + dtb[h];
            const float sp = x > 20.0f ? x : logf(1 + expf(x));
            g->g[(size_t)t * g->n_vh + h] = sp * A[h];
            g->b[(size_t)t * g->n_vh + h] = 1.0f / (1.0f + expf(-g->br[(size_t)t * g->n_vh + h]));
        }
    }
}

/* A position's k (its key head's), delta and G for value head h: from the
 * call's rows or from the ring. */
typedef struct hist {
    const float *k, *d;
    float G;
} hist;

static hist hist_at(const tl_gdn *g, float *lay, int r, int p, int h) {
    const int kh = h % g->n_kh;
    if (p >= g->run_p0[r]) {
        const int t = g->tidx[g->run_t0[r] + p - g->run_p0[r]];
        return (hist){g->k + (size_t)t * g->kd + kh * g->ds, g->d + (size_t)t * g->vd + h * g->ds,
                      g->G[(size_t)t * g->n_vh + h]};
    }
    const float *e = ring_of(g, lay, p);
    return (hist){e + g->e.k + kh * g->ds, e + g->e.d + h * g->ds, e[g->e.G + h]};
}

/* Fast form, one run's value head h. */
static void fast_head(tl_gdn *g, float *lay, int r, int h, float *scr) {
    const int ds = g->ds, kh = h % g->n_kh, p_end = g->run_p0[r] + g->run_n[r];
    const float scale = 1.0f / sqrtf((float)ds);
    const size_t hs = (size_t)h * ds * ds;
    float *sk = scr, *sq = NULL, *acc = scr + 2 * (size_t)BLK * ds, *acc2 = acc + ds;
    for (int p = g->run_p0[r]; p < p_end;) {
        const int B = p / BLK * BLK, e_end = B + BLK < p_end ? B + BLK : p_end, nt = e_end - p;
        const float *S = slot_of(g, lay, B) + hs;
        /* S^T k and S^T q of the segment's tokens in one pass over S */
        const float *x[2 * BLK], **xk = x, **xq = x + nt;
        for (int i = 0; i < nt; i++) {
            const int t = g->tidx[g->run_t0[r] + p + i - g->run_p0[r]];
            xk[i] = g->k + (size_t)t * g->kd + kh * ds;
            xq[i] = g->q + (size_t)t * g->kd + kh * ds;
        }
        g->f.sdot(ds, S, 2 * nt, x, sk);
        sq = sk + (size_t)nt * ds;
        for (int i = 0; i < nt; i++) {
            const int pp = p + i, t = g->tidx[g->run_t0[r] + pp - g->run_p0[r]];
            const float Gt = (pp == B ? 0.0f : hist_at(g, lay, r, pp - 1, h).G) + g->g[(size_t)t * g->n_vh + h];
            const float gam = expf(Gt), beta = g->b[(size_t)t * g->n_vh + h];
            const float *kt = xk[i], *qt = xq[i], *vt = g->v + (size_t)t * g->vd + h * ds;
            float *dt = g->d + (size_t)t * g->vd + h * ds, *ot = g->o + (size_t)t * g->vd + h * ds;
            g->f.scale(ds, gam, sk + (size_t)i * ds, acc);
            g->f.scale(ds, gam, sq + (size_t)i * ds, acc2);
            for (int e = B; e < pp; e++) {
                const hist he = hist_at(g, lay, r, e, h);
                const float w = expf(Gt - he.G);
                g->f.axpy(ds, w * g->f.dot(ds, he.k, kt), he.d, acc);
                g->f.axpy(ds, w * g->f.dot(ds, he.k, qt), he.d, acc2);
            }
            for (int j = 0; j < ds; j++) dt[j] = (vt[j] - acc[j]) * beta;
            g->G[(size_t)t * g->n_vh + h] = Gt;
            g->f.axpy(ds, g->f.dot(ds, kt, qt), dt, acc2);
            g->f.scale(ds, scale, acc2, ot);
        }
        if (e_end == B + BLK) { /* the block is whole: the state at its end */
            float *Sn = slot_of(g, lay, B + BLK) + hs;
            const float Gl = hist_at(g, lay, r, B + BLK - 1, h).G, gl = expf(Gl);
            g->f.scale(ds * ds, gl, S, Sn);
            for (int e = B; e < B + BLK; e++) {
                const hist he = hist_at(g, lay, r, e, h);
                const float w = expf(Gl - he.G);
                for (int a = 0; a < ds; a++) g->f.axpy(ds, w * he.k[a], he.d, Sn + (size_t)a * ds);
            }
        }
        p = e_end;
    }
}

/* llama.cpp's step on one head's transposed state M (M[j][i] = S[i][j]). */
static void exact_step(const tl_gdn *g, float *M, const float *q, const float *k, const float *v, float gv,
                       float beta, float *o, float *delta) {
    const int ds = g->ds;
    g->f.scale(ds * ds, expf(gv), M, M);
    for (int j = 0; j < ds; j++) delta[j] = (v[j] - g->dot_ggml(ds, M + (size_t)j * ds, k)) * beta;
    for (int j = 0; j < ds; j++) g->f.axpy(ds, delta[j], k, M + (size_t)j * ds);
    if (o) {
        const float scale = 1.0f / sqrtf((float)ds);
        for (int j = 0; j < ds; j++) o[j] = g->dot_ggml(ds, M + (size_t)j * ds, q) * scale;
    }
}

static void exact_head(tl_gdn *g, float *lay, int r, int h, float *scr) {
    const int ds = g->ds, kh = h % g->n_kh;
    const size_t hs = (size_t)h * ds * ds;
    float *M = run_of(g, lay) + hs;
    for (int i = 0; i < g->run_n[r]; i++) {
        const int t = g->tidx[g->run_t0[r] + i], p = g->run_p0[r] + i;
        exact_step(g, M, g->q + (size_t)t * g->kd + kh * ds, g->k + (size_t)t * g->kd + kh * ds,
                   g->v + (size_t)t * g->vd + h * ds, g->g[(size_t)t * g->n_vh + h], g->b[(size_t)t * g->n_vh + h],
                   g->o + (size_t)t * g->vd + h * ds, scr);
        if ((p + 1) % BLK == 0) memcpy(slot_of(g, lay, p + 1) + hs, M, (size_t)ds * ds * sizeof *M);
    }
}

static void rec_worker(void *arg, int ith, int nth) {
    (void)nth;
    gdn_job *j = arg;
    tl_gdn *g = j->c->gdn;
    float *scr = g->scr + (size_t)ith * g->scr_n;
    for (int it; (it = atomic_fetch_add(&j->next, 1)) < g->n_run * g->n_vh;) {
        const int r = it / g->n_vh, h = it % g->n_vh;
        float *lay = lay_of(g, g->run_seq[r], j->G->rec_layer);
        if (g->exact) exact_head(g, lay, r, h, scr);
        else fast_head(g, lay, r, h, scr);
    }
}

/* o = RMSNorm(o) * ssm_norm * silu(z), per head. */
static void gate_tokens(tl_cpu *c, int t0, int t1, int ith, void *arg) {
    const tl_gdn_block *G = arg;
    tl_gdn *g = c->gdn;
    float *sz = g->scr + (size_t)ith * g->scr_n;
    for (int t = t0; t < t1; t++) {
        float *o = g->o + (size_t)t * g->vd;
        c->kern.math.swiglu(g->vd, sz, g->z + (size_t)t * g->vd, g->ones);
        for (int h = 0; h < g->n_vh; h++)
            c->kern.math.rmsnorm(o + h * g->ds, o + h * g->ds, G->ssm_norm->data, g->ds, c->m->hp.norm_eps);
        for (int i = 0; i < g->vd; i++) o[i] *= sz[i];
    }
}

/* After the call: each run's last positions into its ring, its new position. */
static void keep_runs(tl_cpu *c, const tl_gdn_block *G) {
    tl_gdn *g = c->gdn;
    for (int r = 0; r < g->n_run; r++) {
        const int s = g->run_seq[r], p_end = g->run_p0[r] + g->run_n[r];
        float *lay = lay_of(g, s, G->rec_layer);
        for (int p = p_end - g->ring > g->run_p0[r] ? p_end - g->ring : g->run_p0[r]; p < p_end; p++) {
            const int t = g->tidx[g->run_t0[r] + p - g->run_p0[r]];
            float *e = ring_of(g, lay, p);
            const struct {
                size_t at;
                const float *src;
                int n;
            } F[] = {{g->e.conv, g->qkv, g->conv_dim}, {g->e.k, g->k, g->kd}, {g->e.v, g->v, g->vd},
                     {g->e.g, g->g, g->n_vh},        {g->e.b, g->b, g->n_vh}, {g->e.d, g->d, g->vd},
                     {g->e.G, g->G, g->n_vh}};
            for (size_t f = 0; f < sizeof F / sizeof *F; f++)
                if (F[f].at != NONE) memcpy(e + F[f].at, F[f].src + (size_t)t * F[f].n, (size_t)F[f].n * sizeof(float));
        }
        if (G->rec_layer == g->n_rec - 1) { /* the last layer: the sequence has moved */
            g->pos[s] = p_end;
            const int lo = p_end / BLK * BLK - BLK;
            if (g->lo[s] < lo) g->lo[s] = lo;
        }
    }
}

void tl_gdn_run(tl_cpu *c, const tl_gdn_block *G, int n) {
    tl_gdn *g = c->gdn;
    if (G->rec_layer == 0) plan_runs(c, n);
    tl_cpu_norm_all(c, n, c->xb, c->x, G->norm);
    tl_w w3[3] = {G->wqkv, G->wz, G->wbeta};
    float *y3[3] = {g->qkv, g->z, g->br};
    tl_cpu_matmul(c, 3, w3, y3, c->xb, n);
    tl_w wa = G->walpha;
    float *ya = g->ar;
    tl_cpu_matmul(c, 1, &wa, &ya, c->xb, n);
    tl_cpu_par_tokens_ith(c, n, conv_tokens, (void *)G);
    gdn_job j = {.c = c, .G = G};
    atomic_init(&j.next, 0);
    tl_pool_run(c->pool, rec_worker, &j);
    tl_cpu_par_tokens_ith(c, n, gate_tokens, (void *)G);
    keep_runs(c, G);
    tl_w wo = G->wout;
    float *out = c->xb;
    tl_cpu_matmul(c, 1, &wo, &out, g->o, n);
    tl_cpu_par_tokens(c, n, tl_cpu_add_tokens, NULL);
}

/* ------------------------------------------------------------ the states */

int tl_gdn_seek(tl_cpu *c, int seq, int pos) {
    tl_gdn *g = c->gdn;
    if (seq < 0 || seq >= g->n_seq || pos < 0) return -1;
    if (pos == g->pos[seq]) return 0;
    if (pos == 0) {
        for (int l = 0; l < g->n_rec; l++) {
            float *lay = lay_of(g, seq, l);
            memset(slot_of(g, lay, 0), 0, g->s_floats * sizeof(float));
            if (g->exact) memset(run_of(g, lay), 0, g->s_floats * sizeof(float));
        }
        g->pos[seq] = g->lo[seq] = 0;
        return 0;
    }
    if (pos > g->pos[seq] || pos < g->lo[seq]) return -1;
    const int B = pos / BLK * BLK;
    if (g->exact) { /* the boundary's state, then the positions since replayed */
        const int ds = g->ds;
        for (int l = 0; l < g->n_rec; l++) {
            float *lay = lay_of(g, seq, l), *M = run_of(g, lay);
            memcpy(M, slot_of(g, lay, B), g->s_floats * sizeof(float));
            for (int p = B; p < pos; p++) {
                const float *e = ring_of(g, lay, p);
                for (int h = 0; h < g->n_vh; h++) {
                    const int kh = h % g->n_kh;
                    exact_step(g, M + (size_t)h * ds * ds, NULL, e + g->e.k + kh * ds, e + g->e.v + h * ds,
                               e[g->e.g + h], e[g->e.b + h], NULL, g->scr);
                }
            }
        }
    }
    g->pos[seq] = pos;
    return 0;
}

int tl_gdn_snap_save(tl_cpu *c, int seq, int pos, void *p) {
    tl_gdn *g = c->gdn;
    if (seq < 0 || seq >= g->n_seq || pos % BLK || pos < g->lo[seq] || pos > g->pos[seq] ||
        pos < g->pos[seq] / BLK * BLK - BLK)
        return -1;
    float *o = p;
    const size_t cw = (size_t)(g->d_conv - 1) * g->conv_dim;
    for (int l = 0; l < g->n_rec; l++) {
        float *lay = lay_of(g, seq, l);
        memcpy(o, slot_of(g, lay, pos), g->s_floats * sizeof(float));
        o += g->s_floats;
        for (int i = 0; i < g->d_conv - 1; i++) {
            const int q = pos - (g->d_conv - 1) + i;
            if (q < 0) memset(o + (size_t)i * g->conv_dim, 0, (size_t)g->conv_dim * sizeof(float));
            else memcpy(o + (size_t)i * g->conv_dim, ring_of(g, lay, q) + g->e.conv, (size_t)g->conv_dim * sizeof(float));
        }
        o += cw;
    }
    return 0;
}

void tl_gdn_snap_load(tl_cpu *c, int seq, int pos, const void *p) {
    tl_gdn *g = c->gdn;
    const float *in = p;
    const size_t cw = (size_t)(g->d_conv - 1) * g->conv_dim;
    for (int l = 0; l < g->n_rec; l++) {
        float *lay = lay_of(g, seq, l);
        memcpy(slot_of(g, lay, pos), in, g->s_floats * sizeof(float));
        if (g->exact) memcpy(run_of(g, lay), in, g->s_floats * sizeof(float));
        in += g->s_floats;
        for (int i = 0; i < g->d_conv - 1; i++) {
            const int q = pos - (g->d_conv - 1) + i;
            if (q >= 0) memcpy(ring_of(g, lay, q) + g->e.conv, in + (size_t)i * g->conv_dim, (size_t)g->conv_dim * sizeof(float));
        }
        in += cw;
    }
    g->pos[seq] = g->lo[seq] = pos;
}
