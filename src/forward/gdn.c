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
    /* The block's end state: Sn[a][:] = g * S[a][:], then
     * Sn[a][:] = fma(c[e][a], dv[e][:], Sn[a][:]) for e = 0..ne-1 in order
     * (c: ne rows of d); each element of Sn read and written once */
    void (*rank)(int d, float g, const float *S, int ne, const float *c, const float *const *dv, float *Sn);
    /* The causal convolution's row: y[ch] = sum over taps j in order of
     * in[j][ch] * wt[j][ch], each product rounded (no fma) as ggml_ssm_conv
     * sums; a NULL in[j] (before the sequence's start) reads zeros */
    void (*conv)(int cd, int K, const float *const *in, const float *wt, float *y);
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

static void rank_ref(int d, float g, const float *S, int ne, const float *c, const float *const *dv, float *Sn) {
    for (int a = 0; a < d; a++) {
        float *y = Sn + (size_t)a * d;
        scale_ref(d, g, S + (size_t)a * d, y);
        for (int e = 0; e < ne; e++) axpy_ref(d, c[(size_t)e * d + a], dv[e], y);
    }
}

static void conv_ref(int cd, int K, const float *const *in, const float *wt, float *y) {
    for (int ch = 0; ch < cd; ch++) {
        float s = 0.0f;
        for (int j = 0; j < K; j++) s += (in[j] ? in[j][ch] : 0.0f) * wt[(size_t)j * cd + ch];
        y[ch] = s;
    }
}

#ifdef GDN_X86
__attribute__((target("avx2"))) static void conv_avx2(int cd, int K, const float *const *in, const float *wt,
                                                      float *y) {
    int ch = 0;
    for (; ch + 8 <= cd; ch += 8) {
        __m256 s = _mm256_setzero_ps();
        for (int j = 0; j < K; j++) {
            const __m256 x = in[j] ? _mm256_loadu_ps(in[j] + ch) : _mm256_setzero_ps();
            s = _mm256_add_ps(s, _mm256_mul_ps(x, _mm256_loadu_ps(wt + (size_t)j * cd + ch)));
        }
        _mm256_storeu_ps(y + ch, s);
    }
    for (; ch < cd; ch++) {
        float s = 0.0f;
        for (int j = 0; j < K; j++) s += (in[j] ? in[j][ch] : 0.0f) * wt[(size_t)j * cd + ch];
        y[ch] = s;
    }
}

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
/* S^T x and the rank update are small matrix products with every output
 * element one fma chain in a fixed order, so any register tiling gives the
 * scalar steps' bits. A tile holds M vectors (tokens, or rows of Sn) by W
 * column registers: each load of S (or of a delta row) serves M fmas and
 * each broadcast W, which keeps the loop on the fma pipes. */
#define GDN_UNROLL _Pragma("GCC unroll 4")
#define GDN_SDOT_TILE(NAME, TGT, VEC, LANES, ZERO, LOAD, STORE, FMA, SET1)                                            \
    __attribute__((target(TGT), always_inline)) static inline void NAME(int d, const float *S, int j,                 \
                                                                        const float *const *x, int m, int w,          \
                                                                        float *acc) {                                 \
        VEC r[4][4];                                                                                                  \
        GDN_UNROLL for (int t = 0; t < 4; t++)                                                                        \
            GDN_UNROLL for (int u = 0; u < 4; u++) r[t][u] = ZERO;                                                    \
        for (int a = 0; a < d; a++) {                                                                                 \
            const float *s = S + (size_t)a * d + j;                                                                   \
            VEC v[4];                                                                                                 \
            GDN_UNROLL for (int u = 0; u < w; u++) v[u] = LOAD(s + u * LANES);                                        \
            GDN_UNROLL for (int t = 0; t < m; t++) {                                                                  \
                const VEC b = SET1(x[t][a]);                                                                          \
                GDN_UNROLL for (int u = 0; u < w; u++) r[t][u] = FMA(b, v[u], r[t][u]);                               \
            }                                                                                                         \
        }                                                                                                             \
        GDN_UNROLL for (int t = 0; t < m; t++)                                                                        \
            GDN_UNROLL for (int u = 0; u < w; u++) STORE(acc + (size_t)t * d + j + u * LANES, r[t][u]);               \
    }

/* Rows a0..a0+m-1 of Sn, columns j..j+w*LANES-1. */
#define GDN_RANK_TILE(NAME, TGT, VEC, LANES, LOAD, STORE, FMA, SET1, MUL)                                             \
    __attribute__((target(TGT), always_inline)) static inline void NAME(                                              \
        int d, float g, const float *S, int ne, const float *c, const float *const *dv, float *Sn, int a0, int j,     \
        int m, int w) {                                                                                               \
        VEC r[4][4];                                                                                                  \
        const VEC vg = SET1(g);                                                                                       \
        GDN_UNROLL for (int t = 0; t < m; t++)                                                                        \
            GDN_UNROLL for (int u = 0; u < w; u++) r[t][u] = MUL(vg, LOAD(S + (size_t)(a0 + t) * d + j + u * LANES)); \
        for (int e = 0; e < ne; e++) {                                                                                \
            VEC v[4];                                                                                                 \
            GDN_UNROLL for (int u = 0; u < w; u++) v[u] = LOAD(dv[e] + j + u * LANES);                                \
            GDN_UNROLL for (int t = 0; t < m; t++) {                                                                  \
                const VEC b = SET1(c[(size_t)e * d + a0 + t]);                                                        \
                GDN_UNROLL for (int u = 0; u < w; u++) r[t][u] = FMA(b, v[u], r[t][u]);                               \
            }                                                                                                         \
        }                                                                                                             \
        GDN_UNROLL for (int t = 0; t < m; t++)                                                                        \
            GDN_UNROLL for (int u = 0; u < w; u++) STORE(Sn + (size_t)(a0 + t) * d + j + u * LANES, r[t][u]);         \
    }

GDN_SDOT_TILE(sdot_tile_avx2, "avx2,fma", __m256, 8, _mm256_setzero_ps(), _mm256_loadu_ps, _mm256_storeu_ps,
              _mm256_fmadd_ps, _mm256_set1_ps)
GDN_RANK_TILE(rank_tile_avx2, "avx2,fma", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_fmadd_ps,
              _mm256_set1_ps, _mm256_mul_ps)
GDN_SDOT_TILE(sdot_tile_avx512, "avx512f", __m512, 16, _mm512_setzero_ps(), _mm512_loadu_ps, _mm512_storeu_ps,
              _mm512_fmadd_ps, _mm512_set1_ps)
GDN_RANK_TILE(rank_tile_avx512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_fmadd_ps,
              _mm512_set1_ps, _mm512_mul_ps)

/* The tile shapes by the registers a level has: AVX2's 16 hold 4 x 2
 * accumulators, AVX-512's 32 hold 4 x 4. Constant m and w let the compiler
 * keep the tile in registers; d is a multiple of 8 (of 16 for AVX-512). */
#define GDN_DRIVERS(SDOT, RANK, TILE_S, TILE_R, LANES, W, TGT)                                                        \
    __attribute__((target(TGT))) static void SDOT(int d, const float *S, int nt, const float *const *x,               \
                                                  float *acc) {                                                       \
        int j = 0;                                                                                                    \
        for (; j + W * LANES <= d; j += W * LANES) {                                                                  \
            int t = 0;                                                                                                \
            for (; t + 4 <= nt; t += 4) TILE_S(d, S, j, x + t, 4, W, acc + (size_t)t * d);                            \
            /* the rest in one tile: a decoded token's k and q share one read of S */                                 \
            if (nt - t == 3) TILE_S(d, S, j, x + t, 3, W, acc + (size_t)t * d);                                       \
            if (nt - t == 2) TILE_S(d, S, j, x + t, 2, W, acc + (size_t)t * d);                                       \
            if (nt - t == 1) TILE_S(d, S, j, x + t, 1, W, acc + (size_t)t * d);                                       \
        }                                                                                                             \
        for (; j < d; j += LANES)                                                                                     \
            for (int t = 0; t < nt; t++) TILE_S(d, S, j, x + t, 1, 1, acc + (size_t)t * d);                           \
    }                                                                                                                 \
    __attribute__((target(TGT))) static void RANK(int d, float g, const float *S, int ne, const float *c,             \
                                                  const float *const *dv, float *Sn) {                                \
        for (int a = 0; a + 4 <= d; a += 4) {                                                                         \
            int j = 0;                                                                                                \
            for (; j + W * LANES <= d; j += W * LANES) TILE_R(d, g, S, ne, c, dv, Sn, a, j, 4, W);                    \
            for (; j < d; j += LANES) TILE_R(d, g, S, ne, c, dv, Sn, a, j, 4, 1);                                     \
        }                                                                                                             \
        for (int a = d / 4 * 4; a < d; a++)                                                                           \
            for (int j = 0; j < d; j += LANES) TILE_R(d, g, S, ne, c, dv, Sn, a, j, 1, 1);                            \
    }

GDN_DRIVERS(sdot_avx2, rank_avx2, sdot_tile_avx2, rank_tile_avx2, 8, 2, "avx2,fma")
GDN_DRIVERS(sdot_avx512, rank_avx512, sdot_tile_avx512, rank_tile_avx512, 16, 4, "avx512f")
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
    float *conv_wt;            /* [n_rec][d_conv][conv_dim]: each layer's taps, channel-minor for vector loads */
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
    float *bufs[] = {g->qkv, g->z, g->br, g->ar, g->q,    g->k,   g->v,
                     g->g,   g->b, g->d,  g->G,  g->o, g->ones, g->scr, g->conv_wt};
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
    g->f = (gdn_fns){axpy_ref, scale_ref, dot_ref, sdot_ref, rank_ref, conv_ref};
#ifdef GDN_X86
    if (c->kern.level >= TL_CPU_AVX2)
        g->f = (gdn_fns){axpy_avx2, scale_avx2, dot_avx2, sdot_avx2, rank_avx2, conv_avx2};
    if (c->kern.level >= TL_CPU_AVX512 && g->ds % 16 == 0) {
        g->f.sdot = sdot_avx512;
        g->f.rank = rank_avx512;
    }
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
    g->conv_wt = tl_cpu_calloc((size_t)g->n_rec * g->d_conv * g->conv_dim, sizeof(float), &fail);
    /* per thread: the convolution's row (or the gate's silu); or S^T k and
     * S^T q of a block's tokens, a row each of delta's and o's sums, and the
     * end state's weighted keys */
    g->scr_n = (size_t)g->conv_dim + 3 * BLK * (size_t)g->ds + 2 * (size_t)g->ds + 64;
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
    for (int l = 0; l < hp->n_layer; l++)
        for (int b = 0; b < c->m->layers[l].n_block; b++) {
            const tl_block *B = &c->m->layers[l].block[b];
            if (B->kind != TL_BLOCK_GDN) continue;
            const float *w = B->u.gdn.conv->data;
            float *wt = g->conv_wt + (size_t)B->u.gdn.rec_layer * g->d_conv * g->conv_dim;
            for (int ch = 0; ch < g->conv_dim; ch++)
                for (int j = 0; j < g->d_conv; j++) wt[(size_t)j * g->conv_dim + ch] = w[(size_t)ch * g->d_conv + j];
        }
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
    const float *wt = g->conv_wt + (size_t)il * K * cd, *dtb = G->dt_bias->data, *A = G->a->data;
    for (int i = t0; i < t1; i++) {
        const int t = g->tidx[i], r = g->tok_run[t], p = c->tpos[t];
        float *lay = lay_of(g, c->tseq[t], il);
        const float *in[16];
        for (int j = 0; j < K; j++) in[j] = conv_row(g, lay, r, p - (K - 1) + j);
        g->f.conv(cd, K, in, wt, row);
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
    float *sk = scr, *sq = NULL, *acc = scr + 2 * (size_t)BLK * ds, *acc2 = acc + ds, *cw = acc2 + ds;
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
            const float Gl = hist_at(g, lay, r, B + BLK - 1, h).G;
            const float *dv[BLK];
            for (int e = 0; e < BLK; e++) {
                const hist he = hist_at(g, lay, r, B + e, h);
                const float w = expf(Gl - he.G);
                for (int a = 0; a < ds; a++) cw[(size_t)e * ds + a] = w * he.k[a];
                dv[e] = he.d;
            }
            g->f.rank(ds, expf(Gl), S, BLK, cw, dv, Sn);
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
